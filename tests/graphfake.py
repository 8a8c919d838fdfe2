"""torch.cuda's graph calls replaced by recorders that run what a graph would, on the CPU (tests/test_step_graph.py,
tests/dist/graph_probe_worker.py): the capture runs the step (a real capture runs nothing on the device, so this
is the harder case for putting the state back), a replay runs the captured step again on the static inputs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from torus_train.train import graphs


class FakeCuda:
    """Records torch.cuda's graph calls; a graph remembers the step_body call made while it captured."""

    def __init__(self):
        self.log: list = []
        self.fail_capture: set[int] = set()  # the numbers (1, 2, ...) of the captures that raise
        self.mismatch = False
        self.capturing = None
        self.captures = 0

    def graph(self, g, pool=None, capture_error_mode=None):
        fake = self

        @contextlib.contextmanager
        def capture():
            fake.captures += 1
            fake.log.append(("capture", capture_error_mode))
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None
            if fake.captures in fake.fail_capture:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

        return capture()


class FakeGraph:
    def __init__(self, fake: FakeCuda, body):
        self.fake, self.body, self.call, self.out = fake, body, None, None

    def replay(self):
        self.fake.log.append("replay")
        self.out.copy_(self.body(*self.call))
        if self.fake.mismatch:  # a graph that computes something else than the eager step
            with torch.no_grad():
                next(self.call[0].model.parameters()).add_(0.5)


class _Stream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass


def install(setattr_: Callable) -> FakeCuda:
    """The recorders in torch.cuda and train/graphs.py, through ``setattr_`` (monkeypatch.setattr, or setattr)."""
    fake = FakeCuda()
    real = graphs.step_body

    def body(rs, images, labels, accumulation):
        out = real(rs, images, labels, accumulation)
        if fake.capturing is not None:
            fake.capturing.call, fake.capturing.out = (rs, images, labels, accumulation), out
        else:
            fake.log.append(("eager", accumulation, tuple(images.shape)))
        out.record_stream = lambda s: None
        return out

    for name, value in {
        "CUDAGraph": lambda: FakeGraph(fake, real),
        "graph_pool_handle": lambda: "pool",
        "graph": fake.graph,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "Stream": _Stream,
        "current_stream": lambda device=None: _Stream(),
        "stream": lambda s: contextlib.nullcontext(),
    }.items():
        setattr_(torch.cuda, name, value)
    setattr_(graphs, "step_body", body)
    return fake
