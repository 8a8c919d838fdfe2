"""NVIDIA DALI pipelines: one code path for GPU ("mixed") decoding and CPU-only decoding (``device_id=None``).

Training: ``fn.readers.file`` over the epoch's padded global order, sharded by GLOBAL rank
(``shard_id=rank, num_shards=world_size``; see checks.shard) -> ``fn.decoders.image_random_crop`` ->
``fn.resize`` (linear, no antialiasing, as NVIDIA's examples) -> ``fn.crop_mirror_normalize`` with a random
horizontal flip, NCHW or NHWC. Validation: ``fn.decoders.image`` -> ``fn.resize(resize_shorter=size / 0.875)``
with antialiasing (to match torchvision's validation transform) -> centre crop -> normalize.

The reader is given the whole epoch's file order (shuffled with the shared seed, the same on every rank), so
each shard mixes all classes; the pipeline is rebuilt at each ``set_epoch`` with the new order (a CPU
pipeline builds in about 50 ms). A corrupt image stops the pipeline; the error names the file.
"""
from __future__ import annotations

import numpy as np
import torch

from torus_train.data.base import MEAN, STD, TRAIN_AREA, TRAIN_RATIO, LoaderConfig, ShardedLoader, val_resize
from torus_train.data.checks import DataError, Split


def available() -> bool:
    """True when nvidia.dali imports."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception:
        return False
    return True


def build_pipeline(files, labels, cfg: LoaderConfig, device_id: int | None, seed: int):
    """The DALI pipeline for ``cfg.split``; GPU operators when device_id is a GPU, CPU ones when None."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = device_id is not None
    decoder_device = "mixed" if gpu else "cpu"
    op_device = "gpu" if gpu else "cpu"
    layout = "HWC" if cfg.channels_last else "CHW"
    mean = [m * 255 for m in MEAN]
    std = [s * 255 for s in STD]
    size = cfg.image_size

    @pipeline_def
    def pipe():
        jpegs, lab = fn.readers.file(files=list(files), labels=list(labels), shard_id=cfg.rank,
                                     num_shards=cfg.world_size, stick_to_shard=True, pad_last_batch=True,
                                     random_shuffle=False, name="Reader")
        if cfg.split == "train":
            img = fn.decoders.image_random_crop(jpegs, device=decoder_device, output_type=types.RGB,
                                                random_area=list(TRAIN_AREA), random_aspect_ratio=list(TRAIN_RATIO),
                                                num_attempts=10)
            # Linear, no antialiasing, as in NVIDIA's DALI ResNet-50 examples: a training crop is shrunk by
            # less than 2x per side, where the aliasing is slight, and this resize is the costliest CPU stage
            # (about 1.3x the pipeline's speed on 500x375 photographs, 2 cores).
            img = fn.resize(img, device=op_device, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                            antialias=False)
            img = fn.crop_mirror_normalize(img, device=op_device, dtype=types.FLOAT, output_layout=layout,
                                           mean=mean, std=std, mirror=fn.random.coin_flip(probability=0.5))
        else:
            img = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB)
            img = fn.resize(img, device=op_device, resize_shorter=val_resize(size), antialias=True)
            img = fn.crop_mirror_normalize(img, device=op_device, dtype=types.FLOAT, output_layout=layout,
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


class DaliLoader(ShardedLoader):
    """Iterates (images float32 [B,3,H,W], labels int64 [B]) on ``device`` from a DALI pipeline."""

    kind = "dali"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device):
        super().__init__(split, cfg, device)
        self._gpu = device.type == "cuda"
        self._device_id = (device.index if device.index is not None else torch.cuda.current_device()) \
            if self._gpu else None
        self._pipe = None

    def _build(self) -> None:
        # The reader sees the epoch's whole padded order; shard_id=rank makes it read exactly self.shard.
        order = []
        for r in range(self.cfg.world_size):
            order.extend(self._shard_of(r))
        files = [self.split.files[i] for i in order]
        labels = [self.split.labels[i] for i in order]
        self.close()
        seed = (self.cfg.seed * 7919 + self.cfg.rank * 104729 + self.epoch) % (2 ** 31)
        self._pipe = build_pipeline(files, labels, self.cfg, self._device_id, seed)

    def _shard_of(self, rank: int):
        if rank == self.cfg.rank:
            return self.shard.indices
        from torus_train.data.checks import shard
        return shard(self.num_samples, rank, self.cfg.world_size, self.cfg.batch_size, epoch=self.epoch,
                     seed=self.cfg.seed, shuffle=self.cfg.split == "train").indices

    def __iter__(self):
        # A fresh pipeline per pass: the reader starts at the shard's first sample even if the previous
        # pass stopped early, and prefetching past the shard end is thrown away.
        self._build()
        pipe = self._pipe
        for step in range(len(self)):
            try:
                images, labels = pipe.run()
            except RuntimeError as e:
                self.close()
                window = self.shard.indices[step * self.batch_size:(step + 3) * self.batch_size]
                raise _named_error(e, self.split, [self.split.files[i] for i in window]) from None
            x = self._to_torch(images)
            y = torch.from_numpy(np.array(labels.as_tensor(), dtype=np.int64).reshape(-1))
            y = self._mark_padding(step, y)
            yield x, y.to(self.device, non_blocking=True)

    def _to_torch(self, images) -> torch.Tensor:
        t = images.as_tensor()
        if self._gpu:
            from nvidia.dali.plugin.pytorch import feed_ndarray
            out = torch.empty(t.shape(), dtype=torch.float32, device=self.device)
            feed_ndarray(t, out, cuda_stream=torch.cuda.current_stream(self.device))
        else:
            out = torch.from_numpy(np.array(t, copy=True))
        if self.cfg.channels_last:  # NHWC in memory: a permuted view is NCHW in channels_last format
            return out.permute(0, 3, 1, 2)
        return out

    def close(self) -> None:
        if self._pipe is not None:
            del self._pipe
            self._pipe = None
