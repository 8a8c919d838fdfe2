"""The torchvision loader's device decoder (data.decoder = gpu): a batch of encoded JPEGs -> a normalised image
batch, on the rank's device.

    images, failed = decode_batch(encoded, device)         nvJPEG, the whole batch in one call
    x = augment(images, split, size, generator, ...)       per-image crop box, resize, flip, normalise

The DataLoader's workers only read the files (bytes as uint8 tensors); decoding, the random-resized crop, the
flip and the normalisation run here, on the GPU of a CUDA rank. The device is a parameter: the same functions
run on the CPU (torchvision decodes a list of JPEGs there too), which is how they are tested without a GPU.

The augmentation follows the CPU path's (torchvision_loader.transform): RandomResizedCrop's box (area
TRAIN_AREA, ratio TRAIN_RATIO, ten tries then a centre crop), bilinear resize with antialiasing, a flip with
probability 1/2; validation: the shorter side resized to val_resize(size), then the centre crop. The random
draws come from ``generator`` (a CPU torch.Generator the loader seeds per epoch and rank), so a batch is a
function of (seed, rank, epoch, step): a resumed run draws what a straight one drew.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.deterministic as det
from torchvision.io import ImageReadMode, decode_image, decode_jpeg

from torus_train.data.base import MEAN, STD, TRAIN_AREA, TRAIN_RATIO, val_resize


def decode_batch(
    encoded: list[torch.Tensor], device, fallback: bool = True
) -> tuple[list[torch.Tensor | None], dict[int, str]]:
    """([3, H, W] uint8 RGB on ``device`` per encoded image, {position: why} of those that did not decode).

    Each image takes its route before any decode (on_device): the JPEGs of one or three components go to the
    device decoder in one batched call (nvJPEG on a GPU); the rest (four-component CMYK or YCCK JPEGs, whose
    Adobe inversion PIL follows and nvJPEG need not, and every other format) go to the CPU route (torchvision's
    CPU decoders, then PIL) and are moved to the device. When the batched call fails, its images are decoded
    one by one, each by the device decoder and, where it refuses, the CPU route, so that one bad file is named
    instead of failing its batch; one that no decoder reads is None, its reason in the dict. ``fallback=False``
    (the decoder probe: data/decode_probe.py) decodes the device route's images on the device only: a device
    decode that fails is their failure, never answered by the CPU."""
    images: list[torch.Tensor | None] = [None] * len(encoded)
    failed: dict[int, str] = {}
    ours = [k for k, data in enumerate(encoded) if on_device(data)]
    try:
        if ours:
            for k, image in zip(ours, device_jpeg([encoded[k] for k in ours], device), strict=True):
                images[k] = image
    except RuntimeError:
        pass  # one by one below: the image the device decoder refuses is named
    one = decode_one if fallback else device_jpeg
    for k, data in enumerate(encoded):
        if images[k] is not None:
            continue
        try:
            images[k] = one(data, device) if k in ours else cpu_decode(data).to(device)
        except RuntimeError as e:
            failed[k] = _why(e)
    return images, failed


def _why(e: RuntimeError) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def on_device(data: torch.Tensor) -> bool:
    """Whether ``data`` takes the device decoder's route: a JPEG (its first bytes FF D8) that is not
    four-component (jpeg_components; a header this cannot read still goes there, and a failure names it)."""
    head = data[:2].tolist()
    return head == [0xFF, 0xD8] and jpeg_components(data) != 4


_NO_LENGTH = {0x01, *range(0xD0, 0xD8)}
"""JPEG markers without a length field (TEM, RST0-7)."""
_FRAMES = {m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC)}
"""Start-of-frame markers (SOF0-15 but DHT, JPG and DAC): their segment holds the component count."""


def jpeg_components(data: torch.Tensor) -> int | None:
    """The component count of a JPEG's frame header (1 grey, 3 YCbCr or RGB, 4 CMYK or YCCK), read from the
    marker segments before the first scan; None where the header does not say (not a JPEG, cut short)."""
    raw = data[: 1 << 16].numpy().tobytes()  # the headers before the frame: the frame comes in the first KiBs
    at = 2
    while at + 4 <= len(raw) and raw[at] == 0xFF:
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker in _NO_LENGTH:
            at += 2
            continue
        if marker in _FRAMES:
            return raw[at + 9] if at + 9 < len(raw) else None
        if marker == 0xDA:  # start of scan: no frame header before it
            return None
        at += 2 + int.from_bytes(raw[at + 2 : at + 4], "big")
    return None


def device_jpeg(
    encoded: torch.Tensor | list[torch.Tensor],
    device: torch.device | str,
    stream: Any = None,
    decode: Callable[..., Any] | None = None,
) -> Any:
    """``decode(encoded, mode=RGB, device=device)`` (torchvision's decode_jpeg: one image or a list), ordered
    against the calling thread's current CUDA stream (``stream``: that stream; a test hands a recorded fake).

    Why: torchvision allocates the outputs with torch.empty on the current stream (the prefetch stream here),
    then nvJPEG writes them on its own stream, which never waits for the current one (pytorch/vision PR 9606).
    The caching allocator gives out a block freed on a stream as soon as the free is queued, so the decode can
    land in memory that kernels still queued on the prefetch stream (the previous batch's crop and resize) are
    reading: silently wrong images. The order, therefore:
      1. the current stream is synchronised (a host wait in the prefetch thread, never in the training step):
         every block the allocator can hand this decode has been read to the end;
      2. under torch.use_deterministic_algorithms, torch.empty fills new memory with a kernel queued on the
         current stream, which would race nvJPEG's writes: that fill is off for the call (no_prefill);
      3. after the decode, torchvision makes the current stream wait on an event recorded on nvJPEG's stream,
         so the augmentation queued next reads finished pixels, and _Prefetch.get makes the consumer's stream
         wait on the event recorded after the augmentation.
    On a CPU device it is the plain call (nothing runs asynchronously)."""
    decode = decode or decode_jpeg
    if torch.device(device).type != "cuda":
        return decode(encoded, mode=ImageReadMode.RGB, device=device)
    (stream or torch.cuda.current_stream(device)).synchronize()
    with no_prefill():
        return decode(encoded, mode=ImageReadMode.RGB, device=device)


_PREFILL = threading.Lock()


@contextlib.contextmanager
def no_prefill() -> Iterator[None]:
    """torch.utils.deterministic.fill_uninitialized_memory off inside (when deterministic algorithms are on).
    The flag is process-wide: other threads' allocations meanwhile go unfilled too, which changes no result
    (the fill only makes a read of uninitialised memory repeatable; no kernel of the step reads one)."""
    with _PREFILL:
        if not (torch.are_deterministic_algorithms_enabled() and det.fill_uninitialized_memory):  # type: ignore[attr-defined]
            yield
            return
        det.fill_uninitialized_memory = False  # type: ignore[attr-defined]
        try:
            yield
        finally:
            det.fill_uninitialized_memory = True  # type: ignore[attr-defined]


def decode_one(data: torch.Tensor, device) -> torch.Tensor:
    """One encoded image -> [3, H, W] uint8 RGB on ``device``: the device's JPEG decoder for the device route's
    (on_device), else the CPU route (cpu_decode) moved to the device; RuntimeError when none reads it."""
    if on_device(data):
        try:
            return device_jpeg(data, device)
        except RuntimeError:
            pass
    return cpu_decode(data).to(device)


def cpu_decode(data: torch.Tensor) -> torch.Tensor:
    """[3, H, W] uint8 RGB on the CPU: torchvision's CPU decoders (JPEG, CMYK included, PNG, WebP, GIF), else
    PIL (BMP, TIFF and every other format it reads); RuntimeError when none reads it."""
    try:
        return decode_image(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        return pil_decode(data)


def pil_decode(data: torch.Tensor) -> torch.Tensor:
    """[3, H, W] uint8 RGB decoded by PIL on the CPU (the CPU decoder's reader); RuntimeError when PIL cannot
    read it, like torchvision's decoders."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
            rgb = np.array(im.convert("RGB"))
    except Exception as e:  # PIL raises several types for bad files
        raise RuntimeError(f"no decoder reads it (PIL: {type(e).__name__}: {e})") from None
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


def crop_box(height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random-resized crop: torchvision's RandomResizedCrop.get_params, drawn from
    ``generator``."""
    area = height * width
    log_ratio = (math.log(TRAIN_RATIO[0]), math.log(TRAIN_RATIO[1]))
    for _ in range(10):
        u = torch.rand(4, generator=generator).tolist()
        target = area * (TRAIN_AREA[0] + u[0] * (TRAIN_AREA[1] - TRAIN_AREA[0]))
        ratio = math.exp(log_ratio[0] + u[1] * (log_ratio[1] - log_ratio[0]))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            return int(u[2] * (height - h + 1)), int(u[3] * (width - w + 1)), h, w
    ratio = width / height  # fallback: the centre crop of the ratio range's nearest bound
    if ratio < TRAIN_RATIO[0]:
        w, h = width, round(width / TRAIN_RATIO[0])
    elif ratio > TRAIN_RATIO[1]:
        h, w = height, round(height * TRAIN_RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def val_box(height: int, width: int, size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((resized h, w), (top, left)): the shorter side resized to val_resize(size) (torchvision's Resize(int)),
    then the centre crop's corner (CenterCrop's rounding)."""
    short = val_resize(size)
    if height <= width:
        rh, rw = short, int(short * width / height)
    else:
        rh, rw = int(short * height / width), short
    return (rh, rw), (round((rh - size) / 2.0), round((rw - size) / 2.0))


def augment(
    images: list[torch.Tensor],
    split: str,
    size: int,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """[B, 3, size, size] in ``dtype``, normalised with MEAN/STD, on the images' device: training's random-resized
    crop and flip, or validation's resize and centre crop, per image (their sizes differ), then one batch."""
    out = []
    for img in images:
        _, height, width = img.shape
        if split == "train":
            top, left, h, w = crop_box(height, width, generator)
            crop = img[None, :, top : top + h, left : left + w].float()
            out.append(F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False))
        else:
            (rh, rw), (top, left) = val_box(height, width, size)
            full = F.interpolate(img[None].float(), size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
            out.append(full[:, :, top : top + size, left : left + size])
    x = torch.cat(out)
    if split == "train":  # one draw per image, as RandomHorizontalFlip's
        flip = to_device(torch.rand(len(images), generator=generator) < 0.5, x.device)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    mean, std = statistics(x.device)
    x = (x.clamp_(0, 255) - mean) / std  # the CPU path's ToTensor (0..1) and Normalize in one
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return x.to(dtype=dtype, memory_format=fmt)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor on ``device`` without waiting for the stream: a plain copy to a GPU waits for the
    stream's earlier work; from pinned memory it is queued like a kernel."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


@functools.cache
def statistics(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(MEAN, STD) x 255 as [1, 3, 1, 1] tensors on ``device``, made once per device."""
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) * 255 for v in (MEAN, STD))
    return to_device(mean, device), to_device(std, device)
