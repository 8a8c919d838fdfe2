"""Stages on their own grids through the CLI without starting ranks: --dry-run shows the legs, and what cannot
work is refused with one line (exit 2)."""

from __future__ import annotations

import pytest

from torus_train.cli import main

STAGES = 'schedule.stages=[{until_epoch=1,global_batch=32,grid="2x1"},{until_epoch=3,global_batch=64,grid="2x2"}]'
BASE = ["run", "--data", "synthetic", "--epochs", "3", "--set", STAGES]


class Result:
    def __init__(self, code: int, output: str):
        self.exit_code, self.output = code, output


def cli(*args: str) -> Result:
    """torus-train ARGS through the console entry point (one-line errors, exit codes), output captured."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), pytest.raises(SystemExit) as e:
        main(list(args))
        raise SystemExit(0)
    return Result(e.value.code or 0, buf.getvalue())


def test_dry_run_prints_the_first_legs_plan_and_the_legs(tmp_path):
    r = cli(*BASE, "--out", str(tmp_path / "run"), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "grid 2x1: 2 ranks" in r.output  # the first leg's plan
    assert "grid stages: epochs 0-1 on grid 2x1, then epochs 1-3 on grid 2x2" in r.output
    assert 'grid = "2x1"' in r.output and 'grid = "2x2"' in r.output  # the resolved spec keeps the stages' grids


def test_what_cannot_move_is_refused(tmp_path):
    r = cli(*BASE, "--out", str(tmp_path / "run"), "--elastic", "--max-restarts", "2")
    assert r.exit_code == 2 and "--elastic cannot be combined with stages that name their own grid" in r.output
    r = cli(*BASE, "--set", 'schedule.stages=[{until_epoch=3,global_batch=30,grid="2x2"}]', "--dry-run")
    assert r.exit_code == 2 and "schedule.stages[0].global_batch: 30 does not divide by world size 4" in r.output
    r = cli(*BASE, "--set", "schedule.stop_epoch=9", "--dry-run")
    assert r.exit_code == 2 and "schedule.stop_epoch: 9 must be in [0, schedule.epochs (3)]" in r.output
