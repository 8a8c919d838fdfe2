"""`torus-train plan rehearse` end to end: real rank processes on the fake backend, the worker's real path.

A small world (8 ranks, 4x2, 2 per node) rehearses in well under a minute and must pass every rule, with the
phases and the graphed step's captures in its tables; the production spec at its full 2,176 ranks is the slow
test (the figures of docs/bench/2026-12-06-rehearse/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, invoke

ROOT = Path(__file__).resolve().parents[1]
SMALL = (
    "grid.gpus=8",
    "grid.grid=4x2",
    "grid.gpus_per_node=2",
    "job.name=small",
    "schedule.epochs=2",
    "schedule.stages=[{until_epoch=1,per_rank_batch=4},{until_epoch=2,per_rank_batch=8}]",
)


def rehearse(tmp_path: Path, *args: str):
    """(exit code, stdout, stderr, the --json document or None)."""
    out = tmp_path / "r.json"
    code, stdout, stderr = invoke("plan", "rehearse", *args, "--json", str(out))
    return code, stdout, stderr, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.timeout(600)
def test_a_small_world_passes_every_rule_with_its_phases(tmp_path):
    sets = [a for s in SMALL for a in ("--set", s)]
    code, out, err, doc = rehearse(
        tmp_path, "--spec", str(ROOT / "torus_train/specs/default.toml"), *sets, "--ranks", "3,4,7"
    )
    assert code == 0, out + err
    assert doc["ok"] and doc["findings"] == [] and doc["world"] == 8 and doc["ranks"] == [0, 3, 4, 7]
    assert "# verdict: passes every rule" in out
    straight = {row["phase"] for row in doc["phases"]["straight"]}
    resumed = {row["phase"]: row for row in doc["phases"]["resumed"]}
    assert {"start-up", "steps (stage 1)", "checkpoint", "finish"} <= straight
    assert {"resume", "steps (stage 2)", "evaluation", "steps (stage 2): graph probe"} <= set(resumed)
    assert resumed["steps (stage 2)"]["captured"] > 0  # the replays of the graphed step
    assert resumed["start-up"]["groups_made"] == 2  # the rows and the columns: one split each


def test_a_spec_without_a_grid_and_a_rank_outside_the_world_are_refused(tmp_path):
    code, _, err, _ = rehearse(tmp_path, "--spec", str(ROOT / "torus_train/specs/default.toml"), "--set", "grid.grid=")
    assert_one_line_error(code, err, "the spec has no grid.grid")
    code, _, err, _ = rehearse(tmp_path, "--spec", str(ROOT / "torus_train/specs/default.toml"), "--ranks", "0,2")
    assert_one_line_error(code, err, "--ranks: 2 is out of range; give an integer from 0 to 1")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_production_spec_at_2176_ranks_passes_every_rule(tmp_path):
    code, out, err, doc = rehearse(tmp_path, "--spec", str(ROOT / "scripts/specs/imagenet_2176.toml"))
    assert code == 0, out + err
    assert doc["world"] == 2176 and doc["ranks"] == [0, 31, 32, 1087, 2175] and doc["findings"] == []
    for leg in ("straight", "resumed"):
        for rank, (comms, peers) in doc["communicators"][leg].items():
            assert peers == 0 and comms <= 4, (leg, rank, comms, peers)
