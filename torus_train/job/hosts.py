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

MAX_HOSTFILE_BYTES = 16 << 20
"""The largest hostfile read: a node file of 2,176 slots is some 50 KB."""

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
                if not value.isdigit() or int(value) < 1:
                    raise HostsError(f"{source}:{lineno}: {opt!r} needs a positive integer, e.g. '{host} slots=4'")
                if key == "slots":
                    n = int(value)
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


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostsError(f"node list {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostsError(f"node list {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    names: list[str] = []
    for rng in body.split(","):
        lo, sep, hi = rng.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostsError(f"node list {whole!r}: bad range {rng!r}; expected e.g. node[001-004,010]")
        if not sep:
            names.append(prefix + lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostsError(f"node list {whole!r}: range {rng!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        names.extend(f"{prefix}{i:0{width}d}" for i in range(a, b + 1))
    return [n + tail for n in names for tail in _expand_one(rest, whole)]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list -> host names, in order (``node[001-003]`` -> node001 node002 node003)."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        out.extend(_expand_one(item, text))
    if not out:
        raise HostsError(f"node list {text!r} is empty")
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """``$SLURM_TASKS_PER_NODE`` (``4(x2),3``) -> [4, 4, 3]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise HostsError(f"SLURM_TASKS_PER_NODE {text!r}: cannot read {part!r}; expected e.g. 4(x2),3")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def slurm_hosts(environ: Mapping[str, str]) -> list[Host]:
    """Hosts of the current Slurm allocation (node list + tasks per node, else GPUs/tasks per node, else 1)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise HostsError(
            "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not; run inside an allocation "
            "(sbatch/salloc) or pass --launcher and --hostfile"
        )
    names = expand_nodelist(nodelist)
    if environ.get("SLURM_TASKS_PER_NODE"):
        counts = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
        if len(counts) == len(names):
            return [Host(n, k) for n, k in zip(names, counts, strict=True)]
    per = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_GPUS_ON_NODE") or "1"
    k = int(per) if per.isdigit() else 1
    return [Host(n, k) for n in names]


def total_slots(hosts: list[Host]) -> int:
    return sum(h.slots for h in hosts)


def format_hostfile(hosts: list[Host]) -> str:
    """Hosts as an OpenMPI hostfile."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)
