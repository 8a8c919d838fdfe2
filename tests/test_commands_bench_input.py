"""`torus-train bench input`: both pipelines on the same files in one run, a table and a JSON file."""

from __future__ import annotations

import json
import subprocess
import sys

from torus_train.data.demo import generate


def test_bench_input_runs_both_and_writes_json(tmp_path):
    generate(tmp_path / "d", seed=0, train_per_class=4, val_per_class=1, size=64, workers=1)
    out = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "bench",
            "input",
            "--data",
            str(tmp_path / "d"),
            "--batch-size",
            "8",
            "--image-size",
            "32",
            "--threads",
            "1",
            "--warmup",
            "1",
            "--batches",
            "3",
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    assert "DALI / torchvision:" in r.stdout and "per round:" in r.stdout
    assert r.stderr.count("round 1/2:") == 2 and r.stderr.count("round 2/2:") == 2
    doc = json.loads(out.read_text())
    kinds = [(x["loader"], x["decoder"]) for x in doc["results"]]
    assert kinds == [("dali", "cpu"), ("torchvision", "cpu")]  # no GPU here: torchvision's GPU decoder is not run
    assert "torchvision with data.decoder = gpu: not measured (data.decoder = gpu needs ranks on CUDA" in r.stderr
    assert doc["not_measured"] and "torchvision (cpu)" in r.stdout
    for x in doc["results"]:
        assert x["rounds"] == 2 and x["images"] == 48 and len(x["round_images_per_s"]) == 2
        assert x["min_images_per_s"] <= x["images_per_s"] <= x["max_images_per_s"]
    assert doc["results"][1]["ratio_to_torchvision"] == 1.0


def test_bench_input_bad_folder_is_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "torus_train", "bench", "input", "--data", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert f"{tmp_path / 'none'}: data folder not found" in r.stderr


def test_bench_input_measures_each_decoder_the_device_takes():
    """On a CUDA device: DALI, torchvision decoding in its workers, torchvision decoding with nvJPEG."""
    from torus_train.bench.input import variants

    assert variants(["dali", "torchvision"], "cuda:0") == (
        [("dali", "auto"), ("torchvision", "cpu"), ("torchvision", "gpu")],
        [],
    )
    rows, skipped = variants(["torchvision"], "cpu")
    assert rows == [("torchvision", "cpu")] and len(skipped) == 1 and "needs ranks on CUDA" in skipped[0]
