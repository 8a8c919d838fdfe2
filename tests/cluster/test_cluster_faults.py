"""Faults that only a cluster has, on the 2-node namespace cluster: a whole node dies, the network between the
nodes is cut, one rank on the far node is killed. The job is started as users start it on a cluster
(`torus-train run --launcher mpirun --hostfile` on node1), runs long enough for the fault to land mid-run, and
must end by itself, non-zero, within the collective timeout plus a margin, with one line that says what
failed, no process of the job left on either node, and the checkpoints written before the fault intact.

Times are printed (`-s` shows them); docs/faults.md carries the table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import CLUSTER, ROOT

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")
TIMEOUT_S = 20  # comm.timeout_s of these runs: how long a rank waits on a peer that never answers
LONG = [
    "--set",
    "schedule.steps=400",
    "--set",
    f"comm.timeout_s={TIMEOUT_S}",
    "--set",
    "checkpoint.every_steps=4",
    "--set",
    "launch.env=[\"OMP_NUM_THREADS=1\"]",
]


def start(cluster, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "run"
    hf = cluster.hostfile(tmp_path / "hosts")
    # output to a file, not a pipe: OpenMPI's daemon on a cut-off node inherits it and would hold a pipe open
    # long after the job has ended
    with open(tmp_path / "output.txt", "w") as log:
        p = subprocess.Popen(
            [
                str(CLUSTER),
                "exec",
                "node1",
                "torus-train",
                "run",
                "--spec",
                TINY,
                "--launcher",
                "mpirun",
                "--hostfile",
                str(hf),
                "--out",
                str(out),
                *LONG,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    return p, out


def wait_for_step(p: subprocess.Popen, out: Path, step: int, limit: float = 90) -> None:
    """Until rank 0's metrics.jsonl shows `step` steps done (the job is training on both nodes)."""
    end = time.time() + limit
    while time.time() < end:
        assert p.poll() is None, f"the job ended before the fault: {output(out)[-3000:]}"
        rows = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        done = max((json.loads(r).get("step", 0) for r in rows if r.startswith("{")), default=0)
        if done >= step:
            return
        time.sleep(0.5)
    pytest.fail(f"no step {step} within {limit} s")


def job_pids(node: str) -> list[int]:
    """Processes of the job inside `node`: ranks and OpenMPI's daemon (not slurmd or munged)."""
    r = subprocess.run(["ip", "netns", "pids", f"ttc-node{node[4:]}"], capture_output=True, text=True)
    pids = []
    for pid in map(int, r.stdout.split()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "torus_train" in cmd or "torus-train" in cmd or "prted" in cmd or "mpirun" in cmd:
            pids.append(pid)
    return pids


def output(out: Path) -> str:
    return (out.parent / "output.txt").read_text(errors="replace")


def finish(p: subprocess.Popen, out: Path, t_fault: float, limit: float) -> tuple[int, str, float]:
    """(exit code, output, seconds from the fault until torus-train exited)."""
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"the job did not end within {limit} s of the fault:\n{output(out)[-3000:]}")
    return p.returncode, output(out), time.time() - t_fault


def nothing_left_and_checkpoints_intact(out: Path, t_fault: float) -> float:
    """Seconds from the fault until no process of the job is left on either node. A rank whose peers died can
    be blocked in a collective: it goes when comm.timeout_s expires, so the bound is that plus a margin."""
    end = time.time() + TIMEOUT_S + 30
    while time.time() < end and any(job_pids(n) for n in ("node1", "node2")):
        time.sleep(0.5)
    left = {n: job_pids(n) for n in ("node1", "node2")}
    assert not any(left.values()), f"processes of the job left behind: {describe(left)}"
    from torus_train.train.checkpoint import find_latest

    ref = find_latest(out / "checkpoints", warn=lambda m: pytest.fail(f"a checkpoint is damaged: {m}"))
    assert ref is not None and ref.step >= 4, "the checkpoints written before the fault are gone"
    return time.time() - t_fault


def describe(left: dict) -> dict:
    def cmd(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            return "(gone)"

    return {n: {pid: cmd(pid) for pid in pids} for n, pids in left.items()}


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def fault_mid_run(cluster, tmp_path: Path, name: str, inject, limit: float, undo=None) -> str:
    """Start the job, inject the fault at step 6, and check that the job ends by itself, non-zero, without a
    traceback as its last line, leaving no process behind and its checkpoints intact; returns its output."""
    p, out = start(cluster, tmp_path)
    wait_for_step(p, out, 6)
    t = time.time()
    inject()
    try:
        code, text, took = finish(p, out, t, limit)
        ranks_left = ranks_after(15)  # (before a cut link comes back) the ranks go with the launcher
    finally:
        if undo is not None:
            undo()
    assert not ranks_left, f"ranks still running when the launcher ended: {ranks_left}"
    assert code != 0
    assert "Traceback" not in last_line(text)
    gone = nothing_left_and_checkpoints_intact(out, t)
    print(
        f"\n{name}: the job ended in {took:.1f} s with exit {code}, its last process in {gone:.1f} s: {last_line(text)}"
    )
    return text


def ranks_after(seconds: float) -> list[int]:
    """The ranks of the job still running on either node after waiting up to `seconds` for them to go."""
    end = time.time() + seconds
    while (left := [pid for n in ("node1", "node2") for pid in job_pids(n) if is_rank(pid)]) and time.time() < end:
        time.sleep(0.5)
    return left


def kill(pids: list[int]) -> None:
    assert pids, "no process of the job found on node2"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def is_rank(pid: int) -> bool:
    try:
        return "torus_train.ranks.worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@pytest.mark.timeout(200)
def test_a_whole_node_dies(cluster, tmp_path):
    """SIGKILL to every process of the job on node2 (its 2 ranks and OpenMPI's daemon), as when a node dies."""
    text = fault_mid_run(cluster, tmp_path, "node killed", lambda: kill(job_pids("node2")), TIMEOUT_S + 90)
    # mpirun may exit 0 here; the launcher counts the ranks that finished
    assert "ranks finished" in last_line(text) or "mpirun exited with code" in last_line(text), last_line(text)


@pytest.mark.timeout(200)
def test_the_link_between_the_nodes_is_cut(cluster, tmp_path):
    """node2's link to the bridge goes down mid-run (a partition): the ranks block on the column exchange
    until comm.timeout_s and fail; mpirun, waiting for node2's daemon, is stopped by the launcher once every
    rank has ended; the link comes back afterwards for the other tests."""

    def link(state: str):
        return lambda: subprocess.run(["ip", "link", "set", "ttc-v2", state], check=True)

    try:
        text = fault_mid_run(cluster, tmp_path, "link cut", link("down"), TIMEOUT_S + 120, undo=link("up"))
    finally:
        slurm_nodes_back(cluster)
    assert "but mpirun did not exit" in last_line(text), last_line(text)


def slurm_nodes_back(cluster, limit: float = 90) -> None:
    """After the cut, slurmctld may have marked node2 not responding (down): return it to service and wait
    until both nodes are in service again, so that the Slurm tests after this one find them."""
    cluster.on("node1", "scontrol", "update", "NodeName=node2", "State=RESUME", timeout=20)
    end = time.time() + limit
    while time.time() < end:
        states = cluster.on("node1", "sinfo", "-h", "-N", "-o", "%t", timeout=20).stdout.split()
        # in service: idle, or running another job; not down, drained or not responding (a trailing *)
        if states and all(s.rstrip("~#!%$@^-") in ("idle", "mix", "alloc", "comp") for s in states):
            return
        time.sleep(1)
    pytest.fail(f"Slurm's nodes did not come back after the link returned: {states}")


@pytest.mark.timeout(200)
def test_one_rank_on_the_far_node_is_killed(cluster, tmp_path):
    """SIGKILL to one rank on node2: mpirun ends the job, and the launcher says which rank and host failed."""
    text = fault_mid_run(
        cluster,
        tmp_path,
        "rank killed",
        lambda: kill([pid for pid in job_pids("node2") if is_rank(pid)][-1:]),
        TIMEOUT_S + 90,
    )
    assert "node2" in text
