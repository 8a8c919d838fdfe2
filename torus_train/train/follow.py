"""The schedule's control at an epoch boundary (job/control.py): read the averaged noise scale once, decide
the next stage's start, and record the decision.

Every rank reads the same B_simple bits (the estimate's inputs travel inside the gradient all-reduce, so every
rank computes the same averages) and runs the same pure rule, so every rank decides the same without a
broadcast; the replica check compares the decided starts at every check and before every checkpoint
(train/step.py), so a rank that decided otherwise fails the run instead of training another schedule.

The decision is taken when an epoch completes, before that epoch's checkpoint: the checkpoint holds it
(Position.stage_starts), so a run resumed from there starts the same stage at the same epoch.
"""

from __future__ import annotations

import logging
import math

from torus_train.job.control import CONTROLS, Decision, decide
from torus_train.train.report import write_jsonl
from torus_train.train.state import RunState

log = logging.getLogger("torus_train.train")


def noise_scale(rs: RunState) -> float | None:
    """The averaged B_simple now (one host read), None where the run has no estimate (one rank, or nothing
    measured yet)."""
    if rs.noise is None:  # train/noise.py: noise.enabled off, or one rank
        return None
    value = float(rs.noise.b_simple().item())  # NaN until the |G|^2 average is positive
    return value if math.isfinite(value) and value > 0 else None


def follow_control(rs: RunState, epoch: int, epoch_done: bool) -> Decision | None:
    """After ``epoch`` completed: whether the next stage starts at epoch + 1 (the control's rule); the decision
    is kept in the position and the schedule rebuilt with it, so the LR follows the new batch by the spec's
    rule. Nothing for the fixed table."""
    s = rs.spec.schedule
    if not (epoch_done and CONTROLS[s.control].rule):
        return None
    world = rs.boot.info.world_size
    b, batches, d = noise_scale(rs), s.global_batches(world), None
    while (nxt := decide(s, batches, rs.pos.stage_starts, epoch + 1, b)) is not None:  # more than one: catch-up
        d = nxt
        rs.pos.stage_starts.append(d.epoch)
        record_decision(rs, d)
    if d is not None:
        rs.schedule = s.at(world, rs.pos.stage_starts)
    return d


def record_decision(rs: RunState, d: Decision) -> None:
    """A metrics.jsonl event and a progress line (rank 0), a log line on every rank."""
    log.info("%s", d.text())
    if not rs.rank0:
        return
    write_jsonl(
        rs.metrics,
        {
            "event": "stage_decision",
            "step": rs.pos.global_step,
            "epoch": d.epoch,
            "stage": d.stage,
            "noise_scale": d.noise_scale,
            "threshold": d.threshold,
            "why": d.why,
        },
    )
    rs.progress.say(d.text())
