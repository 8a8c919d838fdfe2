"""NVIDIA DALI pipelines: one code path for GPU ("mixed") decoding and CPU-only decoding (``device_id=None``).

Training: this rank's shard of the epoch (data/sharding.py) -> ``fn.external_source`` (the encoded files, read
here) -> ``fn.decoders.image_random_crop`` -> ``fn.resize`` (linear, no antialiasing, as NVIDIA's examples) ->
``fn.crop_mirror_normalize`` with a random horizontal flip, NCHW or NHWC. Validation: ``fn.decoders.image``
-> ``fn.resize(resize_shorter=size / 0.875)`` with antialiasing (to match torchvision's validation transform)
-> centre crop -> normalize.

The pipeline is built once per loader (the loop builds a loader per batch stage) and fed epoch after epoch
from a stream of this rank's shards, so it never holds more than one shard's file names and is not rebuilt at
an epoch boundary; it is rebuilt only when a pass stopped early or the loop jumps to another epoch (resume).
A corrupt image stops the pipeline; the error names the file.
"""
from __future__ import annotations

import numpy as np
import torch

from torus_train.data.base import MEAN, STD, TRAIN_AREA, TRAIN_RATIO, LoaderConfig, ShardedLoader, val_resize
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


def read_batch(files, labels, indices) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The encoded bytes and labels of ``indices``; DataError naming a file that cannot be read."""
    data = []
    for i in indices:
        try:
            data.append(np.fromfile(files[i], dtype=np.uint8))
        except OSError as e:
            raise DataError(f"{files[i]}: cannot read ({e.strerror or e})") from None
    return data, [np.array([labels[i]], dtype=np.int32) for i in indices]


def shard_stream(split: Split, cfg: LoaderConfig, epoch: int):
    """This rank's batches, epoch after epoch from ``epoch`` (DALI prefetches across an epoch's end); it holds
    no reference to the loader, so a dropped loader frees its pipeline and DALI's threads at once."""
    while True:
        sh = shard(len(split), cfg.rank, cfg.world_size, cfg.batch_size, epoch=epoch, seed=cfg.seed,
                   shuffle=cfg.split == "train")
        for step in range(sh.steps):
            yield read_batch(split.files, split.labels, sh.indices[step * cfg.batch_size:(step + 1) * cfg.batch_size])
        if cfg.split == "train":
            epoch += 1


class DaliLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` from a DALI pipeline."""

    kind = "dali"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device):
        super().__init__(split, cfg, device)
        self._gpu = device.type == "cuda"
        self._device_id = (device.index if device.index is not None else torch.cuda.current_device()) \
            if self._gpu else None
        self._pipe = None
        self._next_epoch = None  # the epoch whose first batch the pipeline delivers next; None: rebuild

    def _pipeline(self):
        if self._pipe is None or self._next_epoch != self.epoch:
            self.close()
            seed = (self.cfg.seed * 7919 + self.cfg.rank * 104729 + self.epoch) % (2 ** 31)
            self._pipe = build_pipeline(shard_stream(self.split, self.cfg, self.epoch), self.cfg, self._device_id, seed)
        self._next_epoch = None
        return self._pipe

    def __iter__(self):
        pipe = self._pipeline()
        for step in range(len(self)):
            try:
                images, labels = pipe.run()
            except (RuntimeError, StopIteration) as e:
                self.close()
                if isinstance(e.__cause__ or e.__context__, DataError):
                    raise e.__cause__ or e.__context__ from None
                window = self.shard.indices[step * self.batch_size:(step + 3) * self.batch_size]
                raise _named_error(e, self.split, [self.split.files[i] for i in window]) from None
            x = self._to_torch(images)
            y = torch.from_numpy(np.array(labels.as_tensor(), dtype=np.int64).reshape(-1))
            y = self._mark_padding(step, y)
            yield x, y.to(self.device, non_blocking=True)
        self._next_epoch = self.epoch + 1 if self.cfg.split == "train" else self.epoch

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
