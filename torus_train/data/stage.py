"""Node-local staging of a packed set (``data.stage = node``; no torch import).

Before the first step, local rank 0 of every node copies the WHOLE packed set to node-local space and checks
it against the index; every rank waits on the rendezvous store until every node has its copy (NodesWait: not a
device collective, so comm.timeout_s does not bound a slow copy; data.stage_timeout_s does), then reads its
node's copy. The whole set, not the shards the node's ranks read: a packed epoch draws a new shard order every
epoch (packed.epoch_order), so over a run every node reads every shard; pinning shards to nodes would turn the
epoch's shuffle into a node-local one. One copy per node moves each byte over the shared file system once per
node and touches its metadata server once per shard.

Where: ``data.stage_dir``, else the first of $SLURM_TMPDIR, $PBS_JOBFS, $SGE_LOCALDIR, $TMPDIR that is set
(the job-scoped folders first: the scheduler removes them with the job). The copy lives in
``WHERE/torus-train-stage/<name>-<hash of the source path>``, written beside and renamed in (outdir.py):

- a copy there whose packed.json has the source's checksum and whose shards have their packed sizes is reused;
- any other copy there (another packing of the same path, a shard truncated or missing) is stale: replaced;
- each shard's SHA-256 is computed while it is copied and compared with packed.json (a damaged source shard
  is a DataError naming it, and nothing is renamed in);
- a folder without room (free space < the set's bytes) fails before copying, in one line with both sizes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from torus_train.data.index import SPLITS, DataError
from torus_train.data.packed import ARRAYS, MARKER, PACKED_KIND, Packed, is_packed, load_packed
from torus_train.errors import RunFailed, UserError, shown_path
from torus_train.job.stagedir import stage_base
from torus_train.outdir import write_folder
from torus_train.userfiles import open_regular

CHUNK = 8 << 20


def stage_target(source: Path, base: Path) -> Path:
    tag = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    return base / "torus-train-stage" / f"{source.resolve().name}-{tag}"


def _gb(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def valid_copy(target: Path, packed: Packed) -> bool:
    """True when ``target`` holds this packed set: the same checksum, every shard at its packed size."""
    if not is_packed(target):
        return False
    try:
        copy = load_packed(target)
    except DataError:
        return False
    if copy.meta.get("checksum") != packed.meta["checksum"]:
        return False
    try:
        return all((target / name).stat().st_size == size for name, size, _ in packed.shard_files())
    except OSError:
        return False


def check_room(base: Path, needed: int) -> None:
    try:
        free = shutil.disk_usage(base).free
    except OSError as e:
        raise UserError(f"data.stage_dir {shown_path(base)}: {e.strerror or e}") from None
    if free < needed:
        raise UserError(
            f"data.stage = node: {shown_path(base)} has {_gb(free)} free, the packed set needs "
            f"{_gb(needed)}; free space there, set data.stage_dir to a larger node-local folder, or "
            f"use data.stage = none"
        )


def _copy_checked(src: Path, dst: Path, sha256: str) -> None:
    h = hashlib.sha256()
    with open_regular(src, "a shard of the packed set") as fi, open(dst, "wb") as fo:
        while True:
            b = fi.read(CHUNK)
            if not b:
                break
            h.update(b)
            fo.write(b)
    if h.hexdigest() != sha256:
        raise DataError(
            f"{src}: its bytes differ from those packed (SHA-256); the shard is damaged: pack the set again"
        )


def stage(source: str | os.PathLike, base: Path, log=None) -> Path:
    """The node-local copy of the packed set ``source`` under ``base`` (reused when valid, else made)."""
    src = Path(source)
    if not is_packed(src):
        raise UserError(
            f"data.stage = node needs a packed set (torus-train data pack --data {shown_path(src)} "
            f"--out SHARDS), not the folder {shown_path(src)}: copying a folder's files would cost "
            f"one metadata operation per image per node"
        )
    packed = load_packed(src)
    target = stage_target(src, base)
    if valid_copy(target, packed):
        if log:
            log(f"data.stage: reusing {target}")
        return target
    base.mkdir(parents=True, exist_ok=True)
    arrays = [f"{s}.{k}.npy" for s in SPLITS for k in ARRAYS]  # the set's own files: nothing else is copied
    check_room(base, packed.bytes + sum((src / name).stat().st_size for name in arrays))

    def fill(tmp: Path) -> None:
        for name, _, sha in packed.shard_files():
            _copy_checked(src / name, tmp / name, sha)
        for name in arrays:
            shutil.copyfile(src / name, tmp / name)
        shutil.copyfile(src / MARKER, tmp / MARKER)  # last: the copy is a packed set only when whole
        load_packed(tmp).verify()

    try:
        write_folder(target, PACKED_KIND, "data.stage_dir", fill)
    except OSError as e:
        raise UserError(
            f"data.stage: cannot copy {shown_path(src)} to {shown_path(target)} ({e.strerror or e})"
        ) from None
    if log:
        log(f"data.stage: copied {src} ({_gb(packed.bytes)}) to {target}")
    return target


def stage_on_node(
    source: str | os.PathLike, stage_dir: str, local_rank: int, wait: NodesWait | None = None, log=None
) -> Path:
    """Local rank 0 stages; every rank waits for every node's copy (``wait``; None: a rank alone, or a
    rehearsal whose store holds nothing) and then reads its node's copy."""
    base = stage_base(stage_dir)
    copy = (lambda: stage(source, base, log)) if local_rank == 0 else None
    if wait is not None:
        wait.around(copy)
    elif copy is not None:
        copy()
    target = stage_target(Path(source), base)
    if not valid_copy(target, load_packed(source)):
        raise DataError(f"{target}: the node's staged copy is missing or incomplete after staging")
    return target


class Store(Protocol):
    """The part of torch.distributed's key-value store the wait uses (TCPStore, HashStore, FileStore)."""

    def add(self, key: str, amount: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


STAGED = "copied"
"""The value of the wait's ``done`` key once every node has its copy; anything else is a leader's failure."""
NAMED_NODES = 8
"""The nodes still copying that a timeout names (then a count of the rest)."""


@dataclass(frozen=True)
class NodesWait:
    """Every rank waits until every node's leader (local rank 0) has its copy, on the job's rendezvous store.

    Not ``dist.barrier()``: on NCCL a barrier is a device collective bounded by comm.timeout_s, and NCCL's
    watchdog would abort every rank while a slow node still copies; the store has no such limit and this wait
    has its own (data.stage_timeout_s). Each leader adds its node's rank count to one counter after its copy;
    the add that brings it to the world size sets ``done``, on which every rank waits: O(1) store operations
    per rank at any world size. A leader whose copy fails sets ``done`` to its reason, waking every rank."""

    store: Store
    key: str
    """The store keys' prefix: one per staged set."""
    rank: int
    local_rank: int
    local_world_size: int
    world_size: int
    timeout_s: float
    host: str

    def around(self, copy: Callable[[], object] | None) -> None:
        """Run the leader's ``copy`` (None on the other ranks), then wait for every node's."""
        k = self.key
        if copy is not None:
            slot = self.store.add(f"{k}/leaders", 1)  # which leader this is: named if it is still copying
            self.store.set(f"{k}/leader/{slot}", f"{self.host} (rank {self.rank})")
            try:
                copy()
            except Exception as e:
                self.tell(f"the node {self.host} (rank {self.rank}) failed to stage: {e}")
                raise
            self.store.set(f"{k}/copied/{slot}", "1")
            if self.store.add(f"{k}/ranks", self.local_world_size) == self.world_size:
                self.store.set(f"{k}/done", STAGED)
        self.wait()

    def tell(self, failure: str) -> None:
        """Wake every rank with ``failure``; a store already gone leaves the leader's own error to be seen."""
        try:
            self.store.set(f"{self.key}/done", failure)
        except RuntimeError:
            pass

    def wait(self) -> None:
        t0 = time.monotonic()
        try:
            self.store.wait([f"{self.key}/done"], timedelta(seconds=self.timeout_s))
        except RuntimeError as e:  # torch's DistStoreError: a timeout, or the store's host gone
            if time.monotonic() - t0 < self.timeout_s:
                raise RunFailed(f"data.stage: rank {self.rank} lost the rendezvous store ({e})") from None
            raise RunFailed(self.late()) from None
        done = self.store.get(f"{self.key}/done").decode()
        if done != STAGED:
            raise RunFailed(f"data.stage: {done}")

    def late(self) -> str:
        """The timeout's line. The first rank to time out names the nodes still copying (a store read per
        node, on this path alone and on one rank: the store is not asked 2,176 times 544 questions); the
        others name that rank."""
        k = self.key
        ranks = self.store.add(f"{k}/ranks", 0)
        head = (
            f"data.stage: after data.stage_timeout_s = {self.timeout_s:g} s the nodes of {ranks} of "
            f"{self.world_size} ranks had copied the packed set"
        )
        if self.store.add(f"{k}/reporter", 1) != 1:
            return f"{head}; rank {self.store.get(f'{k}/reporter_rank').decode()}'s log names those still copying"
        self.store.set(f"{k}/reporter_rank", str(self.rank))
        leaders = self.store.add(f"{self.key}/leaders", 0)
        slow = [i for i in range(1, leaders + 1) if not self.store.check([f"{self.key}/copied/{i}"])]
        names = [self.store.get(f"{self.key}/leader/{i}").decode() for i in slow[:NAMED_NODES]]
        more = f" and {len(slow) - NAMED_NODES} more" if len(slow) > NAMED_NODES else ""
        if not names:  # every leader that began has its copy: some node's leader never reached staging
            return f"{head}; none of the {leaders} node(s) that began is still copying: a node never began"
        return f"{head}; still copying: {', '.join(names)}{more}; raise data.stage_timeout_s"


def stage_key(source: str | os.PathLike) -> str:
    """The store keys' prefix of one staged set: the same on every rank (the source as the job names it)."""
    return f"torus-train/stage/{hashlib.sha256(str(source).encode()).hexdigest()[:12]}"
