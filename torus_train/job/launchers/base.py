"""What a launcher is: a class of pure methods, the request its `build` answers and the plan it returns.

A launcher answers, each with a method (Horovod's runner keeps one launcher per module behind one call):
whether `launch.launcher = auto` should pick it here (`auto`), the hosts it may use (`hosts`), whether a grid
fits them (`check_capacity`) and their GPUs (`check_gpus`, where the scheduler says how many a node has:
`node_gpus`), the CPUs each rank is bound to (`rank_cpus`, from launch.cpus_per_rank or `scheduler_cpus`) and
its threads (`threads`), the exact argv and environment that start the ranks, bound to their GPUs and cores
(`build`), how a process recognises that it is one of its ranks and reads its place (`is_rank`,
`rank_vars`), where rank 0 is when nobody said (`rendezvous_by_hand`), and which rank its last stderr lines
blame for a failure (`culprit`). Of the planning methods only `hosts` reads a file (a hostfile or node file);
the others are functions of their arguments, which the tests check argv for argv. No torch import.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from torus_train.errors import UserError
from torus_train.job.hosts import Host, HostsError, total_slots
from torus_train.job.rank import RankInfo
from torus_train.job.topology import Grid
from torus_train.usernumbers import env_int, int_of

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_WORLD = 1 << 20
"""The most ranks a launcher's environment may say a world has (the largest jobs run some 10^5)."""
MAX_CPUS = 1 << 16
"""The most CPUs a scheduler's variable may say a node or a task has."""
MAX_NODE_GPUS = 1024
"""The most GPUs a scheduler's variable may say a node has."""
DEFAULT_THREADS = 4
"""Threads per rank when neither the scheduler nor this machine says how many cores a rank's node has."""


class LaunchError(UserError):
    """A launch that cannot work as asked (too few slots, no way to reach that many GPUs)."""


@dataclass(frozen=True)
class RankVars:
    """The environment variables through which a launcher tells each process its place."""

    source: str
    """What RankInfo.source says when these were read (torchrun, openmpi, slurm, pmi, ...)."""
    rank: str
    size: str
    local_rank: str
    local_size: str

    def read(self, environ: Mapping[str, str]) -> RankInfo | None:
        """This process's place, or None when the launcher did not set rank and size. A missing local rank
        or local size falls back to the global one (one node)."""
        if self.rank not in environ or self.size not in environ:
            return None
        size = int_of(environ[self.size], self.size, 1, MAX_WORLD)
        rank = int_of(environ[self.rank], self.rank, 0, size - 1)
        local = env_int(environ, self.local_rank, 0, size - 1)
        local_size = env_int(environ, self.local_size, 1, size)
        return RankInfo(rank, size, rank if local is None else local, local_size or size, self.source)


@dataclass
class LaunchPlan:
    """Everything needed to start the ranks; printed by --dry-run and executed by `run`."""

    launcher: str
    """The launcher's name in the table (local, mpirun, srun, ...)."""
    why: str
    """How the launcher was chosen."""
    grid: Grid
    """The grid the ranks form."""
    hosts: list[Host]
    """Nodes used (one 'localhost' entry for a launcher whose ranks run here)."""
    argv: list[str]
    """A launcher with a command: that one command; one whose ranks run here: the command every rank runs."""
    entry: Launcher = field(repr=False, compare=False)
    """The launcher's table entry: ask it (plan.entry.runs_here) instead of comparing plan.launcher to names."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the environment of the command (ranks that run here: of every rank)."""
    rank_env: list[dict[str, str]] = field(default_factory=list)
    """Ranks that run here only: the per-rank variables (RANK, LOCAL_RANK, ...)."""
    hostfile: str = ""
    """The hostfile or node file the plan reads, if any."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (said once)."""

    @property
    def world_size(self) -> int:
        return self.grid.size

    def command_text(self) -> str:
        """The exact command as a shell line (ranks that run here: the first rank's, with its variables)."""
        return self.entry.command_text(self)


@dataclass(frozen=True)
class PlanRequest:
    """What `Launcher.build` gets: the ranks to start, on which hosts, the command each runs, and what this
    machine says. Built by torus_train.job.launch (from the spec) or by a side door such as `bench`."""

    grid: Grid
    why: str
    """How the launcher was chosen (copied into the plan)."""
    hosts: list[Host]
    """Hosts in order; the first grid.nodes are used, rank 0 on the first."""
    hostfile: str
    """The file those hosts came from ('' when they came from the scheduler or are this machine)."""
    command: list[str]
    """What every rank runs (the worker, or bench's own command line), container prefix included."""
    env: dict[str, str]
    """Variables every rank gets (launch.env, resolved)."""
    launcher_args: list[str]
    """launch.launcher_args: put right after the launcher's own options."""
    environ: Mapping[str, str]
    """This process's environment (the scheduler's variables)."""
    port: int
    """The rendezvous port (MASTER_PORT)."""
    as_root: bool = False
    cpu_count: int = 1
    """CPUs this process may use (affinity and cgroup quota)."""
    local_gpus: int = 0
    backend: str = "auto"
    """comm.backend: nccl, gloo, or auto (NCCL where the ranks find GPUs): whether the ranks take GPUs."""
    cpus_per_rank: int = 0
    """launch.cpus_per_rank: CPUs each rank is bound to; 0 = as the scheduler says (Launcher.scheduler_cpus)."""

    @property
    def used(self) -> list[Host]:
        """The hosts the grid's nodes take, in order."""
        return self.hosts[: self.grid.nodes]

    def rendezvous(self) -> dict[str, str]:
        """MASTER_ADDR/MASTER_PORT for every rank: the first host (rank 0 runs there) and the port; a name
        in launch.env wins (it may name rank 0's host on another network)."""
        rdv = {"MASTER_ADDR": self.used[0].name, "MASTER_PORT": str(self.port)}
        return {k: v for k, v in rdv.items() if k not in self.env}

    def all_local(self) -> bool:
        return all(h.name in LOCAL_NAMES for h in self.used)


def killed_by(sig: int) -> str:
    """How a rank ended by signal `sig` is told: 'was killed by SIGKILL'."""
    try:
        return f"was killed by {signal.Signals(sig).name}"
    except ValueError:
        return f"was killed by signal {sig}"


def threads_per_rank(ranks_on_node: int, cpu_count: int) -> int:
    """CPU threads per rank so that the ranks of one node share its cores: max(1, cores // ranks)."""
    return max(1, cpu_count // max(1, ranks_on_node))


class Launcher:
    """One way of starting ranks. Subclasses set the attributes and override what differs; the defaults are
    those of a launcher that runs one command over a list of hosts."""

    name: str = ""
    """The name in launch.launcher and --launcher."""
    program: str = ""
    """The command the launcher runs (mpirun, srun); '' when `run` starts the ranks itself."""
    runs_here: bool = False
    """True: `run` starts and supervises one process per rank on this machine (plan.rank_env filled);
    False: one command (plan.argv) starts them, on the plan's hosts."""
    mpi_world: bool = False
    """Its ranks form one MPI world (MPI_COMM_WORLD), so the MPI transport can run on them."""
    auto_priority: int = 50
    """Under launch.launcher = auto the entries are asked lowest first: a scheduler's own allocation before
    a host list before this machine."""
    allocation: str = "the host list"
    """How a message names the hosts when no hostfile gave them."""
    rank_vars: tuple[RankVars, ...] = ()
    """The variables it sets in each rank, most specific first."""
    shared_rank_vars: tuple[RankVars, ...] = ()
    """Variables of an interface other launchers set too (PMI): read only after every launcher's own."""

    def auto(self, environ: Mapping[str, str], hostfile: str) -> str:
        """Why launch.launcher = auto takes this launcher here, or '' when it does not."""
        return ""

    def is_rank(self, environ: Mapping[str, str]) -> bool:
        """True when this process is already one rank that this launcher started."""
        return any(v.rank in environ and v.size in environ for v in self.rank_vars)

    def rendezvous_by_hand(self, environ: Mapping[str, str]) -> tuple[str, int] | None:
        """(rank 0's address, port) for ranks that this launcher started by hand, without MASTER_ADDR and
        MASTER_PORT; None when the environment does not say."""
        return None

    def hosts(self, hostfile: str, environ: Mapping[str, str]) -> tuple[list[Host], str]:
        """(hosts, the file they came from) for this launcher; may read the hostfile."""
        raise NotImplementedError(f"launcher {self.name} does not say which hosts it uses")

    def default_world(self, hosts: list[Host], local_gpus: int) -> int:
        """Ranks when the spec names neither grid.gpus nor grid.grid: every slot offered."""
        return total_slots(hosts)

    def default_per_node(self, world: int, hosts: list[Host]) -> int:
        """Ranks per node when grid.gpus_per_node is 0: the slots of the first host."""
        return hosts[0].slots

    def check_capacity(self, grid: Grid, hosts: list[Host], hostfile: str, local_gpus: int, cpu_count: int) -> None:
        """Refuse a grid whose ranks cannot all get a slot, saying how to fit it."""
        n, where = grid.size, hostfile or self.allocation
        have = total_slots(hosts)
        if have < n:
            raise HostsError(
                f"{where} offers {have} slots on {len(hosts)} hosts but the job needs {n} ranks "
                f"(grid {grid}); add hosts or lower --gpus/--grid"
            )
        small = [h for h in hosts[: grid.nodes] if h.slots < grid.gpus_per_node]
        if small:
            raise HostsError(
                f"{where}: host {small[0].name} offers {small[0].slots} slots but --gpus-per-node is "
                f"{grid.gpus_per_node}; ranks are placed {grid.gpus_per_node} per node"
            )

    def scheduler_cpus(self, environ: Mapping[str, str], ranks_on_node: int) -> tuple[int, str] | None:
        """(CPUs each of a node's ranks may take, the variable that says so) when the scheduler's environment
        says how many CPUs a node gives the job; None when it does not."""
        return None

    def node_gpus(self, environ: Mapping[str, str]) -> tuple[int, str] | None:
        """(GPUs each node gives the job, the variable that says so) when the scheduler's environment says;
        None when it does not."""
        return None

    def threads(
        self, environ: Mapping[str, str], ranks_on_node: int, cpu_count: int, all_local: bool
    ) -> tuple[int, str]:
        """(threads per rank, where that number came from): the scheduler's CPUs per rank, else this machine's
        usable CPUs shared among its ranks when every host is this one, else DEFAULT_THREADS."""
        found = self.scheduler_cpus(environ, ranks_on_node)
        if found:
            return found
        if all_local:
            return threads_per_rank(ranks_on_node, cpu_count), "usable CPUs"
        return DEFAULT_THREADS, "default"

    def rank_cpus(self, req: PlanRequest) -> tuple[int, str] | None:
        """(CPUs each rank is bound to, where that number came from): launch.cpus_per_rank, else what the
        scheduler says; None when nothing says, and the ranks are then not bound to CPUs."""
        if req.cpus_per_rank:
            return req.cpus_per_rank, "launch.cpus_per_rank"
        return self.scheduler_cpus(req.environ, req.grid.gpus_per_node)

    def check_gpus(self, grid: Grid, environ: Mapping[str, str], backend: str) -> None:
        """Refuse, before any rank starts, more ranks per node than the GPUs the scheduler says each node
        gives: two ranks would share a GPU, which NCCL refuses ("Duplicate GPU detected") after start-up."""
        found = self.node_gpus(environ)
        if backend == "gloo" or found is None or grid.gpus_per_node <= found[0]:
            return
        have, said = found
        if have == 0 and backend == "auto":  # no GPUs: the ranks run on the CPU (gloo)
            return
        raise LaunchError(
            f"grid.gpus_per_node = {grid.gpus_per_node}, but {self.allocation} gives each node {have} GPU(s) "
            f"({said}): two ranks would share a GPU, which NCCL refuses; put at most {have} rank(s) on a node "
            f"(--gpus-per-node {have}), ask for {grid.gpus_per_node} GPUs per node, or pass --backend gloo"
        )

    def build(self, req: PlanRequest) -> LaunchPlan:
        """The exact argv and environment that start req.grid's ranks (pure)."""
        raise NotImplementedError(f"launcher {self.name} does not build a command")

    def culprit(self, lines: list[str]) -> tuple[int, str, str] | None:
        """(rank, host, how it ended) of the rank that the launcher's last stderr lines say ended the job,
        or None when they do not say."""
        return None

    def plan(
        self,
        req: PlanRequest,
        argv: list[str],
        env: dict[str, str],
        *,
        hosts: list[Host] | None = None,
        rank_env: list[dict[str, str]] | None = None,
        notes: list[str] | None = None,
    ) -> LaunchPlan:
        """The LaunchPlan of this launcher for `req` (what `build` returns)."""
        return LaunchPlan(
            self.name,
            req.why,
            req.grid,
            req.used if hosts is None else hosts,
            argv,
            self,
            env,
            rank_env or [],
            req.hostfile,
            notes or [],
        )

    def command_text(self, plan: LaunchPlan) -> str:
        """The plan's command as a shell line, its environment in front."""
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in plan.env.items())
        return prefix + shlex.join(plan.argv)
