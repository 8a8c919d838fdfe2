"""The ranks' own word on a failed job: who they waited for, who they saw exit, who did not run (no torch import).

Under mpirun and srun the launcher cannot look at a rank's process on another node, and the launchers' own last
lines name at most the rank they killed or the first that exited; the ranks' .failed markers (ranks/worker.py)
say more: a peer that timed out waiting for rank N (comm/shm.py names it), one that saw rank N exit, and a rank
that did not run for a while before its failure (stopped or frozen, woken by the launcher at the end).
ranks/diagnosis.py reads the markers into ``Said`` and asks these functions who the failure started with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WAITED_FOR = re.compile(r"timed out after [^;]*? waiting for ((?:rank \d+(?:, )?)+)")
"""A rank's own line for a peer that did not answer within comm.timeout_s (comm/shm.py's row exchange)."""
SAW_EXIT = re.compile(r"((?:rank \d+ \(pid \d+\)(?:, )?)+) exited during")
"""A rank's own line for a peer that exited inside a collective."""


@dataclass(frozen=True)
class Said:
    """A rank's .failed marker as evidence: when it was written, its line, and how long the rank had not run."""

    rank: int
    at: float
    message: str
    stalled_s: float

    @property
    def timed_out(self) -> bool:
        return "timed out" in self.message.lower()


def hung_rank(said: list[Said], ranks: int) -> tuple[int, list[int], str] | None:
    """(the hung rank, the ranks that timed out waiting for it, what it says of itself) from the ranks' own
    markers; None when they do not show one. In order of strength: a rank that did not run for STALLED_S before
    its failure (worker.stalled_for: stopped or frozen, and woken by the launcher at the end); the one silent
    rank when every other rank timed out; the rank the others' lines name as the one they waited for, less
    any that had itself timed out before it was named (it waited in turn: the hang spreads along the grid)."""
    waiters = [s.rank for s in said if s.timed_out]
    stalled = [s for s in said if s.stalled_s > 0]
    if stalled:
        top = max(stalled, key=lambda s: s.stalled_s)
        return top.rank, [r for r in waiters if r != top.rank], f" (it did not run for {top.stalled_s:.0f} s)"
    silent = sorted(set(range(ranks)) - {s.rank for s in said})
    if len(silent) == 1 and len(waiters) == ranks - 1:
        return silent[0], waiters, ""
    found = named_in(said, WAITED_FOR)
    return (found[0], found[1], "") if found else None


def named_in(said: list[Said], pattern: re.Pattern) -> tuple[int, list[int]] | None:
    """The rank the markers' lines name (pattern), and the ranks that name it; a named rank that timed out
    itself before it was first named is a waiter too, and counts only when every named rank is one."""
    named: dict[int, list[Said]] = {}
    for s in said:
        m = pattern.search(s.message)
        for peer in map(int, re.findall(r"rank (\d+)", m.group(1)) if m else []):
            if peer != s.rank:
                named.setdefault(peer, []).append(s)
    if not named:
        return None
    own = {s.rank: s for s in said}
    roots = [p for p, by in named.items() if not (p in own and own[p].timed_out and own[p].at <= by[0].at)] or list(
        named
    )
    peer = max(roots, key=lambda p: len(named[p]))  # the first named among equals (dicts keep order)
    return peer, [s.rank for s in named[peer]]
