"""Inside a rank: rank / world size / local rank from each launcher's environment, and the rendezvous."""

from __future__ import annotations

import sys

import pytest

from torus_train.errors import RunFailed, UserError
from torus_train.job.launch import rendezvous_port
from torus_train.job.launchers.srun import slurm_rendezvous
from torus_train.ranks.bootstrap import RankInfo, rank_info, rendezvous
from torus_train.usernumbers import NumberError


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"},
            RankInfo(5, 8, 1, 4, "torchrun"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            RankInfo(3, 4, 3, 4, "openmpi"),
        ),
        (
            {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"},
            RankInfo(9, 16, 1, 4, "slurm"),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            RankInfo(2, 4, 0, 2, "pmi"),
        ),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, RankInfo(1, 2, 1, 2, "slurm")),  # no local vars: fall back
        ({}, RankInfo(0, 1, 0, 1, "single")),
    ],
)
def test_rank_info_sources(env, expected):
    assert rank_info(env) == expected


def test_torchrun_variables_win_over_the_scheduler_ones():
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert rank_info(env).source == "torchrun"


def test_rank_outside_the_world_is_refused():
    with pytest.raises(UserError, match=r"^RANK: 4 is out of range; give an integer from 0 to 3$"):
        rank_info({"RANK": "4", "WORLD_SIZE": "4"})


@pytest.mark.parametrize(
    "env, source",
    [
        ({"RANK": "\u00b2", "WORLD_SIZE": "4"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "four"}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "x"}, "LOCAL_RANK"),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "\u00b2"}, "LOCAL_WORLD_SIZE"),
        ({"OMPI_COMM_WORLD_RANK": "nan", "OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_RANK"),
        ({"PMI_RANK": "0", "PMI_SIZE": "-1"}, "PMI_SIZE"),
        ({"SLURM_PROCID": "1.5", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, "SLURM_PROCID"),
    ],
)
def test_a_launchers_variable_that_is_no_rank_is_refused_by_name(env, source):
    """The issue's ValueError at launchers/base.py: each of these is one line naming the variable."""
    with pytest.raises(UserError, match=f"^{source}: .* give an integer"):
        rank_info(env)


def test_rendezvous_from_the_environment():
    info = RankInfo(1, 4, 1, 4, "torchrun")
    assert rendezvous(info, {"MASTER_ADDR": "node001", "MASTER_PORT": "29555"}) == ("node001", 29555)
    addr, port = rendezvous(RankInfo(0, 1, 0, 1, "single"), {})
    assert addr == "127.0.0.1" and 0 < port < 65536
    with pytest.raises(RunFailed, match="no MASTER_ADDR/MASTER_PORT"):
        rendezvous(info, {})


def test_ranks_launched_by_the_plan_need_no_mpi(monkeypatch):
    """mpirun -x hands every rank MASTER_ADDR/MASTER_PORT: an OpenMPI rank must not import mpi4py."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # any `import mpi4py` now fails
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "2176",
        "MASTER_ADDR": "host001",
        "MASTER_PORT": "21473",
    }
    assert rendezvous(rank_info(env), env) == ("host001", 21473)


SRUN = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "3",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gpu[007-008],gpu010",
}


def test_srun_by_hand_derives_the_rendezvous(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    info = rank_info(SRUN)
    # first node of the list, port from job id x 16 + step id (rendezvous_port of the digits)
    assert slurm_rendezvous(SRUN, (32768, 60999)) == ("gpu007", rendezvous_port(str(4242 * 16), (32768, 60999)))
    assert rendezvous_port(str(4242 * 16)) == 20000 + 4242 * 16 % 12768
    addr, port = rendezvous(info, SRUN)
    assert addr == "gpu007" and 1024 <= port < 65536
    # every rank of the step computes the same; the next step of the job another one
    other = {**SRUN, "SLURM_PROCID": "7", "SLURM_LOCALID": "1"}
    assert rendezvous(rank_info(other), other) == (addr, port)
    step1 = {**SRUN, "SLURM_STEP_ID": "1"}
    assert rendezvous(rank_info(step1), step1)[1] != port
    # the step's own node list wins over the allocation's
    step_nodes = {**SRUN, "SLURM_STEP_NODELIST": "gpu[008,010]"}
    assert rendezvous(rank_info(step_nodes), step_nodes)[0] == "gpu008"


def test_srun_by_hand_without_a_node_list_is_refused():
    env = {k: v for k, v in SRUN.items() if k != "SLURM_JOB_NODELIST"}
    with pytest.raises(RunFailed, match="no MASTER_ADDR/MASTER_PORT"):
        rendezvous(rank_info(env), env)


def test_rank_threads_from_the_launcher_or_slurm():
    from torus_train.ranks.worker import rank_threads

    assert rank_threads({"OMP_NUM_THREADS": "4", "SLURM_CPUS_PER_TASK": "8"}) == 4
    assert rank_threads({"SLURM_CPUS_PER_TASK": "8"}) == 8  # srun by hand: Slurm sets no OMP_NUM_THREADS
    assert rank_threads({"OMP_NUM_THREADS": "8,2"}) == 8  # OpenMP's list per nesting level: the first is ours
    assert rank_threads({"OMP_NUM_THREADS": "0", "SLURM_CPUS_PER_TASK": ""}) is None  # 0 or empty says nothing
    assert rank_threads({}) is None
    for name, value in (("SLURM_CPUS_PER_TASK", "x"), ("OMP_NUM_THREADS", "²"), ("OMP_NUM_THREADS", "9" * 5000)):
        with pytest.raises(NumberError, match=f"^{name}: .* give an integer from 0 to 65536$"):
            rank_threads({name: value})
