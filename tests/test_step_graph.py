"""StepGraph (train/graphs.py) on the CPU, with torch.cuda's graph calls replaced by recorders that run what a
graph would: the capture runs the step (a real capture runs nothing on the device, so this is the harder case
for putting the state back), a replay runs the captured step again on the static inputs. The real loop drives
it (train/loop.py, a world of one, a small model): warm-up steps eager, the probe (capture, one replay against
the eager step), replays after it, a new probe at a stage switch; a capture that raises or a replay that
differs leaves the run eager, said in one line, recorded in the summary's choices, and every parameter equal
to the bit to an eager run's. Whether the captured step is right on a GPU is `torus-train check`'s graphs part."""

from __future__ import annotations

import json

import pytest
import torch
from graphfake import install

from torus_train.check.smallrun import force_precision, loop_run, small_spec, world_of_one
from torus_train.errors import RunFailed
from torus_train.ranks.distributed import shutdown
from torus_train.train import graphs, loop

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fake_cuda(monkeypatch):
    return install(monkeypatch.setattr)


@pytest.fixture(scope="module")
def boot():
    b = world_of_one("gloo")
    yield b
    shutdown()


def run(boot, tmp_path, graph=None, steps=6, batch=4, precision=None, name="run"):
    spec = small_spec(tmp_path / name, batch, steps, arch="resnet18_w32", image_size=32, cuda_graphs="off")
    return loop_run(spec, boot, tmp_path / name, precision=precision, graphs=graph)


def test_warm_up_then_the_probe_then_replays_equal_to_the_eager_run(fake_cuda, boot, tmp_path):
    said: list[str] = []
    got = run(boot, tmp_path, graphs.StepGraph(said.append, warmup=2), name="graphed")
    eager = run(boot, tmp_path, name="eager")
    shape = (4, 3, 32, 32)
    # two warm-up steps; step 3 is the probe: captured without the exchange (every rank agrees), captured with
    # it, replayed once, then run eagerly (its result); then replays
    probe = [("capture", "thread_local"), ("capture", "thread_local"), "replay", ("eager", 1, shape)]
    assert fake_cuda.log == [("eager", 1, shape)] * 2 + probe + ["replay"] * 3
    assert len(said) == 1 and "step 3 captured" in said[0] and "agreed with the eager step" in said[0]
    assert got.choices["cuda_graphs"]["choice"] == "graphed" and got.rel_diff == 0.0
    assert got.steps == eager.steps == 6 and got.digest == eager.digest
    assert eager.choices == {"cuda_graphs": {"choice": "eager", "why": "model.cuda_graphs = off"}}


@pytest.mark.parametrize("precision", ["fp32", "fp16-scaler"])
def test_a_failed_capture_runs_eagerly_said_once_with_the_eager_runs_parameters(fake_cuda, boot, tmp_path, precision):
    fake_cuda.fail_capture = {1}
    said: list[str] = []
    got = run(boot, tmp_path, graphs.StepGraph(said.append, warmup=1), precision=precision, name="graphed")
    eager = run(boot, tmp_path, precision=precision, name="eager")
    assert "replay" not in fake_cuda.log and len(said) == 1 and "\n" not in said[0]
    assert "at step 2 the capture failed (CUDA error: operation not permitted" in said[0]
    assert "goes on with the eager step" in said[0]
    assert got.choices["cuda_graphs"]["choice"] == "eager"
    assert "capture failed" in got.choices["cuda_graphs"]["why"]
    assert torch.equal(got.params, eager.params) and got.digest == eager.digest


def test_a_replay_that_differs_runs_eagerly_with_the_eager_runs_parameters(fake_cuda, boot, tmp_path):
    fake_cuda.mismatch = True
    said: list[str] = []
    got = run(boot, tmp_path, graphs.StepGraph(said.append, warmup=1), precision="fp16-scaler", name="graphed")
    eager = run(boot, tmp_path, precision="fp16-scaler", name="eager")
    assert fake_cuda.log.count("replay") == 1 and len(said) == 1
    assert "one replay differed from the eager step by max relative difference" in said[0]
    assert got.choices["cuda_graphs"]["choice"] == "eager" and got.rel_diff > graphs.AGREE_TOLERANCE
    assert torch.equal(got.params, eager.params)


def test_a_later_stage_whose_capture_fails_goes_on_eagerly(fake_cuda, boot, tmp_path, monkeypatch):
    """The first stage is graphed (captures 1 and 2); the capture at the next stage (batch 4 -> 8) fails: eager
    from there."""
    fake_cuda.fail_capture = {3}
    said: list[str] = []
    spec = small_spec(
        tmp_path / "two",
        4,
        8,
        cuda_graphs="off",
        extra=("schedule.epochs=2", "schedule.stages=[{until_epoch=1,global_batch=4},{until_epoch=2,global_batch=8}]"),
    )
    spec.schedule.steps = 0
    g = graphs.StepGraph(said.append, warmup=1)
    from torus_train.train.stop import StopRequest

    (tmp_path / "two").mkdir()
    rs = loop.start(spec, boot, tmp_path / "two", StopRequest())
    rs.graphs = g
    for epoch in (0, 1):
        loop.switch_stage(rs, epoch)
        loop.run_epoch(rs, epoch)
    rs.loader.close()
    rs.ddp.close()
    assert [e for e in fake_cuda.log if isinstance(e, tuple) and e[0] == "capture"] == [("capture", "thread_local")] * 3
    assert len(said) == 2 and "captured" in said[0] and "capture failed" in said[1]
    assert g.eager and g.choice["choice"] == "eager" and len(g.capture_seconds) == 1
    last = fake_cuda.log[-1]
    assert last == ("eager", 1, (8, 3, 32, 32))  # the second stage's steps after the failure: eager


def start(boot, tmp_path, name):
    from torus_train.train.stop import StopRequest

    (tmp_path / name).mkdir()
    return loop.start(small_spec(tmp_path / name, 4, 2, cuda_graphs="off"), boot, tmp_path / name, StopRequest())


def batch(n=4):
    return torch.zeros(n, 3, 32, 32), torch.zeros(n, dtype=torch.long)


def test_accumulation_and_odd_shapes_run_eagerly_said_once(fake_cuda, boot, tmp_path):
    said: list[str] = []
    g = graphs.StepGraph(said.append, warmup=0)
    rs = start(boot, tmp_path, "acc")
    for _ in range(2):
        g.step(rs, *batch(4), accumulation=2)
    assert fake_cuda.log == [("eager", 2, (4, 3, 32, 32))] * 2 and len(said) == 1 and "accumulation" in said[0]
    g.step(rs, *batch(4), accumulation=1)  # the probe at batch 4
    assert "captured" in said[-1] and not g.eager
    fake_cuda.log.clear()
    for _ in range(2):
        g.step(rs, *batch(3), accumulation=1)
    assert fake_cuda.log == [("eager", 1, (3, 3, 32, 32))] * 2 and sum("eagerly" in s for s in said) == 2
    rs.ddp.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16-scaler"])
def test_a_capture_that_makes_new_state_is_not_kept(fake_cuda, boot, tmp_path, precision):
    """No warm-up step: the capture itself would make the skip counters, the momentum (and the GradScaler its
    scale), which the graph would hold but the run would not: eager, said once, as an eager run from the start."""
    said: list[str] = []
    g = graphs.StepGraph(said.append, warmup=0)
    rs = start(boot, tmp_path, "new")
    force_precision(rs, precision)
    g.step(rs, *batch(4), accumulation=1)
    assert g.eager and len(said) == 1 and "new optimizer or counter state inside the capture" in said[0]
    assert "replay" not in fake_cuda.log and rs.skip_counts is not None  # made by the eager step after it
    after = [p.detach().clone() for p in rs.model.parameters()]
    rs.ddp.close()
    eager = start(boot, tmp_path, "eager")  # the same first step, eagerly, from the same seed
    force_precision(eager, precision)
    graphs.step_body(eager, *batch(4), 1)
    assert all(torch.equal(a, b) for a, b in zip(after, eager.model.parameters(), strict=True))
    if precision == "fp16-scaler":
        assert torch.equal(rs.scaler._scale, eager.scaler._scale)
    eager.ddp.close()


def test_the_summary_names_the_choice(boot, tmp_path):
    """A run through loop.finish writes summary.json with choices.cuda_graphs (CPU ranks: eager, and why)."""
    spec = small_spec(tmp_path / "s", 4, 2)
    (tmp_path / "s").mkdir()
    from torus_train.train.stop import StopRequest

    rs = loop.start(spec, boot, tmp_path / "s", StopRequest())
    loop.switch_stage(rs, 0)
    loop.run_epoch(rs, 0)
    loop.finish(rs)
    s = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert s["choices"]["cuda_graphs"] == {
        "choice": "eager",
        "why": "auto: the ranks run on the CPU (a graph needs a CUDA rank)",
    }


def test_a_capture_with_the_exchange_that_fails_after_the_agreement_ends_the_run(fake_cuda, boot, tmp_path):
    """Every rank's capture without the exchange passed and they agreed; the capture with it then fails: the
    other ranks' graphs would hold collectives this rank never issued, so the run ends, saying what to do."""
    fake_cuda.fail_capture = {2}
    g = graphs.StepGraph(lambda text: None, warmup=1)
    rs = start(boot, tmp_path, "late")
    g.step(rs, *batch(4), accumulation=1)  # the warm-up: the skip counters and momentum exist after it
    with pytest.raises(RunFailed, match=r"capture with the exchange failed .*model\.cuda_graphs = off"):
        g.step(rs, *batch(4), accumulation=1)
    rs.ddp.close()


def out_of_capture(fake) -> bool:
    """The process as before any capture: the default stream current, no pool allocated to, empty_cache fine."""
    torch.cuda.empty_cache()
    return fake.stream is fake.default and not fake.underway and not torch.cuda.is_current_stream_capturing()


@pytest.mark.parametrize("where", ["capture_end", "step"])
def test_a_failed_capture_puts_the_stream_and_the_pool_back_and_names_the_first_cause(fake_cuda, boot, tmp_path, where):
    """torch.cuda.graph leaves the capture stream current and the pool allocated to when capture_end raises; the
    probe puts both back (the pool ended and released once), shows the process out of capture, and names the
    error the capture began with (the step's, not capture_end's that followed it), then runs eagerly."""
    (fake_cuda.fail_capture if where == "capture_end" else fake_cuda.fail_in_body).add(1)
    said: list[str] = []
    g = graphs.StepGraph(said.append, warmup=1)
    rs = start(boot, tmp_path, where)
    for _ in range(3):
        g.step(rs, *batch(4), accumulation=1)
    assert g.eager and g.damaged is None and out_of_capture(fake_cuda)
    assert fake_cuda.released == [(0, 1)]  # the failed capture's pool, once
    assert len(said) == 1 and "at step 1 the capture failed (CUDA error: operation not permitted when stream" in said[0]
    assert "previous error during capture" not in said[0]
    assert fake_cuda.log[-1] == ("eager", 1, (4, 3, 32, 32))
    g.new_stage()  # a stage switch's empty_cache: the allocator is out of capture mode
    rs.ddp.close()


def test_a_process_left_capturing_ends_the_run_on_every_rank(fake_cuda, boot, tmp_path):
    """A failed capture whose stream cannot be shown out of capture: no eager step runs in that process; the
    ranks agree on it and every rank ends the run, saying what to do."""
    fake_cuda.fail_capture, fake_cuda.stuck = {1}, True
    g = graphs.StepGraph(lambda text: None, warmup=1)
    rs = start(boot, tmp_path, "stuck")
    g.step(rs, *batch(4), accumulation=1)
    with pytest.raises(
        RunFailed, match=r"left the process in capture mode \(its capture stream is still capturing.*cuda_graphs = off"
    ):
        g.step(rs, *batch(4), accumulation=1)
    rs.ddp.close()


def test_the_capture_with_the_exchange_that_fails_is_put_back_before_the_run_ends(fake_cuda, boot, tmp_path):
    fake_cuda.fail_capture = {2}
    g = graphs.StepGraph(lambda text: None, warmup=1)
    rs = start(boot, tmp_path, "late2")
    g.step(rs, *batch(4), accumulation=1)
    with pytest.raises(RunFailed, match="capture with the exchange failed"):
        g.step(rs, *batch(4), accumulation=1)
    assert out_of_capture(fake_cuda) and fake_cuda.released == [
        (0, 2)
    ]  # the failed capture's; the dry one ended, its graph releases its pool
    rs.ddp.close()
