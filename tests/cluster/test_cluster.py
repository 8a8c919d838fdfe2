"""Every launch path on a 2-node cluster made of network namespaces (scripts/dev/cluster.sh), with real Slurm.

The job everywhere is tests/cluster/tiny.toml: 4 CPU ranks on a 2x2 grid, 2 nodes x 2 ranks, so each row lies
inside one node and each column crosses the bridge between the nodes. Every run must end with the replicas
agreeing (summary.json param_digests_agree), and since all runs train the same job on the same grid, with
the same summation order, they must end with the same parameters whichever way the ranks were started.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import ROOT

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")
PROBE = str(ROOT / "tests" / "cluster" / "transport_probe.py")
DIGESTS: dict[str, str] = {}  # launch path -> final parameter digest, compared by the last test


def finished(out: Path, how: str, r) -> dict:
    """summary.json of a run that must have succeeded on 4 ranks with agreeing replicas."""
    assert (out / "summary.json").exists(), f"{how}: no summary.json\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 4 and s["grid"] == "2x2" and s["steps"] == 3, s
    assert s["param_digests_agree"] is True, s
    DIGESTS[how] = s["param_digest"]
    return s


def rank_logs(out: Path) -> dict[int, str]:
    """rank -> the text of its log."""
    return {int(p.stem[4:]): p.read_text() for p in sorted((out / "logs").glob("rank*.log"))}


# launch.python = a wrapper that writes each rank's environment to a file before starting the worker; the
# spec passes a value with commas, which srun's --export would cut at the first comma
HCA = "mlx5_0,mlx5_1"
ENV_PROBE = [
    "--set",
    f"launch.python={ROOT / 'tests' / 'cluster' / 'rank_env.sh'}",
    "--set",
    f'launch.env=["NCCL_IB_HCA={HCA}", "OMP_NUM_THREADS=1"]',
]
# one thread per rank everywhere: the thread count changes the order of float sums inside the kernels, and
# the last test compares the parameters of every launch path bit for bit
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def env_probe(tmp_path: Path) -> dict:
    (tmp_path / "env").mkdir()
    return {"TTC_ENV_DUMP": str(tmp_path / "env"), "TTC_PYTHON": sys.executable}


def check_rank_env(tmp_path: Path, threads: str | None = None) -> None:
    """Every rank saw the comma value whole, the rendezvous, and (if given) its thread count."""
    dumps = sorted((tmp_path / "env").glob("rank-*.env"))
    assert [p.name for p in dumps] == [f"rank-{r}.env" for r in range(4)], dumps
    for p in dumps:
        env = dict(line.split("=", 1) for line in p.read_text().splitlines() if "=" in line)
        assert env.get("NCCL_IB_HCA") == HCA, (p.name, env.get("NCCL_IB_HCA"))
        assert env.get("MASTER_ADDR") == "node1" and env.get("MASTER_PORT", "").isdigit(), p.name
        if threads is not None:
            assert env.get("OMP_NUM_THREADS") == threads, (p.name, env.get("OMP_NUM_THREADS"))


@pytest.mark.timeout(60)
def test_rows_use_shared_memory_and_columns_the_network(cluster, tmp_path):
    """One torus all-reduce of 16 MiB: each row (2 ranks on one node) goes through shared memory, so almost
    nothing crosses loopback; each column pairs ranks on node1 and node2, so eth0 carries the column share:
    2 ranks x 2(Y-1)/Y x 16 MiB / X = 16 MiB per node."""
    hf = cluster.hostfile(tmp_path / "hosts")
    r = cluster.on(
        "node1",
        "mpirun",
        "-np",
        "4",
        "--map-by",
        "ppr:2:node",
        "--hostfile",
        str(hf),
        sys.executable,
        PROBE,
        timeout=50,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = sorted((json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")), key=lambda d: d["rank"])
    assert [d["host"] for d in ranks] == ["node1", "node1", "node2", "node2"]
    for d in ranks:
        assert d["correct"], d
        assert d["row_hosts"] == [d["host"]] and d["col_hosts"] == ["node1", "node2"], d
        assert d["shm_row"], d
        assert f"row {d['row']} lies inside one host: shared memory" in " ".join(d["notes"]), d["notes"]
        assert d["sent_eth0"] >= 0.95 * (16 << 20), d
        assert d["sent_lo"] < 64 << 10, d


@pytest.mark.timeout(120)
def test_run_with_mpirun_and_a_hostfile(cluster, tmp_path):
    """`torus-train run --launcher mpirun --hostfile` on node1 starts ranks 2 and 3 on node2 through the agent."""
    out = tmp_path / "run"
    hf = cluster.hostfile(tmp_path / "hosts")
    r = cluster.on(
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
        *ENV_PROBE,
        timeout=110,
        env=env_probe(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mpirun --allow-run-as-root -np 4 --map-by ppr:2:node" in r.stdout
    assert "-x PATH" in r.stdout
    finished(out, "run --launcher mpirun", r)
    check_rank_env(tmp_path)


@pytest.mark.timeout(150)
def test_sbatch_script(cluster, tmp_path):
    """scripts/slurm/torus_train.sbatch as a user submits it: one srun step over the allocation's 2 nodes."""
    out = tmp_path / "run"
    log = tmp_path / "slurm-%j.out"
    r = cluster.on(
        "node1",
        "sbatch",
        "--wait",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        f"--output={log}",
        "scripts/slurm/torus_train.sbatch",
        TINY,
        "--out",
        str(out),
        *ENV_PROBE,
        timeout=140,
        env=env_probe(tmp_path),
    )
    text = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert r.returncode == 0, r.stdout + r.stderr + text[-4000:]
    assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --cpus-per-task=1 --cpu-bind=cores" in text, text[-4000:]
    finished(out, "sbatch + srun launcher", r)
    check_rank_env(tmp_path, threads="1")  # OMP_NUM_THREADS from --cpus-per-task, not the 4 of a guess


BY_HAND = {
    # each process is one rank: under srun the rendezvous comes from Slurm's variables (no MPI needed); under
    # mpirun rank 0 broadcasts it with MPI
    "srun": (["srun", "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1"], "from slurm"),
    "mpirun": (["mpirun", "-np", "4", "--map-by", "ppr:2:node", "--hostfile", "HOSTS"], "from openmpi"),
    # one torchrun agent per node (srun starts them), meeting at node1 by torchrun's c10d rendezvous: torchrun's
    # variables win over Slurm's, and its local world size makes the nodes of the grid
    "torchrun": (
        [
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
            "--rdzv-endpoint=node1:29411",
            "--no-python",
        ],
        "from torchrun",
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", list(BY_HAND))
def test_ranks_started_by_hand(cluster, tmp_path, launcher):
    """`srun -n 4 torus-train run`, `mpirun -np 4 torus-train run` and a torchrun agent per node on the two
    nodes."""
    out = tmp_path / "run"
    prefix, source = BY_HAND[launcher]
    hf = str(cluster.hostfile(tmp_path / "hosts"))
    r = cluster.on(
        "node1",
        *[hf if w == "HOSTS" else w for w in prefix],
        "torus-train",
        "run",
        "--spec",
        TINY,
        "--out",
        str(out),
        timeout=110,
        env=ONE_THREAD,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    finished(out, f"{launcher} by hand", r)
    logs = rank_logs(out)
    assert all(source in logs[i] for i in range(4)), logs[0][:500]


@pytest.mark.timeout(120)
def test_pbs_script_with_a_pbs_pro_node_file(cluster, tmp_path):
    """scripts/pbs/abci_torus_train.sh as PBS Pro runs it on the first node: select=2:ncpus=2:mpiprocs=2 gives
    a node file with each host once per MPI process, PBS_* variables, and no module command on these nodes."""
    out = tmp_path / "run"
    nodefile = tmp_path / "1234.pbs01"
    nodefile.write_text("node1\nnode1\nnode2\nnode2\n")
    env = {
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "1234.pbs01",
        "PBS_O_WORKDIR": str(ROOT),
        "PBS_JOBNAME": "torus",
        "NCPUS": "2",
        "TORUS_TRAIN_MODULES": "",
    }
    r = cluster.on("node1", "bash", "scripts/pbs/abci_torus_train.sh", TINY, "--out", str(out), env=env, timeout=110)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"--hostfile {nodefile}" in r.stdout and "--map-by ppr:2:node" in r.stdout, r.stdout[-2000:]
    finished(out, "PBS script + mpirun", r)


@pytest.mark.timeout(10)
def test_every_launch_path_ends_with_the_same_parameters():
    """Same job, grid, threads and summation order: the launcher must not change a single bit."""
    if len(DIGESTS) < 2:
        pytest.skip("fewer than two launch paths ran")
    assert len(set(DIGESTS.values())) == 1, json.dumps(DIGESTS, indent=1)
