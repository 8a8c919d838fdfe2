"""StepGraph's control flow around the capture (train/graphs.py), on the CPU with torch.cuda's graph calls
replaced by recorders: warm-up steps eager, one capture per stage, replays after it, a new capture at a stage
switch, accumulation and odd shapes eager, and a failed capture a one-line RunFailed. Whether the captured
step is right is the GPU check's work (scripts/gpu_check.sh --parts graphs)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from torus_train.errors import RunFailed
from torus_train.train import graphs


class FakeGraph:
    def __init__(self, log):
        self.log = log

    def replay(self):
        self.log.append("replay")


@pytest.fixture
def fake_cuda(monkeypatch):
    log: list = []
    fail = {"capture": False}

    @contextlib.contextmanager
    def graph(g, pool=None, capture_error_mode=None):
        log.append(("capture", capture_error_mode))
        yield
        if fail["capture"]:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    stream = SimpleNamespace(wait_stream=lambda other: None)
    for name, value in {
        "CUDAGraph": lambda: FakeGraph(log),
        "graph_pool_handle": lambda: "pool",
        "graph": graph,
        "synchronize": lambda: None,
        "empty_cache": lambda: None,
        "Stream": Stream,
        "current_stream": lambda device=None: stream,
        "stream": lambda s: contextlib.nullcontext(),
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)

    def body(rs, images, labels, accumulation):
        log.append(("eager", accumulation, tuple(images.shape)))
        out = torch.zeros(())
        out.record_stream = lambda s: None
        return out

    monkeypatch.setattr(graphs, "step_body", body)
    return log, fail


def run_state(step=0):
    return SimpleNamespace(times=None, pos=SimpleNamespace(global_step=step))


def batch(n=4):
    return torch.zeros(n, 3, 8, 8), torch.zeros(n, dtype=torch.long)


def test_warm_up_then_one_capture_then_replays(fake_cuda):
    log, _ = fake_cuda
    said = []
    g = graphs.StepGraph(said.append, warmup=2)
    for _ in range(5):
        g.step(run_state(), *batch(), accumulation=1)
    # two eager warm-up steps; the capture records the third step, which is then run as the first replay
    assert log == [("eager", 1, (4, 3, 8, 8))] * 2 + [
        ("capture", "thread_local"),
        ("eager", 1, (4, 3, 8, 8)),
        "replay",
        "replay",
        "replay",
    ]
    assert len(g.capture_seconds) == 1 and said and "captured in" in said[0]


def test_a_new_stage_captures_again(fake_cuda):
    log, _ = fake_cuda
    g = graphs.StepGraph(warmup=1)
    for _ in range(2):
        g.step(run_state(), *batch(4), accumulation=1)
    g.new_stage()
    for _ in range(3):
        g.step(run_state(), *batch(8), accumulation=1)
    assert [e for e in log if isinstance(e, tuple) and e[0] == "capture"] == [("capture", "thread_local")] * 2
    assert log.count("replay") == 3 and len(g.capture_seconds) == 2


def test_accumulation_and_odd_shapes_run_eagerly_said_once(fake_cuda):
    log, _ = fake_cuda
    said = []
    g = graphs.StepGraph(said.append, warmup=0)
    for _ in range(2):
        g.step(run_state(), *batch(4), accumulation=2)
    assert log == [("eager", 2, (4, 3, 8, 8))] * 2 and len(said) == 1 and "accumulation" in said[0]
    g.step(run_state(), *batch(4), accumulation=1)  # captured at batch 4
    log.clear()
    for _ in range(2):
        g.step(run_state(), *batch(3), accumulation=1)
    assert log == [("eager", 1, (3, 3, 8, 8))] * 2 and sum("eagerly" in s for s in said) == 2


def test_a_failed_capture_stops_the_run_in_one_line(fake_cuda):
    _, fail = fake_cuda
    fail["capture"] = True
    g = graphs.StepGraph(warmup=0)
    with pytest.raises(RunFailed) as e:
        g.step(run_state(step=41), *batch(), accumulation=1)
    text = str(e.value)
    assert "\n" not in text and "step 42" in text and "operation not permitted" in text
    assert "model.cuda_graphs=off" in text
