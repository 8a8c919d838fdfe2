"""NVIDIA DALI pipelines: one code path for GPU ("mixed") decoding and CPU-only decoding (``device_id=None``).

Training: this rank's shard of the epoch (data/sharding.py) -> ``fn.external_source`` (the encoded samples,
read ahead by ``data.io_workers`` reader threads from a folder or a packed set; readers.ReadAhead) ->
``fn.decoders.image_random_crop`` -> ``fn.resize`` (linear, no antialiasing, as NVIDIA's examples) ->
``fn.crop_mirror_normalize`` with a random horizontal flip, NCHW or NHWC. Validation: ``fn.decoders.image``
-> ``fn.resize(resize_shorter=size / 0.875)`` with antialiasing (to match torchvision's validation transform)
-> centre crop -> normalize. ``data.prefetch`` batches are read and decoded ahead of the step.

The training thread does no file I/O: external_source's generator only takes batches the reader threads
finished (threads, not processes: DALI's parallel external_source forks its workers, and a fork beside the
threads of another live pipeline, as a rank's train and val loaders are, was seen to hang the child). The
pipeline is built once per loader (the loop builds a loader per batch stage) and fed epoch after epoch from a
stream of this rank's shards, so it is not rebuilt at an epoch boundary; it is rebuilt only when a pass
stopped early or the loop jumps to another epoch (resume).
Every image PIL reads trains. The reader thread checks each file's content as it reads it (checks.
content_problem: the format by its magic bytes, a JPEG's end marker after its last scan; a packed sample also
against its CRC-32): no extra I/O, nothing decoded unless it looks cut short. A file whose format DALI's
decoder takes (DALI_FORMATS) goes to the pipeline as read; any other one (TIFF, GIF, a format only PIL knows)
is decoded by PIL in the reader thread and handed over as an uncompressed BMP, which DALI takes. The pipeline
keeps one input and one decoder, so the common sample costs one magic-byte comparison more; the rare one costs
its PIL decode on a reader thread. A file the sniffing admitted but DALI still refuses (a JPEG variant its
decoder lacks) stops the pipeline: the samples in flight are decoded with PIL, those PIL reads but DALI does
not are marked for the CPU route, and the step is redone.

A corrupt sample (no decoder reads it) is the spec's choice (``data.on_corrupt``). ``fail``: a DataError naming
the file or shard. ``skip``: the sample is replaced by the next readable one (base.CorruptLog): a reader-found one
at once, in the batch being read; a decode failure by rebuilding the pipeline at the failing step with the sample
marked, so the step is redone with a whole batch. The shard, the batch size and the step count do not change.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from torus_train.data.base import (
    MEAN,
    PAD_LABEL,
    STD,
    TRAIN_AREA,
    TRAIN_RATIO,
    CorruptLog,
    LoaderConfig,
    ShardedLoader,
    epoch_shard,
    replacement_after,
    val_resize,
)
from torus_train.data.checks import sniff
from torus_train.data.index import DataError, Split
from torus_train.data.readers import ReadAhead, sample_reader

DALI_FORMATS = frozenset({"jpeg", "png", "bmp", "webp"})
"""Formats DALI 2.4's fn.decoders.image reads in every variant tried (on CPU: baseline, progressive, grayscale,
CMYK, 4:4:4 and trailing-byte JPEGs; RGB, RGBA, palette, grey, 1- and 16-bit PNGs; 1-bit, palette and RGBA
BMPs; lossy, lossless and RGBA WebPs). Not TIFF (a bilevel one fails, others log errors) nor GIF (refused): those
and every format only PIL knows take the CPU route (``cpu_decoded``)."""


def available() -> bool:
    """True when nvidia.dali imports."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception:
        return False
    return True


def build_pipeline(source, cfg: LoaderConfig, device_id: int | None, seed: int, read=None):
    """The DALI pipeline for ``cfg.split`` fed by ``source`` (an iterator of (encoded samples, labels) batches,
    read ahead by reader threads); GPU operators when device_id is a GPU, CPU ones when None. ``read``: a
    function giving the (encoded samples, labels) nodes in place of ``source`` (scripts/bench/
    bench_webdataset.py puts DALI's fn.readers.webdataset there, before the same decode and augmentation)."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = device_id is not None
    decoder_device = "mixed" if gpu else "cpu"
    op_device = "gpu" if gpu else "cpu"
    size = cfg.image_size
    normalize = _normalize(cfg, types)

    @pipeline_def
    def pipe():
        # ``source`` yields batches that reader threads read ahead: the training thread only takes them
        if read is not None:
            jpegs, lab = read()
        else:
            jpegs, lab = fn.external_source(source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32])
        if cfg.split == "train":
            img = fn.decoders.image_random_crop(
                jpegs,
                device=decoder_device,
                output_type=types.RGB,
                random_area=list(TRAIN_AREA),
                random_aspect_ratio=list(TRAIN_RATIO),
                num_attempts=10,
            )
            # Linear, no antialiasing, as in NVIDIA's DALI ResNet-50 examples: a training crop is shrunk by
            # less than 2x per side, where the aliasing is slight, and this resize is the costliest CPU stage
            # (about 1.3x the pipeline's speed on 500x375 photographs, 2 cores).
            img = fn.resize(
                img, device=op_device, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=False
            )
            img = fn.crop_mirror_normalize(
                img, device=op_device, mirror=fn.random.coin_flip(probability=0.5), **normalize
            )
        else:
            img = fn.decoders.image(jpegs, device=decoder_device, output_type=types.RGB)
            img = fn.resize(img, device=op_device, resize_shorter=val_resize(size), antialias=True)
            img = fn.crop_mirror_normalize(img, device=op_device, crop=(size, size), **normalize)
        return img, lab

    p = pipe(
        batch_size=cfg.batch_size,
        num_threads=max(1, cfg.num_threads),
        device_id=device_id,
        seed=seed,
        prefetch_queue_depth=cfg.prefetch,
    )
    p.build()
    return p


def _normalize(cfg: LoaderConfig, types) -> dict:
    """crop_mirror_normalize's arguments that both splits share: ImageNet's mean and std on 0..255 pixels, the
    layout and the output dtype."""
    return {
        "mean": [m * 255 for m in MEAN],
        "std": [s * 255 for s in STD],
        "output_layout": "HWC" if cfg.channels_last else "CHW",
        # DALI has no bfloat16: bf16 models get float16 (its 10-bit mantissa holds every bf16 value of a
        # normalized pixel) and the loader casts on the device, a half-size copy instead of a full float32 one.
        "dtype": types.DALIDataType.FLOAT if cfg.dtype == "float32" else types.DALIDataType.FLOAT16,
    }


def _decode_problem(data: np.ndarray | None) -> str | None:
    """Why PIL cannot fully decode these bytes (None when it can)."""
    from PIL import Image

    if data is None:
        return "cannot read it"
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()
    except Exception as e:  # PIL raises several types for bad files
        return f"{type(e).__name__}: {e}"
    return None


def cpu_decoded(data: np.ndarray) -> tuple[np.ndarray | None, str | None]:
    """A file DALI's decoder does not take, decoded by PIL (RGB) and re-encoded as an uncompressed BMP, which it
    does: lossless, and a copy rather than a compression. (None, why) when PIL cannot decode it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            rgb = im.convert("RGB")
        out = io.BytesIO()
        rgb.save(out, format="BMP")
    except Exception as e:  # PIL raises several types for bad files
        return None, f"does not decode ({type(e).__name__}: {str(e)[:120]})"
    return np.frombuffer(out.getvalue(), dtype=np.uint8), None


def _dali_refuses(data: np.ndarray, device_id: int | None) -> bool:
    """Whether DALI's image decoder (on the loader's device) fails on these bytes: one sample through a
    one-sample pipeline (built in about 15 ms; a failure leaves a pipeline unusable, so one per sample)."""
    from nvidia.dali import fn, pipeline_def, types

    # DALI documents device_id=None for a CPU-only pipeline; its annotation says int
    @pipeline_def(batch_size=1, num_threads=1, device_id=device_id, exec_pipelined=False, exec_async=False)  # type: ignore[arg-type]
    def probe():
        x = fn.external_source(name="x", dtype=types.UINT8)
        return fn.decoders.image(x, device="cpu" if device_id is None else "mixed", output_type=types.RGB)

    p = probe()
    p.build()
    p.feed_input("x", [data])
    try:
        p.run()
    except RuntimeError:
        return True
    finally:
        del p
    return False


def _find_bad_sample(split: Split, indices) -> tuple[str, str] | None:
    """The first sample among ``indices`` that PIL cannot fully decode, with PIL's reason (read here, on the
    training thread: only after a pipeline failure)."""
    reader = sample_reader(split)
    try:
        for i in indices:
            why = _decode_problem(reader.read(int(i))[0])
            if why is not None:
                return split.files[int(i)], why
    finally:
        reader.close()
    return None


def _named_error(e: Exception, split: Split, window) -> DataError:
    """A one-line DataError for a DALI pipeline failure, naming the sample that does not decode.

    DALI's message names the operator, not the file; the sample is found by decoding the batches that were
    in flight (the failing one and those prefetched after it) with PIL.
    """
    msg = str(e)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    reason = next(
        (lines[i + 1] for i, ln in enumerate(lines) if ln == "encountered:" and i + 1 < len(lines)),
        lines[0] if lines else type(e).__name__,
    )
    bad = _find_bad_sample(split, window)
    if bad is not None:
        return DataError(f"{bad[0]}: corrupt image, DALI cannot decode it ({reason}; PIL: {bad[1][:120]})")
    return DataError(f"{split.root}: DALI pipeline failed ({reason[:200]})")


class Feed:
    """What the reader threads read with: the split's reader, the policy, and the run's CorruptLog (whose
    ``undecodable`` the loader marks after a pipeline failure)."""

    def __init__(self, split: Split, cfg: LoaderConfig, corrupt: CorruptLog):
        self.split, self.skip, self.val, self.corrupt = split, cfg.on_corrupt == "skip", cfg.split == "val", corrupt
        self.bad = corrupt.undecodable
        self.on_cpu: set[int] = set()  # samples DALI refused though PIL reads them: always the CPU route
        self.reader = sample_reader(split)

    def _read(self, i: int) -> tuple[np.ndarray | None, str | None]:
        name = self.split.files[i]
        if name in self.bad:
            return None, self.bad[name]
        data, problem = self.reader.read(i)
        if problem is None and (i in self.on_cpu or sniff(data) not in DALI_FORMATS):
            return cpu_decoded(data)
        return data, problem

    def sample(self, i: int) -> tuple[np.ndarray, int]:
        """The bytes and label of sample ``i``, or of its replacement under skip."""
        data, problem = self._read(i)
        if problem is None:
            assert data is not None  # a read without a problem has the bytes
            return data, int(self.split.labels[i])
        name = self.split.files[i]
        if not self.skip:
            raise DataError(f"{name}: {problem}")
        got: dict[int, Any] = {}

        def readable(j: int) -> bool:
            got[j], why = self._read(j)
            return why is None

        j = replacement_after(self.split, i, readable)
        self.corrupt.note(name, problem, self.split.files[j])
        return got[j], PAD_LABEL if self.val else int(self.split.labels[j])

    def batch(self, indices) -> tuple[list[np.ndarray], list[np.ndarray]]:
        data, labels = [], []
        for i in indices:
            d, lab = self.sample(int(i))
            data.append(d)
            labels.append(np.array([lab], dtype=np.int32))
        return data, labels


def batch_indices(split: Split, cfg: LoaderConfig, epoch: int, first_step: int = 0):
    """This rank's batches of sample indices, epoch after epoch from step ``first_step`` of ``epoch`` (DALI
    prefetches across an epoch's end)."""
    while True:
        sh = epoch_shard(split, cfg, epoch)
        for step in range(first_step, sh.steps):
            yield sh.indices[step * cfg.batch_size : (step + 1) * cfg.batch_size]
        first_step = 0
        if cfg.split == "train":
            epoch += 1


def shard_stream(feed: Feed, cfg: LoaderConfig, epoch: int, first_step: int, ahead: ReadAhead):
    """The batches read by ``ahead``'s threads; it holds no reference to the loader, so a dropped loader frees
    its pipeline and DALI's threads at once."""
    return ahead.map(feed.batch, batch_indices(feed.split, cfg, epoch, first_step))


class DaliLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` from a DALI pipeline."""

    kind = "dali"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device, corrupt: CorruptLog | None = None):
        super().__init__(split, cfg, device, corrupt)
        self._gpu = device.type == "cuda"
        self.decoder = "mixed" if self._gpu else "cpu"  # DALI's JPEG decoder, for the run's summary
        self._device_id = (
            (device.index if device.index is not None else torch.cuda.current_device()) if self._gpu else None
        )
        self._feed = Feed(split, cfg, self.corrupt)
        self._pipe = None
        self._ahead: ReadAhead | None = None
        self._next_epoch = None  # the epoch whose first batch the pipeline delivers next; None: rebuild

    def _pipeline(self, first_step: int = 0):
        if self._pipe is None or self._next_epoch != self.epoch or first_step:
            self.close()
            seed = (self.cfg.seed * 7919 + self.cfg.rank * 104729 + self.epoch) % (2**31)
            # in flight: prefetch batches, and at least one per reader thread so that all of them read
            ahead = self._ahead = ReadAhead(self.cfg.io_workers, max(self.cfg.prefetch, self.cfg.io_workers))
            stream = shard_stream(self._feed, self.cfg, self.epoch, first_step, ahead)
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
        """The pipeline failed at ``step``: a DataError naming the sample (one a reader thread found unusable,
        or one DALI could not decode), or (skip) the sample marked and a new pipeline from this step on."""
        self.close()
        cause = e.__cause__ or e.__context__
        if isinstance(cause, DataError):
            raise cause from None
        window = [
            i
            for i in self.shard.indices[step * self.batch_size : (step + 3) * self.batch_size]
            if self.split.files[int(i)] not in self._feed.bad
        ]
        bad = _find_bad_sample(self.split, window)
        if bad is None and self._route_to_cpu(window):
            return self._pipeline(first_step=step)
        if not self._feed.skip or bad is None:
            raise _named_error(e, self.split, window) from None
        self._feed.bad[bad[0]] = f"DALI cannot decode it; PIL: {bad[1][:120]}"
        return self._pipeline(first_step=step)

    def _route_to_cpu(self, window) -> bool:
        """After a failure where PIL reads every sample in flight: the ones DALI's decoder refuses, marked for
        the CPU route (True when there were any; False: the failure was not a decoder's refusal)."""
        reader, refused = sample_reader(self.split), []
        try:
            for i in map(int, window):
                data = reader.read(i)[0]
                if i in self._feed.on_cpu or data is None or sniff(data) not in DALI_FORMATS:
                    continue  # already decoded on the CPU, or unreadable (the reader names it)
                if _dali_refuses(data, self._device_id):
                    refused.append(i)
        finally:
            reader.close()
        self._feed.on_cpu.update(refused)
        return bool(refused)

    def _to_torch(self, images) -> torch.Tensor:
        t = images.as_tensor()
        if self._gpu:
            from nvidia.dali.plugin.pytorch import feed_ndarray

            out = torch.empty(
                t.shape(), dtype=torch.float32 if self.cfg.dtype == "float32" else torch.float16, device=self.device
            )
            feed_ndarray(t, out, cuda_stream=torch.cuda.current_stream(self.device))
        else:
            out = torch.from_numpy(np.array(t, copy=True))
        if out.dtype != self.cfg.torch_dtype():
            out = out.to(self.cfg.torch_dtype())
        if self.cfg.channels_last:  # NHWC in memory: a permuted view is NCHW in channels_last format
            return out.permute(0, 3, 1, 2)
        return out

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self._pipe is not None:
            del self._pipe
            self._pipe = None
