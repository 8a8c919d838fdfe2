"""Batch-size control: stage lookup, per-rank split, accumulation, LR policies and the errors users see."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from torus_train.errors import UserError
from torus_train.job.schedule import Schedule, Stage, steps_per_epoch


def G(until: int, batch: int) -> Stage:
    return Stage(until_epoch=until, global_batch=batch)


def two_stage(world_size=4, **kw):
    args = dict(
        stages=[G(2, 128), G(5, 512)],
        epochs=5,
        base_lr=0.1,
        lr_reference_batch=256,
        warmup_epochs=1,
        lr_policy="linear",
        decay="poly",
    )
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
    sched = Schedule(
        stages=[Stage(until_epoch=2, per_rank_batch=32), Stage(until_epoch=5, per_rank_batch=64)],
        lr_reference_batch=128,
    ).check()
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
    assert s.lr_at(0.0) == pytest.approx(0.1 * s.peak_lr(0))  # warm-up starts at 10% of the peak
    assert s.lr_at(0.5) == pytest.approx(0.55 * s.peak_lr(0))
    assert s.lr_at(1.0) == pytest.approx(s.peak_lr(0))
    assert s.lr_at(2.0) == pytest.approx(s.peak_lr(1))  # the switch quadruples the LR with the batch
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


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(stages=[G(2, 128), G(5, 514)]),
            r"schedule\.stages\[1\]\.global_batch: 514 does not divide by world size 4",
        ),
        (
            dict(stages=[G(3, 128), G(2, 512), G(5, 512)]),
            r"schedule\.stages\[1\]\.until_epoch: 2 must be greater than the previous stage's 3",
        ),
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
    ],
)
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


@pytest.mark.parametrize(
    "stages, field",
    [
        (
            "[{until_epoch = 2, global_batch = 128}, {until_epoch = 6, global_batch = 130}]",
            "schedule.stages[1].global_batch: 130 does not divide by world size 4",
        ),
        (
            "[{until_epoch = 4, global_batch = 128}, {until_epoch = 2, global_batch = 256}]",
            "schedule.stages[1].until_epoch: 2 ",
        ),
    ],
)
def test_cli_rejects_bad_stages_with_exit_2(stages, field):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "run",
            "--dry-run",
            "--gpus",
            "4",
            "--grid",
            "2x2",
            "--set",
            f"schedule.stages={stages}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert field in r.stderr


def test_stages_on_their_own_grids_split_their_batch_over_their_grid():
    from torus_train.job.legs import leg_at, leg_spec, plan_legs
    from torus_train.job.spec import load_spec

    stages = [
        {"until_epoch": 2, "per_rank_batch": 32, "grid": "2x1"},
        {"until_epoch": 4, "per_rank_batch": 32},
        {"until_epoch": 6, "global_batch": 256, "grid": "4x2"},
    ]
    spec = load_spec(
        None, [("schedule.epochs", 6), ("schedule.stages", stages), ("grid.grid", "2x1"), ("grid.gpus", 2)]
    )
    st = spec.schedule.at(8).stages  # bound to the last grid's world size: each stage keeps its own
    assert [(s.global_batch, s.per_rank_batch) for s in st] == [(64, 32), (256, 32), (256, 32)]
    assert spec.schedule.grid_spans() == [("2x1", 0, 2), ("", 2, 4), ("4x2", 4, 6)]
    legs = plan_legs(spec)  # the stage without a grid runs on the job's 2x1, with the first
    assert [(g.grid, g.start_epoch, g.until_epoch, g.last) for g in legs] == [("2x1", 0, 4, False), ("4x2", 4, 6, True)]
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
    with pytest.raises(UserError, match=re.escape("schedule.stop_epoch")):
        load_spec(None, [("schedule.epochs", 6), ("schedule.stop_epoch", 7)])


def _brute_accumulation(per_rank: int, limit: int) -> int:
    """The definition, by brute force: the smallest number of equal micro-batches of at most ``limit``."""
    if not limit or per_rank <= limit:
        return 1
    return next(a for a in range(2, per_rank + 1) if per_rank % a == 0 and per_rank // a <= limit)


def test_accumulation_is_the_smallest_split_for_every_small_case():
    from torus_train.job.schedule import _accumulation

    for per_rank in range(1, 400):
        for limit in (0, 1, 2, 3, 5, 7, 16, 48, 100, 399):
            assert _accumulation(per_rank, limit) == _brute_accumulation(per_rank, limit), (per_rank, limit)


@pytest.mark.parametrize(
    "per_rank, limit, room",
    [
        (2**31 - 1, 1, "(it would take 2,147,483,647)"),  # a prime under micro-batches of 1: one pass per sample
        (2**31 - 1, 2**20, None),  # prime: 2,048 passes would do, but only micro-batches of 1 divide it
        (4099 * 4097, 4099, "(it would take 4,097)"),  # 4,097 passes of 4,099: one more than allowed
    ],
)
def test_absurd_accumulation_is_refused_at_once(per_rank, limit, room):
    from torus_train.job.schedule import MAX_ACCUMULATION

    sched = Schedule(stages=[Stage(until_epoch=5, per_rank_batch=per_rank)], max_per_rank_batch=limit).check()
    with pytest.raises(
        UserError,
        match=r"schedule\.stages\[0\]: a per-rank batch of [\d,]+ does not split into "
        rf"at most {MAX_ACCUMULATION:,} equal micro-batches",
    ) as e:
        sched.at(1)
    assert (room in str(e.value)) if room else ("it would take" not in str(e.value))
    assert str(e.value).count("\n") == 0 and "schedule.max_per_rank_batch" in str(e.value)
    ok = Schedule(stages=[Stage(until_epoch=5, per_rank_batch=4096 * 3)], max_per_rank_batch=3).check().at(1)
    assert (ok.stages[0].accumulation, ok.stages[0].micro_batch) == (MAX_ACCUMULATION, 3)  # the cap itself runs


def test_dry_run_with_a_huge_batch_split_into_micro_batches_of_one_ends_at_once():
    """Issue 33: this spun at full CPU in the micro-batch split; now one line and exit 2, in well under a second
    of work (the limit leaves room for a slow machine's interpreter start)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "run",
            "--dry-run",
            "--set",
            "schedule.stages=[{until_epoch=7, per_rank_batch=2147483647}]",
            "--set",
            "schedule.max_per_rank_batch=1",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "torus-train: error: schedule.stages[0]: a per-rank batch of 2,147,483,647 does not split into at most "
        "4,096 equal micro-batches of at most 1 samples (schedule.max_per_rank_batch) (it would take 2,147,483,647); "
        "raise schedule.max_per_rank_batch or choose a per-rank batch that such micro-batches divide"
    ]
    assert "Traceback" not in r.stdout + r.stderr


def test_huge_epoch_counts_and_many_stages_cost_one_term_per_stage():
    import time

    from torus_train.job.schedule import MAX_STAGES

    t = time.monotonic()
    big = two_stage(epochs=2**31 - 1, warmup_epochs=0, stages=[G(2, 128), G(2**31 - 1, 512)])
    assert big.total_steps(10_000) == 2 * 79 + (2**31 - 3) * 20
    assert big.stage_at(2**31 - 2).index == 1 and big.stage_at(10**12).index == 1  # past the end: the last stage
    stages = [G(i + 1, 128 + 4 * (i // 7)) for i in range(MAX_STAGES)]  # many stages, each with its own split
    many = two_stage(epochs=MAX_STAGES, stages=stages, max_per_rank_batch=7)
    assert [many.stage_at(e + 0.5).index for e in range(MAX_STAGES)] == list(range(MAX_STAGES))
    assert many.total_steps(1000) == sum(many.steps_in_epoch(e, 1000) for e in range(MAX_STAGES))
    many.table()
    assert time.monotonic() - t < 5  # each of these was a loop over every epoch or every stage
    with pytest.raises(UserError, match=rf"schedule\.stages: {MAX_STAGES + 1:,} stages; at most {MAX_STAGES:,}"):
        two_stage(epochs=MAX_STAGES + 1, stages=[G(i + 1, 128) for i in range(MAX_STAGES + 1)])


def test_total_steps_counts_every_epoch_up_to_the_stop_and_the_cap():
    s = two_stage(stop_epoch=3)
    assert s.total_steps(10_000) == 2 * 79 + 20
    assert two_stage(steps=100).total_steps(10_000) == 100
    assert two_stage(steps=10**6).total_steps(10_000) == 2 * 79 + 3 * 20


def test_the_epoch_count_is_bounded_in_the_spec():
    from torus_train.job.spec import MAX_EPOCHS, SpecError, load_spec

    assert load_spec(None, [("schedule.epochs", MAX_EPOCHS)]).schedule.epochs == MAX_EPOCHS
    with pytest.raises(SpecError, match=rf"^schedule\.epochs: 1000001 must be <= {MAX_EPOCHS:,}$"):
        load_spec(None, [("schedule.epochs", MAX_EPOCHS + 1)])
