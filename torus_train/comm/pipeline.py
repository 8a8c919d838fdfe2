"""The torus exchange of a step's buckets in two lanes, so that bucket k+1's row phase runs beside bucket k's
column phase (comm/buckets.py uses it; the bucket timeline of `torus-train plan` models it).

    lanes = torus_lanes(state, nccl, cuda)   # None: the exchange stays serial (the reasons below)
    lanes.launch(bucket)                     # each bucket in bucket order, as soon as it is complete
    lanes.join()                             # every launched bucket averaged

Lane R runs the row phases, lane C the column phase. Each unit (a bucket; on CPU a piece of one, as much as the
row exchange takes at once) is issued in this order, the same on every rank:
    launch:  R: reduce-scatter of unit u;  C: all-reduce of unit u (after R's reduce-scatter of u);
             R: all-gather of unit u-1 (after C's all-reduce of u-1)
    join:    R: all-gather of the last unit
So lane R runs unit u+1's reduce-scatter while lane C runs unit u's all-reduce, and unit u's all-gather while
lane C runs unit u+1's. The row's communicator and the column's each see their collectives in one order on every
rank, which gloo and NCCL require; that is why the all-gather of u waits to be issued until unit u+1 (or join)
comes: issued as soon as u's all-reduce ends, its place in the row's order would depend on timing.
Where the lanes run:
- CPU buckets (gloo, shared-memory rows): one thread per lane; a task first waits for the task it follows on the
  other lane. A shared-memory row then holds two pieces in flight (comm/shm.py: three slot sets).
- CUDA buckets on NCCL: one stream per lane, events between them, nothing waits on the host (capturable). NCCL
  runs two communicators' kernels side by side safely only from NCCL 2.26 with NCCL_LAUNCH_ORDER_IMPLICIT=1,
  which orders them by the host's issue order (the same on every rank here); before that, concurrent kernels
  of two communicators may deadlock (NCCL's "Using multiple NCCL communicators concurrently"). Without it the
  exchange stays on one stream (hooks.exchange_cuda).
The exchange divides each bucket by the world size first, as hooks.reduce_bucket does, and sums in the same
order as the serial exchange: the gradients are the same bits.
Whether the lanes pay depends on the buckets and the links (the all-gather of u waits for unit u+1): `torus-train
plan` shows the two schedules side by side. By default (TORUS_TRAIN_PIPELINE unset) CPU buckets take the lanes,
NCCL does not; torus_lanes says why.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torus_train.comm import collectives
from torus_train.comm.algos import algorithm, torus_allreduce
from torus_train.comm.chunks import chunk_bounds
from torus_train.comm.hooks import TorusHookState, copy_back, nccl_layout
from torus_train.errors import UserError

PIPELINE_ENV = "TORUS_TRAIN_PIPELINE"
"""0: the serial exchange; 1: the two lanes (refused where they cannot run); unset or auto: the lanes for CPU
buckets (measured to pay on gloo), the serial exchange on NCCL (the plan's timeline shows where they pay there)."""
NCCL_ORDERED = (2, 26)
"""The first NCCL that orders two communicators' kernels by the host's issue order (NCCL_LAUNCH_ORDER_IMPLICIT)."""


def nccl_orders_launches() -> bool:
    """Whether NCCL here runs the row's and the column's kernels side by side without a deadlock (module docstring)."""
    try:
        version = tuple(torch.cuda.nccl.version()[:2])
    except (AttributeError, RuntimeError, TypeError):  # a torch built without NCCL
        return False
    return version >= NCCL_ORDERED and os.environ.get("NCCL_LAUNCH_ORDER_IMPLICIT") == "1"


def why_serial(state: TorusHookState, nccl: bool, cuda: bool) -> str | None:
    """Why the two lanes cannot run for this exchange; None when they can. Every rank decides alike (the same
    grid, algorithm, torch, NCCL and launch environment), which matters: the lanes change each group's order."""
    g = state.groups
    if not state.asynchronous:
        return "the exchange runs inside the hook (synchronous)"
    if algorithm(state.algo) is not torus_allreduce:
        return f"{state.algo} is not the torus"
    if g.grid.x == 1 or g.grid.y == 1:
        return f"grid {g.grid.x}x{g.grid.y} has no row phase or no column phase to overlap"
    if cuda and not nccl:
        return "CUDA buckets on a host backend go through host memory one at a time"
    if nccl and (g.row_group is None or state.nccl_exchange is None):
        return "no row group for the NCCL exchange"
    if nccl and not nccl_orders_launches():
        return "NCCL orders two communicators' kernels only from 2.26 with NCCL_LAUNCH_ORDER_IMPLICIT=1"
    return None


def torus_lanes(state: TorusHookState | None, nccl: bool, cuda: bool) -> ThreadLanes | StreamLanes | None:
    """The two lanes for this exchange, or None for the serial one. state.pipelined decides (None: the
    TORUS_TRAIN_PIPELINE variable, unset = auto); a request for the lanes (True, or the variable's 1) where they
    cannot run is refused with the reason. auto: the lanes for CPU buckets where they can run (on gloo they beat
    the serial exchange: docs/comm.md); on NCCL the serial exchange, because the plan's timeline has them lose
    where the row phase needs the NICs too or buckets are large (the production grid, 32x68 with 25 MiB
    buckets), and win only on some grids."""
    if state is None:
        return None
    request = state.pipelined
    if request is None:
        env = os.environ.get(PIPELINE_ENV, "auto").strip().lower()
        if env not in ("auto", "", "0", "1"):
            raise UserError(f"{PIPELINE_ENV}={env!r}: use 0, 1 or auto")
        request = None if env in ("auto", "") else env == "1"
    if request is False or (request is None and nccl):
        return None
    why = why_serial(state, nccl, cuda)
    if why is not None:
        if request:
            asked = f"{PIPELINE_ENV}=1" if state.pipelined is None else "pipelined=True"
            raise UserError(f"{asked}: the two-lane torus exchange cannot run here: {why}")
        return None
    return StreamLanes(state) if nccl else ThreadLanes(state)


@dataclass
class _Unit:
    """A unit between its column phase and its all-gather (CPU lanes)."""

    bucket: int
    index: int
    """The piece's place in its bucket."""
    piece: torch.Tensor
    bounds: Sequence[tuple[int, int]]
    column: Future
    """The unit's column phase (or its reduce-scatter where this rank's chunk is empty)."""
    then: Callable[[], object] | None = None
    """What follows the bucket's last all-gather on lane R (the copy back from the wire dtype)."""


class ThreadLanes:
    """The lanes on CPU: two threads, tasks in issue order on each (module docstring)."""

    def __init__(self, state: TorusHookState):
        self.state = state
        self._row = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torus-row")
        self._col = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torus-column")
        self._open: _Unit | None = None
        self._tasks: list[Future] = []
        self._buckets = 0
        self.spans: list[dict] = []
        """Per phase run: bucket, piece, phase, start and end (perf_counter seconds), when state.timeline is on."""

    def launch(self, bucket: torch.Tensor) -> None:
        """Issue bucket's units (the training thread; returns at once)."""
        s, k = self.state, self._buckets
        self._buckets += 1
        if bucket.numel() == 0:
            return
        wire = bucket if s.wire_dtype in (None, bucket.dtype) else torch.empty_like(bucket, dtype=s.wire_dtype)
        self._submit(self._row, k, -1, "divide", None, _divide, bucket, wire, s.world_size)
        pieces = list(s.groups.pieces(s.groups.buffer(wire)))
        for i, piece in enumerate(pieces):
            bounds = chunk_bounds(len(piece), s.groups.grid.x)
            a, b = bounds[s.groups.col]
            rs = self._submit(self._row, k, i, "row reduce-scatter", None, s.groups.row_reduce_scatter, piece, bounds)
            col = self._submit(self._col, k, i, "column all-reduce", rs, s.groups.col_allreduce, piece[a:b])
            self._close()
            last = i == len(pieces) - 1 and wire is not bucket
            then = (lambda: bucket.copy_(wire)) if last else None  # decompress after the last all-gather
            self._open = _Unit(k, i, piece, bounds, col if b > a else rs, then)

    def _close(self) -> None:
        """Issue the open unit's all-gather on lane R (after its column phase)."""
        u, self._open = self._open, None
        if u is None:
            return
        gather = self.state.groups.row_all_gather
        self._submit(self._row, u.bucket, u.index, "row all-gather", u.column, gather, u.piece, u.bounds)
        if u.then is not None:
            self._submit(self._row, u.bucket, u.index, "copy back", None, u.then)

    def _submit(self, lane, bucket: int, piece: int, phase: str, after: Future | None, fn, *args) -> Future:
        def task():
            if after is not None:
                after.result()  # the task it follows on the other lane; its error ends this one too
            start = time.perf_counter()
            fn(*args)
            if self.state.timeline is not None:
                self.spans.append(dict(bucket=bucket, piece=piece, phase=phase, start=start, end=time.perf_counter()))

        f = lane.submit(task)
        self._tasks.append(f)
        return f

    def join(self) -> None:
        """Issue the last all-gather, then wait for every task; an exchange's error surfaces here."""
        self._close()
        tasks, self._tasks = self._tasks, []
        for f in tasks:
            f.result()
        self.state.buckets_reduced += self._buckets
        self._buckets = 0

    def reset(self) -> None:
        self._open, self._buckets = None, 0

    def close(self) -> None:
        self._row.shutdown(wait=True)
        self._col.shutdown(wait=True)


def _divide(bucket: torch.Tensor, wire: torch.Tensor, world: int) -> None:
    """Divide first, in the bucket's precision (no overflow in a half-precision sum), then compress if asked."""
    bucket.div_(world)
    if wire is not bucket:
        wire.copy_(bucket)


class StreamLanes:
    """The lanes on NCCL: two CUDA streams with events between them (module docstring). No host waits.
    CPU buckets on NCCL (a rehearsal, plan/rehearse, where the fake backend plays NCCL) go through the same
    collectives in the same order, inline."""

    def __init__(self, state: TorusHookState):
        self.state = state
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None
        self._open: tuple | None = None
        self._buckets = 0
        self.spans: list[dict] = []  # host times are not GPU times: none kept on CUDA

    def _lanes(self, bucket: torch.Tensor) -> tuple[torch.cuda.Stream | None, torch.cuda.Stream | None]:
        if not bucket.is_cuda:
            return None, None
        if self._streams is None:
            self._streams = (torch.cuda.Stream(device=bucket.device), torch.cuda.Stream(device=bucket.device))
        return self._streams

    def launch(self, bucket: torch.Tensor) -> None:
        """Queue the bucket's reduce-scatter on lane R, its all-reduce on lane C, the previous all-gather on R."""
        s, g = self.state, self.state.groups
        row, col = self._lanes(bucket)
        if row is not None:
            row.wait_stream(torch.cuda.current_stream(bucket.device))  # backward wrote the bucket
        with _on(row):
            bucket.div_(s.world_size)  # divide first, in the bucket's precision
            padded, chunk = nccl_layout(s, bucket)
            collectives.reduce_scatter(chunk, padded, group=g.row_group)
            scattered = _mark(row)
        _after(col, scattered)
        with _on(col):
            if g.col_group is not None:
                dist.all_reduce(chunk, group=g.col_group)
            summed = _mark(col)
        self._close()
        self._open = (bucket, padded, chunk, summed)
        self._buckets += 1

    def _close(self) -> None:
        if self._open is None:
            return
        (bucket, padded, chunk, summed), self._open = self._open, None
        row = self._lanes(bucket)[0]
        _after(row, summed)
        with _on(row):
            collectives.all_gather(padded, chunk, group=self.state.groups.row_group)
            copy_back(bucket, padded)

    def join(self) -> None:
        """The last all-gather, then the current stream waits for both lanes (a capture joins them here)."""
        self._close()
        if self._streams is not None:
            current = torch.cuda.current_stream(self._streams[0].device)
            for lane in self._streams:
                current.wait_stream(lane)
        self.state.buckets_reduced += self._buckets
        self._buckets = 0

    def reset(self) -> None:
        self._open, self._buckets = None, 0

    def close(self) -> None:
        pass


def _on(stream: torch.cuda.Stream | None):
    """Work queued on `stream`; inline without one (CPU buckets)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _mark(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    """An event at the end of what `stream` has queued so far (None without a stream)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _after(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
    """`stream`'s next work waits for `event` (a GPU-side wait: the host goes on)."""
    if stream is not None and event is not None:
        stream.wait_event(event)
