"""When each batch-size stage starts: the controls of ``schedule.control`` (pure; no torch import).

``fixed`` starts stage i at the table's epoch (the previous stage's ``until_epoch``). ``noise`` starts it at
the first epoch boundary where the averaged gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al.
2018, measured inside the gradient exchange: metrics.jsonl's ``noise_scale``) reaches ``noise_multiple`` times
the stage's global batch, within the stage's window [earliest_epoch, latest_epoch]; at latest_epoch it starts
whatever the measure says. Why that threshold: by the paper's model a batch B costs (1 + B_noise/B) times the
fewest steps and (1 + B/B_noise) times the fewest examples, so at B = B_simple both overheads are 2x; a
multiple of 2 grows the batch only once it costs at most 1.5x the examples, a multiple of 0.5 accepts 3x.

The rule is a pure function of (the schedule, the starts decided so far, the epoch, the B_simple value):
every rank holds the same B_simple bits (the values travel inside the all-reduce), so every rank decides the
same without a broadcast; the decided starts are kept in the checkpoint's position, so a resume, a restart, a
regrid and the next grid's ranks continue the same schedule.

The schedule module asks this one through ``CONTROLS`` with its own objects (duck-typed here, so that this
module does not import it back): ``problem`` (world-independent checks), ``resolve`` (each stage's
until_epoch given the starts decided so far; undecided ones at their latest), ``problem_at`` (checks at a
world size) and ``cells``/``footer`` (the dry run's table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    """One stage start the rule decided: recorded in metrics.jsonl, the progress line and the checkpoint."""

    stage: int
    """The stage that starts."""
    epoch: int
    """The epoch it starts at (an epoch boundary)."""
    noise_scale: float | None
    """The averaged B_simple the rule read (None: no estimate yet)."""
    threshold: float
    """noise_multiple x the stage's global batch."""
    why: str
    """"noise scale" (B_simple reached the threshold) or "latest epoch" (the window's end)."""

    def text(self) -> str:
        if self.why == "noise scale":
            return (
                f"stage {self.stage} starts at epoch {self.epoch}: B_simple {self.noise_scale:,.0f} >= "
                f"{self.threshold:,.0f} (noise scale)"
            )
        b = (
            "no B_simple measured"
            if self.noise_scale is None
            else f"B_simple {self.noise_scale:,.0f} < {self.threshold:,.0f}"
        )
        return f"stage {self.stage} starts at epoch {self.epoch}, its latest epoch ({b})"


class FixedControl:
    """The table: stage i starts at stages[i - 1].until_epoch."""

    name = "fixed"
    rule = False

    def problem(self, schedule: Any, p: str) -> str:
        for i, st in enumerate(schedule.stages):
            for key in ("earliest_epoch", "latest_epoch"):
                if getattr(st, key):
                    return (
                        f'{p}.stages[{i}].{key}: applies with {p}.control = "noise" only; the fixed table '
                        "starts each stage at the previous stage's until_epoch"
                    )
        return ""

    def resolve(self, schedule: Any, starts: Sequence[int]) -> list[dict]:
        """The table is the schedule: nothing changes."""
        return [{} for _ in schedule.stages]

    def problem_at(self, schedule: Any, stages: Sequence[Any], world_size: int) -> str:
        return ""

    def cells(self, batch: Any) -> list[str]:
        return [f"{st.start_epoch}-{st.until_epoch}" for st in batch.stages]

    def footer(self, batch: Any) -> str:
        return ""


def windows(schedule: Any) -> list[tuple[int, int]]:
    """(earliest, latest) start epoch of each stage; stage 0's is (0, 0). By default a stage may start one
    epoch after the previous one could (each stage runs at least an epoch) and at the table's epoch at the
    latest, so the table is the slowest the noise control grows the batch."""
    out: list[tuple[int, int]] = [(0, 0)]
    for i in range(1, len(schedule.stages)):
        st = schedule.stages[i]
        out.append((st.earliest_epoch or out[-1][0] + 1, st.latest_epoch or schedule.stages[i - 1].until_epoch))
    return out


def decide(
    schedule: Any, global_batches: Sequence[int], starts: Sequence[int], epoch: int, noise_scale: float | None
) -> Decision | None:
    """The noise rule at the boundary where ``epoch`` begins: the next stage's start, or None.

    starts: the epochs at which stages 1, 2, ... started so far; global_batches: each stage's global batch at
    the run's world size. A stage runs at least one epoch, and none starts at the end of the run. A stage
    whose latest epoch passed undecided (a checkpoint of the fixed table resumed under this control) is
    recorded where the schedule put it, its latest; call again until None to catch up."""
    nxt, last = len(starts) + 1, starts[-1] if starts else 0
    if nxt >= len(schedule.stages) or epoch >= schedule.epochs or epoch <= last:
        return None
    earliest, latest = windows(schedule)[nxt]
    threshold = schedule.noise_multiple * global_batches[nxt]
    known = noise_scale if noise_scale is not None and math.isfinite(noise_scale) else None
    if latest < epoch:  # passed undecided (resumed from a run under another control): it began at its latest
        return Decision(nxt, max(latest, last + 1), known, threshold, "latest epoch")
    if epoch < earliest:
        return None
    if known is not None and known >= threshold:
        return Decision(nxt, epoch, known, threshold, "noise scale")
    if epoch >= latest:
        return Decision(nxt, epoch, known, threshold, "latest epoch")
    return None


class NoiseControl:
    """Stages that follow the measured noise scale (the module's docstring)."""

    name = "noise"
    rule = True

    def problem(self, schedule: Any, p: str) -> str:
        m = schedule.noise_multiple
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
            return (
                f"{p}.noise_multiple: {m!r} must be a positive finite number (a stage starts when B_simple "
                "reaches this multiple of its global batch; 1 is the paper's balance)"
            )
        first = schedule.stages[0]
        if first.earliest_epoch or first.latest_epoch:
            return f"{p}.stages[0]: the first stage starts at epoch 0; earliest_epoch and latest_epoch apply to later stages"
        return self._window_problem(schedule, p)

    def _window_problem(self, schedule: Any, p: str) -> str:
        prev = 0
        for i, (lo, hi) in enumerate(windows(schedule)[1:], start=1):
            st = schedule.stages[i]
            for key in ("earliest_epoch", "latest_epoch"):
                if getattr(st, key) < 0:
                    return f"{p}.stages[{i}].{key}: {getattr(st, key)!r} must be >= 0 (0 = the default)"
            if lo > hi:
                return (
                    f"{p}.stages[{i}]: earliest_epoch {lo} is after latest_epoch {hi}, so the stage could never "
                    "start; make earliest_epoch <= latest_epoch"
                )
            if hi <= prev:
                return (
                    f"{p}.stages[{i}].latest_epoch: {hi} is not after stage {i - 1}'s latest start ({prev}); "
                    "stages start in order, at least one epoch apart"
                )
            prev = hi
        return ""

    def resolve(self, schedule: Any, starts: Sequence[int]) -> list[dict]:
        """Each stage's until_epoch: the decided start of the next stage, else the next stage's latest (kept
        increasing); the windows pinned, so that the resolved schedule keeps them."""
        wins, out = windows(schedule), list[dict]()
        for k, st in enumerate(schedule.stages):
            if k == len(schedule.stages) - 1:
                end = st.until_epoch
            else:
                end = starts[k] if k < len(starts) else wins[k + 1][1]
            end = max(end, out[-1]["until_epoch"] + 1 if out else 1)
            pin = {"earliest_epoch": wins[k][0], "latest_epoch": wins[k][1]} if k else {}
            out.append({"until_epoch": end, **pin})
        return out

    def problem_at(self, schedule: Any, stages: Sequence[Any], world_size: int) -> str:
        """A stage the rule must end needs a small batch to measure against (train/noise.py sizes): more than
        one rank (the rank's whole batch against the exchanged one), or on one rank gradient accumulation (the
        micro-batch against the rank's batch)."""
        for st in stages:
            if st.index < len(schedule.stages) - 1 and st.per_rank_batch == st.global_batch and st.accumulation == 1:
                return (
                    f'schedule.control = "noise": stage {st.index} runs on one rank without gradient accumulation, '
                    "so the noise scale has no small batch to compare (B_small = B_big) and no estimate; run 2 or "
                    "more ranks, set schedule.max_per_rank_batch below its per-rank batch (the micro-batch is then "
                    'the small batch), or use schedule.control = "fixed"'
                )
        return ""

    def cells(self, batch: Any) -> list[str]:
        wins = windows(batch.schedule)
        return ["0" if st.index == 0 else f"{wins[st.index][0]}..{wins[st.index][1]}" for st in batch.stages]

    def footer(self, batch: Any) -> str:
        m = batch.schedule.noise_multiple
        rules = "; ".join(
            f"stage {st.index} at B_simple >= {m * st.global_batch:,.0f}" for st in batch.stages if st.index
        )
        return (
            f'stages follow the noise scale (schedule.control = "noise", multiple {m:g}): each later stage starts '
            "at the first epoch boundary in its window where the averaged B_simple (metrics.jsonl noise_scale) "
            f"reaches {m:g} x its global batch, at the window's last epoch otherwise ({rules or 'one stage'}); "
            "LR at start depends on that epoch"
        )


CONTROLS: dict[str, Any] = {c.name: c for c in (FixedControl(), NoiseControl())}
"""Every control by its schedule.control name: the spec's allowed values and the docs' list come from here."""
