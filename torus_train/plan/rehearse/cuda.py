"""The CUDA calls of the graphed step (train/graphs.py), played on the CPU of a rehearsal (imports torch).

A rehearsed rank has no GPU, but the job it rehearses replays its step from a CUDA graph. So that the rehearsal
takes that path and records what NCCL would see, torch.cuda's graph, stream and synchronisation calls are
replaced in the rehearsal's process only: a capture runs the step once with the recorder in "capture" mode (its
collectives are recorded as captured: a real capture enqueues them into the graph), a replay runs the captured
step again in "replay" mode (a graph launch re-issues exactly the captured collectives), and a synchronisation
is recorded as an event, since NCCL's graph-mixing rule depends on it. Nothing here is used outside
`plan rehearse`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from torus_train.plan.rehearse.record import Recorder
from torus_train.train import graphs, loop


class _Stream:
    def __init__(self, device=None, **_):
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Graph:
    """A graph that remembers the step_body call made while it captured, and makes it again on replay."""

    def __init__(self, standin: CudaStandIn):
        self.standin = standin
        self.call: tuple | None = None
        self.out: torch.Tensor | None = None

    def replay(self) -> None:
        assert self.call is not None and self.out is not None
        rec = self.standin.recorder
        rec.mode = "replay"
        try:
            self.out.copy_(self.standin.real_body(*self.call).detach())
        finally:
            rec.mode = "eager"


class CudaStandIn:
    """Installs the stand-ins (install) and takes them out again (uninstall)."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.real_body = graphs.step_body
        self.capturing: _Graph | None = None
        self._saved: dict[tuple[Any, str], Any] = {}

    def _set(self, owner, name: str, value) -> None:
        self._saved[(owner, name)] = getattr(owner, name, None)
        setattr(owner, name, value)

    def install(self) -> None:
        rec = self.recorder
        for name, value in {
            "CUDAGraph": lambda: _Graph(self),
            "graph_pool_handle": lambda: "pool",
            "graph": self.graph,
            "synchronize": lambda device=None: rec.note("sync", "torch.cuda.synchronize"),
            "empty_cache": lambda: None,
            "Stream": _Stream,
            "current_stream": lambda device=None: _Stream(),
            "stream": lambda s: contextlib.nullcontext(),
        }.items():
            self._set(torch.cuda, name, value)
        self._set(graphs, "step_body", self.body)
        self._set(loop, "graphs_wanted", lambda spec, boot: spec.model.cuda_graphs == "auto")  # as on a CUDA rank

    def uninstall(self) -> None:
        for (owner, name), value in self._saved.items():
            setattr(owner, name, value)
        self._saved = {}

    def graph(self, g: _Graph, pool=None, capture_error_mode=None):
        @contextlib.contextmanager
        def capture():
            self.capturing, self.recorder.mode = g, "capture"
            try:
                yield
            finally:
                self.capturing, self.recorder.mode = None, "eager"

        return capture()

    def body(self, rs, images, labels, accumulation):
        out = self.real_body(rs, images, labels, accumulation)
        if self.capturing is not None:
            self.capturing.call, self.capturing.out = (rs, images, labels, accumulation), out
        out.record_stream = lambda stream: None
        return out
