"""Each rank bound to its GPU and its NUMA-near cores in the launch command (srun, mpirun), and two ranks on one GPU
refused: before launch where the scheduler says how many GPUs a node has, else by the rank before its process
group. Exact argv, as the other launch tests (Horovod's runner style)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.errors import RunFailed, UserError
from torus_train.job.hosts import Host
from torus_train.job.launch import LaunchError, build_plan, plan_launch
from torus_train.job.launchers.srun import fewest_per_node, gpus_said
from torus_train.job.rank import RankInfo
from torus_train.job.spec import load_spec
from torus_train.job.topology import Grid
from torus_train.ranks.bootstrap import rank_gpu

ROOT = Path(__file__).resolve().parents[1]
JOB = "/shared/run/job.json"
PY = "/usr/bin/python3"
WORKER = [PY, "-m", "torus_train.ranks.worker", "--job", JOB]
GPU_JOB = {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_CPUS_PER_NODE": "40(x2)"}
"""What sbatch --nodes=2 --gpus-per-node=4 on 40-CPU nodes puts in the job's environment (among the rest)."""


def spec(**fields):
    return load_spec(None, list(fields.items()))


GRID = Grid(4, 2, 4)
"""8 ranks, 4 per node on 2 nodes."""


def plan(launcher, environ, grid=GRID, hostfile="", **fields):
    hosts = [Host(f"node{i:03d}", grid.gpus_per_node) for i in range(1, grid.nodes + 1)]
    return build_plan(
        spec(**fields), grid, launcher, "why", hosts, hostfile=hostfile, job_file=JOB, python=PY, environ=environ
    )


def test_srun_binds_one_gpu_and_a_sockets_cores_to_each_rank():
    p = plan("srun", GPU_JOB)
    assert p.argv == [
        "srun",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",  # not --gpus-per-task=1: its per-task binding fences each task off its peers' GPUs
        "--cpus-per-task=10",  # 40 CPUs of a node over its 4 ranks
        "--cpu-bind=cores",
        "--distribution=block:block",  # local ranks 0, 1 on the first socket, beside GPUs 0, 1
        "--kill-on-bad-exit=1",
        "--export=ALL",
        *WORKER,
    ]
    assert p.env["OMP_NUM_THREADS"] == "10"
    assert p.notes[0].startswith("GPUs: one per rank: --gpus-per-node") and "SLURM_LOCALID" in p.notes[0]
    assert p.notes[1].startswith("cores: 10 CPUs per rank (SLURM_JOB_CPUS_PER_NODE=40(x2) over 4 ranks)")


@pytest.mark.parametrize(
    "environ, fields, gpus, cpus",
    [
        (GPU_JOB, {"comm.backend": "gloo"}, False, 10),  # CPU ranks: no GPU asked for
        ({"SLURM_JOB_ID": "7"}, {"comm.backend": "nccl"}, True, None),  # NCCL asked: a GPU each; cores unknown
        ({"SLURM_JOB_ID": "7"}, {}, False, None),  # auto in a job without GPUs: CPU ranks, asking would fail
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1,2,3"}, {}, True, None),
        ({"SLURM_JOB_ID": "7", "SLURM_GPUS_PER_NODE": "v100:4"}, {}, True, None),
        ({**GPU_JOB, "SLURM_CPUS_PER_TASK": "6"}, {}, True, 6),  # the job's -c before the node's share
        (GPU_JOB, {"launch.cpus_per_rank": 8}, True, 8),  # the spec before the scheduler
        ({**GPU_JOB, "SLURM_JOB_CPUS_PER_NODE": "72(x1),36"}, {}, True, 9),  # the smallest node
        ({**GPU_JOB, "SLURM_JOB_CPUS_PER_NODE": "3(x2)"}, {}, True, None),  # fewer CPUs than ranks: not bound
    ],
)
def test_srun_binding_follows_the_backend_and_what_slurm_says(environ, fields, gpus, cpus):
    p = plan("srun", environ, **fields)
    assert ("--gpus-per-node=4" in p.argv) == gpus and not [a for a in p.argv if a.startswith("--gpu-bind")]
    if cpus is None:
        assert not [a for a in p.argv if a.startswith(("--cpus-per-task", "--cpu-bind", "--distribution"))]
        assert p.notes[1].startswith("cores: not bound: Slurm does not say") and "launch.cpus_per_rank" in p.notes[1]
    else:
        i = p.argv.index(f"--cpus-per-task={cpus}")
        assert p.argv[i + 1 : i + 3] == ["--cpu-bind=cores", "--distribution=block:block"]
        assert p.env["OMP_NUM_THREADS"] == str(cpus)


def test_slurm_variables_read():
    assert fewest_per_node("40(x544)") == 40 and fewest_per_node("72(x2),36") == 36 and fewest_per_node("8") == 8
    assert fewest_per_node("") == 0
    for text in ("forty", "4(x2),?", "\u00b2", "9" * 5000, "0"):
        with pytest.raises(UserError, match=r"^SLURM_JOB_CPUS_PER_NODE"):
            fewest_per_node(text)
    with pytest.raises(UserError, match=r"^SLURM_GPUS_ON_NODE: '99999999999999999999'...[(]5000 characters[)] is not"):
        gpus_said("SLURM_GPUS_ON_NODE", "9" * 5000)
    assert gpus_said("SLURM_GPUS_ON_NODE", "\u00b2") is None  # not a count: the next variable is asked
    assert gpus_said("SLURM_GPUS_ON_NODE", "4") == 4 and gpus_said("SLURM_GPUS_ON_NODE", "") is None
    assert gpus_said("SLURM_JOB_GPUS", "0,1") == 2 and gpus_said("SLURM_JOB_GPUS", "") is None
    assert gpus_said("SLURM_GPUS_PER_NODE", "gpu:v100:4") == 4 and gpus_said("SLURM_GPUS_PER_NODE", "a:2,b:2") == 4
    assert gpus_said("SLURM_GPUS_PER_NODE", "v100") is None


def test_mpirun_binds_each_rank_to_its_block_of_cores_when_the_count_is_known():
    """PBS's NCPUS or launch.cpus_per_rank; ranks take GPU OMPI_COMM_WORLD_LOCAL_RANK (mpirun binds no GPU)."""
    pbs = {"PBS_JOBID": "1.pbs", "NCPUS": "40"}
    p = plan("mpirun", pbs, hostfile="nodes")
    assert p.argv[:9] == [
        "mpirun",
        "-np",
        "8",
        "--map-by",
        "ppr:4:node:PE=10",
        "--bind-to",
        "core",
        "--hostfile",
        "nodes",
    ]
    assert "OMP_NUM_THREADS=10" in p.argv
    assert p.notes == [
        "GPUs: each rank takes GPU OMPI_COMM_WORLD_LOCAL_RANK of those its node shows (mpirun binds no GPU; a rank "
        "without a GPU of its own stops at start-up)",
        "cores: 10 cores per rank (NCPUS=40 over 4 ranks), a node's ranks filling its first socket first, beside "
        "GPUs 0, 1, ... (--map-by ppr:4:node:PE=10 --bind-to core)",
    ]
    p = plan("mpirun", pbs, hostfile="nodes", **{"launch.cpus_per_rank": 9})
    assert p.argv[3:7] == ["--map-by", "ppr:4:node:PE=9", "--bind-to", "core"] and "OMP_NUM_THREADS=9" in p.argv
    p = plan("mpirun", {}, hostfile="hosts.txt", **{"launch.cpus_per_rank": 12})
    assert p.argv[3:7] == ["--map-by", "ppr:4:node:PE=12", "--bind-to", "core"]


def test_mpirun_leaves_ranks_unbound_when_nothing_says_the_cores():
    """PRRTE binds to the first free object inside the mapped one: ppr:K:node with --bind-to numa would put a
    node's K ranks on its first NUMA domain, so without a count the ranks stay unbound, and the plan says so."""
    p = plan("mpirun", {}, hostfile="hosts.txt")
    assert p.argv[3:7] == ["--map-by", "ppr:4:node", "--bind-to", "none"]
    assert p.notes[1].startswith("cores: not bound: nothing says how many CPUs a node has")
    assert plan("mpirun", {}, hostfile="h", **{"comm.backend": "gloo"}).notes[0].startswith("cores:")


def test_more_ranks_per_node_than_the_allocations_gpus_is_refused_before_launch():
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_GPUS_ON_NODE": "2",
    }
    s = spec(**{"grid.gpus": 8, "grid.grid": "4x2", "grid.gpus_per_node": 4, "launch.launcher": "srun"})
    kw = dict(job_file=JOB, python=PY, as_root=False, master_port=1, cpu_count=2, local_gpus=0)
    with pytest.raises(LaunchError) as e:
        plan_launch(s, environ, **kw)
    assert str(e.value) == (
        "grid.gpus_per_node = 4, but the Slurm allocation gives each node 2 GPU(s) (SLURM_GPUS_ON_NODE=2): two "
        "ranks would share a GPU, which NCCL refuses; put at most 2 rank(s) on a node (--gpus-per-node 2), ask "
        "for 4 GPUs per node, or pass --backend gloo"
    )
    assert "cannot start here: grid.gpus_per_node = 4" in plan_launch(s, environ, strict=False, **kw).notes[-1]
    s.comm.backend = "gloo"  # CPU ranks take no GPU
    assert plan_launch(s, environ, **kw).argv[:4] == ["srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4"]
    s.comm.backend = "auto"
    plan_launch(s, {**environ, "SLURM_GPUS_ON_NODE": "4"}, **kw)  # one GPU each: fine


def test_the_refusal_is_one_line_and_exit_2():
    env = {
        **os.environ,
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_GPUS_ON_NODE": "2",
    }
    r = subprocess.run(
        [sys.executable, "-m", "torus_train", "run", "--launcher", "srun", "--gpus", "8", "--grid", "4x2"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("torus-train: error: grid.gpus_per_node = 4, but")


@pytest.mark.parametrize(
    "info, count, device",
    [
        (RankInfo(5, 8, 1, 4, "slurm"), 4, 1),  # a node's GPUs shared as a list: its local rank
        (RankInfo(7, 8, 3, 4, "slurm"), 1, 0),  # one GPU of its own (srun --gpus-per-task=1): cuda:0
        (RankInfo(0, 1, 0, 1, "single"), 8, 0),
    ],
)
def test_a_rank_takes_its_own_gpu(info, count, device):
    assert rank_gpu(info, count, "0,1,2,3") == device


def test_two_ranks_on_one_gpu_are_refused_by_the_rank():
    with pytest.raises(RunFailed) as e:
        rank_gpu(RankInfo(6, 8, 2, 4, "slurm"), 2, "0,1")
    assert str(e.value) == (
        "rank 6: local rank 2 of 4 on this node has no GPU of its own: CUDA shows 2 GPU(s) here "
        "(CUDA_VISIBLE_DEVICES=0,1), and two ranks on one GPU fail in NCCL; start at most 2 ranks per node "
        "(grid.gpus_per_node), give each rank its own GPU, or pass --backend gloo for CPU ranks"
    )
    with pytest.raises(RunFailed, match=re.escape("rank 3: comm.backend = nccl, but CUDA shows this rank no GPU")):
        rank_gpu(RankInfo(3, 4, 3, 4, "openmpi"), 0, None)


def test_init_distributed_refuses_before_the_process_group(monkeypatch):
    """The rank's start-up asks rank_gpu instead of local_rank % count (which put local ranks 0 and 2 on GPU 0)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from torus_train.ranks import distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("the process group was started"))
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}
    with pytest.raises(RunFailed, match=re.escape("rank 3: local rank 2 of 4 on this node has no GPU of its own")):
        distributed.init_distributed(Grid(2, 2, 4), 60, env, backend="nccl")


FAKE_544 = {
    "SLURM_JOB_ID": "99",
    "SLURM_JOB_NODELIST": "n[1-544]",
    "SLURM_TASKS_PER_NODE": "4(x544)",
    "SLURM_JOB_NUM_NODES": "544",
}
"""The allocation the sbatch tests fake (tests/test_launch.py)."""


def _dry_run(*args, env):
    r = subprocess.run(
        [sys.executable, "-m", "torus_train", "run", "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    return next(ln.strip() for ln in r.stdout.splitlines() if " -m torus_train.ranks.worker " in ln)


def test_the_production_specs_dry_run_binds_gpus_and_cores(tmp_path):
    """scripts/specs/imagenet_2176.toml at 2,176 GPUs: under a 544-node Slurm allocation of 4 GPUs and 40 CPUs a
    node (what sbatch --gpus-per-node=4 sets, with SLURM_JOB_CPUS_PER_NODE, which every job has), and under
    PBS with NCPUS=40."""
    spec_file = "scripts/specs/imagenet_2176.toml"
    slurm = {**FAKE_544, "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_CPUS_PER_NODE": "40(x544)"}
    line = _dry_run("--spec", spec_file, "--launcher", "srun", env=slurm)
    srun = " srun --nodes=544 --ntasks=2176 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=10 --cpu-bind=cores "
    assert "OMP_NUM_THREADS=10 " in line
    assert srun + "--distribution=block:block --kill-on-bad-exit=1 --export=ALL " in line
    nodes = tmp_path / "nodes"
    nodes.write_text("".join(f"n{i}\n" * 4 for i in range(1, 545)))  # PBS: one line per rank
    pbs = {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodes), "NCPUS": "40"}
    line = _dry_run("--spec", spec_file, "--launcher", "mpirun", env=pbs)
    assert line.replace("--allow-run-as-root ", "").startswith(
        f"mpirun -np 2176 --map-by ppr:4:node:PE=10 --bind-to core --hostfile {nodes} "
    )
    assert "-x OMP_NUM_THREADS=10 " in line
