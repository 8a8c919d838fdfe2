"""schedule.control: the noise rule as a pure function, the schedule it resolves to, and the inputs refused
before launch (job/control.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from torus_train.job.control import CONTROLS, decide, windows
from torus_train.job.legs import leg_spec, plan_legs
from torus_train.job.schedule import Schedule, ScheduleError, Stage
from torus_train.job.spec import load_spec


def noise_schedule(**kw) -> Schedule:
    """Three stages on per-rank batches 64 -> 128 -> 256 (global 128, 256, 512 on 2 ranks), table 2, 5, 7."""
    args = dict(
        epochs=7,
        stages=[Stage(2, 64), Stage(5, 128), Stage(7, 256)],
        control="noise",
        lr_reference_batch=128,
        decay="none",
    )
    args.update(kw)
    return Schedule(**args).check()


def run_rule(s: Schedule, values: dict[int, float | None], world: int = 2) -> list[tuple[int, str]]:
    """Drive the rule over every epoch boundary as the loop does; (epoch, why) of each start."""
    starts: list[int] = []
    out = []
    for epoch in range(1, s.epochs + 1):
        d = decide(s, s.global_batches(world), starts, epoch, values.get(epoch))
        if d is not None:
            starts.append(d.epoch)
            out.append((d.epoch, d.why))
    return out


def test_a_stage_starts_at_the_first_boundary_where_the_noise_scale_reaches_its_multiple():
    s = noise_schedule()
    # stage 1 needs B_simple >= 256, stage 2 >= 512
    assert run_rule(s, {1: 100, 2: 300, 3: 400, 4: 600}) == [(2, "noise scale"), (4, "noise scale")]
    assert run_rule(s, {1: 300, 2: 600}) == [(1, "noise scale"), (2, "noise scale")]
    # never reached: the table's epochs, the default latest starts
    assert run_rule(s, dict.fromkeys(range(8), 10.0)) == [(2, "latest epoch"), (5, "latest epoch")]
    # no estimate (one value missing, a nan, an inf) counts as not reached
    assert run_rule(s, {1: None, 2: math.nan, 3: math.inf}) == [(2, "latest epoch"), (5, "latest epoch")]


def test_the_multiple_scales_the_threshold():
    s = noise_schedule(noise_multiple=2.0)
    assert run_rule(s, {1: 300, 2: 600, 3: 1000, 4: 1100}) == [(2, "noise scale"), (4, "noise scale")]
    d = decide(s, s.global_batches(2), [], 2, 600.0)
    assert (
        d is not None
        and d.threshold == 512
        and d.text() == "stage 1 starts at epoch 2: B_simple 600 >= 512 (noise scale)"
    )


def test_earliest_and_latest_bound_the_start():
    s = noise_schedule(
        stages=[Stage(2, 64), Stage(5, 128, earliest_epoch=3, latest_epoch=4), Stage(7, 256, latest_epoch=6)]
    )
    assert windows(s) == [(0, 0), (3, 4), (4, 6)]
    assert run_rule(s, {1: 1e9, 2: 1e9, 3: 1e9, 4: 1e9}) == [(3, "noise scale"), (4, "noise scale")]
    assert run_rule(s, {}) == [(4, "latest epoch"), (6, "latest epoch")]


def test_stages_passed_undecided_are_recorded_at_their_latest_epoch():
    """A checkpoint of the fixed table (no starts recorded) resumed under the noise control at epoch 6: the
    schedule already ran stages 1 and 2 from their latest epochs, 2 and 5; the rule records them there."""
    s = noise_schedule()
    starts: list[int] = []
    while (d := decide(s, s.global_batches(2), starts, 6, None)) is not None:
        starts.append(d.epoch)
    assert starts == [2, 5] and s.at(2, starts).stage_at(5.5).index == 2


def test_the_global_batch_is_the_stages_world_and_a_stage_runs_at_least_an_epoch():
    s = noise_schedule()
    assert s.global_batches(4) == [256, 512, 1024]
    # a huge B_simple at every boundary still starts one stage per boundary
    assert run_rule(s, dict.fromkeys(range(8), 1000000000000.0), world=4) == [(1, "noise scale"), (2, "noise scale")]


def test_the_decided_starts_resolve_the_schedule_and_the_lr_follows_the_batch():
    s = noise_schedule(lr_policy="linear")
    before = s.at(2)
    assert [(st.start_epoch, st.until_epoch) for st in before.stages] == [(0, 2), (2, 5), (5, 7)]
    after = s.at(2, [1, 3])
    assert [(st.start_epoch, st.until_epoch) for st in after.stages] == [(0, 1), (1, 3), (3, 7)]
    assert after.lr_at(1.0) == pytest.approx(0.1 * 256 / 128) and after.lr_at(3.5) == pytest.approx(0.4)
    assert after.schedule.stages[2].latest_epoch == 5  # the windows are kept in the resolved schedule
    assert "1..2" in after.table() and "B_simple >= 512" in after.table()


def test_the_fixed_table_is_unchanged_and_refuses_the_windows():
    s = noise_schedule(control="fixed")
    assert s.resolved([1, 3]) is s and CONTROLS["fixed"].rule is False
    bad = noise_schedule(control="noise", stages=[Stage(2, 64), Stage(5, 128, earliest_epoch=1)])
    bad.control = "fixed"
    with pytest.raises(ScheduleError, match=r'stages\[1\]\.earliest_epoch: applies with schedule.control = "noise"'):
        bad.check()


@pytest.mark.parametrize(
    "override, message",
    [
        ("schedule.control=adaptive", "schedule.control: 'adaptive' is not one of fixed, noise"),
        ("schedule.noise_multiple=0", "schedule.noise_multiple: 0.0 must be a positive finite number"),
        ("schedule.noise_multiple=-2", "schedule.noise_multiple: -2.0 must be a positive finite number"),
        ("schedule.noise_multiple=nan", "schedule.noise_multiple: nan must be a finite number"),
        ("schedule.noise_multiple=inf", "schedule.noise_multiple: inf must be a finite number"),
        (
            "schedule.stages=[{until_epoch=2,per_rank_batch=64},{until_epoch=7,per_rank_batch=128,"
            "earliest_epoch=5,latest_epoch=3}]",
            "schedule.stages[1]: earliest_epoch 5 is after latest_epoch 3",
        ),
        (
            "schedule.stages=[{until_epoch=2,per_rank_batch=64,latest_epoch=1},{until_epoch=7,per_rank_batch=128}]",
            "schedule.stages[0]: the first stage starts at epoch 0",
        ),
        ("noise.enabled=false", "noise.enabled = false turns the measure off"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_launch(tmp_path, override, message):
    argv = [sys.executable, "-m", "torus_train", "run", "--out", str(tmp_path / "o"), "--set", override]
    if not override.startswith("schedule.control"):
        argv += ["--set", "schedule.control=noise"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()  # nothing launched, nothing written


def test_noise_on_one_rank_without_accumulation_is_refused_before_launch(tmp_path):
    argv = [sys.executable, "-m", "torus_train", "run", "--out", str(tmp_path / "o"), "--gpus", "1", "--grid", "1x1"]
    r = subprocess.run([*argv, "--set", "schedule.control=noise"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "stage 0 runs on one rank without gradient accumulation" in r.stderr
    assert not (tmp_path / "o").exists()
    # the same rank accumulating micro-batches has a small batch (the micro-batch): the plan passes (a dry run)
    ok = subprocess.run(
        [*argv, "--dry-run", "--set", "schedule.control=noise", "--set", "schedule.max_per_rank_batch=32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "32 x 2" in ok.stdout and "stage 1 at B_simple >= 128" in ok.stdout, ok.stderr


def test_the_dry_run_prints_the_rule_instead_of_fixed_epochs(tmp_path):
    argv = [sys.executable, "-m", "torus_train", "run", "--dry-run", "--out", str(tmp_path / "o")]
    r = subprocess.run(
        [*argv, "--set", "schedule.control=noise", "--set", "schedule.noise_multiple=2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("# batch schedule")[1]
    assert "starts in" in table and "1..2" in table and "2..5" in table
    assert "stage 1 at B_simple >= 512; stage 2 at B_simple >= 1,024" in table
    assert " 0-2 " not in table


def test_grid_legs_under_the_noise_control_stop_at_the_next_grids_first_stage():
    spec = load_spec(
        None,
        [
            ("grid.gpus", 2),
            ("grid.grid", "2x1"),
            ("schedule.control", "noise"),
            ("schedule.epochs", 4),
            (
                "schedule.stages",
                [
                    {"until_epoch": 2, "per_rank_batch": 32, "grid": "2x1"},
                    {"until_epoch": 4, "per_rank_batch": 32, "grid": "2x2", "latest_epoch": 3},
                ],
            ),
        ],
    )
    legs = plan_legs(spec)
    assert [(leg.grid, leg.start_epoch, leg.until_epoch, leg.next_grid_stage) for leg in legs] == [
        ("2x1", 0, 3, 1),
        ("2x2", 3, 4, 0),
    ]
    first = leg_spec(spec, legs[0])
    assert (first.schedule.stop_stage, first.schedule.stop_epoch, first.checkpoint.at_end) == (1, 3, True)
    # the rule started stage 1 at epoch 1: the legs left are planned again from there
    moved = plan_legs(spec, [1])
    assert [(leg.grid, leg.start_epoch, leg.until_epoch) for leg in moved] == [("2x1", 0, 1), ("2x2", 1, 4)]
    assert leg_spec(spec, moved[1]).schedule.stop_stage == 0


def test_the_replica_check_compares_the_decided_starts():
    """Every rank decides alone; the replica check's vector carries the starts, so a rank that decided another
    epoch (or one start more) differs from the others in that slot and the check fails the run."""
    import torch.nn as nn

    from torus_train.train.state import Position
    from torus_train.train.step import CHECKED, replica_vector

    model = nn.Linear(3, 2)
    slot = CHECKED.index("batch-size stage starts")
    vectors = [replica_vector(model, Position(stage_starts=s), False) for s in ([], [2], [3], [2, 5], [2, 6])]
    assert len({int(v[slot]) for v in vectors}) == 5
    assert all(v[:slot].tolist() == vectors[0][:slot].tolist() for v in vectors)  # only that slot differs


def test_an_elastic_shrink_keeps_the_windows_and_the_decided_starts():
    """--elastic drops a node: every stage keeps its global batch and window, and the starts already decided
    (the checkpoint's) resolve the shrunk schedule as they did the full one."""
    from torus_train.job.elastic import shrink
    from torus_train.job.topology import Grid

    spec = load_spec(
        None,
        [
            ("grid.gpus", 4),
            ("grid.grid", "2x2"),
            ("schedule.control", "noise"),
            (
                "schedule.stages",
                [
                    {"until_epoch": 2, "per_rank_batch": 64},
                    {"until_epoch": 7, "per_rank_batch": 128, "latest_epoch": 4},
                ],
            ),
        ],
    )
    small, _ = shrink(spec, Grid(2, 2, 2), lost_node=1)
    assert [(st.global_batch, st.latest_epoch) for st in small.schedule.stages] == [(256, 0), (512, 4)]
    full, after = spec.schedule.at(4, [3]), small.schedule.at(2, [3])
    assert [(st.start_epoch, st.global_batch) for st in after.stages] == [
        (st.start_epoch, st.global_batch) for st in full.stages
    ]
    assert after.lr_at(3.5) == full.lr_at(3.5)
