"""`srun` (Slurm): one job step starts every rank inside the allocation (no torch import).

``srun --nodes --ntasks --ntasks-per-node [--cpus-per-task=C --cpu-bind=cores] --kill-on-bad-exit=1
--export=ALL [--nodelist] [launch.launcher_args] COMMAND``, with the variables for the ranks in srun's own
environment: srun splits ``--export`` on commas, so a value such as ``NCCL_IB_HCA=mlx5_0,mlx5_1`` cannot travel
inside it. Since Slurm 22.05 a step does not inherit ``--cpus-per-task`` from the batch job, so it is passed on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torus_train.job.hosts import Host, expand_nodelist, read_hostfile, slurm_hosts
from torus_train.job.launchers.base import Launcher, LaunchError, LaunchPlan, PlanRequest, RankVars
from torus_train.job.launchers.rendezvous import ephemeral_range, rendezvous_port

# "srun: error: node2: task 3: Killed" (or "tasks 2-3")
TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)")
SLURM = RankVars("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")


def slurm_rendezvous(env: Mapping[str, str], ephemeral: tuple[int, int] | None = None) -> tuple[str, int] | None:
    """(first node of the step, port from job and step id) for ranks started by `srun` by hand; None outside
    a Slurm step. srun places rank 0 on the first node of the step's list (block and cyclic distributions)."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    job = env.get("SLURM_JOB_ID", "")
    if not nodes or not job.isdigit():
        return None
    step = env.get("SLURM_STEP_ID", "0")
    # job id x 16 + step: consecutive steps of one allocation get different ports; every node of a cluster
    # shares the ephemeral range, so every rank computes the same port
    key = str(int(job) * 16 + (int(step) % 16 if step.isdigit() else 0))
    return expand_nodelist(nodes)[0], rendezvous_port(key, ephemeral or ephemeral_range())


class Srun(Launcher):
    name = "srun"
    program = "srun"
    auto_priority = 10  # inside an allocation its own launcher comes first, even with a hostfile
    allocation = "the Slurm allocation"
    rank_vars = (SLURM,)

    def auto(self, environ: Mapping[str, str], hostfile: str) -> str:
        return f"auto: inside Slurm job {environ['SLURM_JOB_ID']}" if environ.get("SLURM_JOB_ID") else ""

    def is_rank(self, environ: Mapping[str, str]) -> bool:
        # a step's task, not the batch script (which has SLURM_PROCID and SLURM_NTASKS but no step id)
        return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ

    def rendezvous_by_hand(self, environ: Mapping[str, str]) -> tuple[str, int] | None:
        return slurm_rendezvous(environ)

    def culprit(self, lines: list[str]) -> tuple[int, str, str] | None:
        """srun lists every task that ended, often a survivor's exit code first: a task ended by a signal is
        preferred."""
        found = [m for ln in lines if (m := TASK_ERROR.search(ln))]
        if not found:
            return None
        m = next((m for m in found if "exit code" not in m.group(3).lower()), found[0])
        status = m.group(3).strip()
        return int(m.group(2)), m.group(1), "was killed by SIGKILL" if status == "Killed" else f"ended ({status})"

    def hosts(self, hostfile: str, environ: Mapping[str, str]) -> tuple[list[Host], str]:
        if hostfile:
            return read_hostfile(hostfile, "--hostfile"), hostfile
        if not environ.get("SLURM_JOB_ID"):
            raise LaunchError(
                "launcher srun needs a Slurm allocation: submit with sbatch (see scripts/slurm/) or run inside salloc"
            )
        return slurm_hosts(environ), ""

    def threads(
        self, environ: Mapping[str, str], ranks_on_node: int, cpu_count: int, all_local: bool
    ) -> tuple[int, str]:
        per_task = environ.get("SLURM_CPUS_PER_TASK", "")
        if per_task.isdigit() and int(per_task) > 0:
            return int(per_task), "SLURM_CPUS_PER_TASK"
        return super().threads(environ, ranks_on_node, cpu_count, all_local)

    def build(self, req: PlanRequest) -> LaunchPlan:
        g = req.grid
        threads, source = self.threads(req.environ, g.gpus_per_node, req.cpu_count, req.all_local())
        argv = [self.program, f"--nodes={g.nodes}", f"--ntasks={g.size}", f"--ntasks-per-node={g.gpus_per_node}"]
        if source == "SLURM_CPUS_PER_TASK":  # a step does not inherit it from the job (Slurm >= 22.05)
            argv += [f"--cpus-per-task={threads}", "--cpu-bind=cores"]
        # the ranks' variables go in srun's environment and --export=ALL carries them: srun splits --export
        # on commas, so NCCL_IB_HCA=mlx5_0,mlx5_1 inside it would lose everything after the first HCA
        argv += ["--kill-on-bad-exit=1", "--export=ALL"]
        if req.hostfile:
            argv.append(f"--nodelist={','.join(h.name for h in req.used)}")
        env = {"OMP_NUM_THREADS": str(threads), **req.env, **req.rendezvous()}
        return self.plan(req, [*argv, *req.launcher_args, *req.command], env)
