"""Batch-size control: stage lookup, per-rank split, accumulation, LR policies and the errors users see."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from torus_train.errors import UserError
from torus_train.job.schedule import Schedule, Stage, steps_per_epoch


def G(until: int, batch: int) -> Stage:
    return Stage(until_epoch=until, global_batch=batch)


def two_stage(world_size=4, **kw):
    args = dict(stages=[G(2, 128), G(5, 512)], epochs=5, base_lr=0.1, lr_reference_batch=256, warmup_epochs=1,
                lr_policy="linear", decay="poly")
    args.update(kw)
    return Schedule(**args).check().at(world_size)


def test_stage_lookup_and_per_rank_split():
    s = two_stage()
    assert [s.stage_at(e).index for e in range(5)] == [0, 0, 1, 1, 1]
    assert s.stage_at(1.99).global_batch == 128 and s.stage_at(2.0).global_batch == 512
    assert s.stage_at(0).per_rank_batch == 32 and s.stage_at(3).per_rank_batch == 128
    assert s.stage_at(3).accumulation == 1 and s.stage_at(3).micro_batch == 128
    assert [st.start_epoch for st in s.stages] == [0, 2]
    assert s.steps_in_epoch(0, 10_000) == steps_per_epoch(10_000, 128) == math.ceil(10_000 / 128)
    assert s.steps_in_epoch(4, 10_000) == math.ceil(10_000 / 512)
    assert s.total_steps(10_000) == 2 * 79 + 3 * 20


def test_per_rank_stages_scale_with_the_world():
    sched = Schedule(stages=[Stage(until_epoch=2, per_rank_batch=32), Stage(until_epoch=5, per_rank_batch=64)],
                     lr_reference_batch=128).check()
    for world in (1, 3, 4, 2176):
        s = sched.at(world)
        assert [(st.global_batch, st.per_rank_batch) for st in s.stages] == [(32 * world, 32), (64 * world, 64)]
        assert s.peak_lr(0) == pytest.approx(0.1 * 32 * world / 128)


def test_accumulation_picks_smallest_split_under_limit():
    s = two_stage(max_per_rank_batch=48)
    info = s.stage_at(3)  # 128 per rank, limit 48 -> 4 x 32 (3 does not divide 128)
    assert (info.accumulation, info.micro_batch) == (4, 32)
    assert info.micro_batch * info.accumulation == info.per_rank_batch
    assert s.stage_at(0).accumulation == 1  # 32 <= 48
    s = two_stage(stages=[G(5, 4 * 96)], max_per_rank_batch=40)
    assert (s.stage_at(0).accumulation, s.stage_at(0).micro_batch) == (3, 32)


def test_linear_policy_scales_peak_with_batch_and_warms_up():
    s = two_stage(decay="none")
    assert s.peak_lr(0) == pytest.approx(0.1 * 128 / 256)
    assert s.peak_lr(1) == pytest.approx(0.1 * 512 / 256)
    assert s.lr_at(0.0) == pytest.approx(0.1 * s.peak_lr(0))   # warm-up starts at 10% of the peak
    assert s.lr_at(0.5) == pytest.approx(0.55 * s.peak_lr(0))
    assert s.lr_at(1.0) == pytest.approx(s.peak_lr(0))
    assert s.lr_at(2.0) == pytest.approx(s.peak_lr(1))         # the switch quadruples the LR with the batch
    lrs = [s.lr_at(i / 10) for i in range(10)]
    assert lrs == sorted(lrs)


def test_constant_policy_holds_first_peak():
    s = two_stage(lr_policy="constant", decay="none")
    assert s.lr_at(1.5) == s.lr_at(4.9) == pytest.approx(0.05)


def test_poly_cosine_step_decays():
    poly = two_stage(decay="poly", lr_policy="constant")
    assert poly.lr_at(1.0) == pytest.approx(0.05)
    t = (3.0 - 1) / 4
    assert poly.lr_at(3.0) == pytest.approx(0.05 * (1 - t) ** 2)
    assert poly.lr_at(5.0) == pytest.approx(0.0)
    cos = two_stage(decay="cosine", lr_policy="constant")
    assert cos.lr_at(3.0) == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    step = two_stage(decay="step", lr_policy="constant", epochs=8, stages=[G(8, 128)])
    assert [round(step.lr_at(e), 6) for e in (3.9, 4.0, 6.2)] == [0.05, 0.005, 0.0005]  # x0.1 at 1/2 and 3/4


@pytest.mark.parametrize("kw, match", [
    (dict(stages=[G(2, 128), G(5, 514)]),
     r"schedule\.stages\[1\]\.global_batch: 514 does not divide by world size 4"),
    (dict(stages=[G(3, 128), G(2, 512), G(5, 512)]),
     r"schedule\.stages\[1\]\.until_epoch: 2 must be greater than the previous stage's 3"),
    (dict(stages=[G(2, 256), G(5, 128)]), r"schedule\.stages\[1\]\.global_batch: 128 is smaller"),
    (dict(stages=[G(2, 256), Stage(5, per_rank_batch=16)]), r"schedule\.stages\[1\]: global batch 64 is smaller"),
    (dict(stages=[]), r"schedule\.stages: at least one stage"),
    (dict(stages=[Stage(until_epoch=5)]), r"schedule\.stages\[0\]: give exactly one of per_rank_batch"),
    (dict(stages=[Stage(5, 8, 64)]), r"schedule\.stages\[0\]: give exactly one of per_rank_batch"),
    (dict(lr_policy="sqrt"), r"schedule\.lr_policy: 'sqrt' is not one of linear, constant"),
    (dict(decay="exp"), r"schedule\.decay: 'exp'"),
    (dict(warmup_epochs=5), r"schedule\.warmup_epochs: 5"),
    (dict(base_lr=-1.0), r"schedule\.base_lr: -1.0"),
    (dict(max_per_rank_batch=-2), r"schedule\.max_per_rank_batch: -2"),
])
def test_bad_schedules_name_the_field(kw, match):
    with pytest.raises(UserError, match=match):
        two_stage(**kw)


def test_stages_past_the_run_are_cut_and_the_last_is_stretched():
    assert [st.until_epoch for st in two_stage(stages=[G(2, 128), G(4, 512)]).stages] == [2, 5]
    assert [st.until_epoch for st in two_stage(stages=[G(5, 128), G(6, 512)]).stages] == [5]


def test_table_lists_every_stage():
    s = two_stage(max_per_rank_batch=64)
    lines = s.table().splitlines()
    assert lines[0].split()[:2] == ["stage", "epochs"]
    assert lines[1].split()[:4] == ["0", "0-2", "128", "32"]
    assert lines[2].split()[:4] == ["1", "2-5", "512", "128"]
    assert "64 x 2" in lines[2]
    assert "warm-up 1 epoch(s)" in lines[-1]


def test_module_is_pure():
    code = "import sys, torus_train.job.schedule; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize("stages, field", [
    ("[{until_epoch = 2, global_batch = 128}, {until_epoch = 6, global_batch = 130}]",
     "schedule.stages[1].global_batch: 130 does not divide by world size 4"),
    ("[{until_epoch = 4, global_batch = 128}, {until_epoch = 2, global_batch = 256}]",
     "schedule.stages[1].until_epoch: 2 "),
])
def test_cli_rejects_bad_stages_with_exit_2(stages, field):
    r = subprocess.run([sys.executable, "-m", "torus_train", "run", "--dry-run", "--gpus", "4", "--grid", "2x2",
                        "--set", f"schedule.stages={stages}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert field in r.stderr


def test_stages_on_their_own_grids_split_their_batch_over_their_grid():
    from torus_train.job.legs import leg_at, leg_spec, plan_legs
    from torus_train.job.spec import load_spec

    stages = [{"until_epoch": 2, "per_rank_batch": 32, "grid": "2x1"}, {"until_epoch": 4, "per_rank_batch": 32},
              {"until_epoch": 6, "global_batch": 256, "grid": "4x2"}]
    spec = load_spec(None, [("schedule.epochs", 6), ("schedule.stages", stages), ("grid.grid", "2x1"),
                            ("grid.gpus", 2)])
    st = spec.schedule.at(8).stages  # bound to the last grid's world size: each stage keeps its own
    assert [(s.global_batch, s.per_rank_batch) for s in st] == [(64, 32), (256, 32), (256, 32)]
    assert spec.schedule.grid_spans() == [("2x1", 0, 2), ("", 2, 4), ("4x2", 4, 6)]
    legs = plan_legs(spec)  # the stage without a grid runs on the job's 2x1, with the first
    assert [(g.grid, g.start_epoch, g.until_epoch, g.last) for g in legs] == [("2x1", 0, 4, False),
                                                                            ("4x2", 4, 6, True)]
    first = leg_spec(spec, legs[0])
    assert (first.schedule.stop_epoch, first.checkpoint.at_end, first.grid.gpus) == (4, True, 2)
    assert (leg_spec(spec, legs[1]).grid.gpus, leg_spec(spec, legs[1]).schedule.stop_epoch) == (8, 0)
    assert [leg_at(legs, e) for e in (0, 3, 4, 6)] == [0, 0, 1, 1]
    cut = load_spec(None, [("schedule.epochs", 6), ("schedule.stages", stages), ("schedule.stop_epoch", 3)])
    assert [(g.grid, g.until_epoch, g.last) for g in plan_legs(cut)] == [("2x1", 3, True)]  # the default's grid
    cut.grid.grid = "2x2"
    assert [(g.grid, g.until_epoch, g.last) for g in plan_legs(cut)] == [("2x1", 2, False), ("", 3, True)]
    with pytest.raises(UserError, match=r"schedule.stages\[0\].grid"):
        load_spec(None, [("schedule.stages", [{"until_epoch": 2, "per_rank_batch": 32, "grid": "2y1"}])])
    with pytest.raises(UserError, match="schedule.stop_epoch"):
        load_spec(None, [("schedule.epochs", 6), ("schedule.stop_epoch", 7)])
