"""TensorBoard scalars of a run, written by rank 0 under OUT/tensorboard/ when the `tensorboard` package is
installed (`pip install -e '.[tensorboard]'`); without it nothing is imported and nothing is written.

Every scalar is written at the same step number as its metrics.jsonl line (the global optimizer step). A
resumed run opens the writer with ``purge_step`` just after the checkpoint's step, so TensorBoard drops what the
interrupted run wrote after it and the curves continue, as metrics.jsonl is cut back to the same step.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

INTERVAL_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "global_batch": "train/global_batch",
    "images_per_second": "speed/images_per_second",
    "data_time": "speed/data_wait_s",
    "step_time": "speed/step_s",
    "skipped_steps": "train/skipped_steps",
    "noise_scale": "noise/b_simple",
    "noise_g2": "noise/g2",
    "noise_trace": "noise/trace",
}
"""metrics.jsonl interval field -> TensorBoard tag."""
EVAL_TAGS = {"top1": "val/top1", "top5": "val/top5", "val_loss": "val/loss"}
FLUSH_S = 10  # a run in progress shows up within this many seconds


def available() -> bool:
    """Whether the tensorboard package is installed (looked up without importing it)."""
    if "tensorboard" in sys.modules:  # imported already, or blocked (None)
        return sys.modules["tensorboard"] is not None
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):
        return False


class Board:
    """Rank 0's writer, opened at the first scalar (or at ``resume``); a no-op without tensorboard."""

    def __init__(self, out: Path):
        self.folder = Path(out) / "tensorboard"
        self.enabled = available()
        self._writer = None
        self._purge: int | None = None

    def resume(self, step: int) -> None:
        """A resumed run from ``step``: the interrupted run's events after it are dropped (TensorBoard purges
        steps >= purge_step; metrics.jsonl keeps the lines up to and with ``step``)."""
        self._purge = step + 1

    def _open(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.folder), purge_step=self._purge, flush_secs=FLUSH_S)
        return self._writer

    def write(self, rec: dict, tags: dict[str, str]) -> None:
        """The fields of ``rec`` named in ``tags`` at step rec["step"]."""
        if not self.enabled:
            return
        w = self._open()
        for name, tag in tags.items():
            if rec.get(name) is not None:
                w.add_scalar(tag, rec[name], rec["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
