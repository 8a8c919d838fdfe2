"""A run that must not end green with the wrong result or lose why it failed, on the 2-node namespace cluster,
each judged as a user would (the final line, the exit code, the files in OUT, the processes left): two runs into
one folder from two nodes, a `torchrun --max-restarts` restart after a refused first attempt, the output file
system filled by another writer mid-run, and a rank stopped on the far node under mpirun and under srun.

Times are printed (`-s` shows them); docs/faults.md carries the table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import CLUSTER, ROOT
from tests.cluster.test_cluster_faults import job_pids
from tests.fulldisk import fill, small_fs

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TIMEOUT_S = 20
LONG = ["--set", "schedule.steps=400", "--set", f"comm.timeout_s={TIMEOUT_S}", "--set", "checkpoint.every_steps=4"]
SALLOC = ["salloc", "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1"]


def run_argv(node: str, *args: str, launcher: str = "mpirun", hosts: Path | None = None) -> list[str]:
    """`torus-train run --spec tiny.toml ...` on `node` with the launcher (srun: inside a 2-node allocation)."""
    where = ["--launcher", "mpirun", "--hostfile", str(hosts)] if launcher == "mpirun" else ["--launcher", "srun"]
    prefix = SALLOC if launcher == "srun" else []
    return [str(CLUSTER), "exec", node, *prefix, "torus-train", "run", "--spec", TINY, *where, *args]


def start(argv: list[str], log: Path) -> subprocess.Popen:
    # output to a file, not a pipe: OpenMPI's daemon on the far node inherits it
    with open(log, "w") as f:
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env={**os.environ, **ONE_THREAD}
        )


def ended(p: subprocess.Popen, log: Path, limit: float) -> tuple[int, str]:
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"the job did not end within {limit} s:\n{log.read_text(errors='replace')[-3000:]}")
    return p.returncode, log.read_text(errors="replace")


def nothing_left(limit: float = TIMEOUT_S + 30) -> None:
    end = time.time() + limit
    while time.time() < end and any(job_pids(n) for n in ("node1", "node2")):
        time.sleep(0.5)
    assert not any(job_pids(n) for n in ("node1", "node2")), "processes of the job left behind"


def final_line(text: str) -> str:
    """The launcher's last line (rank 0's progress bar, cut short, may precede it on the same line)."""
    at = text.rfind("torus-train: error:")
    return text[at:].splitlines()[0] if at >= 0 else ""


def beat(out: Path, rank: int) -> dict | None:
    try:
        return json.loads((out / "logs" / f"rank{rank:05d}.beat").read_text())
    except (OSError, ValueError):
        return None


def wait_for(what, limit: float, p: subprocess.Popen, log: Path):
    end = time.time() + limit
    while not (got := what()):
        assert time.time() < end and p.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)
    return got


@pytest.mark.timeout(300)
def test_two_runs_into_one_folder_from_two_nodes(cluster, tmp_path):
    """A from node1, B from node2 a moment later into the same --out: B refused in one line before launch naming
    A's host and pid; A's results exactly what A gives alone."""
    hosts = cluster.hostfile(tmp_path / "hosts")
    alone, shared = tmp_path / "alone", tmp_path / "shared"
    code, text = ended(
        start(run_argv("node1", "--out", str(alone), hosts=hosts), tmp_path / "alone.txt"), tmp_path / "alone.txt", 150
    )
    assert code == 0, text[-3000:]
    a = start(run_argv("node1", "--out", str(shared), hosts=hosts), tmp_path / "a.txt")
    note = wait_for(
        lambda: (shared / "run.lock").exists() and (shared / "run.lock").read_text(), 60, a, tmp_path / "a.txt"
    )
    b = cluster.on(
        "node2",
        "torus-train",
        "run",
        "--spec",
        TINY,
        "--launcher",
        "mpirun",
        "--hostfile",
        str(hosts),
        "--set",
        "job.seed=7",
        "--out",
        str(shared),
        env=ONE_THREAD,
        timeout=60,
    )
    code, text = ended(a, tmp_path / "a.txt", 150)
    held = json.loads(note)
    assert b.returncode == 2 and b.stdout == "", b.stdout + b.stderr
    assert b.stderr.strip() == (
        f"torus-train: error: --out {shared}: in use by the run started {held['started']} on node1 "
        f"(pid {held['pid']}); wait for it to end or give another --out"
    ), b.stderr
    assert code == 0, text[-3000:]
    digest = lambda out: json.loads((out / "summary.json").read_text())["param_digest"]  # noqa: E731
    assert digest(shared) == digest(alone)
    steps = [json.loads(r)["step"] for r in (shared / "metrics.jsonl").read_text().splitlines() if '"loss"' in r]
    assert steps == sorted(set(steps)), steps
    assert not (shared / "run.lock").exists()
    nothing_left()
    print(f"\ntwo runs, one folder: the second refused from node2: {b.stderr.strip()}")


TORCHRUN = [
    "srun",
    "--nodes=2",
    "--ntasks-per-node=1",
    "--cpus-per-task=2",
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--nnodes=2",
    "--nproc-per-node=2",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=node1:29412",
    "--max-restarts=1",
    "--no-python",
]


@pytest.mark.timeout(300)
def test_a_torchrun_restart_refuses_what_its_first_attempt_refused(cluster, tmp_path):
    """A torchrun agent per node (srun) with --max-restarts 1 into a folder that holds another run's results:
    attempt 0 refuses it and so does attempt 1; the other run's files stay as they were."""
    hosts = cluster.hostfile(tmp_path / "hosts")
    old = tmp_path / "old"
    code, text = ended(
        start(run_argv("node1", "--out", str(old), hosts=hosts), tmp_path / "old.txt"), tmp_path / "old.txt", 150
    )
    assert code == 0, text[-3000:]
    before = {p.name: p.read_bytes() for p in (old / "metrics.jsonl", old / "summary.json")}
    argv = [*TORCHRUN, "torus-train", "run", "--spec", TINY, "--set", "schedule.steps=6", "--out", str(old)]
    r = cluster.on("node1", *argv, env=ONE_THREAD, timeout=240)
    said = r.stdout + r.stderr
    assert r.returncode != 0
    assert said.count(f"{old} already holds results") == 2, said[-3000:]
    assert "resumed at" not in said
    assert {p.name: p.read_bytes() for p in (old / "metrics.jsonl", old / "summary.json")} == before
    nothing_left()
    print(f"\ntorchrun restart after a refusal: exit {r.returncode}, refused in both attempts")


@pytest.mark.timeout(300)
def test_the_output_file_system_fills_up_mid_run(cluster, tmp_path):
    """OUT on a 300 MB tmpfs, filled to the last byte by another writer once the checkpoint at step 8 is in:
    the final line names OUT and "no space", exit 1, no restart (--max-restarts 1), the checkpoint intact."""
    from torus_train.train.checkpoint import find_latest

    hosts = cluster.hostfile(tmp_path / "hosts")
    with small_fs(tmp_path / "fs", "300m") as fs:
        out = fs / "O"
        p = start(run_argv("node1", *LONG, "--max-restarts", "1", "--out", str(out), hosts=hosts), tmp_path / "o.txt")
        wait_for(lambda: (out / "checkpoints" / "step-00000008.json").exists(), 150, p, tmp_path / "o.txt")
        t = time.time()
        threading.Thread(target=fill, args=(fs / "filler",), daemon=True).start()
        code, text = ended(p, tmp_path / "o.txt", 120)
        final = final_line(text)
        assert code == 1, text[-3000:]
        assert final.startswith("torus-train: error: rank ") and str(out) in final and "no space" in final, final
        assert "restart 1 of 1" not in text and "Traceback" not in text.split("$ mpirun")[-1].split("\n", 1)[-1]
        ref = find_latest(out / "checkpoints", warn=lambda m: pytest.fail(f"a checkpoint is damaged: {m}"))
        assert ref is not None and ref.step >= 8
        assert all(m.stat().st_size for m in (out / "logs").glob("*.failed")), "an empty marker"
        nothing_left()
        print(f"\nfull disk: ended in {time.time() - t:.1f} s with exit {code}: {final}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_a_stopped_rank_on_the_far_node_is_named(cluster, tmp_path, launcher):
    """SIGSTOP to rank 3 (node2) at step 6, comm.timeout_s 20: the job ends by itself, exit 1, the final line
    names rank 3 on node2, nothing left running."""
    hosts = cluster.hostfile(tmp_path / "hosts")
    out = tmp_path / "run"
    p = start(run_argv("node1", *LONG, "--out", str(out), launcher=launcher, hosts=hosts), tmp_path / "o.txt")
    b = wait_for(lambda: (x := beat(out, 3)) and x["step"] >= 6 and x, 150, p, tmp_path / "o.txt")
    t = time.time()
    os.kill(b["pid"], signal.SIGSTOP)  # the nodes share this machine's process namespace
    code, text = ended(p, tmp_path / "o.txt", TIMEOUT_S + 120)
    final = final_line(text)
    assert code == 1, text[-3000:]
    assert final.startswith("torus-train: error: rank 3 on node2 stopped responding"), final
    nothing_left()
    print(f"\nrank 3 stopped under {launcher}: ended in {time.time() - t:.1f} s: {final}")
