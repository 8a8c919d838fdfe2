"""The training step replayed as one CUDA graph per batch-size stage (model.cuda_graphs = auto; docs/graphs.md).

At the run's per-GPU batch (16-32 images) a step is a few milliseconds of GPU work and launching it kernel by
kernel from Python costs more than the work. step.step_body has no host read and takes everything that
changes per step from device tensors (LR, step number, loss scale, skip counts), so PyTorch's whole-network
capture recipe applies to it unchanged:

1. warm-up: the stage's first ``warmup`` steps run eagerly on a side stream (real steps, counted as any:
   cuDNN picks its kernels, NCCL makes its communicators, the optimizer and the loss scaler their state);
2. capture: the next step's batch is copied into static input buffers and step_body(static inputs) is captured
   once into a graph with its own memory pool (the exchange's side stream and its NCCL calls inside it);
3. replay: every later step copies its batch into the static buffers and replays; the returned loss is the
   graph's static output, added to the interval's sum on the device before the next replay.
Everything that needs the host (logging, replica checks, checkpoints, stop requests, the heartbeat) runs
between replays, on the same parameters and optimizer state the graph holds. A stage switch (new shapes)
drops the graph and captures again; a step of another shape (none in the loaders' full batches) and stages
with gradient accumulation run eagerly, said once.
A graph launch holding NCCL calls is a collective: every rank replays the same graph, which holds because every
rank captures at the same step of the same stage.
"""

from __future__ import annotations

import logging
import time

import torch

from torus_train.errors import RunFailed
from torus_train.train.step import step_body

log = logging.getLogger("torus_train.train")

WARMUP_STEPS = 3
"""Eager steps of each stage before its capture (the recipe's warm-up; torch's docs use 3 as well)."""


def wanted(spec, boot) -> bool:
    """model.cuda_graphs = auto on a CUDA rank whose exchange runs on NCCL (a host backend stages buckets
    through host memory, which a graph cannot hold)."""
    return spec.model.cuda_graphs == "auto" and boot.device.type == "cuda" and boot.backend == "nccl"


class StepGraph:
    """One captured step per stage, replayed (see the module docstring)."""

    def __init__(self, say=None, warmup: int = WARMUP_STEPS):
        self.say = say or (lambda text: None)
        """Rank 0's progress line (report.Progress.say); the others log only."""
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.pool: object = None  # the graph's memory pool, kept while the graph lives
        self.static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (images, labels, loss)
        self.eager_steps = 0
        """Steps of this stage run eagerly so far (the warm-up)."""
        self.capture_seconds: list[float] = []
        """Seconds of each capture (one per stage), for the summary and gpu_check."""
        self._said: set = set()
        self._side: torch.cuda.Stream | None = None

    def new_stage(self) -> None:
        """New shapes from here on: the graph goes (its pool with it) and the next steps warm up again."""
        self.graph = self.static = self.pool = None
        self.eager_steps = 0
        torch.cuda.empty_cache()

    def step(self, rs, images, labels, accumulation: int) -> torch.Tensor:
        if accumulation > 1:
            self._once(
                "accumulation",
                f"CUDA graphs: a stage with gradient accumulation ({accumulation} "
                "micro-batches) runs its steps eagerly",
            )
            return step_body(rs, images, labels, accumulation)
        if self.graph is None and self.eager_steps < self.warmup:
            self.eager_steps += 1
            return self._on_side_stream(rs, images, labels)
        if self.graph is None:
            self._capture(rs, images, labels)
        assert self.graph is not None and self.static is not None  # _capture made them or raised
        x, y, loss = self.static
        if images.shape != x.shape or labels.shape != y.shape or images.dtype != x.dtype:
            self._once(
                ("shape", tuple(images.shape)),
                f"CUDA graphs: a batch of shape {tuple(images.shape)} (the graph's is {tuple(x.shape)}) runs eagerly",
            )
            return step_body(rs, images, labels, 1)
        x.copy_(images)
        y.copy_(labels)
        self.graph.replay()
        return loss

    def _on_side_stream(self, rs, images, labels) -> torch.Tensor:
        """An eager step on a side stream (the recipe's warm-up: lazy state is made off the default stream)."""
        if self._side is None:
            self._side = torch.cuda.Stream(device=images.device)
        main = torch.cuda.current_stream(images.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            loss = step_body(rs, images, labels, 1)
        main.wait_stream(self._side)
        loss.record_stream(main)  # used on the main stream after this
        return loss

    def _capture(self, rs, images, labels) -> None:
        """Static inputs holding this step's batch; the whole step captured into a new graph."""
        if rs.times is not None:
            rs.times.whole_step()  # no per-gradient timing hook inside the graph
        torch.cuda.synchronize()  # nothing of the eager steps in flight (NCCL's watchdog included)
        t0 = time.perf_counter()
        x, y = images.clone(), labels.clone()  # clone keeps the memory format (channels_last)
        graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                loss = step_body(rs, x, y, 1)
            torch.cuda.synchronize()
        except RuntimeError as e:
            # a failed capture leaves host-side step state (loss scaler, bucket counts) half-stepped: continuing
            # eagerly could train wrong, so the run stops with the way around
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RunFailed(
                f"CUDA graph capture failed at step {rs.pos.global_step + 1} (batch {tuple(x.shape)}): "
                f"{first}; run with --set model.cuda_graphs=off for the eager step"
            ) from None
        seconds = time.perf_counter() - t0
        self.graph, self.pool, self.static = graph, pool, (x, y, loss)
        self.capture_seconds.append(seconds)
        text = (
            f"CUDA graph: step {rs.pos.global_step + 1} captured in {seconds:.2f} s (batch "
            f"{tuple(x.shape)}); replayed from here until the next stage"
        )
        log.info("%s", text)
        self.say(text)

    def _once(self, key, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info("%s", text)
            self.say(text)
