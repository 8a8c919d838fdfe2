"""The torchvision fallback: DataLoader worker processes read the files, and PIL decodes them there (decoder
"cpu") or nvJPEG on the rank's GPU (decoder "gpu", data/batch_decode.py); with the DALI path's semantics.

The files and labels are ImageFolder's (sorted class folders); the order is the same per-epoch sharding rule
as DALI's (checks.shard: a DistributedSampler-like permutation, padded to whole batches so every rank takes
the same steps). Training: RandomResizedCrop + RandomHorizontalFlip; validation: Resize(size / 0.875) +
CenterCrop; then ToTensor + Normalize with the ImageNet statistics. With the GPU decoder the workers hand over
a batch's encoded files, and a prefetch thread decodes, crops, flips and normalises them on a side CUDA stream,
``cfg.prefetch`` batches ahead of the training step (its draws from a generator seeded by seed, rank and epoch).

A file PIL cannot decode is a DataError naming it (``on_corrupt = fail``) or, with ``skip``, is replaced in the
worker by the next readable file (base.CorruptLog); the worker returns the skipped name with the sample and this
process logs it, so the count holds across workers.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import queue
import signal
import sys
import threading
from typing import cast

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision import transforms as T

from torus_train.data.base import (
    MEAN,
    PAD_LABEL,
    STD,
    TRAIN_AREA,
    TRAIN_RATIO,
    CorruptLog,
    LoaderConfig,
    ShardedLoader,
    replacement_after,
    val_resize,
)
from torus_train.data.batch_decode import augment, decode_batch, decode_one
from torus_train.data.device_work import DEVICE_WORK
from torus_train.data.index import DataError, Split
from torus_train.data.readers import sample_reader


def transform(split: str, image_size: int):
    """The torchvision transform for ``split``."""
    if split == "train":
        ops = [T.RandomResizedCrop(image_size, scale=TRAIN_AREA, ratio=TRAIN_RATIO), T.RandomHorizontalFlip()]
    else:
        ops = [T.Resize(val_resize(image_size)), T.CenterCrop(image_size)]
    return T.Compose([*ops, T.ToTensor(), T.Normalize(MEAN, STD)])


def _decode(reader, i: int):
    """Sample i decoded (a folder's file or a packed set's sample); the reader's problem raised as ValueError."""
    data, problem = reader.read(i)
    if problem is not None:
        raise ValueError(problem)
    with Image.open(io.BytesIO(data.tobytes())) as im:
        return im.convert("RGB")


def _read(reader, i: int) -> np.ndarray:
    """Sample i's encoded bytes (the GPU decoder's workers: no decoding); the reader's problem as ValueError."""
    data, problem = reader.read(i)
    if problem is not None:
        raise ValueError(problem)
    return data


def _as_is(x):
    """No transform (the encoded bytes go as they are); a module function: the forkserver pickles it."""
    return x


def _collate_encoded(samples):
    """A batch of encoded samples as one flat uint8 tensor and the sizes that split it (one shared-memory
    tensor per batch, not one per image), the labels, and the skip notes when there are."""
    data = [s[0] for s in samples]
    flat = torch.from_numpy(np.concatenate(data)) if data else torch.empty(0, dtype=torch.uint8)
    rest = ([s[2] for s in samples],) if len(samples[0]) > 2 else ()
    return (
        flat,
        torch.tensor([d.size for d in data], dtype=torch.int64),
        torch.tensor([s[1] for s in samples], dtype=torch.int64),
        *rest,
    )


class _GatedBatch(tuple):
    """A collated batch whose page-locking (the DataLoader's pin thread calls ``pin_memory()`` on it) takes the
    device-work gate: the pin thread's CUDA calls stay out of a CUDA graph capture (data/device_work.py)."""

    def pin_memory(self, device=None) -> _GatedBatch:
        with DEVICE_WORK.work():
            return _GatedBatch(t.pin_memory() if isinstance(t, torch.Tensor) else t for t in self)


def _collate_gated(samples) -> _GatedBatch:
    """The default collation, as a _GatedBatch; a module function: the forkserver pickles it."""
    return _GatedBatch(default_collate(samples))


class _Files(torch.utils.data.Dataset):
    """(image, label) per index; with skip=True (image, label, "PATH\tREASON" of a replaced file or "").
    ``load(reader, i)`` makes the image (PIL's decode, or the encoded bytes), ``tf`` transforms it."""

    def __init__(self, split: Split, tf, skip: bool = False, val: bool = False, load=_decode):
        self.split, self.files, self.labels, self.tf = split, split.files, split.labels, tf or _as_is
        self.skip, self.val, self.load = skip, val, load
        self.reader = sample_reader(split)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        try:
            img = self.load(self.reader, i)
        except Exception as e:  # PIL raises several types for bad files
            reason = f"{type(e).__name__}: {e}"
            if not self.skip:
                raise DataError(f"{path}: cannot decode ({reason})") from None
            return self._replaced(i, reason)
        return (self.tf(img), self.labels[i], "") if self.skip else (self.tf(img), self.labels[i])

    def _replaced(self, i: int, reason: str):
        got = {}

        def readable(j: int) -> bool:
            try:
                got[j] = self.load(self.reader, j)
            except Exception:
                return False
            return True

        j = replacement_after(self.split, i, readable)
        label = PAD_LABEL if self.val else self.labels[j]
        return self.tf(got[j]), label, f"{self.files[i]}\t{reason}\t{self.files[j]}"


class _ShardSampler(torch.utils.data.Sampler):
    """Yields the loader's current shard (set_epoch swaps it; the DataLoader asks again each pass)."""

    def __init__(self, owner: TorchvisionLoader):
        self.owner = owner

    def __iter__(self):
        return iter(self.owner.shard.indices)

    def __len__(self) -> int:
        return len(self.owner.shard.indices)


def _seed_worker(seed: int, rank: int, rank_pid: int, worker_id: int) -> None:
    torch.manual_seed(seed * 7919 + rank * 104729 + worker_id * 31 + torch.initial_seed() % 1000003)
    _leave_stops_to_the_rank(rank_pid)


def _worker_seed(seed: int, rank: int):
    return functools.partial(_seed_worker, seed, rank, os.getpid())  # picklable, for the forkserver context


def _leave_stops_to_the_rank(rank_pid: int) -> None:
    """A worker ends on SIGTERM or SIGINT from its rank only (torch's and multiprocessing's ``terminate``).
    slurmstepd, torchrun's agent and a terminal's Ctrl-C signal the rank's whole process group, and a worker
    ended by that signal failed the rank ("DataLoader worker ... is killed by signal") before its agreed stop
    could checkpoint. Ignoring the signals outright would not do: the rank's own ``terminate`` would then leave
    a worker running and its exit waiting on it forever. So a thread reads each signal's sender (sigwaitinfo)."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # in this thread; threads started from here inherit it

    def wait() -> None:
        while signal.sigwaitinfo(signals).si_pid != rank_pid:
            pass  # another's: the rank stops, then ends its loader and this worker with it
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="stops-from-the-rank", daemon=True).start()


def _worker_context():
    """None (fork) unless DALI is loaded in this process: a fork beside DALI's running threads can leave a worker
    stuck forever on a lock one of them held (seen with a DALI and a torchvision loader in one process, as
    `bench input` and the tests have). Then forkserver: workers forked from a server that holds only torch."""
    if "nvidia.dali" not in sys.modules:
        return None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchvision", __name__])
    return ctx


class TorchvisionLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` through a DataLoader; ``decoder``
    "cpu" (PIL in the workers) or "gpu" (the workers read, data/batch_decode.py decodes on ``device``)."""

    kind = "torchvision"

    def __init__(
        self,
        split: Split,
        cfg: LoaderConfig,
        device: torch.device,
        corrupt: CorruptLog | None = None,
        decoder: str = "cpu",
    ):
        super().__init__(split, cfg, device, corrupt)
        self.decoder = decoder  # where the JPEGs are decoded, for the run's summary
        self._skip = cfg.on_corrupt == "skip"
        self._producer: _Prefetch | None = None
        encoded = decoder == "gpu"
        files = _Files(
            split,
            None if encoded else transform(cfg.split, cfg.image_size),
            self._skip,
            cfg.split == "val",
            load=_read if encoded else _decode,
        )
        self._loader = torch.utils.data.DataLoader(
            files,
            batch_size=cfg.batch_size,
            sampler=_ShardSampler(self),
            num_workers=cfg.num_threads,
            drop_last=False,
            collate_fn=_collate_encoded if encoded else _collate_gated,
            pin_memory=device.type == "cuda" and not encoded,
            persistent_workers=cfg.num_threads > 0,
            prefetch_factor=max(1, cfg.prefetch) if cfg.num_threads > 0 else None,
            worker_init_fn=_worker_seed(cfg.seed, cfg.rank) if cfg.num_threads > 0 else None,
            multiprocessing_context=_worker_context() if cfg.num_threads > 0 else None,
        )

    def __iter__(self):
        if self.decoder == "gpu":
            yield from self._decoded_here()
            return
        it = iter(self._loader)
        for step in range(len(self)):
            x, y, *skipped = self._next(it)
            self._note(skipped)
            y = self._mark_padding(step, y.to(torch.int64))
            # copy the pinned batch as it is (asynchronous), then change the layout on the device
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.cfg.channels_last or self.cfg.dtype != "float32":
                fmt = torch.channels_last if self.cfg.channels_last else torch.contiguous_format
                x = x.to(dtype=self.cfg.torch_dtype(), memory_format=fmt)  # one kernel for both
            yield x, y

    @staticmethod
    def _next(it):
        try:
            return next(it)
        except DataError as e:
            # Raised in a worker, re-raised here with the worker's traceback: keep the one-line message.
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            msg = lines[-1].split("DataError: ", 1)[-1] if lines else str(e)
            raise DataError(msg) from None

    def _note(self, skipped) -> None:
        for note in skipped[0] if skipped else ():
            if note:
                self.corrupt.note(*note.split("\t"))

    # ---- the GPU decoder ---------------------------------------------------------------------------------
    def _decoded_here(self):
        """The epoch's batches decoded on the device by a prefetch thread (``cfg.prefetch`` ahead)."""
        self._stop_producer()
        generator = torch.Generator().manual_seed(augment_seed(self.cfg.seed, self.cfg.rank, self.epoch))
        self._producer = producer = _Prefetch(self._decode_epoch(generator), self.cfg.prefetch, self.device)
        try:
            for _ in range(len(self)):
                yield producer.get()
        finally:
            self._stop_producer()

    def _decode_epoch(self, generator: torch.Generator):
        """(images, labels) of each step of the epoch, made on the device (runs in the prefetch thread)."""
        it, cfg = iter(self._loader), self.cfg
        for step in range(len(self)):
            flat, sizes, y, *skipped = self._next(it)
            self._note(skipped)
            with DEVICE_WORK.work():  # out of a CUDA graph capture's window; never around the yield (a queue wait)
                images, failed = decode_batch(list(torch.split(flat, sizes.tolist())), self.device)
                for k, reason in failed.items():
                    images[k], y[k] = self._replaced(self.shard.indices[step * self.batch_size + k], reason)
                y = self._mark_padding(step, y)
                x = augment(
                    cast(list[torch.Tensor], images),
                    cfg.split,
                    cfg.image_size,
                    generator,
                    cfg.torch_dtype(),
                    cfg.channels_last,
                )
                y = y.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else y
            yield x, y

    def _replaced(self, i: int, reason: str) -> tuple[torch.Tensor, int]:
        """The decoded replacement of sample ``i``, which read but did not decode (on_corrupt = skip), and its
        label; a DataError naming the file under fail."""
        path = self.split.files[i]
        if not self._skip:
            raise DataError(f"{path}: cannot decode ({reason})")
        reader, got = sample_reader(self.split), {}

        def readable(j: int) -> bool:
            try:
                got[j] = decode_one(torch.from_numpy(_read(reader, j)), self.device)
            except (ValueError, RuntimeError):
                return False
            return True

        j = replacement_after(self.split, int(i), readable)
        self.corrupt.note(path, reason, self.split.files[j])
        return got[j], PAD_LABEL if self.cfg.split == "val" else int(self.split.labels[j])

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def close(self) -> None:
        self._stop_producer()
        it = getattr(self._loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def augment_seed(seed: int, rank: int, epoch: int) -> int:
    """The GPU decoder's augmentation seed: another stream per rank and epoch, the same on every run."""
    return (seed * 1_000_003 + rank * 10_007 + epoch) % (2**63 - 1)


class _Prefetch:
    """Runs a generator of (images, labels) on a thread, ``depth`` items ahead of ``get()``; on a CUDA device
    its work goes to a side stream, and each item waits for it on the consumer's stream (an event, not a host
    wait). An exception in the generator is raised by ``get()``."""

    def __init__(self, items, depth: int, device: torch.device):
        self.device, self.items = device, items
        self.queue: queue.Queue = queue.Queue(max(1, depth))
        self.stopped = threading.Event()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.thread = threading.Thread(target=self._run, name="torus-decode", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.stream is not None:
                with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
                    self._fill()
            else:
                self._fill()
        except BaseException as e:
            self._put(("error", e))

    def _fill(self) -> None:
        for x, y in self.items:
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                with DEVICE_WORK.work():
                    event.record(self.stream)
            if not self._put(("batch", (x, y, event))):
                return

    def _put(self, item) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self):
        kind, value = self.queue.get()
        if kind == "error":
            raise value
        x, y, event = value
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            x.record_stream(current)  # made on the side stream, freed only after the consumer's use
            y.record_stream(current)
        return x, y

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)
        if not self.thread.is_alive():  # a generator still running in the thread cannot be closed from here
            self.items.close()
