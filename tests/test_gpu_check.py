"""scripts/bench/gpu_check.sh on a machine without a GPU: argument handling, the JSON skeleton against the schema its
header documents, the embedded programs (they compile; their limits add up to under 8 minutes) and the
production spec shrunk to one GPU (it validates). The checks themselves need a CUDA GPU; the rehearsal (slow)
runs every part's program on the CPU at toy size."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "gpu_check.sh"
CHECKS = {
    "machine",
    "host_syncs",
    "speed_vs_bare",
    "bf16_vs_fp16",
    "peak_memory",
    "production",
    "data_wait",
    "digest",
    "graphs",
}
PARTS = {"check", "syncs", "speed", "production", "digest", "graphs"}
ORDER = ["check", "syncs", "speed", "production", "digest", "graphs"]
FILE_PARTS = {"graphs": "gpu_check_graphs.py"}  # parts whose program is a file of its own beside the script


def run(*args: str, env: dict | None = None):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def documented() -> dict[str, set[str]]:
    """check -> fields, from the header lines "#   check.field   meaning"."""
    fields: dict[str, set[str]] = {}
    for m in re.finditer(r"^#   (\w+)\.(\w+) ", SCRIPT.read_text(), flags=re.M):
        fields.setdefault(m.group(1), set()).add(m.group(2))
    return fields


def test_help_and_usage_errors():
    r = run("--help")
    assert r.returncode == 0 and "bench/gpu_check.sh [--out DIR] [--json FILE]" in r.stdout
    for bad in (["--bogus"], ["--out"], ["--json"], ["--parts"], ["--parts", ""], ["--parts", "syncs,bogus"]):
        r = run(*bad)
        assert r.returncode == 2 and r.stderr.startswith("gpu_check: ") and r.stdout == "", bad


def test_without_a_gpu_it_says_so_and_prints_the_documented_skeleton(tmp_path):
    r = run("--out", str(tmp_path / "out"), "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU" in r.stderr
    doc = json.loads(r.stdout)
    assert doc == json.loads((tmp_path / "s.json").read_text())
    assert (doc["status"], doc["gpu"], doc["gpu_check"], doc["parts"]) == ("no-gpu", None, 3, [])
    assert set(doc["checks"]) == CHECKS == set(documented())
    for name, check in doc["checks"].items():
        assert check["ok"] is None and check["pass_if"] and "seconds" in check
        assert set(check) - {"ok", "pass_if", "seconds"} == documented()[name], name


def test_embedded_programs_compile_and_fit_in_eight_minutes():
    text = SCRIPT.read_text()
    parts = re.findall(r"^part (\w+) (\d+) <<'EOF'\n(.*?)^EOF$", text, flags=re.S | re.M)
    files = re.findall(r"^part (\w+) (\d+) < \"\$\(dirname \"\$0\"\)/(\S+)\"$", text, flags=re.M)
    assert {name for name, _, _ in parts} | {name for name, _, _ in files} == PARTS
    assert {name: f for name, _, f in files} == FILE_PARTS
    for name, _, body in parts:
        compile(body, f"gpu_check:{name}", "exec")
    for name, limit, f in files:
        compile((SCRIPT.parent / f).read_text(), f, "exec")
        assert int(limit) <= 180, name
    # the acceptance parts in 8 minutes; `torus-train check` (the machine's parts) in 2 more
    assert sum(int(limit) for name, limit, _ in parts if name != "check") < 8 * 60
    assert [int(limit) for name, limit, _ in parts if name == "check"] == [120]


def shrunk_module(monkeypatch):
    body = re.search(r"^cat > \"\$OUT/parts/shrunk.py\" <<'EOF'\n(.*?)^EOF$", SCRIPT.read_text(), flags=re.S | re.M)
    monkeypatch.setenv("GPU_CHECK_HERE", str(SCRIPT.parents[2]))
    namespace: dict = {}
    exec(compile(body.group(1), "shrunk.py", "exec"), namespace)
    return namespace


def test_the_production_spec_shrunk_to_one_gpu_is_valid(monkeypatch, tmp_path):
    from torus_train.job.spec import load_spec, parse_override

    shrunk = shrunk_module(monkeypatch)
    spec = shrunk["loop_spec"](str(tmp_path), 256, 30)
    assert (spec.model.arch, spec.model.precision, spec.model.channels_last) == ("resnet50", "fp16", True)
    assert (spec.optimizer.name, spec.comm.algo, spec.comm.compression) == ("lars", "torus", "fp16")
    assert (spec.data.image_size, spec.grid.grid, spec.schedule.steps) == (224, "1x1", 30)
    bf16 = shrunk["loop_spec"](str(tmp_path), 256, 30, "bf16")  # the speed part's bf16 loop validates too
    assert (bf16.model.precision, bf16.comm.compression) == ("bf16", "bf16")
    deterministic = shrunk["loop_spec"](str(tmp_path), 256, 30, deterministic=True)
    assert not spec.job.deterministic and deterministic.job.deterministic
    sets = shrunk["cli_sets"](
        [
            "model.num_classes=8",
            "schedule.stages=[{until_epoch=1,global_batch=32},{until_epoch=2,global_batch=256}]",
            "schedule.epochs=2",
        ]
    )
    cli = load_spec(str(shrunk["SPEC"]), [parse_override(v) for k, v in zip(sets[::2], sets[1::2], strict=True)])
    assert cli.data.loader == "dali" and cli.eval.every_epochs == 5 and cli.grid.gpus == 1
    assert [s.global_batch for s in cli.schedule.stages] == [32, 256]


@pytest.mark.slow
@pytest.mark.timeout(1560)  # the script's own limits (x5 in a rehearsal) bound it; a loaded 2-core CPU is slow
def test_the_rehearsal_runs_every_part_on_the_cpu(tmp_path):
    """--rehearse: the four parts' programs end to end on the CPU (gloo, DALI's CPU decoder, 64 px), every
    documented field filled; the pass lines that hold on any device hold here."""
    r = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse", "--out", str(tmp_path / "out"), "--json", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "rehearsal" and doc["gpu"] is None and doc["parts"] == sorted(PARTS, key=ORDER.index)
    checks = doc["checks"]
    for name, check in checks.items():
        assert "error" not in check and None not in check.values(), (name, check)
        assert documented()[name] <= set(check), name
    machine = checks["machine"]["parts"]  # `torus-train check` on the CPU: the GPU parts null, the others ok
    assert machine["decoder_cpu"]["ok"] and machine["deterministic"]["ok"] and machine["environment"]["ok"]
    assert all(machine[n]["ok"] is None for n in ("gpus", "nccl", "graphs", "decoder_gpu")) and checks["machine"]["ok"]
    assert checks["host_syncs"]["ok"] and checks["host_syncs"]["syncs_per_step"] == 0
    assert checks["host_syncs"]["steps"] > 0 and checks["host_syncs"]["backend"] == "gloo"
    prod = checks["production"]
    assert prod["ok"] and (prod["backend"], prod["loader"], prod["evaluations"]) == ("gloo", "dali (cpu)", 2)
    assert prod["dali_checked"] is True and prod["note"] == "DALI" and prod["images_per_s"] > 0
    assert prod["replicas_agree"] is True and prod["steps"] == 48 + 24  # 192 images at batch 4, then at batch 8
    wait = checks["data_wait"]
    assert (wait["steps_batch_32"], wait["steps_batch_256"]) == (48 - 3, 24 - 3)  # each stage's first 3 left out
    assert 0 <= wait["share_batch_32"] <= 1 and 0 <= wait["share_batch_256"] <= 1
    digest = checks["digest"]
    assert digest["ok"] and len(digest["first"]) == 64
    assert digest["deterministic_cost"] == pytest.approx(digest["deterministic_img_s"] / digest["default_img_s"])
    speed = checks["speed_vs_bare"]
    assert speed["batch"] == 8 and speed["torus_train_img_s"] > 0 and speed["bare_img_s"] > 0
    assert abs(speed["ratio"] - speed["torus_train_img_s"] / speed["bare_img_s"]) < 1e-9
    prec = checks["bf16_vs_fp16"]  # the pass line: the loop in bf16 against the bare loop in bf16
    assert prec["fp16_img_s"] == speed["torus_train_img_s"]
    assert prec["ratio"] == pytest.approx(prec["bf16_img_s"] / prec["bare_bf16_img_s"])
    assert prec["bf16_over_fp16"] == pytest.approx(prec["bf16_img_s"] / prec["fp16_img_s"])
    # run again into the same --out: the part starts from nothing of the earlier run (its runs would be refused
    # as results already there, and their old figures read)
    again = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse", "--parts", "digest", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    redo = json.loads(again.stdout)["checks"]["digest"]
    assert "error" not in redo and redo["ok"] and redo["first"] == digest["first"], redo


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_one_part_without_dali_passes_on_torchvision_and_says_dali_was_not_checked(tmp_path):
    """--parts production where nvidia.dali does not import (a package of that name that raises): the run takes
    torchvision (with its GPU decoder on a GPU; the CPU one here), its figures are filled, the check passes and
    its note says that DALI was not checked; the other parts' checks stay null."""
    fake = tmp_path / "nodali" / "nvidia"
    (fake / "dali").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os, site\n"  # the real nvidia.* packages stay importable
        "__path__.extend(os.path.join(d, 'nvidia') for d in site.getsitepackages())\n"
    )
    (fake / "dali" / "__init__.py").write_text("raise ImportError('nvidia.dali hidden by the test')\n")
    r = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse", "--parts", "production", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(fake.parent)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["parts"]) == ("rehearsal", ["production"])
    prod = doc["checks"]["production"]
    assert prod["ok"] is True and "error" not in prod and prod["dali_checked"] is False
    assert "DALI was not checked" in prod["note"]
    assert (prod["loader"], prod["evaluations"], prod["replicas_agree"]) == ("torchvision (cpu)", 2, True)
    assert doc["checks"]["data_wait"]["steps_batch_256"] == 21
    for name in ("machine", "host_syncs", "speed_vs_bare", "bf16_vs_fp16", "peak_memory", "digest"):
        assert doc["checks"][name]["ok"] is None and doc["checks"][name]["seconds"] is None, name


@pytest.mark.slow
def test_the_graphs_part_rehearses_on_the_cpu_with_every_field_filled(tmp_path):
    """--rehearse --parts graphs: the part's program end to end on the CPU at batch 2, 4 and 8 (nothing is
    captured there), every column of every batch filled, the ratio its columns' quotient."""
    r = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse", "--parts", "graphs", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["parts"]) == ("rehearsal", ["graphs"])
    graphs = doc["checks"]["graphs"]
    assert "error" not in graphs and sorted(graphs["batches"], key=int) == ["2", "4", "8"]
    for batch, row in graphs["batches"].items():
        assert None not in row.values(), batch
        assert (
            min(row[k] for k in ("ours_graphed_img_s", "ours_eager_img_s", "bare_eager_img_s", "bare_graphed_img_s"))
            > 0
        ), batch
        assert abs(row["ratio"] - row["ours_graphed_img_s"] / row["bare_graphed_img_s"]) < 0.01, batch
        assert row["capture_seconds"] == 0.0  # no capture on the CPU
    assert graphs["eager_ratio_batch_32"] > 0
    # on the CPU both sides run the same step eagerly: equal to the bit, and the NaN step skipped and counted
    agree = graphs["agree"]
    assert (agree["eager_vs_graphed_max_rel"], agree["graphed_runs_equal"]) == (0.0, True), agree
    assert agree["nonfinite_step_skipped"] and agree["all_finite"] and agree["ok"], agree
