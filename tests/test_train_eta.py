"""The ETA (train/eta.py): work left per stage at that stage's measured rate; unrun stages from their batch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torus_train.job.spec import load_spec
from torus_train.train.eta import Eta


def default_eta(epochs: int = 7) -> Eta:
    """The default job's stages on 2 ranks over 10,000 images: 79 steps of 128 (epochs 0-1), 40 of 256
    (epochs 2-4), 20 of 512 (epochs 5-6)."""
    spec = load_spec(None, [("schedule.epochs", epochs)])
    return Eta.plan(spec.schedule.at(2), 10_000, epochs)


def test_plan_spans_every_stage():
    eta = default_eta()
    assert [(s.global_batch, s.first, s.end) for s in eta.stages] == [(128, 0, 158), (256, 158, 278), (512, 278, 318)]
    assert eta.boundary_steps == [79, 158, 198, 238, 278, 298, 318]
    assert eta.seconds_left(0) is None  # nothing measured, no prior


def test_prior_alone_scales_with_the_batch():
    eta = default_eta()
    eta.prior = (0.1, 128)  # the timed step: 0.1 s at 128 images
    assert eta.seconds_left(0) == pytest.approx(158 * 0.1 + 120 * 0.2 + 40 * 0.4)


def test_measured_stage_replaces_the_prior_and_unrun_stages_follow_its_rate_per_image():
    eta = default_eta()
    eta.prior = (1.0, 128)
    eta.observe(10, 10, 2.0)  # 0.2 s per step at 128
    assert eta.step_seconds(eta.stages[0]) == pytest.approx(0.2)
    assert eta.seconds_left(10) == pytest.approx(148 * 0.2 + 120 * 0.4 + 40 * 0.8)


def test_a_stages_first_interval_leaves_its_rate_once_others_exist():
    eta = default_eta()
    eta.observe(10, 10, 5.0)  # warm-up: 0.5 s per step
    assert eta.step_seconds(eta.stages[0]) == pytest.approx(0.5)
    eta.observe(20, 10, 2.0)
    eta.observe(30, 10, 2.0)
    assert eta.step_seconds(eta.stages[0]) == pytest.approx(0.2)


def test_two_measured_stages_fit_a_per_step_cost_plus_a_per_image_cost():
    eta = default_eta()
    eta.observe(158, 158, 158 * 0.2)  # 128 images: 0.2 s per step
    eta.observe(168, 10, 10 * 0.3, gap=1.5, crossed_boundary=True)  # 256 images: 0.3 s (0.1 + 128 * 0.1/128)
    # a + c * b through (128, 0.2), (256, 0.3): c = 0.1 / 128, a = 0.1; stage 2 (512): 0.5 s per step
    assert eta.step_seconds(eta.stages[2]) == pytest.approx(0.5)
    boundaries_ahead = sum(1 for b in eta.boundary_steps if b >= 168)
    assert eta.seconds_left(168) == pytest.approx(110 * 0.3 + 40 * 0.5 + boundaries_ahead * 1.5)


def test_steps_cap_the_plan():
    spec = load_spec(None, [("schedule.steps", 100)])
    eta = Eta.plan(spec.schedule.at(2), 10_000, 7, cap_steps=100)
    assert eta.stages[-1].end == 100 and sum(s.end - s.first for s in eta.stages) == 100
    assert eta.boundary_steps == [79]  # only the one whole epoch ends with an evaluation


def test_eta_does_not_import_torch():
    code = "import sys, torus_train.train.eta; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_huge_epoch_count_capped_by_steps_plans_at_once():
    import time

    from torus_train.job.spec import MAX_EPOCHS

    spec = load_spec(None, [("schedule.epochs", MAX_EPOCHS), ("schedule.steps", 100)])
    t = time.monotonic()
    eta = Eta.plan(spec.schedule.at(2), 10_000, MAX_EPOCHS, cap_steps=100)
    assert time.monotonic() - t < 1  # the epochs after the cap are not walked
    assert eta.stages[-1].end == 100 and eta.boundary_steps == [79]
