"""The check's table (stdout) and JSON document (--json), and its exit code (pure: no torch)."""

from __future__ import annotations

import platform
import socket
import textwrap
import time

from torus_train import __version__
from torus_train.outfiles import Writer
from torus_train.verdict import Verdict

SCHEMA = 1
"""The JSON document's "check" field: its version."""
WHY_WIDTH = 88
WRITER = Writer("check")
"""The check's files (--json, an acceptance run's summary.json) carry "written_by": "torus-train check"."""


def document(found: dict[str, tuple[Verdict, float]], wall: float) -> dict:
    """{"check": 1, "date", "host", "torus_train", "wall_seconds", "ok", "parts": {NAME: {"ok", "why", "detail",
    "seconds"}}}; "ok" is False when a part failed (null parts are not failures)."""
    return {
        "check": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "torus_train": __version__,
        "wall_seconds": round(wall, 1),
        "ok": not failed(found),
        "parts": {name: {**v.to_json(), "seconds": round(s, 2)} for name, (v, s) in found.items()},
    }


def failed(found: dict[str, tuple[Verdict, float]]) -> list[str]:
    return [name for name, (v, _) in found.items() if v.ok is False]


def table(found: dict[str, tuple[Verdict, float]], wall: float) -> str:
    """One row per part: name, ok / FAILED / n/a, seconds, why (wrapped); then one line of totals."""
    width = max([len(n) for n in found] + [4])
    lines = [f"{'part':<{width}}  {'result':<6}  {'sec':>5}  why"]
    for name, (v, s) in found.items():
        why = textwrap.wrap(v.why, WHY_WIDTH) or [""]
        lines.append(f"{name:<{width}}  {v.word:<6}  {s:>5.1f}  {why[0]}")
        lines += [f"{'':<{width + 17}}{w}" for w in why[1:]]
    counts = {word: sum(v.word == word for v, _ in found.values()) for word in ("ok", "FAILED", "n/a")}
    lines.append(
        f"{len(found)} parts in {wall:.0f} s: {counts['ok']} ok, {counts['FAILED']} failed, "
        f"{counts['n/a']} cannot run here"
    )
    return "\n".join(lines)
