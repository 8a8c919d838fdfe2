"""`torus-train --help` and `bench allreduce`: fast help, one-line usage errors with exit code 2, a real run."""

import json
import subprocess
import sys
import time

import pytest


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "torus_train", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args", [["--help"], ["bench", "allreduce", "--help"], ["bench", "--help"]])
def test_help_is_fast_and_imports_no_torch(args):
    code = (
        "import sys, time; t = time.perf_counter(); from torus_train.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', time.perf_counter() - t, rc)"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "NOTORCH"
    assert float(last[1]) < 1.0
    assert last[2] == "0"
    assert "Usage:" in out.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--grid", "3x3", "--nprocs", "8"], "grid 3x3 = 9 ranks but --nprocs is 8"),
        (["--grid", "0x4"], "0x4"),
        (["--grid", "abc"], "'abc' is not of the form XxY"),
        (["-b", "1M", "-e", "1K"], "-b 1048576 is larger than -e 1024"),
        (["--algo", "ring"], "--algo ring is unknown"),
        (["-d", "int8"], "-d 'int8' is not supported"),
        (["--backend", "smoke"], "smoke"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = cli("bench", "allreduce", *args)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("torus-train: error:") and needle in lines[0]


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_bench_runs_four_local_ranks_and_writes_json(tmp_path):
    path = tmp_path / "b.json"
    t = time.time()
    out = cli(
        "bench",
        "allreduce",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "3",
        "-w",
        "1",
        "--grid",
        "2x2",
        "--json",
        str(path),
        timeout=170,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for algo in ("flat", "torus", "hierarchical"):
        assert f"# algo: {algo}" in out.stdout
    assert out.stdout.count("# Out of bounds values : 0 OK") == 3
    rows = json.loads(path.read_text())
    assert len(rows) == 3 * 3
    assert {r["algo"] for r in rows} == {"flat", "torus", "hierarchical"}
    assert all(r["wrong"] == 0 and r["grid"] == "2x2" and r["time_us"] > 0 for r in rows)
    assert time.time() - t < 170


@pytest.mark.parametrize("args", [["--nprocs", "2"], ["--grid", "2x2"]])
def test_nccl_with_more_ranks_than_gpus_is_refused_before_any_rank_starts(args):
    import os

    code = (
        "import sys; from torus_train.cli import main\n"
        "from torus_train.job import gpus\n"
        "gpus.driver_gpus = lambda: 1\n"  # a driver that lists one GPU (NVML's count, job/gpus.py)
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "bench", "allreduce", "--backend", "nccl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert out.stdout.split() == ["NOTORCH", "2"], out.stdout + out.stderr  # no rank (and no torch) started
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("torus-train: error: --backend nccl: ")
    assert "ranks but 1 GPU(s) here, and NCCL runs one rank per GPU; run CPU ranks with --backend gloo" in lines[0]
