"""The time a run has left, from the work left in each batch-size stage at that stage's own rate (pure).

A stage's steps take longer as its batch grows, so one rate for the whole run (the last interval's steps per
second) jumps at every switch. Here:

* a stage that has run: its own measured seconds per step over its logging intervals so far, without its
  first interval once there are others (the first one pays the loader's and the kernels' warm-up);
* a stage not yet run: estimated from its batch: with two or more measured stages a line a + c x batch through
  their seconds per step (a: the per-step cost every step pays, c: the cost of one image), with one, that
  stage's seconds per image times the batch;
* before any interval: the timed throw-away step at stage 0's batch (``prior``), used as a measurement of
  stage 0 until the first interval replaces it;
* the time between epochs (evaluation, checkpoint, loader switch) as measured per epoch boundary so far;
  before the first boundary it is not counted (an evaluation is forward passes only, over a validation set
  usually a tenth or less of the training set).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StageWork:
    """One stage of the run: its batch and its span of global steps [first, end)."""

    index: int
    global_batch: int
    first: int
    end: int
    seconds: float = 0.0
    """Measured training seconds of this stage so far (logging intervals, data wait included)."""
    steps: int = 0
    """Steps those seconds cover."""
    first_seconds: float = 0.0
    """Of those, the stage's first interval (left out of the rate once later intervals exist)."""
    first_steps: int = 0

    def rate(self) -> float:
        """Measured seconds per step (call only when steps > 0)."""
        if self.steps > self.first_steps > 0:
            return (self.seconds - self.first_seconds) / (self.steps - self.first_steps)
        return self.seconds / self.steps


@dataclass
class Eta:
    stages: list[StageWork]
    boundary_steps: list[int] = field(default_factory=list)
    """The global step at the end of each epoch (an evaluation and a checkpoint may follow)."""
    gap_seconds: float = 0.0
    boundaries: int = 0
    prior: tuple[float, int] | None = None
    """(seconds, global batch) of the timed step before training."""

    @classmethod
    def plan(cls, schedule, num_samples: int, end_epoch: int, cap_steps: int = 0) -> Eta:
        """The stages' step spans of a BatchSchedule over ``num_samples`` images per epoch, to ``end_epoch``,
        capped at ``cap_steps`` (schedule.steps) when given."""
        stages: dict[int, StageWork] = {}
        step, boundaries = 0, []
        for epoch in range(end_epoch):
            if cap_steps and step >= cap_steps:
                break  # the run stops here: later epochs add neither steps nor boundaries
            st = schedule.stage_at(epoch)
            full = schedule.steps_in_epoch(epoch, num_samples)
            n = max(0, min(full, cap_steps - step)) if cap_steps else full
            work = stages.setdefault(st.index, StageWork(st.index, st.global_batch, step, step))
            step += n
            work.end = step
            if n == full:  # an epoch cut by schedule.steps ends without evaluation or checkpoint
                boundaries.append(step)
        return cls([stages[k] for k in sorted(stages)], boundaries)

    def observe(
        self, global_step: int, steps: int, seconds: float, gap: float = 0.0, crossed_boundary: bool = False
    ) -> None:
        """A logging interval of ``steps`` steps that ended at ``global_step`` and took ``seconds``; ``gap``:
        seconds since the previous interval ended (an epoch boundary's evaluation and checkpoint when
        ``crossed_boundary``)."""
        first = global_step - steps
        for st in self.stages:
            inside = min(st.end, global_step) - max(st.first, first)
            if inside > 0:  # an interval lies inside one epoch, so inside one stage
                if not st.steps:
                    st.first_seconds, st.first_steps = seconds * inside / steps, inside
                st.seconds += seconds * inside / steps
                st.steps += inside
        if crossed_boundary and gap > 0:
            self.gap_seconds += gap
            self.boundaries += 1

    def step_seconds(self, st: StageWork) -> float | None:
        """Seconds per step of stage ``st``: measured, else estimated from the measured stages (or the prior)."""
        if st.steps:
            return st.rate()
        measured = [(s.global_batch, s.rate()) for s in self.stages if s.steps]
        if not measured and self.prior:
            measured = [(self.prior[1], self.prior[0])]
        if not measured:
            return None
        batches = {b for b, _ in measured}
        if len(batches) >= 2:
            a, c = _line(measured)
            if c > 0:
                return max(a, 0.0) + c * st.global_batch
        b, t = min(measured, key=lambda m: abs(m[0] - st.global_batch))
        return t / b * st.global_batch

    def boundary_seconds(self) -> float:
        """Seconds one epoch boundary takes (evaluation, checkpoint) as measured so far; 0 before the first."""
        return self.gap_seconds / self.boundaries if self.boundaries else 0.0

    def seconds_left(self, global_step: int) -> float | None:
        """Seconds until the run ends after ``global_step`` steps; None before anything was measured."""
        total = 0.0
        for st in self.stages:
            left = st.end - max(st.first, global_step)
            if left <= 0:
                continue
            t = self.step_seconds(st)
            if t is None:
                return None
            total += left * t
        ahead = sum(1 for b in self.boundary_steps if b >= global_step and b > 0)
        return total + ahead * self.boundary_seconds()


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares a, c of t = a + c * batch."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    var = sum((b - mx) ** 2 for b, _ in points)
    c = sum((b - mx) * (t - my) for b, t in points) / var
    return my - c * mx, c
