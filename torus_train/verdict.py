"""A probe's answer (pure: no torch): whether a layer works on this machine, and why.

    Verdict(True, "nvJPEG agrees with PIL on 11 images")         the layer may be used
    Verdict(False, "cmyk: mean difference 41.2 levels > 2")       it must not: the known path runs instead
    Verdict(None, "no CUDA device here")                          the probe cannot run on this machine

The start-up probes (the device decoder, the graphed step) return one, a run records the choice it led to in its
summary, and `torus-train check` prints one per part and writes ``to_json()`` to its --json file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """One probe's outcome."""

    ok: bool | None
    """True: shown to work here; False: shown not to (or the probe itself failed); None: cannot run here."""
    why: str
    """One line for a user: what was tried and what came of it (for None: what this machine lacks)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Figures behind the verdict (JSON-able): per-image differences, timings, versions."""

    @classmethod
    def passed(cls, why: str, **detail: Any) -> Verdict:
        return cls(True, why, detail)

    @classmethod
    def failed(cls, why: str, **detail: Any) -> Verdict:
        return cls(False, why, detail)

    @classmethod
    def cannot_run(cls, why: str, **detail: Any) -> Verdict:
        return cls(None, why, detail)

    @property
    def word(self) -> str:
        """ "ok", "FAILED" or "n/a": the verdict's column in a table."""
        return {True: "ok", False: "FAILED", None: "n/a"}[self.ok]

    def to_json(self) -> dict[str, Any]:
        """{"ok": true/false/null, "why": ..., "detail": {...}}: a JSON-able dict (json.dumps takes it as is)."""
        return {"ok": self.ok, "why": self.why, "detail": dict(self.detail)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """The inverse of to_json (a summary or a --json file read back)."""
        return cls(data.get("ok"), str(data.get("why", "")), dict(data.get("detail") or {}))
