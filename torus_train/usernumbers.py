"""The one door for the numbers a user supplies, as userfiles.py is for the files: an option's text, an
environment variable (ours, the launchers', Slurm's, PBS's, MPI's, torchrun's, CUDA's), a hostfile's field, a
network TOML's figures. Each kind has one function, and each refusal is one line that names the source
(``--ranks``, ``SLURM_GPUS_ON_NODE``, ``hosts.txt:3 slots``, ``n.toml [inter] bandwidth_gbytes_per_s``) and
what is allowed. (A spec's fields are typed and bounded by job/spec.py, a JSON file's by userfiles.check's
Fields: neither reads a number from text.)

    int_of      text -> an int in [low, high]: ASCII digits only (``str.isdigit`` takes "²", which ``int``
                refuses; ``int`` also takes "٤", "1_000" and refuses more than 4,300 digits)
    float_of    text -> a finite float in range (``float`` takes "nan", "inf" and "1_0")
    int_value   a value a parser already read (TOML, JSON) -> an int in range; text, a bool or 2.5 refused
    float_value the same for a finite float
    env_int, env_float
                an environment variable through int_of / float_of; None when it is unset or empty
    node_list   a Slurm compressed node list expanded, refused before expanding past the allocation's nodes

tests/test_floors.py fails when code under torus_train/ converts text to a number outside this module (an
``int()`` or ``float()`` of an environment variable, a string field or a regex group, or a ``str.isdigit``)
without a reason in scripts/dev/measure_structure.py's NOT_USER_NUMBERS. No torch import.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping

from torus_train.errors import UserError

_INT = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
SHOWN = 40
"""The most of a refused text a message shows (a 5,000-digit value is cut)."""

MAX_NODES = 1 << 20
"""The most nodes a node list may expand to when the allocation does not say how many it has (the largest
machines have some 10^5 nodes)."""


class NumberError(UserError):
    """A number a user supplied that is not one, or out of range: one line naming the source and the range."""


def shown(text: object) -> str:
    """``text`` for a refusal, quoted and cut when long."""
    s = str(text)
    return repr(s) if len(s) <= SHOWN else f"{s[:20]!r}...({len(s)} characters)"


def allowed(low: float | None, high: float | None, kind: str = "an integer", low_open: bool = False) -> str:
    """'an integer from 1 to 64', 'a number > 0', ... for a refusal."""
    if low is not None and high is not None and not low_open:
        return f"{kind} from {low:g} to {high:g}"
    words = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
    words += [f"<= {high:g}"] if high is not None else []
    return " and ".join([f"{kind} {words[0]}", *words[1:]]) if words else kind


def _number(n: float) -> str:
    if isinstance(n, int) and abs(n) >= 10**20:  # str() of a number past 4,300 digits raises; log10 does not
        return f"a {math.floor(math.log10(abs(n))) + 1}-digit number"
    return f"{n:g}"


def _in_range(n, source: str, low: float | None, high: float | None, kind: str, low_open: bool = False):
    """``n`` itself when inside [low, high] (above low when ``low_open``); NumberError naming ``source``."""
    if (low is not None and (n < low or (low_open and n == low))) or (high is not None and n > high):
        raise NumberError(f"{source}: {_number(n)} is out of range; give {allowed(low, high, kind, low_open)}")
    return n


def int_of(text: str, source: str, low: int | None = None, high: int | None = None) -> int:
    """Text a user wrote -> an int in [low, high]; NumberError naming ``source`` otherwise."""
    s = str(text).strip()
    if not _INT.fullmatch(s):
        raise NumberError(f"{source}: {shown(text)} is not a whole number; give {allowed(low, high)}")
    return int(_in_range(int(s), source, low, high, "an integer"))


def float_of(
    text: str, source: str, low: float | None = None, high: float | None = None, low_open: bool = False
) -> float:
    """Text a user wrote -> a finite float in range (above ``low`` when ``low_open``)."""
    s = str(text).strip()
    if len(s) > SHOWN or not _FLOAT.fullmatch(s) or not math.isfinite(value := float(s)):
        raise NumberError(
            f"{source}: {shown(text)} is not a finite number; give {allowed(low, high, 'a number', low_open)}"
        )
    return _in_range(value, source, low, high, "a number", low_open)


def int_value(value: object, source: str, low: int | None = None, high: int | None = None) -> int:
    """A value a parser read (TOML, JSON) -> an int in range; a string, a bool or a fraction is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NumberError(f"{source}: {shown(value)} is not an integer; give {allowed(low, high)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise NumberError(f"{source}: {value!r} is not a whole number; give {allowed(low, high)}")
    return int(_in_range(value, source, low, high, "an integer"))


def float_value(
    value: object, source: str, low: float | None = None, high: float | None = None, low_open: bool = False
) -> float:
    """A value a parser read -> a finite float in range; a string or a bool is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NumberError(f"{source}: {shown(value)} is not a number; give {allowed(low, high, 'a number', low_open)}")
    if isinstance(value, int):
        if abs(value) > sys.float_info.max:  # float() of it raises OverflowError
            raise NumberError(
                f"{source}: {_number(value)} is out of range; give {allowed(low, high, 'a number', low_open)}"
            )
        return float(_in_range(value, source, low, high, "a number", low_open))
    if not math.isfinite(value):
        raise NumberError(
            f"{source}: {value!r} is not a finite number; give {allowed(low, high, 'a number', low_open)}"
        )
    return _in_range(float(value), source, low, high, "a number", low_open)


def env_int(environ: Mapping[str, str], name: str, low: int | None = None, high: int | None = None) -> int | None:
    """The environment variable ``name`` as an int in range; None when it is unset or empty."""
    text = environ.get(name, "")
    return int_of(text, name, low, high) if text.strip() else None


def env_float(
    environ: Mapping[str, str],
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float | None:
    """The environment variable ``name`` as a finite float in range; None when it is unset or empty."""
    text = environ.get(name, "")
    return float_of(text, name, low, high, low_open) if text.strip() else None


_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?", re.ASCII)
NODELIST_FORMAT = "e.g. node[001-004,010],gpu1"


def _split_top(text: str, source: str) -> list[str]:
    """Split on the commas outside brackets; nested or unbalanced brackets are refused."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            why = "unbalanced ']'" if depth < 0 else "nested brackets"
            raise NumberError(f"{source} {shown(text)}: {why}; expected {NODELIST_FORMAT}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise NumberError(f"{source} {shown(text)}: unbalanced '['; expected {NODELIST_FORMAT}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _ranges(item: str, source: str, whole: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """``a[1-2]b[3]c`` -> [("a", [("1","2")]), ("b", [("3","")]), ("c", [])]: each literal piece with the
    bracket that follows it, read before anything is expanded."""
    pieces = []
    for m in re.finditer(r"([^\[\]]*)(\[([^\[\]]*)\])?", item):
        if not m.group(0):
            continue
        lit, bracket, body = m.group(1), m.group(2), m.group(3) or ""
        rngs = []
        for rng in body.split(",") if bracket else []:
            r = _RANGE.fullmatch(rng.strip())
            if not r or (r.group(2) and int(r.group(2)) < int(r.group(1))):
                raise NumberError(f"{source} {shown(whole)}: bad range {shown(rng)}; expected {NODELIST_FORMAT}")
            rngs.append((r.group(1), r.group(2) or ""))
        pieces.append((lit, rngs))
    return pieces


def _count(rngs: list[tuple[str, str]]) -> int:
    return sum(int(hi) - int(lo) + 1 if hi else 1 for lo, hi in rngs) if rngs else 1


def _names(lit: str, rngs: list[tuple[str, str]]) -> list[str]:
    if not rngs:
        return [lit]
    out: list[str] = []
    for lo, hi in rngs:
        width = len(lo) if lo.startswith("0") else 0
        out.extend(f"{lit}{i:0{width}d}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def node_list(text: str, source: str, max_nodes: int = MAX_NODES) -> list[str]:
    """Slurm's compressed node list -> host names in order (``node[001-003]`` -> node001 node002 node003).
    Its size is counted before anything is expanded: more than ``max_nodes`` (the allocation's node count)
    is refused, as are nested brackets, so no list can hang the launcher or fill its memory."""
    items = _split_top(text.strip(), source)
    parsed = [_ranges(item, source, text) for item in items]
    total = sum(math.prod(_count(r) for _, r in pieces) for pieces in parsed)
    if total > max_nodes:
        raise NumberError(f"{source} {shown(text)}: names {total:,} nodes, more than the {max_nodes:,} allowed")
    if not total:
        raise NumberError(f"{source} {shown(text)}: names no node; expected {NODELIST_FORMAT}")
    out: list[str] = []
    for pieces in parsed:
        names = [""]
        for lit, rngs in pieces:
            names = [n + tail for n in names for tail in _names(lit, rngs)]
        out.extend(names)
    return out
