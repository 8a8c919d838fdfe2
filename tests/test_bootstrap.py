"""Inside a rank: rank / world size / local rank from each launcher's environment, and the rendezvous."""
from __future__ import annotations

import pytest

from torus_train.ranks.bootstrap import RankInfo, rank_info, rendezvous
from torus_train.errors import RunFailed


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, RankInfo(5, 8, 1, 4, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, RankInfo(3, 4, 3, 4, "openmpi")),
    ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"},
     RankInfo(9, 16, 1, 4, "slurm")),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, RankInfo(2, 4, 0, 2, "pmi")),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, RankInfo(1, 2, 1, 2, "slurm")),  # no local vars: fall back
    ({}, RankInfo(0, 1, 0, 1, "single")),
])
def test_rank_info_sources(env, expected):
    assert rank_info(env) == expected


def test_torchrun_variables_win_over_the_scheduler_ones():
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert rank_info(env).source == "torchrun"


def test_rank_outside_the_world_is_refused():
    with pytest.raises(RunFailed, match="rank 4 of 4"):
        rank_info({"RANK": "4", "WORLD_SIZE": "4"})


def test_rendezvous_from_the_environment():
    info = RankInfo(1, 4, 1, 4, "torchrun")
    assert rendezvous(info, {"MASTER_ADDR": "node001", "MASTER_PORT": "29555"}) == ("node001", 29555)
    addr, port = rendezvous(RankInfo(0, 1, 0, 1, "single"), {})
    assert addr == "127.0.0.1" and 0 < port < 65536
    with pytest.raises(RunFailed, match="no MASTER_ADDR/MASTER_PORT"):
        rendezvous(info, {})
