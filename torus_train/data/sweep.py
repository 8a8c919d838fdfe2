"""`torus-train data check`'s sweep: every file of a data set checked on a process pool, every problem counted
by kind (checks.KINDS), the first few named per kind. No torch.

    report = sweep(folder_chunks(folder, names), len(names), decode=True, workers=16, progress=bar)
    report.summary()       the lines `data check` prints: counts per kind, the first FIRST files of each

The files go to the workers in chunks of CHUNK names (or sample ranges of a packed set), at most two chunks
per worker in flight, and each chunk comes back as its problems only: the parent holds the counts and the
FIRST named files per kind, so its memory does not grow with the set (1.28 million files). A chunk is checked
as a rank's reader checks a sample (checks.content_problem), or with ``decode`` decoded whole by PIL
(checks.decode_problem), the check to run once before a long job.
"""

from __future__ import annotations

import functools
import heapq
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

from torus_train.data.checks import KINDS, Problem, content_problem, decode_problem, file_problem
from torus_train.data.packed import ShardReader, load_packed

CHUNK = 256
"""Files per task: large enough that the pool's overhead is small, small enough to keep every core busy."""
FIRST = 5
"""Files named per kind of problem."""

Found = tuple[int, str, str, str]
"""(position in the split, file name, kind, why) of one unusable file."""


@dataclass(frozen=True)
class FileChunk:
    """Files of a folder split (names relative to ``folder``), from position ``start`` on."""

    start: int
    folder: str
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.names)

    def problems(self, decode: bool) -> list[Found]:
        found = []
        for k, name in enumerate(self.names):
            path = os.path.join(self.folder, name)
            p = file_problem(path, decode)
            if p is not None:
                found.append((self.start + k, path, p.kind, p.why))
        return found


@functools.cache
def _packed_reader(root: str, split: str):
    """A worker process's reader of a packed split (opened once per process, shards kept open)."""
    sp = load_packed(root).split(split)
    return sp, ShardReader(sp)


@dataclass(frozen=True)
class PackedChunk:
    """Samples ``start`` to ``stop`` of a packed set's split."""

    root: str
    split: str
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def problems(self, decode: bool) -> list[Found]:
        sp, reader = _packed_reader(self.root, self.split)
        check = decode_problem if decode else content_problem
        found = []
        for i in range(self.start, self.stop):
            data, why = reader.read(i)
            p = Problem("unreadable", why) if why is not None else check(data)
            if p is not None:
                found.append((i, sp.files[i], p.kind, p.why))
        return found


def folder_chunks(folder: str, names: Sequence[str]) -> Iterator[FileChunk]:
    """A folder split's files (``names`` relative to ``folder``, as the index holds them) in chunks of CHUNK:
    the parent holds the relative names only, a worker joins the paths of its chunk."""
    for start in range(0, len(names), CHUNK):
        yield FileChunk(start, folder, tuple(names[start : start + CHUNK]))


def packed_chunks(root: str, split: str, count: int) -> Iterator[PackedChunk]:
    """A packed split's samples in ranges of CHUNK."""
    for start in range(0, count, CHUNK):
        yield PackedChunk(root, split, start, min(count, start + CHUNK))


def _check(chunk, decode: bool) -> tuple[int, list[Found]]:
    """A worker's task: (files checked, the problems found)."""
    return len(chunk), chunk.problems(decode)


@dataclass
class SweepReport:
    """What a sweep found: files checked, problems per kind, the first FIRST files of each kind by position."""

    decode: bool
    workers: int
    files: int = 0
    seconds: float = 0.0
    counts: Counter = field(default_factory=Counter)
    named: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)

    @property
    def bad(self) -> int:
        return sum(self.counts.values())

    def take(self, checked: int, found: Iterable[Found]) -> None:
        self.files += checked
        for position, name, kind, why in found:
            self.counts[kind] += 1
            self.named[kind] = heapq.nsmallest(FIRST, [*self.named.get(kind, []), (position, name, why)])

    def add(self, other: SweepReport) -> None:
        """Another split's report added to this one (positions stay per split: named files keep their order)."""
        self.files += other.files
        self.seconds += other.seconds
        self.counts.update(other.counts)
        for kind, rows in other.named.items():
            self.named[kind] = (self.named.get(kind, []) + rows)[:FIRST]

    def rate(self) -> str:
        """Files per second, in all and per worker process."""
        per_s = self.files / max(self.seconds, 1e-9)
        return f"{per_s:,.0f} files/s, {per_s / self.workers:,.0f} per process"

    def verdict(self) -> str:
        """One line: how many files will not train, by kind."""
        kinds = ", ".join(f"{k} {n:,}" for k, n in self.counts.most_common())
        return f"{self.bad:,} of {self.files:,} files will not train ({kinds})"

    def summary(self) -> list[str]:
        """The lines `data check` prints: counts per kind and the first files named per kind."""
        how = "decoded whole by PIL" if self.decode else "checked by content; --decode decodes every file"
        if not self.bad:
            return [f"summary: every one of {self.files:,} files trains ({how})"]
        lines = [f"summary: {self.verdict()}; {how}"]
        width = max(len(k) for k in self.counts)
        for kind, n in self.counts.most_common():
            lines.append(f"  {kind:<{width}}  {n:>9,}  {KINDS.get(kind, '')}")
            lines += [f"      {name}: {why}" for _, name, why in self.named[kind]]
            if n > len(self.named[kind]):
                lines.append(f"      ... and {n - len(self.named[kind]):,} more")
        return lines


def sweep(
    chunks: Iterable,
    total: int,
    decode: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> SweepReport:
    """Check every chunk (FileChunk or PackedChunk) on ``workers`` processes (1: in this process), at most two
    chunks per worker in flight; ``progress(done, total)`` after each chunk."""
    report = SweepReport(decode, max(1, min(workers, total)))  # no worker without a file to check
    t0 = time.perf_counter()

    def take(result: tuple[int, list[Found]]) -> None:
        report.take(*result)
        if progress:
            progress(report.files, total)

    if report.workers == 1:
        for chunk in chunks:
            take(_check(chunk, decode))
    else:
        with ProcessPoolExecutor(report.workers) as pool:
            pending: set[Future] = set()
            for chunk in chunks:
                if len(pending) >= 2 * report.workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        take(f.result())
                pending.add(pool.submit(_check, chunk, decode))
            for f in wait(pending).done:
                take(f.result())
    report.seconds = time.perf_counter() - t0
    if progress and total == 0:
        progress(0, 0)
    return report
