"""Grid choice by predicted time and whole plans: the fastest factor pair, the Sony point, sweeps."""

from __future__ import annotations

import itertools

import pytest

from torus_train.job.topology import Grid, GridError
from torus_train.plan.cost import ALGORITHMS, MODELS, allreduce_cost
from torus_train.plan.grids import best_grid, rank_grids
from torus_train.plan.networks import PRESETS, Link, Network
from torus_train.plan.search import make_plan, sweep

ABCI = PRESETS["abci-v100"]
R50_FP16 = MODELS["resnet50"].gradient_bytes("fp16")


def test_best_grid_is_the_fastest_factor_pair_and_says_why():
    g, why = best_grid(1088, ABCI, R50_FP16)
    t = allreduce_cost("torus", g, ABCI, R50_FP16).seconds
    for x in (1, 2, 4, 8, 16, 17, 32, 34, 64, 68, 136, 272, 544, 1088):
        assert t <= allreduce_cost("torus", Grid(x, 1088 // x, 4), ABCI, R50_FP16).seconds + 1e-15
    assert "fastest predicted torus" in why and "ms" in why
    assert [c.seconds for _, c in rank_grids(1088, ABCI, R50_FP16)] == sorted(
        c.seconds for _, c in rank_grids(1088, ABCI, R50_FP16)
    )
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
    assert set(d["algorithms"]["torus"]) >= {
        "steps",
        "bytes_across_nodes",
        "allreduce_seconds",
        "step_seconds",
        "scaling_efficiency",
    }
    with pytest.raises(GridError, match="1088"):
        make_plan(1088, ABCI, grid=Grid(32, 32, 4))


def test_sweep_covers_every_algorithm():
    s = sweep(PRESETS["dgx-h100"], R50_FP16, [64, 256, 1024, 4096])
    # ours and NCCL's (CollNet is opt-in in NCCL, so the curves leave it out)
    assert set(s) == set(ALGORITHMS) | {"nccl-ring", "nccl-tree", "nccl-nvls", "nccl"}
    flat = [t for _, t in s["flat"]]
    assert flat == sorted(flat)  # a flat ring only gets slower with more ranks


# Two GPUs per node, one 1 GB/s NIC, 100 GB/s inside a node, no latency: for n bytes on 4 ranks the torus costs
# 2x2: rows inside nodes, 2 x n/2 at 100 GB/s + the column ring's 2 steps of n/4 with both of a node's flows on
# its one NIC (0.5 GB/s each) = n (1/100 + 1) / 1e9 s; 4x1 and 1x4: one ring of 4 crossing nodes on two of its
# edges, 6 steps of n/4 at 1 GB/s = 1.5 n / 1e9 s. So 2x2 wins by 1.5/1.01 whatever the buckets.
SMALL = Network("small", 2, Link(100.0, 0.0), Link(1.0, 0.0), 1, reduce_gbytes_per_s=1e9)


def test_gpus_n_chooses_grid_and_cap_by_the_step_on_a_hand_checked_case():
    n = MODELS["resnet18"].gradient_bytes("fp32")
    assert allreduce_cost("torus", Grid(2, 2, 2), SMALL, n).seconds == pytest.approx(n * 1.01 / 1e9)
    assert allreduce_cost("torus", Grid(4, 1, 2), SMALL, n).seconds == pytest.approx(n * 1.5 / 1e9)
    p = make_plan(4, SMALL, "resnet18", 32, None, "fp32", images_per_second=1e6, bucket_cap=None)
    assert p.grid == "2x2" and p.grid_why.startswith("fastest predicted step of")
    steps = [c["step_seconds"] for c in p.candidates]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(steps)) and {c["grid"] for c in p.candidates} == {
        "2x2",
        "4x1",
        "1x4",
    }
    best = p.candidates[0]
    # the chosen pair's step is the plan's own torus step at that grid and cap
    assert p.bucket_cap_bytes == int(best["cap_mb"] * 2**20)
    assert p.algorithms["torus"].step_seconds == pytest.approx(best["step_seconds"])
    assert set(best) == {
        "grid",
        "cap_mb",
        "buckets",
        "allreduce_seconds",
        "exposed_seconds",
        "step_seconds",
        "scaling_efficiency",
    }
    # compute ~ 0: every byte is exposed, the step is the buckets' exchanges, and bucketing cannot beat the grid
    assert best["step_seconds"] == pytest.approx(n * 1.01 / 1e9, rel=1e-3)


def test_latency_picks_few_buckets_bandwidth_picks_small_ones():
    slow_msgs = Network("lat", 2, Link(1e6, 10_000.0), Link(1e6, 10_000.0), 1, reduce_gbytes_per_s=1e9)
    p = make_plan(4, slow_msgs, "resnet18", 32, None, "fp32", images_per_second=1000.0, bucket_cap=None)
    assert p.candidates[0]["buckets"] == min(c["buckets"] for c in p.candidates)  # 10 ms per message
    # no latency, a long backward: small buckets start early and leave a small last bucket exposed
    q = make_plan(4, SMALL, "resnet18", 32, None, "fp32", images_per_second=100.0, bucket_cap=None)
    assert q.candidates[0]["cap_mb"] < 25 and q.candidates[0]["buckets"] > 3
    # a cap given: only the grid is chosen
    r = make_plan(4, SMALL, "resnet18", 32, None, "fp32", images_per_second=100.0, bucket_cap=25 * 2**20)
    assert {c["cap_mb"] for c in r.candidates} == {25} and r.bucket_cap_bytes == 25 * 2**20
