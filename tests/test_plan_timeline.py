"""The bucket timeline (torus_train.plan.timeline): the one bucket rule (comm/bucketing.py) that the run and the
plan share, a hand-computed two-bucket step, and the plan's buckets against the run's own."""

from __future__ import annotations

import random

import pytest

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES, assign_buckets, parameter_buckets
from torus_train.job.sections import CommSection
from torus_train.plan.cost import STEP_OVERHEAD
from torus_train.plan.timeline import (
    BUCKET_BYTES,
    Layer,
    bucket_plan,
    lanes,
    links_shared,
    model_layers,
    timeline,
    torus_lanes,
    torus_phase_seconds,
)


def test_bucket_rule_by_hand():
    # caps 4 then 10: 3 fits the first bucket, 3 + 2 would pass 4; 2 + 6 fit, + 4 would pass 10; 4 + 5 fit.
    # (DDP's reducer closes a bucket once it has reached its cap: [[0, 1], [2, 3], [4]], over the caps.)
    assert assign_buckets([3, 2, 6, 4, 5], 10, 4) == [[0], [1, 2], [3, 4]]
    # a tensor larger than the cap is a bucket of its own; a zero-byte tensor joins the bucket before it
    assert assign_buckets([1, 30, 2, 0, 9], 10, 4) == [[0], [1], [2, 3], [4]]
    # the first cap is never more than the others
    assert assign_buckets([5, 5, 5], 5, 100) == [[0], [1], [2]]
    # a new bucket where the key (the dtype) changes, whatever the room left
    assert assign_buckets([1, 1, 1, 1], 100, 100, ["f32", "f32", "f16", "f32"]) == [[0, 1], [2], [3]]
    assert assign_buckets([], 10) == []
    # parameters in parameter order: the reverse cut, indices into the parameter list in gradient-ready order
    assert parameter_buckets([5, 4, 6, 2, 3], 10, 4) == [[4], [3, 2], [1, 0]]  # the first case, reversed
    # the run's defaults: the spec's comm.bucket_mb (25 MiB) and a 1 MiB first bucket
    assert BUCKET_BYTES == CommSection().bucket_mb * 2**20 == 25 * 2**20 and FIRST_BUCKET_BYTES == 2**20


def test_bucket_rule_never_passes_a_cap_and_cuts_only_where_it_must():
    rng = random.Random(45)
    for _ in range(2000):
        n = rng.randint(0, 30)
        sizes = [rng.choice([0, rng.randint(1, 40), rng.randint(1, 400)]) for _ in range(n)]
        keys = [rng.choice("ab") for _ in range(n)] if rng.random() < 0.3 else None
        cap, first = rng.randint(1, 120), rng.randint(1, 120)
        buckets = assign_buckets(sizes, cap, first, keys)
        assert [i for b in buckets for i in b] == list(range(n))  # every tensor once, in order
        for k, b in enumerate(buckets):
            limit = min(first, cap) if k == 0 else cap
            assert len(b) == 1 or sum(sizes[i] for i in b) <= limit  # only a lone tensor passes its cap
            if keys is not None:
                assert len({keys[i] for i in b}) == 1
            if k + 1 < len(buckets):  # a cut only where the next tensor would pass the cap, or its key differs
                nxt = buckets[k + 1][0]
                assert sum(sizes[i] for i in b) + sizes[nxt] > limit or (keys is not None and keys[nxt] != keys[b[0]])


def test_two_bucket_timeline_by_hand():
    # Parameter order a, b, c; DDP order c, b, a. fp32 caps: first 8 bytes, then 1000.
    # c: 2 values (8 B) -> bucket 0 = [c]; bucket 1 = [b, a].
    layers = [Layer("a", 10, 50.0), Layer("b", 5, 30.0), Layer("c", 2, 20.0)]
    assert [[layer.name for layer in b] for b in bucket_plan(layers, 1000, 8)] == [["c"], ["b", "a"]]
    # compute 0.3 s, backward 2/3 of it = 0.2 s; FLOP shares: c 0.2, b 0.3, a 0.5.
    # bucket 0 ready 0.04, exchange 2 values x 2 B = 4 B -> 0.1 s: 0.04..0.14
    # bucket 1 ready 0.04 + 0.16 = 0.2, exchange 30 B -> 0.05 s: starts 0.2, ends 0.25
    t = timeline(layers, 0.3, 2 / 3, lambda nbytes: {4: 0.1, 30: 0.05}[nbytes], 2, "x", 1000, 8)
    b0, b1 = t.buckets
    assert (b0.ready_seconds, b0.start_seconds, b0.end_seconds) == pytest.approx((0.04, 0.04, 0.14))
    assert (b1.ready_seconds, b1.start_seconds, b1.end_seconds) == pytest.approx((0.2, 0.2, 0.25))
    assert t.exposed_seconds == pytest.approx(0.05) and t.step_seconds == pytest.approx(0.35)
    assert t.scaling_efficiency == pytest.approx(0.3 / 0.35)
    assert t.derived_overlap == pytest.approx((0.15 - 0.05) / 0.2)
    # A slow first exchange queues the second: bucket 0 ends at 0.34, bucket 1 runs 0.34..0.39.
    q = timeline(layers, 0.3, 2 / 3, lambda nbytes: {4: 0.3, 30: 0.05}[nbytes], 2, "x", 1000, 8)
    assert q.buckets[1].start_seconds == pytest.approx(0.34) and q.exposed_seconds == pytest.approx(0.19)
    assert q.to_json()["buckets"][1]["parameter_count"] == 2
    # An unhidden overhead of 0.02 s lengthens the step and nothing else: 0.3 + 0.02 + 0.05.
    o = timeline(layers, 0.3, 2 / 3, lambda nbytes: {4: 0.1, 30: 0.05}[nbytes], 2, "x", 1000, 8, 0.02)
    assert o.exposed_seconds == pytest.approx(0.05) and o.step_seconds == pytest.approx(0.37)
    assert o.scaling_efficiency == pytest.approx(0.3 / 0.37) and o.to_json()["overhead_seconds"] == 0.02


def test_model_layers_resnet50_counts_and_flops():
    layers = model_layers("resnet50")
    assert len(layers) == 161 and sum(layer.numel for layer in layers) == 25_557_032
    # about 4.1 GMACs per image = 8.2 GFLOPs forward
    assert 7.5e9 < sum(layer.flops for layer in layers) < 8.8e9


@pytest.mark.timeout(300)
def test_plan_buckets_are_the_runs():
    """The timeline's buckets are the run's: comm/buckets.py's plan_buckets on ResNet-50 (built on the meta device)
    and BucketedModel on ResNet-18 hold the same tensors in the same order as bucket_plan of the same model."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from torus_train.comm.buckets import BucketedModel, plan_buckets

    with torch.device("meta"):
        m = torchvision.models.resnet50()
    names = {id(p): n for n, p in m.named_parameters()}
    params = [p for p in m.parameters() if p.requires_grad]
    for cap in (BUCKET_BYTES, 5 * 2**20, 2**20, 200 * 2**20):
        run = [[names[id(p)] for p in b] for b in plan_buckets(params, cap)]
        assert run == [[layer.name for layer in b] for b in bucket_plan(model_layers("resnet50"), cap)]
    mine = bucket_plan(model_layers("resnet50"))
    # fc.bias alone (fc.weight, 8.2 MB, would pass the 1 MiB first cap), then 5 buckets of at most 25 MiB
    assert [len(b) for b in mine] == [1, 12, 9, 15, 48, 76] and [layer.name for layer in mine[0]] == ["fc.bias"]
    assert max(sum(layer.numel for layer in b) * 4 for b in mine) <= BUCKET_BYTES

    small = torchvision.models.resnet18(num_classes=10)
    names = {id(p): n for n, p in small.named_parameters()}
    dp = BucketedModel(small, None, CommSection().bucket_mb)
    try:
        run = [[names[id(p)] for p in b.params] for b in dp.buckets]
    finally:
        dp.close()
    assert run == [[layer.name for layer in b] for b in bucket_plan(model_layers("resnet18", 224, 10))]


@pytest.mark.timeout(120)
def test_gradient_ready_order_is_the_reverse_parameter_order():
    """The order backward makes ResNet-18's gradients ready (post-accumulate-grad hooks) is the reverse parameter
    order the bucket rule assumes, up to a BatchNorm's weight and bias (the same module's backward: one time)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    m = torchvision.models.resnet18(num_classes=10)
    names = {id(p): n for n, p in m.named_parameters()}
    ready: list[str] = []
    hooks = [p.register_post_accumulate_grad_hook(lambda q: ready.append(names[id(q)])) for p in m.parameters()]
    try:
        m(torch.randn(2, 3, 64, 64)).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    reverse = [n for n, _ in reversed(list(m.named_parameters()))]
    assert sorted(ready) == sorted(reverse)
    assert [n.rsplit(".", 1)[0] for n in ready] == [n.rsplit(".", 1)[0] for n in reverse]


def test_plan_json_carries_the_timeline_and_the_override_is_labelled(tmp_path):
    import json

    from click.testing import CliRunner

    from torus_train.commands.plan import plan

    out = tmp_path / "p.json"
    r = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34", "--network", "abci-v100", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "exposed ms" in r.output and "overlap derived from the bucket timeline" in r.output
    d = json.loads(out.read_text())
    assert d["overlap"] is None and d["overlap_source"] == "bucket timeline"
    assert d["step_overhead"] == STEP_OVERHEAD and d["step_overhead_source"] == "fitted (STEP_OVERHEAD)"
    assert "FITTED constant" in r.output
    for algo, a in d["algorithms"].items():
        t = a["timeline"]
        assert t["algo"] == algo and 0 <= a["derived_overlap"] <= 1
        assert a["exposed_seconds"] == pytest.approx(t["exposed_seconds"])
        assert a["scaling_efficiency"] == pytest.approx(t["scaling_efficiency"])
        assert sum(b["numel"] for b in t["buckets"]) == 25_557_032
        ends = [b["end_seconds"] for b in t["buckets"]]
        assert ends == sorted(ends)
        assert set(t["buckets"][0]) >= {
            "index",
            "nbytes",
            "ready_seconds",
            "start_seconds",
            "allreduce_seconds",
            "end_seconds",
            "parameter_count",
        }
    r2 = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34", "--overlap", "0.5", "--json", str(out)])
    assert r2.exit_code == 0, r2.output
    assert "OVERRIDE" in r2.output
    d2 = json.loads(out.read_text())
    assert d2["overlap"] == 0.5 and d2["overlap_source"].startswith("override")
    assert d2["algorithms"]["torus"]["timeline"] is None and d2["step_overhead"] is None
    r3 = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34", "--step-overhead", "0", "--json", str(out)])
    d3 = json.loads(out.read_text())
    assert r3.exit_code == 0 and d3["step_overhead_source"] == "--step-overhead"
    t3, t = d3["algorithms"]["torus"], d["algorithms"]["torus"]
    assert t3["exposed_seconds"] == pytest.approx(t["exposed_seconds"])
    assert t["step_seconds"] - t3["step_seconds"] == pytest.approx(STEP_OVERHEAD * d["compute_seconds"])
    for bad in (["--step-overhead", "-0.1"], ["--step-overhead", "0.1", "--overlap", "0.5"]):
        r4 = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34", *bad])
        assert r4.exit_code != 0 and "--step-overhead" in str(r4.exception), r4.output


@pytest.mark.timeout(300)
def test_efficiency_table_json_and_it_agrees_with_plan(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out, plan_json = tmp_path / "eff.json", tmp_path / "plan.json"
    r = subprocess.run(
        [sys.executable, str(root / "scripts" / "experiments" / "efficiency_table.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
    )
    assert r.returncode == 0, r.stderr
    table = json.loads(out.read_text())
    assert [t["work"].split(" (")[0] for t in table] == ["Sony v1", "Sony v2", "Goyal et al. 2017", "Jia et al. 2018"]
    assert [t["reported_percent"] for t in table] == [91.62, 84.75, 90.0, 87.9]
    assert all(0 < t["predicted_percent"] < t["timeline_only_percent"] <= 100 for t in table)
    # The one fitted constant is what the fit gives on all four, and each work left out is predicted by the fit
    # on the other three (the target is 3 points: kept here so a model change that loses it shows).
    assert "WARNING" not in r.stdout
    assert all(t["step_overhead"] == STEP_OVERHEAD for t in table)
    assert all(abs(t["loo_predicted_percent"] - t["reported_percent"]) <= 3 for t in table), r.stdout
    assert len({t["loo_overhead_fraction"] for t in table}) == 4
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "plan",
            "--gpus",
            "1088",
            "--grid",
            "32x34",
            "--network",
            "abci-v100",
            "--model",
            "resnet50",
            "--per-gpu-batch",
            "32",
            "--json",
            str(plan_json),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
    )
    assert r.returncode == 0, r.stderr
    eff = json.loads(plan_json.read_text())["algorithms"]["torus"]["scaling_efficiency"]
    assert table[0]["predicted_percent"] == pytest.approx(eff * 100, abs=0.005)


def test_png_timeline_and_bucket_cap(tmp_path):
    import json

    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from torus_train.commands.plan import plan

    png, out = tmp_path / "t.png", tmp_path / "p.json"
    r = CliRunner().invoke(
        plan, ["--gpus", "1088", "--grid", "32x34", "--png", str(png), "--bucket-cap-mb", "100", "--json", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads(out.read_text())
    assert d["bucket_cap_bytes"] == 100 * 2**20 and "then 100 MiB" in r.output
    # the 1 MiB first bucket (fc.bias: fc.weight would pass it), then everything else in one bucket under 100 MiB
    assert [b["parameter_count"] for b in d["algorithms"]["torus"]["timeline"]["buckets"]] == [1, 160]
    r = CliRunner().invoke(plan, ["--gpus", "64", "--png", str(png), "--overlap", "0.5"])
    assert r.exit_code != 0 and "--png" in str(r.exception)
    r = CliRunner().invoke(plan, ["--gpus", "64", "--bucket-cap-mb", "0"])
    assert r.exit_code != 0 and "--bucket-cap-mb" in str(r.exception)


def test_plan_tries_bucket_caps_and_names_the_fastest(tmp_path):
    import json

    from click.testing import CliRunner

    from torus_train.commands.plan import plan
    from torus_train.plan.grids import BUCKET_CAPS_MB

    out = tmp_path / "p.json"
    r = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    caps = d["bucket_caps"]
    assert [c["cap_mb"] for c in caps] == list(BUCKET_CAPS_MB)
    at25 = next(c for c in caps if c["cap_mb"] == 25)
    assert at25["step_seconds"] == pytest.approx(d["algorithms"]["torus"]["step_seconds"])
    assert at25["buckets"] == 6
    best = min(caps, key=lambda c: c["step_seconds"])
    assert f"the fastest is {best['cap_mb']:g} MiB" in r.output


def test_measured_profile_replaces_flops(tmp_path):
    import json

    from click.testing import CliRunner

    from torus_train.commands.plan import plan
    from torus_train.plan.timeline import layers_with_profile

    layers = model_layers("resnet18")
    modules = {layer.name.rsplit(".", 1)[0] for layer in layers}
    prof = {m: 1e-3 * (i + 1) for i, m in enumerate(sorted(modules))}  # a measured profile's shape (step_profile.py)
    # a profile that puts all the time in fc: the share of every other tensor is 0, fc's two tensors split it
    fake = dict.fromkeys(modules, 0.0) | {"fc": 1.0}
    with_p = layers_with_profile(layers, fake)
    assert [layer.flops for layer in with_p if layer.name.startswith("fc.")] == [0.5, 0.5]
    with pytest.raises(Exception, match="layer-profile"):
        layers_with_profile(layers, {"fc": 1.0})
    f, out = tmp_path / "prof.json", tmp_path / "p.json"
    f.write_text(json.dumps(prof))
    r = CliRunner().invoke(
        plan,
        [
            "--grid",
            "2x2",
            "--model",
            "resnet18",
            "--network",
            "dgx-h100",
            "--images-per-second",
            "500",
            "--layer-profile",
            str(f),
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "measured --layer-profile" in r.output
    assert json.loads(out.read_text())["backward_share"] == "measured profile"


def test_two_lanes_by_hand():
    """comm/pipeline.py's schedule: lane R reduce-scatter k, then all-gather k-1; lane C the column of k."""
    # (ready, row reduce-scatter, column all-reduce, row all-gather) seconds
    two = [(0.0, 1.0, 2.0, 1.0), (1.0, 1.0, 2.0, 1.0)]
    ln = lanes(two, backward_seconds=1.0, compute_seconds=1.5)
    b0, b1 = ln.buckets
    # R: rs0 0..1, rs1 1..2, ag0 3..4 (after column 0), ag1 5..6; C: column 0 1..3, column 1 3..5
    assert (b0["row_reduce_scatter"], b0["column_allreduce"], b0["row_all_gather"]) == ((0, 1), (1, 3), (3, 4))
    assert (b1["row_reduce_scatter"], b1["column_allreduce"], b1["row_all_gather"]) == ((1, 2), (3, 5), (5, 6))
    # serial: bucket 0 0..4, bucket 1 4..8; exposed 7 against 5
    assert ln.end_seconds == 6 and ln.exposed_seconds == 5 and ln.step_seconds == pytest.approx(6.5)
    assert ln.serial_step_seconds == pytest.approx(8.5) and ln.gain_seconds == pytest.approx(2.0)
    # sharing the NICs no two phases overlap: every phase in issue order, the same end as serial here
    shared = lanes(two, 1.0, 1.5, shared_links=True)
    assert shared.buckets[1]["row_reduce_scatter"] == (3, 4) and shared.end_seconds == 8 and shared.gain_seconds == 0
    # the all-gather of bucket 0 waits for bucket 1's reduce-scatter: with bucket 1 ready late, the lanes lose
    late = lanes([(0.0, 1.0, 1.0, 5.0), (10.0, 1.0, 1.0, 1.0)], 10.0, 15.0)
    assert late.buckets[0]["row_all_gather"] == (11, 16) and late.end_seconds == 17
    assert late.gain_seconds == pytest.approx(-4.0)  # serial: 0..7, then 10..13


def test_two_lanes_on_a_plan_and_where_they_pay():
    from torus_train.job.topology import parse_grid
    from torus_train.plan.networks import load_network
    from torus_train.plan.search import make_plan

    net = load_network("abci-v100")
    for grid, cap, shared, pays in (("32x34", 25, True, False), ("4x272", 5, False, True)):
        g = parse_grid(grid, net.gpus_per_node)
        p = make_plan(g.size, net, grid=g, bucket_cap=cap * 2**20)
        assert links_shared(g, net.gpus_per_node) is shared
        ln = torus_lanes(p.torus.timeline, torus_phase_seconds(g, net), shared)
        # each bucket's three phases add up to its all-reduce: the serial schedule is the plan's own step
        assert ln.serial_step_seconds == pytest.approx(p.torus.step_seconds)
        assert len(ln.buckets) == len(p.torus.timeline["buckets"]) and (ln.gain_seconds > 0) is pays
    assert links_shared(parse_grid("32x34", 4), 4, "columns") and not links_shared(parse_grid("4x2", 4), 4)


@pytest.mark.timeout(300)
def test_plan_prints_the_two_lanes():
    from click.testing import CliRunner

    from torus_train.commands.plan import plan

    for grid, cap, verdict in (("32x34", "25", "they lose"), ("4x272", "5", "they pay")):
        r = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", grid, "--bucket-cap-mb", cap])
        assert r.exit_code == 0, r.output
        assert "# torus lanes bucket 0: row reduce-scatter 0.00.." in r.output  # fc.bias alone, ready at once
        (line,) = [x for x in r.output.splitlines() if x.startswith("# torus in two lanes")]
        assert verdict in line, line
