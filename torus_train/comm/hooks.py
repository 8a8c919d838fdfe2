"""The exchange of one gradient bucket with the torus (or flat, or hierarchical) all-reduce, and its state.

    state = TorusHookState(groups, algo="torus", compression=None)   # or "fp16" / "bf16"; asynchronous=False
    dp = BucketedModel(model, state, bucket_mb=25)                    # comm/buckets.py launches the buckets

The steps of one bucket's exchange (reduce_bucket; exchange_cuda for CUDA buckets on NCCL):
  1. divide the bucket by the world size first, in its own precision (the average of the gradients can never
     overflow where the sum could: fp16 tops out at 65504);
  2. compress to fp16 or bf16 if asked (what crosses the wire is then half the bytes);
  3. sum with the chosen algorithm (torus_train.comm.algos; on NCCL the torus runs as three collectives on equal
     chunks, see exchange_torus_nccl, its table entry's `nccl`);
  4. decompress into the bucket.
The state holds where an asynchronous exchange runs: CUDA buckets on NCCL on one side stream, CPU buckets on one
background thread per process, buckets in submission order (every rank must issue the row and column
collectives in the same order; gloo and the shared-memory copies release the GIL). The package's owned buckets
replaced a DDP comm hook here: they overlap with the backward pass as DDP does and can be captured in a CUDA
graph, which DDP's reducer cannot.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from torus_train.comm import collectives
from torus_train.comm.algos import algorithm, allreduce
from torus_train.job.algorithms import ALGORITHMS, DEFAULT
from torus_train.registry import load

_COMPRESS = {None: None, "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorusHookState:
    """What the hook needs: the grid communicator, the algorithm, the wire precision and where to run."""

    def __init__(
        self,
        groups,
        algo: str = DEFAULT,
        compression: str | None = None,
        asynchronous: bool = True,
        timeline: bool = False,
        pipelined: bool | None = None,
    ):
        algorithm(algo)  # ValueError unless a rank can run it
        if compression not in _COMPRESS:
            raise ValueError(f"comm.compression {compression!r} is not one of none, fp16, bf16")
        self.groups = groups
        """GridGroups (or any grid communicator of torus_train.comm)."""
        self.algo = algo
        """A runnable algorithm of torus_train.job.algorithms."""
        nccl = ALGORITHMS.get(algo).nccl
        self.nccl_exchange = load(nccl) if nccl else None
        """The algorithm's own exchange for CUDA buckets on NCCL (exchange_torus_nccl), or None."""
        self.wire_dtype = _COMPRESS[compression]
        """dtype exchanged, or None to exchange the bucket's own dtype."""
        self.world_size = groups.grid.size
        self.asynchronous = asynchronous
        """Launch the exchange and go on (side stream / background thread); False: exchange at the launch."""
        self.timeline: list[dict] | None = [] if timeline else None
        """The two-lane exchange's phase runs (comm/pipeline.py: bucket, piece, phase, start, end), if kept."""
        self.pipelined = pipelined
        """comm/buckets.py: bucket k+1's row phase beside bucket k's column phase (comm/pipeline.py); None: the
        TORUS_TRAIN_PIPELINE variable decides (unset: on for CPU buckets, off on NCCL)."""
        self._pool: ThreadPoolExecutor | None = None
        self._stream: torch.cuda.Stream | None = None
        self._lock = threading.Lock()
        self.buckets_reduced = 0
        """How many buckets were exchanged (for tests and logs)."""

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torus-allreduce")
            return self._pool

    def stream(self, device: torch.device) -> torch.cuda.Stream:
        """The side stream the CUDA exchange runs on (one per state)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def reduce_bucket(state: TorusHookState, buffer: torch.Tensor) -> torch.Tensor:
    """Average `buffer` over all ranks in place (the steps of the module docstring); returns it."""
    buffer.div_(state.world_size)  # 1. divide first: no overflow in a half-precision sum
    return sum_divided(state, buffer)


def sum_divided(state: TorusHookState, buffer: torch.Tensor) -> torch.Tensor:
    """Steps 2-4 for a buffer already divided by the world size."""
    if state.wire_dtype is not None and buffer.dtype != state.wire_dtype:
        wire = buffer.to(state.wire_dtype)  # 2. compress
        allreduce(wire, state.algo, state.groups)  # 3. sum
        buffer.copy_(wire)  # 4. decompress
    else:
        allreduce(buffer, state.algo, state.groups)
    state.buckets_reduced += 1
    return buffer


def exchange_cuda(state: TorusHookState, buffer: torch.Tensor) -> torch.Tensor:
    """Average a CUDA bucket on NCCL, on the current (side) stream; returns `buffer`.

    With the algorithm's own NCCL exchange (its table entry's `nccl`) where the row has a group; else its
    function over the transport, as on any backend."""
    buffer.div_(state.world_size)  # divide first, in the bucket's precision
    if state.nccl_exchange is None or state.groups.row_group is None:  # a row of one without its group (gloo)
        return sum_divided(state, buffer)
    state.nccl_exchange(state, buffer)
    state.buckets_reduced += 1
    return buffer


def exchange_torus_nccl(state: TorusHookState, buffer: torch.Tensor) -> None:
    """The torus on NCCL for a bucket already divided by the world size, on the current stream.

    The bucket (compressed if asked) is laid out as X equal chunks of one buffer, padded with zeros at the end
    when X does not divide its length, so each phase is one collective on whole aligned tensors:
      1. reduce-scatter along the row (comm/collectives.py) -> my chunk of the row's sum;
      2. all_reduce of that chunk along the column;
      3. all-gather along the row -> the whole sum; one copy back into the bucket.
    Without padding or compression the bucket itself is the buffer and nothing is copied but the chunk.
    """
    g = state.groups
    padded, chunk = nccl_layout(state, buffer)
    collectives.reduce_scatter(chunk, padded, group=g.row_group)  # 1.
    if g.col_group is not None:
        dist.all_reduce(chunk, group=g.col_group)  # 2.
    collectives.all_gather(padded, chunk, group=g.row_group)  # 3.
    copy_back(buffer, padded)


def nccl_layout(state: TorusHookState, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(padded, chunk) for the torus on NCCL: the bucket in the wire dtype as X equal chunks of one buffer
    (zeros after its end; the bucket itself when X divides it and nothing is compressed), and my chunk's buffer."""
    x, n = state.groups.grid.x, buffer.numel()
    m = -(-n // x)
    dtype = state.wire_dtype or buffer.dtype
    flat = buffer.view(-1)
    if m * x != n or dtype != buffer.dtype:
        padded = torch.empty(m * x, dtype=dtype, device=buffer.device)
        padded[:n].copy_(flat)
        padded[n:].zero_()
    else:
        padded = flat
    return padded, torch.empty(m, dtype=dtype, device=buffer.device)


def copy_back(buffer: torch.Tensor, padded: torch.Tensor) -> None:
    """The summed bucket from the layout's buffer into the bucket (nothing when it is the bucket itself)."""
    flat = buffer.view(-1)
    if padded.data_ptr() != flat.data_ptr() or padded.dtype != flat.dtype:
        flat.copy_(padded[: flat.numel()])  # the one copy back
