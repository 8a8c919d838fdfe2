"""Host lists in the forms clusters hand out (pure apart from reading a named file; no torch import).

- OpenMPI hostfiles: ``host slots=K`` (``max_slots=`` ignored, ``#`` comments); a host named twice adds slots.
- PBS node files (``$PBS_NODEFILE``, ABCI): one line per slot, so a host listed K times has K slots.
- Slurm compressed node lists (``$SLURM_JOB_NODELIST``): ``node[001-004,010],gpu[1-2]-ib,login1``, with zero
  padding kept; and ``$SLURM_TASKS_PER_NODE`` in its ``4(x2),3`` form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torus_train.errors import UserError
from torus_train.userfiles import read_bytes
from torus_train.usernumbers import MAX_NODES, NumberError, env_int, int_of, node_list, shown

MAX_HOSTFILE_BYTES = 16 << 20
"""The largest hostfile read: a node file of 2,176 slots is some 50 KB."""

MAX_SLOTS = 4096
"""The most ranks one host may offer (a hostfile's slots=, a scheduler's tasks per node)."""

HOSTFILE_FORMAT = "one host per line as 'host slots=K' (OpenMPI) or one line per slot (PBS node file)"


class HostsError(UserError):
    """A host list that cannot be read; the message shows the accepted format."""


@dataclass(frozen=True)
class Host:
    """One node and the ranks it may run."""

    name: str
    """Host name as the launcher should reach it."""
    slots: int
    """Ranks (GPUs) this host offers."""


_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_LINE_RE = re.compile(r"^(?P<host>\S+)(?P<rest>(\s+\S+)*)\s*$")


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """Hosts of an OpenMPI hostfile or a PBS node file, in order of first appearance."""
    slots: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE_RE.match(line)
        host = m.group("host") if m else ""
        if m is None or not _HOST_RE.match(host):
            raise HostsError(f"{source}:{lineno}: {raw.strip()!r} is not a host line; expected {HOSTFILE_FORMAT}")
        n = 1
        for opt in (m.group("rest") or "").split():
            key, _, value = opt.partition("=")
            if key in ("slots", "max_slots", "max-slots"):
                try:
                    count = int_of(value, f"{source}:{lineno} {key}", 1, MAX_SLOTS)
                except NumberError as e:
                    raise HostsError(f"{e}, e.g. '{host} slots=4'") from None
                if key == "slots":
                    n = count
            else:
                raise HostsError(f"{source}:{lineno}: unknown option {opt!r}; expected {HOSTFILE_FORMAT}")
        slots[host] = slots.get(host, 0) + n
    if not slots:
        raise HostsError(f"{source}: lists no hosts; expected {HOSTFILE_FORMAT}")
    return [Host(h, k) for h, k in slots.items()]


def read_hostfile(path: str | Path, what: str = "hostfile") -> list[Host]:
    """Read and parse a hostfile or node file; a missing file is a HostsError naming it."""
    if not Path(path).exists():
        raise HostsError(f"{what} {path}: no such file")
    try:  # through the door: a FIFO or a device is refused by name, never opened to block
        raw = read_bytes(path, what, MAX_HOSTFILE_BYTES)
    except UserError as e:
        raise HostsError(str(e)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HostsError(f"{what} {path}: not UTF-8 text (byte {e.start})") from None
    return parse_hostfile(text, str(path))


def allocation_nodes(environ: Mapping[str, str]) -> int:
    """The nodes of the Slurm allocation (``SLURM_JOB_NUM_NODES``, else ``SLURM_NNODES``), the most its node
    list may expand to; MAX_NODES when neither says."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        count = env_int(environ, name, 1, MAX_NODES)
        if count is not None:
            return count
    return MAX_NODES


def expand_nodelist(text: str, max_nodes: int = MAX_NODES, source: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's compressed node list -> host names, in order (``node[001-003]`` -> node001 node002 node003),
    counted before it is expanded: more than ``max_nodes`` (the allocation's) is refused, and nested brackets."""
    return node_list(text, source, max_nodes)


def expand_tasks_per_node(text: str, max_nodes: int = MAX_NODES) -> list[int]:
    """``$SLURM_TASKS_PER_NODE`` (``4(x2),3``) -> [4, 4, 3]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part, re.ASCII)
        if not m:
            raise HostsError(f"SLURM_TASKS_PER_NODE {shown(text)}: cannot read {shown(part)}; expected e.g. 4(x2),3")
        repeat = int_of(m.group(2) or "1", "SLURM_TASKS_PER_NODE", 1, max_nodes - len(out))
        out.extend([int_of(m.group(1), "SLURM_TASKS_PER_NODE", 0, MAX_SLOTS)] * repeat)
    return out


def slurm_hosts(environ: Mapping[str, str]) -> list[Host]:
    """Hosts of the current Slurm allocation (node list + tasks per node, else GPUs/tasks per node, else 1)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise HostsError(
            "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not; run inside an allocation "
            "(sbatch/salloc) or pass --launcher and --hostfile"
        )
    nodes = allocation_nodes(environ)
    names = expand_nodelist(
        nodelist, nodes, "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    )
    if environ.get("SLURM_TASKS_PER_NODE"):
        counts = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"], nodes)
        if len(counts) == len(names):
            return [Host(n, k) for n, k in zip(names, counts, strict=True)]
    name = next((v for v in ("SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE") if environ.get(v, "").strip()), "")
    k = env_int(environ, name, 0, MAX_SLOTS) if name else 1  # 0 GPUs on a node (a CPU allocation): 1 slot
    return [Host(n, k or 1) for n in names]


def total_slots(hosts: list[Host]) -> int:
    return sum(h.slots for h in hosts)


def format_hostfile(hosts: list[Host]) -> str:
    """Hosts as an OpenMPI hostfile."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)
