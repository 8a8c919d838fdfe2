"""Grid choice by predicted time and whole plans: the fastest factor pair, the Sony point, sweeps."""
from __future__ import annotations

import pytest

from torus_train.job.topology import Grid, GridError
from torus_train.plan.cost import ALGORITHMS, MODELS, allreduce_cost
from torus_train.plan.networks import PRESETS
from torus_train.plan.search import best_grid, make_plan, rank_grids, sweep

ABCI = PRESETS["abci-v100"]
R50_FP16 = MODELS["resnet50"].gradient_bytes("fp16")


def test_best_grid_is_the_fastest_factor_pair_and_says_why():
    g, why = best_grid(1088, ABCI, R50_FP16)
    t = allreduce_cost("torus", g, ABCI, R50_FP16).seconds
    for x in (1, 2, 4, 8, 16, 17, 32, 34, 64, 68, 136, 272, 544, 1088):
        assert t <= allreduce_cost("torus", Grid(x, 1088 // x, 4), ABCI, R50_FP16).seconds + 1e-15
    assert "fastest predicted torus" in why and "ms" in why
    assert [c.seconds for _, c in rank_grids(1088, ABCI, R50_FP16)] == sorted(
        c.seconds for _, c in rank_grids(1088, ABCI, R50_FP16))
    with pytest.raises(GridError):
        best_grid(0, ABCI, R50_FP16)


def test_plan_for_sony_point_uses_datasheet_figures():
    p = make_plan(1088, ABCI, "resnet50", 32, grid=Grid(32, 34, 4))
    assert p.gradient_bytes == 25_557_032 * 2
    assert p.compute_seconds == pytest.approx(32 / 1376)
    for algo, a in p.algorithms.items():
        assert 0 < a.scaling_efficiency <= 1, algo
        assert a.step_seconds >= p.compute_seconds
    assert p.algorithms["torus"].steps == 128
    assert p.algorithms["torus"].allreduce_seconds < p.algorithms["flat"].allreduce_seconds
    d = p.to_json()
    assert set(d["algorithms"]["torus"]) >= {"steps", "bytes_across_nodes", "allreduce_seconds",
                                              "step_seconds", "scaling_efficiency"}
    with pytest.raises(GridError, match="1088"):
        make_plan(1088, ABCI, grid=Grid(32, 32, 4))


def test_sweep_covers_every_algorithm():
    s = sweep(PRESETS["dgx-h100"], R50_FP16, [64, 256, 1024, 4096])
    assert set(s) == set(ALGORITHMS)
    flat = [t for _, t in s["flat"]]
    assert flat == sorted(flat)                           # a flat ring only gets slower with more ranks
