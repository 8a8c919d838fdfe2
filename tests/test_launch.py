"""The launch plan: exact argv and environment for local, mpirun and srun (like Horovod's runner tests)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from torus_train.errors import UserError
from torus_train.job.hosts import Host, HostsError
from torus_train.job.launch import (
    LaunchError,
    build_plan,
    check_capacity,
    choose_launcher,
    ephemeral_range,
    inside_launched_rank,
    job_key,
    plan_launch,
    port_band,
    rendezvous_port,
    resolve_grid,
    threads_per_rank,
)
from torus_train.job.spec import load_spec
from torus_train.job.topology import Grid

JOB = "/shared/run/job.json"
PY = "/usr/bin/python3"


def spec(**fields):
    return load_spec(None, list(fields.items()))


def hosts(n, k=4):
    return [Host(f"node{i:03d}", k) for i in range(1, n + 1)]


def test_mpirun_argv_exact():
    s = spec(**{"launch.env": ["NCCL_DEBUG", "A=1"], "launch.launcher_args": ["--mca", "btl", "^openib"]})
    plan = build_plan(
        s,
        Grid(4, 2, 4),
        "mpirun",
        "why",
        hosts(2),
        hostfile="hosts.txt",
        job_file=JOB,
        python=PY,
        environ={"NCCL_DEBUG": "INFO"},
        as_root=False,
        cpu_count=32,
    )
    assert plan.argv == [
        "mpirun",
        "-np",
        "8",
        "--map-by",
        "ppr:4:node",
        "--bind-to",
        "none",
        "--hostfile",
        "hosts.txt",
        "-x",
        "OMP_NUM_THREADS=4",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "A=1",
        "-x",
        "MASTER_ADDR=node001",
        "-x",
        "MASTER_PORT=21473",  # rank 0's host; rendezvous_port(":" + JOB)
        "--mca",
        "btl",
        "^openib",
        PY,
        "-m",
        "torus_train.ranks.worker",
        "--job",
        JOB,
    ]
    assert plan.world_size == 8 and plan.hosts == hosts(2)


def test_mpirun_with_container_as_root():
    s = spec(**{"launch.container": "/images/torus.sif"})
    plan = build_plan(
        s,
        Grid(2, 2, 2),
        "mpirun",
        "why",
        hosts(2, 2),
        hostfile="/var/pbs/nodes",
        job_file=JOB,
        python=PY,
        environ={},
        as_root=True,
        cpu_count=8,
    )
    assert plan.argv == [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "4",
        "--map-by",
        "ppr:2:node",
        "--bind-to",
        "none",
        "--hostfile",
        "/var/pbs/nodes",
        "-x",
        "OMP_NUM_THREADS=4",
        "-x",
        "MASTER_ADDR=node001",
        "-x",
        "MASTER_PORT=21473",  # singularity passes the host environment on
        "singularity",
        "exec",
        "--nv",
        "--bind",
        "/shared/run",  # the output folder, which holds job.json
        "/images/torus.sif",
        "python3",
        "-m",
        "torus_train.ranks.worker",
        "--job",
        JOB,
    ]


def test_srun_argv_exact():
    s = spec(**{"launch.env": ["X=2"], "launch.container": "img.sif", "launch.container_runtime": "apptainer"})
    plan = build_plan(
        s,
        Grid(8, 4, 4),
        "srun",
        "why",
        hosts(8),
        hostfile="",
        job_file=JOB,
        python=PY,
        environ={"SLURM_JOB_ID": "4242"},
        cpu_count=16,
    )
    assert plan.argv == [
        "srun",
        "--nodes=8",
        "--ntasks=32",
        "--ntasks-per-node=4",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/shared/run",
        "img.sif",
        "python3",
        "-m",
        "torus_train.ranks.worker",
        "--job",
        JOB,
    ]
    # the ranks' variables travel in srun's own environment (--export=ALL), never inside --export
    assert plan.env == {
        "OMP_NUM_THREADS": "4",
        "X": "2",
        "MASTER_ADDR": "node001",
        "MASTER_PORT": "26476",
    }  # port of "4242:" + JOB
    assert rendezvous_port(job_key({"SLURM_JOB_ID": "4242"}, JOB)) == 26476


def test_launch_env_may_name_the_rendezvous_host():
    s = spec(**{"launch.env": ["MASTER_ADDR=node001-ib"]})
    plan = build_plan(
        s, Grid(2, 2, 2), "mpirun", "why", hosts(2, 2), hostfile="h", job_file=JOB, python=PY, environ={}, cpu_count=8
    )
    assert plan.argv[9:17] == [
        "-x",
        "OMP_NUM_THREADS=4",
        "-x",
        "MASTER_ADDR=node001-ib",
        "-x",
        "MASTER_PORT=21473",
        PY,
        "-m",
    ]


def test_rendezvous_port_rule(tmp_path):
    # below the default ephemeral range, the same in every process, spread by the job
    assert port_band() == (20000, 32767)
    assert rendezvous_port("4242") == 20000 + 4242 and rendezvous_port("4243") == 20000 + 4243
    assert rendezvous_port(str(12768 + 5)) == 20005
    assert rendezvous_port("7:/a/job.json") == rendezvous_port("7:/a/job.json") != rendezvous_port("7:/b/job.json")
    ports = {rendezvous_port(f":/runs/{i}/job.json") for i in range(1000)}
    assert min(ports) >= 20000 and max(ports) <= 32767 and len(ports) > 900
    # a host whose ephemeral range overlaps the band: the band shrinks to what stays outside it
    assert port_band((15000, 25000)) == (25001, 32767)
    assert all(25001 <= rendezvous_port(str(j), (15000, 25000)) <= 32767 for j in range(0, 20000, 7))
    assert port_band((10000, 40000)) == (40001, 65535)
    assert port_band((1024, 65535)) == (20000, 32767)  # nothing is outside: keep the band
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40000, 50000)
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


def test_local_plan_env_per_rank():
    plan = build_plan(
        spec(),
        Grid(2, 2, 4),
        "local",
        "why",
        [],
        hostfile="",
        job_file=JOB,
        python=PY,
        environ={},
        master_port=12345,
        cpu_count=2,
        local_gpus=0,
    )
    assert plan.argv == [PY, "-m", "torus_train.ranks.worker", "--job", JOB]
    assert plan.env == {"OMP_NUM_THREADS": "1"}
    assert plan.rank_env[3] == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "12345",
    }
    assert any("CPU ranks on gloo" in n for n in plan.notes)
    assert threads_per_rank(4, 2) == 1 and threads_per_rank(4, 16) == 4


@pytest.mark.parametrize(
    "environ, hostfile, expected",
    [
        ({"SLURM_JOB_ID": "1"}, "", "srun"),
        ({"PBS_NODEFILE": "/var/spool/pbs/aux/1"}, "", "mpirun"),
        ({}, "hosts.txt", "mpirun"),
        ({}, "", "local"),
    ],
)
def test_auto_launcher(environ, hostfile, expected):
    assert choose_launcher("auto", environ, hostfile)[0] == expected
    assert choose_launcher("srun", environ, hostfile)[0] == "srun"


def test_inside_a_launched_rank():
    assert inside_launched_rank({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"})
    assert inside_launched_rank({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"})
    assert not inside_launched_rank({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"})  # sbatch script, not a step
    assert not inside_launched_rank({})


def test_grid_from_hosts_and_flags():
    assert resolve_grid(spec(**{"grid.gpus": 0, "grid.grid": ""}), "mpirun", hosts(4), 0) == Grid(4, 4, 4)
    g = resolve_grid(
        spec(**{"grid.gpus": 2176, "grid.grid": "32x68", "grid.gpus_per_node": 4}), "mpirun", hosts(544), 0
    )
    assert (g.x, g.y, g.nodes) == (32, 68, 544)
    with pytest.raises(UserError, match="grid 3x3 = 9 ranks but --gpus is 8"):
        resolve_grid(spec(**{"grid.gpus": 8, "grid.grid": "3x3"}), "mpirun", hosts(2), 0)


def test_capacity_errors():
    with pytest.raises(HostsError, match=re.escape("hosts.txt offers 8 slots on 2 hosts but the job needs 16 ranks")):
        check_capacity("mpirun", Grid(4, 4, 4), hosts(2), "hosts.txt", 0, 2)
    with pytest.raises(HostsError, match="host node002 offers 2 slots but --gpus-per-node is 4"):
        check_capacity(
            "mpirun", Grid(4, 2, 4), [Host("node001", 4), Host("node002", 2), Host("n3", 4)], "hosts.txt", 0, 2
        )
    with pytest.raises(LaunchError, match=r"2176 ranks do not fit on this machine.*--hostfile.*--dry-run"):
        check_capacity("local", Grid(32, 68, 2176), [], "", 0, 2)
    check_capacity("local", Grid(2, 2, 4), [], "", 0, 2)  # 4 CPU ranks fit


def test_plan_launch_reads_the_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("".join(f"host{i:03d} slots=4\n" for i in range(1, 545)))
    s = spec(
        **{
            "grid.gpus": 2176,
            "grid.grid": "32x68",
            "grid.gpus_per_node": 4,
            "launch.launcher": "mpirun",
            "launch.hostfile": str(f),
            "schedule.stages": [{"until_epoch": 4, "global_batch": 69632}],
        }
    )
    plan = plan_launch(s, {}, job_file=JOB, python=PY, as_root=False, master_port=1, cpu_count=2, local_gpus=0)
    assert plan.argv[:9] == [
        "mpirun",
        "-np",
        "2176",
        "--map-by",
        "ppr:4:node",
        "--bind-to",
        "none",
        "--hostfile",
        str(f),
    ]
    port = rendezvous_port(f":{JOB}", ephemeral_range())
    assert plan.argv[11:15] == ["-x", "MASTER_ADDR=host001", "-x", f"MASTER_PORT={port}"]
    with pytest.raises(LaunchError, match="needs a hostfile"):
        plan_launch(
            spec(**{"launch.launcher": "mpirun"}),
            {},
            job_file=JOB,
            python=PY,
            as_root=False,
            master_port=1,
            cpu_count=2,
            local_gpus=0,
        )


def _cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "torus_train", *args], capture_output=True, text=True, timeout=timeout)


def test_dry_run_at_2176_gpus_is_fast_and_complete(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("".join(f"host{i:03d} slots=4\n" for i in range(1, 545)))
    t = time.time()
    r = _cli(
        "run",
        "--dry-run",
        "--gpus",
        "2176",
        "--grid",
        "32x68",
        "--gpus-per-node",
        "4",
        "--launcher",
        "mpirun",
        "--hostfile",
        str(f),
        "--set",
        "schedule.stages=[{until_epoch=2,global_batch=34816},{until_epoch=4,global_batch=69632}]",
    )
    took = time.time() - t
    assert r.returncode == 0, r.stderr
    assert took < 2.0, f"dry run took {took:.2f} s"
    out = r.stdout
    assert "grid 32x68: 2176 ranks" in out and "544 node(s)" in out
    assert "row 0: ranks 0-31 on node(s) 0-7 (host001 .. host008)" in out
    assert "column 0: ranks 0, 32, ..., 2144" in out
    assert f"mpirun -np 2176 --map-by ppr:4:node --bind-to none --hostfile {f}" in out.replace(
        "--allow-run-as-root ", ""
    )
    assert "-x MASTER_ADDR=host001 -x MASTER_PORT=" in out
    assert "34816" in out and "69632" in out and "peak LR" in out  # the batch table
    assert "torus 2(32-1) + 2(68-1) = 196" in out


def test_dry_run_imports_no_torch():
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torus_train", "run", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert not [ln for ln in r.stderr.splitlines() if ln.split("|")[-1].strip().split(".")[0] == "torch"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "2176", "--grid", "32x68"], "2176 ranks do not fit on this machine"),
        (["--gpus", "8", "--grid", "3x3"], "grid 3x3 = 9 ranks but --gpus is 8"),
        (["--set", "comm.algos=flat"], "comm.algos: unknown key"),
        (["--set", "grid.gpus=four"], "grid.gpus: expected an integer"),
        (["--launcher", "mpirun", "--hostfile", "/nonexistent/hosts"], "--hostfile /nonexistent/hosts: no such file"),
        (
            ["--gpus", "6", "--grid", "3x2", "--set", "schedule.stages=[{until_epoch=9,global_batch=64}]"],
            "schedule.stages[0].global_batch: 64 does not divide by world size 6",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = _cli("run", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("torus-train: error:")


def test_fewer_slots_than_gpus(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("localhost slots=2\n")
    r = _cli("run", "--launcher", "mpirun", "--hostfile", str(f), "--gpus", "4", "--grid", "2x2")
    assert r.returncode == 2 and f"{f} offers 2 slots on 1 hosts but the job needs 4 ranks" in r.stderr


def test_dry_run_prints_the_plan_even_when_the_schedule_does_not_fit(tmp_path):
    """The default job's stages (a few hundred images) cannot be split over 2,176 ranks: the plan is still
    printed in full, then the schedule error ends it with exit 2, as it would stop a real run."""
    f = tmp_path / "hosts"
    f.write_text("".join(f"host{i:03d} slots=4\n" for i in range(1, 545)))
    r = _cli(
        "run",
        "--dry-run",
        "--gpus",
        "2176",
        "--grid",
        "32x68",
        "--gpus-per-node",
        "4",
        "--launcher",
        "mpirun",
        "--hostfile",
        str(f),
        "--set",
        "schedule.stages=[{until_epoch=9,global_batch=128}]",
    )
    assert r.returncode == 2
    assert "grid 32x68: 2176 ranks" in r.stdout and "mpirun" in r.stdout and "-np 2176" in r.stdout
    assert "cannot be built for 2176 ranks" in r.stdout
    assert r.stderr == ("torus-train: error: schedule.stages[0].global_batch: 128 does not divide by world size 2176\n")


# ---- what a first cluster run would have found (issue 14) -------------------------------------------------
def test_srun_passes_values_with_commas_whole():
    """srun splits --export on commas: NCCL_IB_HCA=mlx5_0,mlx5_1 inside it reached the ranks as mlx5_0."""
    s = spec(**{"launch.env": ["NCCL_IB_HCA"]})
    plan = build_plan(
        s,
        Grid(4, 2, 4),
        "srun",
        "why",
        hosts(2),
        hostfile="",
        job_file=JOB,
        python=PY,
        environ={"SLURM_JOB_ID": "7", "NCCL_IB_HCA": "mlx5_0,mlx5_1"},
        cpu_count=8,
    )
    exports = [a for a in plan.argv if a.startswith("--export")]
    assert exports == ["--export=ALL"]
    assert plan.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert plan.command_text().startswith("OMP_NUM_THREADS=4 NCCL_IB_HCA=mlx5_0,mlx5_1 MASTER_ADDR=node001 ")


def test_srun_step_gets_the_jobs_cpus_per_task_and_threads():
    """Since Slurm 22.05 a step does not inherit --cpus-per-task; OMP_NUM_THREADS follows it (was 4 for 1),
    and each task is bound to its CPUs, a node's tasks filling one socket before the next."""
    for per_task in ("1", "8"):
        plan = build_plan(
            spec(),
            Grid(4, 2, 4),
            "srun",
            "why",
            hosts(2),
            hostfile="",
            job_file=JOB,
            python=PY,
            environ={"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": per_task},
            cpu_count=64,
        )
        assert plan.argv[:7] == [
            "srun",
            "--nodes=2",
            "--ntasks=8",
            "--ntasks-per-node=4",
            f"--cpus-per-task={per_task}",
            "--cpu-bind=cores",
            "--distribution=block:block",
        ]
        assert plan.env["OMP_NUM_THREADS"] == per_task


def test_mpirun_carries_path_and_library_path():
    """Remote ranks start from the remote shell's environment: without -x PATH the activated environment and
    the loaded modules are missing there."""
    plan = build_plan(
        spec(),
        Grid(2, 2, 2),
        "mpirun",
        "why",
        hosts(2, 2),
        hostfile="h",
        job_file=JOB,
        python=PY,
        environ={"PATH": "/venv/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64"},
        cpu_count=8,
    )
    assert plan.argv[9:13] == ["-x", "PATH", "-x", "LD_LIBRARY_PATH"]
    plan = build_plan(
        spec(),
        Grid(2, 2, 2),
        "mpirun",
        "why",
        hosts(2, 2),
        hostfile="h",
        job_file=JOB,
        python=PY,
        environ={},
        cpu_count=8,
    )
    assert "PATH" not in plan.argv


def test_mpirun_under_pbs_binds_each_rank_to_its_cores():
    environ = {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": "/var/spool/pbs/aux/1.pbs", "NCPUS": "40"}
    plan = build_plan(
        spec(),
        Grid(4, 2, 4),
        "mpirun",
        "why",
        hosts(2),
        hostfile="/var/spool/pbs/aux/1.pbs",
        job_file=JOB,
        python=PY,
        environ=environ,
        as_root=False,
        cpu_count=2,
    )
    assert plan.argv[:7] == ["mpirun", "-np", "8", "--map-by", "ppr:4:node:PE=10", "--bind-to", "core"]
    assert "OMP_NUM_THREADS=10" in plan.argv


def test_container_binds_data_output_and_extra_folders():
    s = spec(
        **{
            "launch.container": "/img/t.sif",
            "data.source": "/groups/x/imagenet",
            "data.index": "/scratch/idx",
            "launch.binds": ["/opt/site:/opt/site:ro"],
        }
    )
    plan = build_plan(
        s,
        Grid(2, 2, 2),
        "mpirun",
        "why",
        hosts(2, 2),
        hostfile="h",
        job_file=JOB,
        python=PY,
        environ={},
        cpu_count=8,
        runtime="apptainer",
    )
    i = plan.argv.index("apptainer")
    assert plan.argv[i : i + 12] == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/groups/x/imagenet",
        "--bind",
        "/scratch/idx",
        "--bind",
        "/shared/run",
        "--bind",
        "/opt/site:/opt/site:ro",
        "/img/t.sif",
    ]


def test_apptainer_where_only_that_is_found():
    from torus_train.job.launch import container_runtime

    only_apptainer = {"apptainer": "/usr/bin/apptainer"}.get
    assert container_runtime("singularity", only_apptainer) == "apptainer"
    assert container_runtime("singularity", {"singularity": "/x", "apptainer": "/y"}.get) == "singularity"
    assert container_runtime("apptainer", lambda name: None) == "apptainer"


def test_usable_cpus_reads_the_cgroup_quota(tmp_path):
    from torus_train.job.launch import usable_cpus

    (tmp_path / "cpu.max").write_text("300000 100000\n")
    assert usable_cpus(cgroup_root=str(tmp_path)) == min(3, len(__import__("os").sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(cgroup_root=str(tmp_path)) == len(__import__("os").sched_getaffinity(0))


def _script_examples(path, command):
    """The `command SCRIPT ARGS...` lines in a job script's header comment."""
    import shlex as _shlex
    from pathlib import Path as _Path

    out = []
    for line in (_Path(__file__).parents[1] / path).read_text().splitlines():
        words = _shlex.split(line.lstrip("# ").split("  #")[0]) if line.startswith("#   " + command) else []
        if words:
            out.append(words)
    return out


def test_sbatch_examples_are_accepted():
    """Each example in the sbatch script's header, dry-run inside an allocation of that many nodes x 4."""
    from pathlib import Path as _Path

    examples = _script_examples("scripts/slurm/torus_train.sbatch", "sbatch")
    assert len(examples) >= 3
    root = _Path(__file__).parents[1]
    for words in examples:
        nodes = int(next(w for w in words if w.startswith("--nodes=")).split("=")[1])
        i = next(j for j, w in enumerate(words) if w.endswith(".sbatch"))
        spec_file, rest = words[i + 1], words[i + 2 :]
        env = {
            **__import__("os").environ,
            "SLURM_JOB_ID": "99",
            "SLURM_JOB_NODELIST": f"n[1-{nodes}]",
            "SLURM_TASKS_PER_NODE": f"4(x{nodes})",
            "SLURM_JOB_NUM_NODES": str(nodes),
        }
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "torus_train",
                "run",
                "--spec",
                str(root / spec_file),
                "--launcher",
                "srun",
                "--dry-run",
                *rest,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            cwd=root,
        )
        assert r.returncode == 0, (words, r.stderr)


def test_pbs_script_asks_for_one_line_per_rank_and_pins_modules():
    from pathlib import Path as _Path

    text = (_Path(__file__).parents[1] / "scripts/pbs/abci_torus_train.sh").read_text()
    select = next(line for line in text.splitlines() if line.startswith("#PBS -l select="))
    fields = dict(f.split("=") for f in select.split("select=")[1].split(":")[1:])
    assert fields["mpiprocs"] == fields["ngpus"], select  # else $PBS_NODEFILE lists each host once
    assert "|| true" not in text
    modules = text.split('TORUS_TRAIN_MODULES-"')[1].split('"')[0].split()
    assert modules and all("/" in m for m in modules), modules  # name/version, never a moving default
    assert "TORUS_TRAIN_ACTIVATE" in text


# --- GPUs here: the probe, and the default job's plan on 0, 1 and 4 of them -----------------------------------
def test_gpu_probe_reads_cuda_visible_devices_as_cuda_does(monkeypatch):
    from torus_train.job.gpus import gpu_count, local_gpu_count, read_visible

    values = ("0", "0,1,2,3", "GPU-3f2a,GPU-77b1", "0,-1,2", "", "-1")
    assert [len(read_visible(v).entries) for v in values] == [1, 4, 2, 1, 0, 0]
    assert gpu_count({}, None).count == 0 and gpu_count({}, 8).count == 8
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None).count == 0  # no driver: CUDA shows nothing
    assert gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 1).count == 1  # no more than the driver has
    assert local_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0 and local_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0


@pytest.mark.parametrize(
    "visible, grid, backend_note",
    [
        (0, Grid(2, 1, 2), "2 CPU ranks on gloo"),
        (1, Grid(1, 1, 1), "one rank on one GPU (grid 1x1)"),
        (4, Grid(2, 2, 4), "4 ranks on NCCL, one per GPU (4 here)"),
    ],
)
def test_the_default_jobs_plan_on_the_gpus_here(visible, grid, backend_note):
    from torus_train.job.launch import fit_to_local_gpus

    s = spec()
    assert fit_to_local_gpus(s, {}, visible) == (visible > 0)
    plan = plan_launch(s, {}, job_file=JOB, python=PY, as_root=False, master_port=1, cpu_count=2, local_gpus=visible)
    assert plan.grid == grid and plan.launcher == "local" and len(plan.rank_env) == grid.size
    assert any(backend_note in n for n in plan.notes), plan.notes


def test_the_default_job_keeps_its_grid_where_others_place_the_ranks_or_gloo_is_asked():
    from torus_train.job.launch import fit_to_local_gpus

    for environ in ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}, {"RANK": "0", "WORLD_SIZE": "2"}):
        s = spec()
        assert not fit_to_local_gpus(s, environ, 4) and (s.grid.gpus, s.grid.grid) == (2, "2x1")
    s = spec(**{"comm.backend": "gloo"})
    assert not fit_to_local_gpus(s, {}, 4) and s.grid.gpus == 2


def test_more_ranks_than_gpus_names_gloo_a_hostfile_and_a_scheduler():
    with pytest.raises(LaunchError) as e:
        check_capacity("local", Grid(2, 1, 2), [], "", 1, 16)
    text = str(e.value)
    assert text.startswith(
        "2 ranks do not fit on this machine (1 GPU(s), one rank each); to run them here as "
        "CPU ranks pass --backend gloo, to launch grid 2x1 pass --hostfile FILE"
    )
    assert "Slurm or PBS job" in text
    check_capacity("local", Grid(2, 2, 4), [], "", 0, 2)  # CPU ranks (gloo) are not held to the GPU count
    with pytest.raises(LaunchError, match=re.escape("comm.backend = nccl needs one GPU per rank")):
        plan_launch(
            spec(**{"comm.backend": "nccl"}),
            {},
            job_file=JOB,
            python=PY,
            as_root=False,
            master_port=1,
            cpu_count=2,
            local_gpus=0,
        )
