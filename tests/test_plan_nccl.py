"""NCCL's tuning model (torus_train.plan.nccl) against cases worked by hand from its tables, its choice of
algorithm by size, the verdict torus vs NCCL, and the plan's JSON carrying them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from torus_train.commands.plan import plan
from torus_train.errors import UserError
from torus_train.job.topology import Grid
from torus_train.plan.cost import algorithms_for, allreduce_cost, allreduce_seconds_fn
from torus_train.plan.nccl import NcclModel
from torus_train.plan.networks import PRESETS, network_from_dict
from torus_train.plan.verdict import _where_it_changes, verdict_text

ABCI, H100 = PRESETS["abci-v100"], PRESETS["dgx-h100"]


def terms(model: NcclModel, algo: str, proto: str) -> tuple[float, float]:
    return model._table[(algo, proto)]


# abci-v100 at 64 ranks: 16 nodes of 4 V100 (ppn 4), 2 EDR NICs -> 2 channels of 12 GB/s (the fastest of NCCL's
# inter speeds under 12.5; 12 < 25 so no duplication); > 2 nodes: Volta ceilings of the third column.
# Each case: (algo, proto, latency us, algorithm bandwidth GB/s), worked from the tables by hand:
ABCI_64 = [
    # ring: 2(64-1) = 126 hops, 2(16-1) = 30 of them network; intra hop = max(NVLink hop, 1 us net overhead
    # (x3 Simple)); bus = 2 x 12 = 24 GB/s; algbw = bus x 64/126
    ("ring", "LL", 6.6 + 96 * 1.0 + 30 * 2.7, min(20.4, 24 * 0.5) * 64 / 126),
    ("ring", "LL128", 14.0 + 96 * 1.9 + 30 * 4.0, min(24 * 0.92, 2 * 20.0) * 64 / 126),
    ("ring", "Simple", 8.4 + 96 * 3.4 + 30 * 14.0, 24 * 64 / 126),
    # tree: 2((ppn-1) NVLink hops + lg 16 = 4 network hops); bus = min(0.92 x 24, 2 x 10) = 20, algbw = bus / 2
    ("tree", "LL", 6.8 + 2 * (3 * 0.6 + 4 * 5.0), min(20 / 3.8, 20.4) / 2),
    ("tree", "LL128", 14.0 + 2 * (3 * 1.25 + 4 * 8.5), min(20 * 120 / 128, 2 * 20.0) / 2),
    ("tree", "Simple", 8.4 + 2 * (3 * 4.0 + 4 * 14.0), 20 / 2),
]


@pytest.mark.parametrize("algo,proto,lat,bw", ABCI_64)
def test_ring_and_tree_match_hand_worked_tables(algo, proto, lat, bw):
    m = NcclModel(ABCI, 64)
    assert (m.nodes, m.ppn, m.ring.count, m.ring.inter_gbps) == (16, 4, 2, 12.0)
    got_lat, got_bw = terms(m, algo, proto)
    assert got_lat == pytest.approx(lat) and got_bw == pytest.approx(bw)


def test_nvls_on_one_node_and_nvls_tree_across_nodes_and_collnet_by_hand():
    one = NcclModel(H100, 8)
    # 8 NVLS channels at 60 GB/s (<= 450 x 8/7 / 8); x 0.85 x 7/8 x 2 = 89.25 > 60: bus 8 x 60, algbw x 8/14
    assert terms(one, "nvls", "Simple") == pytest.approx((25.0, 480 * 8 / 14))
    many = NcclModel(H100, 64)  # 8 nodes: NVLSTree, network 48 GB/s, Hopper ceiling 45.5
    assert terms(many, "nvls", "Simple") == pytest.approx((25.0 + 2 * 3 * 20.9, 8 * 45.5 * 64 / 126))
    # CollNet Direct: 8 channels x 48 GB/s, one NIC per GPU (factor 1), x 0.85 on Hopper, algbw = bus / 2
    assert terms(many, "collnet", "Simple") == pytest.approx((2 * (3.7 + 7 * 0.4) + 31.0, 8 * 48 * 0.85 / 2))
    for proto in ("LL", "LL128"):  # NVLS and CollNet run only Simple
        assert many.estimate("nvls", proto, 1 << 20) is None and many.estimate("collnet", proto, 1 << 20) is None


def test_size_dependent_fixes_tree_correction_and_ring_plateau():
    m = NcclModel(ABCI, 64)
    lat, bw = terms(m, "tree", "LL128")
    # 1 MiB: 2^20 >> 6 = 2^14 -> the LL128 row's factor at index 14 is 0.6
    assert m.estimate("tree", "LL128", 1 << 20).seconds == pytest.approx((lat + 2**20 / (1000 * bw * 0.6)) * 1e-6)
    lat, bw = terms(m, "ring", "Simple")
    # 64 bytes per rank per channel is the plateau's edge: 2 x 64 x 64 = 8192 bytes; Volta multiplies by 1.9
    assert m.estimate("ring", "Simple", 8191).latency_us == pytest.approx(lat)
    assert m.estimate("ring", "Simple", 8192).latency_us == pytest.approx(lat * 1.9)


def test_choice_switches_from_tree_to_ring_where_the_model_says():
    """abci-v100, 64 ranks: tree/LL128 (89.5 us, 9.375 GB/s x the 0.8 correction of 4..8 MiB) and ring/LL128
    (316.4 us, 11.215 GB/s) cross where 89.5 + S / 7500 = 316.4 + S / 11215.2 (us, S in bytes / 1000): about
    5.14 MB. Below it NCCL's model picks the tree, above it the ring."""
    m = NcclModel(ABCI, 64)
    tree_lat, tree_bw = terms(m, "tree", "LL128")
    ring_lat, ring_bw = terms(m, "ring", "LL128")
    tree_bw *= 0.8  # LL128 correction at index 16 (4..8 MiB)
    s = (ring_lat - tree_lat) / (1 / (1000 * tree_bw) - 1 / (1000 * ring_bw))
    assert 4 * 2**20 < s < 8 * 2**20 and s == pytest.approx(5.137e6, rel=1e-3)
    below, above = m.choose(s * 0.99), m.choose(s * 1.01)
    assert (below.algo, below.protocol) == ("tree", "LL128")
    assert (above.algo, above.protocol) == ("ring", "LL128")
    assert m.choose(4 << 10).protocol == "LL"  # small messages: the low-latency protocol


def test_planner_names_cost_and_seconds_fn_agree_and_hardware_decides_the_list():
    assert "nccl-nvls" not in algorithms_for(ABCI) and "nccl-collnet" not in algorithms_for(ABCI)
    assert {"nccl-nvls", "nccl-collnet"} <= set(algorithms_for(H100, 64))
    assert "nccl-collnet" not in algorithms_for(H100, 8)  # one node: nothing for SHARP to do
    g = Grid(8, 8, 8)
    for algo in ("nccl-ring", "nccl-tree", "nccl-nvls", "nccl-collnet", "nccl"):
        f = allreduce_seconds_fn(algo, g, H100)
        for n in (1000, 1 << 20, 51_114_064):
            c = allreduce_cost(algo, g, H100, n)
            assert f(n) == pytest.approx(c.seconds) and c.nccl_choice
    best = allreduce_cost("nccl", g, H100, 51_114_064)
    assert best.seconds == min(
        allreduce_cost(a, g, H100, 51_114_064).seconds for a in ("nccl-ring", "nccl-tree", "nccl-nvls")
    )  # CollNet is opt-in


def test_unknown_or_absent_algorithm_is_a_user_error():
    with pytest.raises(UserError, match="unknown all-reduce algorithm 'nccl-magic'"):
        allreduce_cost("nccl-magic", Grid(8, 8, 4), ABCI, 1000)
    with pytest.raises(UserError, match="nccl-nvls needs hardware"):
        allreduce_cost("nccl-nvls", Grid(8, 8, 4), ABCI, 1000)
    base = {
        "gpus_per_node": 4,
        "nics_per_node": 1,
        "intra": {"bandwidth_gbytes_per_s": 50, "latency_us": 2},
        "inter": {"bandwidth_gbytes_per_s": 12.5, "latency_us": 2},
    }
    with pytest.raises(UserError, match=re.escape("[nccl] generation")):
        network_from_dict({**base, "nccl": {"generation": "kepler"}})
    with pytest.raises(UserError, match=re.escape("[nccl] switches")):
        network_from_dict({**base, "nccl": {"switches": 2}})
    assert network_from_dict({**base, "nccl": {"generation": "hopper", "nvswitch": True}}).nccl.nvswitch


def _row(gpus, torus, nccl):
    gain = nccl - torus
    return {
        "gpus": gpus,
        "grid": "8x8",
        "torus_step_seconds": torus,
        "nccl_step_seconds": nccl,
        "torus_efficiency": 0.9,
        "nccl_efficiency": 0.9,
        "torus_gain_seconds": gain,
        "torus_gain_fraction": gain / nccl,
        "outcome": "tie" if abs(gain / nccl) < 0.005 else ("torus" if gain > 0 else "nccl"),
    }


def test_verdict_wording():
    win, lose, tie = _row(64, 0.020, 0.025), _row(2176, 0.030, 0.025), _row(8, 0.0250, 0.02501)
    assert "the torus beats NCCL by 5.00 ms per step (20.0% of NCCL's step)" in verdict_text(win, [win], "n")[0]
    assert (
        "NCCL beats the torus by 5.00 ms per step (20.0% of NCCL's step): the torus LOSES here"
        in verdict_text(lose, [lose], "n")[0]
    )
    assert "tie" in verdict_text(tie, [tie], "n")[0]
    assert _where_it_changes([tie, win, lose]).startswith(
        "the torus starts to win at 64 GPUs and wins up to 64, then stops (2176 nccl)"
    )
    assert _where_it_changes([win, _row(2176, 0.02, 0.03)]).startswith("the torus wins at every count scanned")
    assert _where_it_changes([lose]).startswith("NCCL wins at every count scanned")


@pytest.mark.timeout(300)
def test_plan_prints_nccl_beside_torus_and_json_carries_it(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(plan, ["--gpus", "64", "--grid", "8x8", "--network", "dgx-h100", "--json", str(out)])
    assert r.exit_code == 0, r.output
    for text in (
        "nccl-ring",
        "nccl-tree",
        "nccl-nvls",
        "nccl-collnet",
        "textbook ring",
        "textbook binomial",
        "per bucket, all-reduce ms",
        "nccl picks",
        "# verdict on dgx-h100 at 64 GPUs, grid 8x8:",
        "over GPU counts:",
        "NCCL 2.30.7",
        "src/graph/tuning.cc",
    ):
        assert text in r.output, text
    d = json.loads(out.read_text())
    assert set(d["algorithms"]) == {
        "flat",
        "tree",
        "hierarchical",
        "torus",
        "nccl-ring",
        "nccl-tree",
        "nccl-nvls",
        "nccl-collnet",
        "nccl",
    }
    n = d["algorithms"]["nccl"]
    assert n["nccl_choice"] and n["label"] and n["timeline"]["buckets"]
    assert d["algorithms"]["torus"]["nccl_choice"] is None
    v = d["verdict"]
    assert set(v) == {"here", "scan", "text"} and v["here"]["gpus"] == 64 and v["here"]["grid"] == "8x8"
    assert {"gpus", "grid", "torus_step_seconds", "nccl_step_seconds", "outcome", "torus_gain_seconds"} <= set(
        v["scan"][0]
    )
    assert v["here"]["outcome"] in ("torus", "nccl", "tie") and d["network"]["nccl"]["generation"] == "hopper"


def test_nccl_model_imports_no_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, torus_train.plan.nccl, torus_train.plan.printout; print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--nodes", "9", "--json", "x.json"], "--nodes: 9: this machine hosts 2..8"),
        (["--nodes", "1", "--json", "x.json"], "--nodes: 1"),
        (["--nodes", "4", "--backends", "nccl", "--json", "x.json"], "--backends: unknown backend 'nccl'"),
        (["--nodes", "4", "--sizes-mib", "big", "--json", "x.json"], "--sizes-mib"),
        (["--nodes", "4", "--algos", "flat,nccl-ring", "--json", "x.json"], "--algos: unknown algorithm 'nccl-ring'"),
        (["--nodes", "4", "--calibration", "guess", "--json", "x.json"], "--calibration: unknown calibration 'guess'"),
    ],
)
def test_cluster_vs_plan_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "cluster_vs_plan.py"
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_torus_vs_nccl_script_bad_preset_is_one_line_and_exit_2():
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "experiments" / "torus_vs_nccl.py"
    r = subprocess.run([sys.executable, str(script), "--networks", "nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown preset 'nope'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_published_torus_vs_nccl_sets_the_planner_against_horovod_3608(tmp_path):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "experiments" / "published_torus_vs_nccl.py"
    out = tmp_path / "published.json"
    r = subprocess.run([sys.executable, str(script), "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert {(x["work"], x["variant"]) for x in rows} == {("horovod-3608", "nvlink"), ("horovod-3608", "pcie3")}
    for x in rows:
        assert set(x) == {
            "work",
            "variant",
            "grid",
            "network",
            "nccl_algo",
            "bytes",
            "torus_ms",
            "nccl_ms",
            "predicted_ratio",
            "published_ratio",
        }
        assert x["grid"] == "6x32" and x["nccl_algo"] == "nccl-ring"
        assert x["published_ratio"] == pytest.approx(978 / 2498)
        assert x["predicted_ratio"] == pytest.approx(x["torus_ms"] / x["nccl_ms"])
    # docs/plan.md: with one NIC per node the planner sees no bandwidth gain at BERT-Large's size
    big = [x["predicted_ratio"] for x in rows if x["bytes"] == 680_000_000]
    assert len(big) == 2 and all(0.9 < q < 1.1 for q in big), big
