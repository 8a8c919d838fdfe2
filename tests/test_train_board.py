"""TensorBoard scalars (train/board.py): written at metrics.jsonl's steps and continued on resume when the
package is installed; without it nothing is imported and nothing is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_without_tensorboard_nothing_is_imported_or_written(tmp_path):
    """The package blocked (as if not installed): the board writes nothing and imports no TensorBoard code."""
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from pathlib import Path\n"
        "from torus_train.train.board import Board, INTERVAL_TAGS, available\n"
        f"b = Board(Path({str(tmp_path)!r}))\n"
        "b.resume(4)\n"
        "b.write({'step': 5, 'loss': 1.0, 'lr': 0.1}, INTERVAL_TAGS)\n"
        "b.close()\n"
        "assert not available() and not b.enabled\n"
        "loaded = [m for m in sys.modules if 'tensorboard' in m and sys.modules[m] is not None]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert not (tmp_path / "tensorboard").exists()


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder))
    ea.Reload()
    return [(e.step, round(e.value, 6)) for e in ea.Scalars(tag)]


def test_scalars_at_the_metrics_steps_and_a_resume_continues_the_curve(tmp_path):
    pytest.importorskip("tensorboard")
    from torus_train.train.board import EVAL_TAGS, INTERVAL_TAGS, Board

    first = Board(tmp_path)
    for step in (2, 4, 6, 8):
        first.write(
            {
                "step": step,
                "loss": 1.0 / step,
                "lr": 0.1,
                "global_batch": 64,
                "images_per_second": 100.0,
                "data_time": 0.01,
                "step_time": 0.1,
                "skipped_steps": 0,
            },
            INTERVAL_TAGS,
        )
    first.write({"step": 8, "top1": 0.5, "top5": 0.9, "val_loss": 1.5}, EVAL_TAGS)
    first.write({"step": 10, "loss": 0.123}, INTERVAL_TAGS)  # after the checkpoint at step 8: to be dropped
    first.close()
    again = Board(tmp_path)  # resumed from the checkpoint at step 8: metrics.jsonl keeps steps <= 8
    again.resume(8)
    again.write({"step": 10, "loss": 0.1}, INTERVAL_TAGS)
    again.write({"step": 12, "loss": 0.08}, INTERVAL_TAGS)
    again.close()
    assert _scalars(tmp_path / "tensorboard", "train/loss") == [
        (2, 0.5),
        (4, 0.25),
        (6, 0.166667),
        (8, 0.125),
        (10, 0.1),
        (12, 0.08),
    ]
    assert _scalars(tmp_path / "tensorboard", "val/top1") == [(8, 0.5)]
    assert _scalars(tmp_path / "tensorboard", "train/global_batch") == [(2, 64), (4, 64), (6, 64), (8, 64)]
