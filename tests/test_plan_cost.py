"""The alpha-beta-gamma cost of an all-reduce and a step: step counts, the paper's formulas, link sharing."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from torus_train.errors import UserError
from torus_train.job.topology import Grid
from torus_train.plan.cost import ALGORITHMS, MODELS, allreduce_cost, node_map, step_cost
from torus_train.plan.networks import PRESETS, Link, Network

ABCI = PRESETS["abci-v100"]
R50_FP16 = MODELS["resnet50"].gradient_bytes("fp16")


def one_node(n_ranks: int, bw: float = 10.0, lat: float = 5.0, reduce: float = 1e30) -> Network:
    """Every rank on one node: the model must reduce to the textbook formulas."""
    return Network("one-node", n_ranks, Link(bw, lat), Link(1.0, 100.0), 1, reduce_gbytes_per_s=reduce)


def test_step_counts_of_the_paper():
    assert allreduce_cost("flat", Grid(32, 68, 4), ABCI, R50_FP16).steps == 4350
    assert allreduce_cost("torus", Grid(32, 68, 4), ABCI, R50_FP16).steps == 196
    assert allreduce_cost("tree", Grid(32, 68, 4), ABCI, R50_FP16).steps == 2 * math.ceil(math.log2(2176))
    assert allreduce_cost("hierarchical", Grid(4, 272, 4), ABCI, R50_FP16).steps == 2 * 2 + 2 * 271


@pytest.mark.parametrize("x,y", [(2, 2), (4, 3), (8, 16), (5, 7)])
def test_single_node_times_are_the_textbook_formulas(x, y):
    n = 12_345_678.0
    net = one_node(x * y, reduce=50.0)
    a, b, g = net.intra.alpha, net.intra.beta, net.gamma
    p = x * y
    flat = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    torus = (
        2 * (x - 1) * a
        + 2 * (x - 1) / x * n * b
        + 2 * (y - 1) * a
        + 2 * (y - 1) / (x * y) * n * b
        + (x - 1) / x * n * g
        + (y - 1) / (x * y) * n * g
    )
    lg = math.ceil(math.log2(p))
    tree = 2 * lg * (a + n * b) + lg * n * g
    assert allreduce_cost("flat", Grid(x, y), net, int(n)).seconds == pytest.approx(flat, rel=1e-6)
    assert allreduce_cost("torus", Grid(x, y), net, int(n)).seconds == pytest.approx(torus, rel=1e-6)
    assert allreduce_cost("tree", Grid(x, y), net, int(n)).seconds == pytest.approx(tree, rel=1e-6)


def test_torus_vertical_carries_one_xth_of_the_hierarchical_leaders_data():
    # Rows inside nodes (X = K): only vertical rings cross nodes.
    g = Grid(4, 272, 4)
    torus = allreduce_cost("torus", g, ABCI, R50_FP16)
    hier = allreduce_cost("hierarchical", g, ABCI, R50_FP16)
    assert torus.bytes_across_nodes == pytest.approx(2 * 271 / (4 * 272) * R50_FP16)
    assert hier.bytes_across_nodes == pytest.approx(2 * 271 / 272 * R50_FP16)
    assert hier.bytes_across_nodes / torus.bytes_across_nodes == pytest.approx(4)
    # 4 vertical flows share 2 NICs (6.25 GB/s each); the leader's single flow is split over both (25 GB/s).
    col = next(p for p in torus.phases if p.name == "column reduce-scatter")
    assert col.seconds == pytest.approx(
        271 * (2e-6 + R50_FP16 / 4 / 272 / 6.25e9) + 271 / 272 * R50_FP16 / 4 * ABCI.gamma
    )
    lead = next(p for p in hier.phases if p.name == "leader ring reduce-scatter")
    assert lead.seconds == pytest.approx(271 * (2e-6 + R50_FP16 / 272 / 25e9) + 271 / 272 * R50_FP16 * ABCI.gamma)
    assert torus.seconds < hier.seconds


def test_flows_leaving_a_node_share_all_its_nics():
    four = Network("four-nics", 8, Link(100.0, 1.0), Link(10.0, 0.0), 4)
    # Rows of 8 = one node each: one column flow per rank, 8 per node over 4 NICs -> 5 GB/s each.
    col = [p for p in allreduce_cost("torus", Grid(8, 2, 8), four, 8e6).phases if p.name == "column all-gather"]
    assert col[0].seconds == pytest.approx(1 * (8e6 / 8 / 2) / 5e9)
    # A ring of 2 whole nodes (flat, 16 ranks): one flow leaves each node per step -> all 4 NICs, 40 GB/s.
    flat = allreduce_cost("flat", Grid(8, 2, 8), four, 16e6)
    assert flat.phases[1].seconds == pytest.approx(15 * max(1e-6 + 1e6 / 100e9, 1e6 / 40e9))


def test_flat_ring_is_paced_by_the_nic_and_rows_inside_nodes_use_nvlink():
    g = Grid(4, 4, 4)
    flat = allreduce_cost("flat", g, ABCI, 16_000_000)
    step = 2e-6 + 1_000_000 / 25e9  # chunk n/16, one flow per node over both NICs
    assert flat.phases[0].seconds == pytest.approx(15 * step + 15 / 16 * 16e6 * ABCI.gamma)
    torus = allreduce_cost("torus", g, ABCI, 16_000_000)
    row = torus.phases[0]
    assert row.seconds == pytest.approx(3 * (2e-6 + 4e6 / 50e9) + 3 / 4 * 16e6 * ABCI.gamma)


def test_more_bandwidth_is_never_slower():
    fast = Network("fast", 4, Link(100.0, 2.0), Link(25.0, 2.0), 2)
    slow = Network("slow", 4, Link(50.0, 2.0), Link(12.5, 2.0), 2)
    for algo in ALGORITHMS:
        for g in (Grid(4, 16, 4), Grid(8, 8, 4), Grid(16, 4, 4)):
            assert allreduce_cost(algo, g, fast, R50_FP16).seconds < allreduce_cost(algo, g, slow, R50_FP16).seconds


def test_step_cost_overlap_bounds():
    no = step_cost(0.1, 0.05, overlap=0.0)
    assert no.step_seconds == pytest.approx(0.15) and no.scaling_efficiency == pytest.approx(0.1 / 0.15)
    full = step_cost(0.1, 0.05, overlap=1.0)  # 0.05 < 2/3 * 0.1: fully hidden
    assert full.scaling_efficiency == 1.0 and full.exposed_seconds == 0.0
    half = step_cost(0.1, 0.05, overlap=0.5)
    assert half.exposed_seconds == pytest.approx(0.05 - 0.5 * 2 / 3 * 0.1)
    with pytest.raises(UserError, match="overlap"):
        step_cost(0.1, 0.05, overlap=1.5)


def test_placement_by_columns_moves_the_row_rings_onto_the_network():
    g = Grid(4, 4, 4)
    assert node_map(g, 4, "rows").tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert node_map(g, 4, "columns").tolist() == [0, 1, 2, 3] * 4
    n = 16_000_000
    rows = allreduce_cost("torus", g, ABCI, n, "rows")
    cols = allreduce_cost("torus", g, ABCI, n, "columns")
    assert rows.bytes_across_nodes == pytest.approx(2 * 3 / 16 * n)  # only the column phase crosses nodes
    assert cols.bytes_across_nodes == pytest.approx(2 * 3 / 4 * n)  # every row edge crosses nodes
    assert rows.seconds < cols.seconds
    with pytest.raises(UserError, match="placement"):
        allreduce_cost("torus", g, ABCI, n, "diagonal")


def test_plan_modules_import_no_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, torus_train.plan.networks, torus_train.plan.cost, "
            "torus_train.plan.grids, torus_train.plan.search, torus_train.plan.verdict, torus_train.plan.calibrate, "
            "torus_train.plan.simulate; "
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr


def test_allreduce_seconds_fn_equals_allreduce_cost():
    """The timeline's fast path (links worked out once per grid) is the same model, to rounding."""
    from torus_train.plan.cost import allreduce_seconds_fn

    for net in PRESETS.values():
        for x, y in ((32, 34), (4, 272), (1, 8), (8, 1), (3, 5), (2, 2), (1, 1)):
            g = Grid(x, y, net.gpus_per_node)
            for placement in ("rows", "columns"):
                for algo in ALGORITHMS:
                    f = allreduce_seconds_fn(algo, g, net, placement)
                    for n in (0, 1, 1000, 4_860_000, 51_114_064):
                        assert f(n) == pytest.approx(
                            allreduce_cost(algo, g, net, n, placement).seconds, rel=1e-12, abs=1e-15
                        ), (net.name, x, y, placement, algo, n)
