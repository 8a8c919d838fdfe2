"""NVIDIA DALI pipelines: one code path for GPU ("mixed") decoding and CPU-only decoding (``device_id=None``).

Training: this rank's shard of the epoch (data/sharding.py) -> ``fn.external_source`` (the encoded files, read
here) -> ``fn.decoders.image_random_crop`` -> ``fn.resize`` (linear, no antialiasing, as NVIDIA's examples) ->
``fn.crop_mirror_normalize`` with a random horizontal flip, NCHW or NHWC. Validation: ``fn.decoders.image``
-> ``fn.resize(resize_shorter=size / 0.875)`` with antialiasing (to match torchvision's validation transform)
-> centre crop -> normalize.

The pipeline is built once per loader (the loop builds a loader per batch stage) and fed epoch after epoch
from a stream of this rank's shards, so it never holds more than one shard's file names and is not rebuilt at
an epoch boundary; it is rebuilt only when a pass stopped early or the loop jumps to another epoch (resume).
A corrupt image is the spec's choice (``data.on_corrupt``). The encoded bytes of every JPEG are checked for
their start and end markers as they are read (no extra I/O: a truncated file or one that is not a JPEG is caught
before DALI sees it). A file that passes that check and still does not decode stops the pipeline; the file is
then found by decoding the batches in flight with PIL. ``fail``: a DataError naming the file. ``skip``: the
file is replaced by the next readable one (base.CorruptLog): a marker failure at once, in the batch being read;
a decode failure by rebuilding the pipeline at the failing step with the file marked, so the step is redone
with a whole batch. The shard, the batch size and the step count do not change.
"""
from __future__ import annotations

import numpy as np
import torch

from torus_train.data.base import (MEAN, PAD_LABEL, STD, TRAIN_AREA, TRAIN_RATIO, CorruptLog, LoaderConfig,
                                   ShardedLoader, replacement_after, val_resize)
from torus_train.data.checks import is_jpeg_name, jpeg_problem
from torus_train.data.index import DataError, Split
from torus_train.data.sharding import shard


def available() -> bool:
    """True when nvidia.dali imports."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception:
        return False
    return True


def build_pipeline(source, cfg: LoaderConfig, device_id: int | None, seed: int):
    """The DALI pipeline for ``cfg.split`` fed by ``source`` (an iterator of (encoded files, labels) batches);
    GPU operators when device_id is a GPU, CPU ones when None."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = device_id is not None
    decoder_device = "mixed" if gpu else "cpu"
    op_device = "gpu" if gpu else "cpu"
    layout = "HWC" if cfg.channels_last else "CHW"
    mean = [m * 255 for m in MEAN]
    std = [s * 255 for s in STD]
    size = cfg.image_size
    # DALI has no bfloat16: bf16 models get float16 (its 10-bit mantissa holds every bf16 value of a normalized
    # pixel) and the loader casts on the device, a half-size copy instead of a full float32 one.
    out_type = types.FLOAT if cfg.dtype == "float32" else types.FLOAT16

    @pipeline_def
    def pipe():
        jpegs, lab = fn.external_source(source=source, num_outputs=2, batch=True,
                                        dtype=[types.UINT8, types.INT32])
        if cfg.split == "train":
            img = fn.decoders.image_random_crop(jpegs, device=decoder_device, output_type=types.RGB,
                                                random_area=list(TRAIN_AREA), random_aspect_ratio=list(TRAIN_RATIO),
                                                num_attempts=10)
            # Linear, no antialiasing, as in NVIDIA's DALI ResNet-50 examples: a training crop is shrunk by
            # less than 2x per side, where the aliasing is slight, and this resize is the costliest CPU stage
            # (about 1.3x the pipeline's speed on 500x375 photographs, 2 cores).
            img = fn.resize(img, device=op_device, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                            antialias=False)
            img = fn.crop_mirror_normalize(img, device=op_device, dtype=out_type, output_layout=layout,
                                           mean=mean, std=std, mirror=fn.random.coin_flip(probability=0.5))
        else:
            img = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB)
            img = fn.resize(img, device=op_device, resize_shorter=val_resize(size), antialias=True)
            img = fn.crop_mirror_normalize(img, device=op_device, dtype=out_type, output_layout=layout,
                                           crop=(size, size), mean=mean, std=std)
        return img, lab

    p = pipe(batch_size=cfg.batch_size, num_threads=max(1, cfg.num_threads), device_id=device_id, seed=seed,
             prefetch_queue_depth=2)
    p.build()
    return p


def _find_bad_file(paths) -> tuple[str, str] | None:
    """The first of ``paths`` that PIL cannot fully decode, with PIL's reason."""
    from PIL import Image

    for p in paths:
        try:
            with Image.open(p) as im:
                im.load()
        except Exception as e:  # PIL raises several types for bad files
            return p, f"{type(e).__name__}: {e}"
    return None


def _named_error(e: Exception, split: Split, candidates) -> DataError:
    """A one-line DataError for a DALI pipeline failure, naming the file that does not decode.

    DALI's message names the operator, not the file; the file is found by decoding the batches that were
    in flight (the failing one and those prefetched after it) with PIL.
    """
    msg = str(e)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    reason = next((lines[i + 1] for i, ln in enumerate(lines) if ln == "encountered:" and i + 1 < len(lines)),
                  lines[0] if lines else type(e).__name__)
    bad = _find_bad_file(candidates)
    if bad is not None:
        return DataError(f"{bad[0]}: corrupt image, DALI cannot decode it ({reason}; PIL: {bad[1][:120]})")
    return DataError(f"{split.root}: DALI pipeline failed ({reason[:200]})")


def read_file(path: str) -> tuple[np.ndarray, str | None]:
    """The encoded bytes of ``path`` and, for a JPEG, why its markers are wrong (None when they are right)."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    if not is_jpeg_name(path):
        return data, None
    raw = data[:3].tobytes(), data[-64:].tobytes()
    return data, jpeg_problem(raw[0], raw[1], data.size)


class Feed:
    """What shard_stream reads with: the split, the policy, and the run's CorruptLog (whose ``undecodable`` the
    loader marks after a pipeline failure)."""

    def __init__(self, split: Split, cfg: LoaderConfig, corrupt: CorruptLog):
        self.split, self.skip, self.val, self.corrupt = split, cfg.on_corrupt == "skip", cfg.split == "val", corrupt
        self.bad = corrupt.undecodable

    def sample(self, i: int) -> tuple[np.ndarray, int]:
        """The bytes and label of file ``i``, or of its replacement under skip."""
        path = self.split.files[i]
        data, problem = (None, self.bad[path]) if path in self.bad else read_file(path)
        if problem is None:
            return data, self.split.labels[i]
        if not self.skip:
            raise DataError(f"{path}: {problem}")
        got = {}

        def readable(j: int) -> bool:
            if self.split.files[j] in self.bad:
                return False
            got[j], why = read_file(self.split.files[j])
            return why is None

        j = replacement_after(self.split, i, readable)
        self.corrupt.note(path, problem, self.split.files[j])
        return got[j], PAD_LABEL if self.val else self.split.labels[j]

    def batch(self, indices) -> tuple[list[np.ndarray], list[np.ndarray]]:
        data, labels = [], []
        for i in indices:
            d, lab = self.sample(i)
            data.append(d)
            labels.append(np.array([lab], dtype=np.int32))
        return data, labels


def shard_stream(feed: Feed, cfg: LoaderConfig, epoch: int, first_step: int = 0):
    """This rank's batches, epoch after epoch from step ``first_step`` of ``epoch`` (DALI prefetches across an
    epoch's end); it holds no reference to the loader, so a dropped loader frees its pipeline and DALI's
    threads at once."""
    while True:
        sh = shard(len(feed.split), cfg.rank, cfg.world_size, cfg.batch_size, epoch=epoch, seed=cfg.seed,
                   shuffle=cfg.split == "train")
        for step in range(first_step, sh.steps):
            yield feed.batch(sh.indices[step * cfg.batch_size:(step + 1) * cfg.batch_size])
        first_step = 0
        if cfg.split == "train":
            epoch += 1


class DaliLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` from a DALI pipeline."""

    kind = "dali"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device, corrupt: CorruptLog | None = None):
        super().__init__(split, cfg, device, corrupt)
        self._gpu = device.type == "cuda"
        self._device_id = (device.index if device.index is not None else torch.cuda.current_device()) \
            if self._gpu else None
        self._feed = Feed(split, cfg, self.corrupt)
        self._pipe = None
        self._next_epoch = None  # the epoch whose first batch the pipeline delivers next; None: rebuild

    def _pipeline(self, first_step: int = 0):
        if self._pipe is None or self._next_epoch != self.epoch or first_step:
            self.close()
            seed = (self.cfg.seed * 7919 + self.cfg.rank * 104729 + self.epoch) % (2 ** 31)
            stream = shard_stream(self._feed, self.cfg, self.epoch, first_step)
            self._pipe = build_pipeline(stream, self.cfg, self._device_id, seed)
        self._next_epoch = None
        return self._pipe

    def __iter__(self):
        pipe = self._pipeline()
        for step in range(len(self)):
            while True:
                try:
                    images, labels = pipe.run()
                    break
                except (RuntimeError, StopIteration) as e:
                    pipe = self._after_failure(e, step)
            x = self._to_torch(images)
            y = torch.from_numpy(np.array(labels.as_tensor(), dtype=np.int64).reshape(-1))
            y = self._mark_padding(step, y)
            yield x, y.to(self.device, non_blocking=True)
        self._next_epoch = self.epoch + 1 if self.cfg.split == "train" else self.epoch

    def _after_failure(self, e: Exception, step: int):
        """The pipeline failed at ``step``: a DataError naming the file, or (skip) the file marked and a new
        pipeline from this step on."""
        self.close()
        cause = e.__cause__ or e.__context__
        if isinstance(cause, DataError):
            raise cause from None
        window = self.shard.indices[step * self.batch_size:(step + 3) * self.batch_size]
        bad = _find_bad_file([self.split.files[i] for i in window if self.split.files[i] not in self._feed.bad])
        if not self._feed.skip or bad is None:
            raise _named_error(e, self.split, [self.split.files[i] for i in window]) from None
        self._feed.bad[bad[0]] = f"DALI cannot decode it; PIL: {bad[1][:120]}"
        return self._pipeline(first_step=step)

    def _to_torch(self, images) -> torch.Tensor:
        t = images.as_tensor()
        if self._gpu:
            from nvidia.dali.plugin.pytorch import feed_ndarray
            out = torch.empty(t.shape(), dtype=torch.float32 if self.cfg.dtype == "float32" else torch.float16,
                              device=self.device)
            feed_ndarray(t, out, cuda_stream=torch.cuda.current_stream(self.device))
        else:
            out = torch.from_numpy(np.array(t, copy=True))
        if out.dtype != self.cfg.torch_dtype():
            out = out.to(self.cfg.torch_dtype())
        if self.cfg.channels_last:  # NHWC in memory: a permuted view is NCHW in channels_last format
            return out.permute(0, 3, 1, 2)
        return out

    def close(self) -> None:
        if self._pipe is not None:
            del self._pipe
            self._pipe = None
