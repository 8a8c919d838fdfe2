"""torch.cuda's graph calls replaced by recorders that run what a graph would, on the CPU (tests/test_step_graph.py,
tests/dist/graph_probe_worker.py): the capture runs the step (a real capture runs nothing on the device, so this
is the harder case for putting the state back), a replay runs the captured step again on the static inputs."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import torch

from torus_train.train import graphs


class FakeCuda:
    """Records torch.cuda's graph calls; a graph remembers the step_body call made while it captured. Models what
    torch 2.x does around a capture: torch.cuda.graph makes a capture stream current and the caching allocator
    route its allocations to the graph's pool ("underway") until capture_end ends both; a capture_end that
    raises (from cudaStreamEndCapture) ends neither, and empty_cache then trips on the capture still underway."""

    def __init__(self):
        self.log: list = []
        self.fail_capture: set[int] = set()  # the numbers (1, 2, ...) of the captures whose capture_end raises
        self.fail_in_body: set[int] = set()  # ... whose step raises inside (capture_end then raises too)
        self.stuck = False  # a failed capture leaves its stream capturing, which nothing here can end
        self.mismatch = False
        self.capturing = None
        self.captures = 0
        self.default, self.capture_stream = _Stream(), _Stream()
        self.stream = self.default
        self.underway: set = set()  # the pools the allocator allocates to (c10's captures_underway)
        self.released: list = []  # the pools released (releasePool)
        self._pools = itertools.count(1)

    def graph(self, g, pool=None, capture_error_mode=None):
        fake = self

        @contextlib.contextmanager
        def capture():
            fake.captures += 1
            n = fake.captures
            fake.log.append(("capture", capture_error_mode))
            before, fake.stream = fake.stream, fake.capture_stream
            fake.underway.add(pool)
            fake.capturing = g
            try:
                yield
            except RuntimeError:  # the step's error: capture_end raises its own, the step's as its __context__
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture")  # noqa: B904
            finally:
                fake.capturing = None
            if n in fake.fail_capture:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
            fake.underway.discard(pool)  # capture_end: endAllocateToPool, then the stream back
            fake.stream = before

        return capture()

    def pool_handle(self):
        return (0, next(self._pools))

    def empty_cache(self):
        if self.underway:
            raise RuntimeError("captures_underway.empty() INTERNAL ASSERT FAILED at CUDACachingAllocator.cpp")

    def end_allocate_to_pool(self, device, pool):
        if pool not in self.underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.underway.discard(pool)

    def release_pool(self, device, pool):
        self.released.append(pool)

    def set_stream(self, stream):
        self.stream = stream

    def is_capturing(self):
        return self.stuck and self.stream is self.capture_stream


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
        if fake.capturing is not None and fake.captures in fake.fail_in_body:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        out = real(rs, images, labels, accumulation)
        if fake.capturing is not None:
            fake.capturing.call, fake.capturing.out = (rs, images, labels, accumulation), out
        else:
            fake.log.append(("eager", accumulation, tuple(images.shape)))
        out.record_stream = lambda s: None
        return out

    for name, value in {
        "CUDAGraph": lambda: FakeGraph(fake, real),
        "graph_pool_handle": fake.pool_handle,
        "graph": fake.graph,
        "synchronize": lambda device=None: None,
        "empty_cache": fake.empty_cache,
        "Stream": _Stream,
        "current_stream": lambda device=None: fake.stream,
        "set_stream": fake.set_stream,
        "is_current_stream_capturing": fake.is_capturing,
        "stream": lambda s: contextlib.nullcontext(),
    }.items():
        setattr_(torch.cuda, name, value)
    setattr_(torch._C, "_cuda_endAllocateToPool", fake.end_allocate_to_pool)
    setattr_(torch._C, "_cuda_releasePool", fake.release_pool)
    setattr_(graphs, "step_body", body)
    return fake
