"""The measured noise scale of a run read back for `torus-train report` and `run --dry-run --noise-from`: its
panel on the report's picture and what it predicts for another global batch (pure: no torch; matplotlib
only inside the panel, which train/results.py's plot draws on its figure).

A run is any object with ``intervals``, ``decisions``, ``stages`` and ``summary`` (train/results.Run); this
module does not import results, which imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torus_train.job.noise import NoisePoint, curve, prediction_lines


def has_noise(run: Any) -> bool:
    """Whether any logging interval of the run carries a noise_scale."""
    return any(r.get("noise_scale") is not None for r in run.intervals)


def run_epochs(run: Any) -> int:
    """The run's epochs as far as its metrics go (the last interval's epoch + 1)."""
    return max((r["epoch"] for r in run.intervals), default=0) + 1


def points(run: Any) -> list[NoisePoint]:
    """The run's measured B_simple at its fraction of training (job/noise.py curve)."""
    return curve(run.intervals, run_epochs(run))


def predictions(run: Any, batches: Sequence[int]) -> list[str]:
    """`report RUN --batch N`: what the run's noise scale says of each global batch (job/noise.py)."""
    return prediction_lines(points(run), batches)


def noise_panel(ax, run: Any, pos: dict, c, label: str) -> None:
    """B_simple against epoch on a log axis, the global batch as a step line on the same axis (both are batch
    sizes), and each stage start: a vertical line, with the threshold the control compared (a marker) and
    why it started where the control decided it."""
    shown = [r for r in run.intervals if r.get("noise_scale") is not None and r["noise_scale"] > 0]
    if shown:
        ax.plot([pos[r["step"]] for r in shown], [r["noise_scale"] for r in shown], color=c, label=label + "B_simple")
    if run.intervals:
        xs = [pos[r["step"]] for r in run.intervals]
        ax.step(xs, [r["global_batch"] for r in run.intervals], "--", where="post", color=c, alpha=0.6,
                label=label + "global batch")  # fmt: skip
    for st in run.stages:
        if st["step"]:
            ax.axvline(pos.get(st["step"], st["epoch"]), color=c, lw=0.6, alpha=0.5)
    for d in run.decisions:
        ax.plot([d["epoch"]], [d["threshold"]], "v", color=c, ms=6)
        ax.annotate(
            f"stage {d['stage']}: {d['why']}",
            (d["epoch"], d["threshold"]),
            xytext=(3, 6),
            textcoords="offset points",
            fontsize=8,
            color=c,
        )
    dropped = sum(1 for r in run.intervals if r.get("noise_scale") is not None and r["noise_scale"] <= 0)
    title = "noise scale B_simple and the global batch"
    ax.set(xlabel="epoch", ylabel="examples", title=title + (f" ({dropped} values <= 0 left out)" if dropped else ""))
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
