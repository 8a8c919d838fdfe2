"""Reading one encoded sample by its index, from a folder or a packed set (numpy; no torch).

``sample_reader(split)`` gives an object with ``read(i) -> (bytes as uint8 array or None, problem or None)``:
a folder split opens each image file (one open per image); a packed split reads from shard files it keeps
open (packed.ShardReader). The loaders call it only in their readers (ReadAhead's threads for DALI,
torchvision's DataLoader workers), never on the training thread, except to name the file after a decode
failure. Also here: how many decode threads a rank gets (``decode_threads``).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from torus_train.data.checks import content_problem
from torus_train.data.index import Split
from torus_train.data.packed import PackedSplit, ShardReader
from torus_train.job.launch import usable_cpus


def decode_threads(
    local_world_size: int, affinity: int | None = None, machine: int | None = None, usable: int | None = None
) -> int:
    """Decode threads of a rank: all the cores it may use when the launcher bound it to its own (mpirun
    --bind-to core, srun --cpu-bind=cores: its affinity mask is already its share, dividing again by the
    node's ranks would leave a 4-GPU node with 8 cores per rank 2 threads each); the node's usable cores
    shared by its ranks when it is unbound (its mask is the whole machine)."""
    affinity = affinity if affinity is not None else len(os.sched_getaffinity(0))
    machine = machine or os.cpu_count() or affinity
    usable = usable or usable_cpus()  # affinity and cgroup quota, not the machine's count
    if affinity < machine:
        return max(1, usable)
    return max(1, usable // max(1, local_world_size))


class FileReader:
    """Sample i of a folder split: the whole file, its content checked (checks.content_problem: no extra I/O,
    nothing decoded unless it looks cut short)."""

    def __init__(self, split: Split):
        self.split = split
        self.opens = 0

    def read(self, i: int) -> tuple[np.ndarray | None, str | None]:
        path = self.split.files[i]
        self.opens += 1
        try:
            data = np.fromfile(path, dtype=np.uint8)
        except OSError as e:
            return None, f"cannot read ({e.strerror or e})"
        problem = content_problem(data)
        return data, None if problem is None else str(problem)

    def close(self) -> None:
        pass


def sample_reader(split: Split):
    """The reader for ``split``: ShardReader for a packed split, FileReader for a folder's."""
    return ShardReader(split) if isinstance(split, PackedSplit) else FileReader(split)


class ReadAhead:
    """Reader threads that run a function over a stream of items ahead of its consumer, results in order.

    ``map(fn, items)`` keeps ``depth`` calls in flight on ``workers`` threads and yields their results in the
    items' order; the consumer (DALI's external_source, on the training thread) only takes finished results.
    File reads release the GIL, so the threads overlap their I/O with each other and with training. An
    exception in ``fn`` is raised to the consumer with the result it belongs to.
    """

    def __init__(self, workers: int, depth: int):
        self.depth = max(1, depth)
        self.pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="torus-read")

    def map(self, fn, items):
        pending = deque()
        for item in items:
            pending.append(self.pool.submit(fn, item))
            if len(pending) > self.depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
