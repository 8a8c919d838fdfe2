"""A DDP communication hook that averages each gradient bucket with the torus (or flat, or hierarchical) all-reduce.

    state = TorusHookState(groups, algo="torus", compression=None)   # or "fp16" / "bf16"
    ddp_model.register_comm_hook(state, allreduce_hook)

DDP keeps doing what it is good at (bucketing gradients in reverse order, launching a bucket as soon as it is
ready, overlapping with the rest of the backward pass); the hook only replaces the exchange:
  1. divide the bucket by the world size first, in its own precision (the average of the gradients can never
     overflow where the sum could: fp16 tops out at 65504);
  2. compress to fp16 or bf16 if asked (what crosses the wire is then half the bytes);
  3. sum with the chosen algorithm (torus_train.comm.algos), which accumulates shared-memory partial sums in fp32;
  4. decompress into the bucket.
On CPU (gloo) the exchange runs on one background thread per process, buckets in submission order, so the
backward pass goes on while a bucket is in flight, as with DDP's own asynchronous all-reduce. Every rank
submits the same buckets in the same order, so the collectives match across ranks.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from torus_train.comm import ALGOS
from torus_train.comm.algos import allreduce

_COMPRESS = {None: None, "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorusHookState:
    """What the hook needs: the grid communicator, the algorithm and the wire precision."""

    def __init__(self, groups, algo: str = "torus", compression: str | None = None, background: bool | None = None):
        if algo not in ALGOS:
            raise ValueError(f"comm.algo {algo!r} is not one of {', '.join(ALGOS)}")
        if compression not in _COMPRESS:
            raise ValueError(f"comm.compression {compression!r} is not one of none, fp16, bf16")
        self.groups = groups
        """GridGroups (or any grid communicator of torus_train.comm)."""
        self.algo = algo
        """flat | torus | hierarchical."""
        self.wire_dtype = _COMPRESS[compression]
        """dtype exchanged, or None to exchange the bucket's own dtype."""
        self.world_size = groups.grid.size
        self.background = background
        """Run CPU exchanges on a background thread (None: yes for CPU buckets)."""
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.buckets_reduced = 0
        """How many buckets went through the hook (for tests and logs)."""

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torus-allreduce")
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def reduce_bucket(state: TorusHookState, buffer: torch.Tensor) -> torch.Tensor:
    """Average `buffer` over all ranks in place (the steps of the module docstring); returns it."""
    buffer.div_(state.world_size)                       # 1. divide first: no overflow in a half-precision sum
    if state.wire_dtype is not None and buffer.dtype != state.wire_dtype:
        wire = buffer.to(state.wire_dtype)              # 2. compress
        allreduce(wire, state.algo, state.groups)       # 3. sum
        buffer.copy_(wire)                              # 4. decompress
    else:
        allreduce(buffer, state.algo, state.groups)
    state.buckets_reduced += 1
    return buffer


def allreduce_hook(state: TorusHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket with state.algo; returns a Future of the reduced buffer."""
    buffer = bucket.buffer()
    fut = torch.futures.Future()
    background = state.background if state.background is not None else not buffer.is_cuda
    if not background:
        fut.set_result(reduce_bucket(state, buffer))
        return fut

    def work():
        try:
            fut.set_result(reduce_bucket(state, buffer))
        except BaseException as exc:  # surface the error in the training thread, at DDP's wait
            fut.set_exception(exc)

    state.pool().submit(work)
    return fut
