"""Data parallelism without DDP's reducer: gradients in flat buckets that torus-train owns, each bucket averaged
with comm.algo as soon as its last gradient is in, so that the exchange overlaps backward as DDP's does, and
so that the whole step can be captured in one CUDA graph (DDP's reducer cannot be: docs/graphs.md).

    dp = BucketedModel(model, TorusHookState(groups, algo="torus"), bucket_mb=25)
    dp.zero_grad()                     # the flat buckets to zero (the gradients are views of them)
    loss = loss_fn(dp(x), y)           # forward, as the model itself
    loss.backward()                    # each bucket's exchange starts when its gradients are all in
    dp.finish()                        # joined: every gradient is the average over the ranks
    optimizer.step()

1. Buckets: the parameters in reverse order (the order backward produces their gradients), cut where a bucket
   would pass its size (the first bucket 1 MiB, as DDP: the exchange starts early) or the dtype changes: the
   bucket rule of comm/bucketing.py, which the plan's timeline also uses. Each bucket is one flat tensor; every
   parameter's ``.grad`` is a view of it with the parameter's own strides (channels_last weights too), so
   backward accumulates straight into the bucket and nothing is copied.
2. A hook per parameter (register_post_accumulate_grad_hook) counts the bucket's gradients; when a bucket is
   complete, it and every complete bucket after the last one launched are exchanged, in bucket order: every
   rank issues the same collectives in the same order, whatever order backward finished them in.
3. The exchange is the torus hook's (torus_train.comm.hooks): divide by the world size first, then the
   algorithm; CUDA buckets on NCCL on a side stream that waits for backward (the current stream waits for it
   in finish(), no host wait: capturable), CPU buckets on the hook state's one background thread. Where the
   torus has rows and columns, two lanes instead (torus_train.comm.pipeline): bucket k+1's row phase runs
   beside bucket k's column phase, on two threads (CPU) or two streams (NCCL, where NCCL allows it).
``no_sync()`` skips the exchange (micro-batches before the last of a step accumulate locally, as in DDP).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES, parameter_buckets
from torus_train.comm.hooks import TorusHookState, exchange_cuda, reduce_bucket
from torus_train.comm.pipeline import torus_lanes


@dataclass
class Bucket:
    """One flat gradient buffer and the parameters whose gradients are views of it."""

    index: int
    params: list
    flat: torch.Tensor
    views: list
    """Each parameter's gradient: a view of ``flat`` with the parameter's strides."""
    pending: int = 0
    """Gradients of this step not in yet."""
    futures: list = field(default_factory=list)
    tail: int = 0
    """Elements after the gradients, exchanged with them: the stats slot (BucketedModel's ``stats``) first,
    then zeros up to a multiple of the row's length."""


def plan_buckets(params: list, bucket_bytes: int, first_bytes: int = FIRST_BUCKET_BYTES) -> list[list]:
    """The parameters in buckets by the bucket rule (comm/bucketing.py): reverse order, at most ``bucket_bytes``
    each (the first at most ``first_bytes``), a new bucket where the dtype changes."""
    sizes = [p.numel() * p.element_size() for p in params]
    cut = parameter_buckets(sizes, bucket_bytes, first_bytes, [p.dtype for p in params])
    return [[params[i] for i in b] for b in cut]


class BucketedModel:
    """A model whose gradients are averaged over the ranks in owned buckets (see the module docstring).

    Called like the model; ``module`` is the model itself (its state_dict has no prefix)."""

    def __init__(
        self,
        module: nn.Module,
        state: TorusHookState | None,
        bucket_mb: float,
        first_bytes: int = FIRST_BUCKET_BYTES,
        stats: bool = False,
    ):
        self.module = module
        self.torus_hook_state = state
        """The exchange's settings (algorithm, groups, wire dtype, where it runs); None: a world of one."""
        params = [p for p in module.parameters() if p.requires_grad]
        cut = plan_buckets(params, int(bucket_mb * 2**20), first_bytes)
        x = state.groups.grid.x if state is not None else 1
        self.buckets = [
            self._bucket(i, ps, stats_tail(ps, x) if stats and i == len(cut) - 1 else 0) for i, ps in enumerate(cut)
        ]
        last = self.buckets[-1] if self.buckets else None
        self.stats: torch.Tensor | None = None
        if stats and last is not None:
            n = last.flat.numel() - last.tail
            self.stats = last.flat[n : n + 1]
        """The stats slot: one element after the last bucket's gradients (the last bucket launched), written
        with this rank's squared gradient norm, summed over every bucket as each is launched (before its
        exchange divides it); the exchange averages it with the gradients, so after finish() it holds the mean
        over the ranks of their squared norms, with no collective of its own (train/noise.py reads it)."""
        self.stats_scale: torch.Tensor | None = None
        """The loss scale that made this step's gradients (a device tensor, the GradScaler's own), divided out
        of the stats slot squared before it is exchanged: the slot then fits a half-precision wire."""
        self._local_sq: torch.Tensor | None = None
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        self._syncing = True
        self._launched = 0
        self._cuda = bool(self.buckets) and self.buckets[0].flat.is_cuda
        # NCCL's exchange: CUDA buckets on a side stream; CPU buckets only in a full-world rehearsal (plan/rehearse),
        # where the fake backend plays NCCL and the same collectives run inline
        self._nccl = state is not None and state.groups.backend == "nccl"
        self._lanes = torus_lanes(state, self._nccl, self._cuda)  # None: each bucket's phases one after another
        self.zero_grad()
        if state is not None and dist.is_initialized():
            broadcast_state(module)  # every rank starts from rank 0's parameters and buffers, as DDP does

    @staticmethod
    def _bucket(index: int, params: list, tail: int = 0) -> Bucket:
        flat = torch.zeros(sum(p.numel() for p in params) + tail, dtype=params[0].dtype, device=params[0].device)
        views, offset = [], 0
        for p in params:  # the gradient keeps the parameter's strides (DDP's gradient_as_bucket_view)
            views.append(flat.as_strided(p.shape, p.stride(), offset))
            p.grad = views[-1]
            offset += p.numel()
        return Bucket(index, params, flat, views, pending=len(params), tail=tail)

    def gradient_parts(self) -> list[torch.Tensor]:
        """Each bucket's gradients as one flat tensor (the stats slot left out)."""
        return [b.flat[: b.flat.numel() - b.tail] for b in self.buckets]

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def zero_grad(self) -> None:
        """Every gradient to zero (one fill per bucket) and the bucket counts reset for the next backward."""
        for b in self.buckets:
            b.flat.zero_()
            for p, view in zip(b.params, b.views, strict=True):
                if p.grad is not view:
                    p.grad = view  # set to None elsewhere (module.zero_grad()): views again
        self._reset()

    def reset(self) -> None:
        """Back to the start of a step: counts and futures cleared, exchanging on (a capture that stopped midway,
        train/graphs.py, leaves them half-counted)."""
        self._syncing = True
        if self._lanes is not None:
            self._lanes.reset()
        self._reset()

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending = len(b.params)
            b.futures = []
        self._launched = 0
        self._local_sq = None

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside accumulates into the buckets without exchanging (a micro-batch before the last)."""
        before, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = before

    def _grad_ready(self, param) -> None:
        if not self._syncing:
            return
        b = self._bucket_of[id(param)]
        b.pending -= 1
        while self._launched < len(self.buckets) and self.buckets[self._launched].pending == 0:
            self._launch(self.buckets[self._launched])
            self._launched += 1

    def _launch(self, b: Bucket) -> None:
        if self.stats is not None:
            self._add_norm(b)
        state = self.torus_hook_state
        if state is None:
            return
        if self._lanes is not None:  # bucket k's row phase beside bucket k-1's column phase (comm/pipeline.py)
            self._lanes.launch(b.flat)
            return
        if self._nccl:
            if not (state.asynchronous and self._cuda):
                exchange_cuda(state, b.flat)
                return
            side = state.stream(b.flat.device)
            side.wait_stream(torch.cuda.current_stream(b.flat.device))  # backward wrote the bucket
            with torch.cuda.stream(side):
                exchange_cuda(state, b.flat)
            return
        if self._cuda:  # CUDA buckets on a host backend: through host memory (not capturable)
            torch.cuda.current_stream(b.flat.device).synchronize()
            host = b.flat.to("cpu")
            reduce_bucket(state, host)
            b.flat.copy_(host)
            return
        if not state.asynchronous:
            reduce_bucket(state, b.flat)
            return
        b.futures.append(state.pool().submit(reduce_bucket, state, b.flat))

    def _add_norm(self, b: Bucket) -> None:
        """This rank's squared gradient norm, bucket by bucket before each is exchanged (on the stream that
        wrote the gradients, before the exchange's stream waits for it); into the stats slot with the last."""
        g = b.flat[: b.flat.numel() - b.tail]
        sq = torch.dot(g, g)
        self._local_sq = sq if self._local_sq is None else self._local_sq + sq
        if b.tail and self.stats is not None:
            scale = self.stats_scale
            self.stats.copy_(self._local_sq if scale is None else self._local_sq / scale.float().square())

    def finish(self) -> None:
        """Join the exchange: every bucket launched (those with a parameter that got no gradient now, in
        order), every gradient averaged; the current stream waits for the side stream, the host waits for CPU
        exchanges only. Then the counts are reset for the next backward."""
        if self._syncing:
            for b in self.buckets[self._launched :]:
                self._launch(b)
            if self._lanes is not None:
                self._lanes.join()
            for b in self.buckets:
                for f in b.futures:
                    f.result()  # an exchange's error surfaces here, in the training thread
            state = self.torus_hook_state
            if self._nccl and self._cuda and state is not None and state.asynchronous:
                torch.cuda.current_stream(self.buckets[0].flat.device).wait_stream(
                    state.stream(self.buckets[0].flat.device)
                )
        self._reset()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._lanes is not None:
            self._lanes.close()
        if self.torus_hook_state is not None:
            self.torus_hook_state.close()


def stats_tail(params: list, x: int) -> int:
    """Elements the stats slot adds to a bucket: the slot and zeros up to a multiple of the row's length x, so
    that NCCL's torus lays the bucket out as X equal chunks without a padded copy (comm/hooks.py nccl_layout)."""
    return (-(sum(p.numel() for p in params) + 1)) % x + 1


def broadcast_state(module: nn.Module) -> None:
    """Parameters and buffers from rank 0 (every rank starts where rank 0 does)."""
    broadcast_from_rank0(list(module.parameters()) + list(module.buffers()))


def broadcast_from_rank0(tensors: list) -> None:
    """Rank 0's values of ``tensors`` on every rank: every tensor's bytes packed into one flat byte tensor, one
    broadcast, unpacked (float statistics and int64 counters alike), instead of one collective per tensor."""
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return
    raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    flat = torch.cat(raw)
    dist.broadcast(flat, 0)
    with torch.no_grad():
        for t, piece in zip(tensors, flat.split([r.numel() for r in raw]), strict=True):
            t.copy_(piece.clone().view(t.dtype).view(t.shape))  # clone: aligned for a wider dtype
