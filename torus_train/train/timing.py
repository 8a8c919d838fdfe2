"""Each rank's own share of a step, for the straggler report: the data wait (getting the batch) and the compute
(from having the batch to the last gradient of backward, the moment the rank hands its last bucket to the
exchange).

In synchronous data parallelism every rank's wall time per step is the same (they wait for each other in the
exchange), so wall time cannot name a slow rank; these two can. The end of compute is taken from a hook on
the gradient accumulation of the parameter whose gradient comes last (learnt in the first step, with a hook on
every parameter; then only that one stays), not from backward returning, which waits for the exchange and so
for the slowest rank. CPU: time.perf_counter in the hook. CUDA: one event re-recorded by
the hooks on the current stream, read with the step's start event at the logging interval (no host sync per
step). Kept per step on the host (two floats); reduced to percentiles once, at the end.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn as nn

PERCENTILES = (50, 90, 100)
FIELDS = ("data", "compute", "work")  # work = data + compute, the rank's own time per step


class StepTimes:
    """Per-step data and compute seconds of this rank."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self.data: list[float] = []
        self.compute: list[float] = []
        self._t0 = 0.0
        self._last = 0.0
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # CUDA: the step in progress
        self._pending: list[tuple] = []  # CUDA: steps whose events are not read yet
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self._params]
        self._last_param = None  # the last parameter whose hook fired (first step: to keep only its hook)
        self._whole = False  # a captured step: compute is the whole step (no hook runs inside a graph replay)

    def whole_step(self) -> None:
        """From here on, compute ends when the step does (the step is replayed from a CUDA graph, where no
        Python hook runs): the gradient hooks go."""
        self._whole = True
        for h in self._handles:
            h.remove()
        self._handles = []

    def _grad_ready(self, param) -> None:
        self._last_param = param
        if self._events is not None:
            self._events[1].record()
        else:
            self._last = time.perf_counter()

    def start(self, data_seconds: float) -> None:
        """The batch is here (it took ``data_seconds``); compute starts."""
        self.data.append(data_seconds)
        if self.cuda:
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
            events[1].record()
            self._events = events
        self._t0 = self._last = time.perf_counter()

    def stop(self) -> None:
        """The step's backward has returned."""
        if self._whole:
            if self._events is not None:
                self._events[1].record()
            self._last = time.perf_counter()
        if self._events is not None:
            self._pending.append(self._events)
            self._events = None
        else:
            self.compute.append(self._last - self._t0)
        if len(self._handles) > 1 and self._last_param is not None:  # keep the hook of the last gradient only
            last = next(i for i, p in enumerate(self._params) if p is self._last_param)
            for i, h in enumerate(self._handles):
                if i != last:
                    h.remove()
            self._handles = [self._handles[last]]

    def flush(self) -> None:
        """Read the CUDA events of the steps since the last flush (call where the host waits anyway)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.compute += [a.elapsed_time(b) / 1000 for a, b in self._pending]
            self._pending = []

    def percentiles(self) -> list[float]:
        """[data p50, p90, max, compute p50, p90, max, work p50, p90, max] in seconds (zeros before a step)."""
        self.flush()
        n = min(len(self.data), len(self.compute))
        if not n:
            return [0.0] * (len(FIELDS) * len(PERCENTILES))
        d, c = np.array(self.data[-n:]), np.array(self.compute[-n:])
        return [float(v) for series in (d, c, d + c) for v in np.percentile(series, PERCENTILES)]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
