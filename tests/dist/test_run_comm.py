"""`torus-train run` compared with itself: the torus hook against the flat ring, and mpirun against the local
launcher. One local torus run is the reference for all of them."""

from __future__ import annotations

import sys

import pytest
import torch

from .runhelp import REF, final_params, local_torus_fixture, metrics, mpi_available, run_cli, summary

pytestmark = pytest.mark.timeout(300)
needs_mpi = [pytest.mark.mpi, pytest.mark.skipif(not mpi_available(), reason="needs mpirun and mpi4py")]
local_torus = local_torus_fixture()


def test_flat_and_torus_end_with_the_same_parameters(local_torus, tmp_path):
    flat = tmp_path / "flat"
    r = run_cli(*REF, "--set", "comm.algo=flat", "--out", str(flat))
    assert r.returncode == 0, r.stdout + r.stderr
    st_t, st_f = summary(local_torus), summary(flat)
    assert (st_t["comm_algo"], st_f["comm_algo"]) == ("torus", "flat")
    assert st_t["param_digests_agree"] and st_f["param_digests_agree"]
    assert st_t["steps"] == st_f["steps"] == 4
    # Each rank trains on its own data, so the gradients differ per rank and a wrong reduction would show.
    losses = [m["loss"] for m in metrics(local_torus) if "loss" in m]
    assert len(losses) == 2 and losses[0] != losses[1]
    a, b = final_params(local_torus), final_params(flat)
    params = [k for k in a if "running_" not in k and "num_batches" not in k]
    worst = max((a[k] - b[k]).abs().max().item() for k in params)
    # The ring and the torus add the same fp32 numbers in another order: the rounding differs and grows through
    # the steps (max 3.2e-5 on one host of this kind, under 1e-5 on another); a wrong reduction (a rank missing,
    # a sum not divided) moves parameters by the size of an update, orders of magnitude more.
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-4) for k in params), f"max |diff| {worst}"


@needs_mpi[0]
@needs_mpi[1]
def test_launcher_mpirun_with_a_localhost_hostfile(local_torus, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n")
    out = tmp_path / "mpi"
    r = run_cli(
        *REF, "--set", "comm.algo=torus", "--launcher", "mpirun", "--hostfile", str(hostfile), "--out", str(out)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"--hostfile {hostfile}" in r.stdout and "-np 4" in r.stdout  # the command it ran, shown
    s = summary(out)
    assert s["param_digests_agree"] and s["steps"] == 4
    assert s["param_digest"] == summary(local_torus)["param_digest"]


@needs_mpi[0]
@needs_mpi[1]
def test_plain_mpirun_of_the_run_command(local_torus, tmp_path):
    """`mpirun -n 4 torus-train run ...`: each process becomes one rank (rank info from OMPI_COMM_WORLD_*)."""
    out = tmp_path / "mpi"
    cmd = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-x",
        "OMP_NUM_THREADS=1",
        "-np",
        "4",
        sys.executable,
        "-m",
        "torus_train",
        "run",
    ]
    r = run_cli(*REF, "--set", "comm.algo=torus", "--out", str(out), cmd=cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(out)
    assert s["param_digests_agree"] and s["world_size"] == 4
    assert s["param_digest"] == summary(local_torus)["param_digest"]
