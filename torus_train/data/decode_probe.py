"""Whether the device decoder (data.decoder = gpu: data/batch_decode.py, nvJPEG on a GPU) may be used on this
machine: it decodes the embedded images of every kind (data/samples.py) as the CPU decoder does, and gives the
same bits twice.

    probe_device_decoder(device)     -> Verdict   every kind decoded on ``device`` agrees with PIL's decode
    probe_decoder_repeats(device)    -> Verdict   two decodes of the same batch on ``device`` are bit-identical

Both take the decode function as a parameter (default: device_only, the loader's own batch_decode.decode_batch
without its CPU fallback), so a test can hand them a decoder that returns another image or raises. The loader's
call answers a device decode that fails with a CPU decode of the same image, which would pass a probe that looks
only at the result's device while every image of a run decodes serially on a CPU thread: so the probe's images
that take the device route (batch_decode.on_device: the JPEGs of one or three components) are decoded on the
device only, and one the device decoder refuses fails the probe. The kinds decode_batch sends to the CPU route
by design (four-component CMYK/YCCK JPEGs, the other formats) are decoded there, as in a run, and compared too.
On a CPU device the device decoder is torchvision's CPU one; on a CUDA device that this machine does not have,
the verdict is None (cannot run here).

The reference is PIL's ``Image.open(...).convert("RGB")``: what data.decoder = cpu feeds the model (the
DataLoader workers' decode, torchvision_loader._decode).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import numpy as np
import torch

from torus_train.data.batch_decode import decode_batch, on_device
from torus_train.data.samples import Sample, jpeg_samples, samples
from torus_train.verdict import Verdict

DecodeFn = Callable[[list[torch.Tensor], torch.device], tuple[list[torch.Tensor | None], dict[int, str]]]
"""batch_decode.decode_batch's shape: (encoded images, device) -> (decoded [3, H, W] uint8 or None, {k: why})."""

MEAN_LEVELS = 2.0
"""Largest mean absolute difference (uint8 levels, over every pixel and channel of one image) between the device
decoder and PIL. nvJPEG and libjpeg-turbo differ slightly by design: another IDCT, and nvJPEG upsamples the
chroma of 4:2:0 JPEGs without libjpeg-turbo's "fancy" (triangle-filter) upsampling, the difference DALI's
``jpeg_fancy_upsampling`` option exists to remove. On a smooth picture that is a level or two at most, and
torchvision's own test of its CUDA decoder (test_image.py, test_decode_jpegs_cuda) bounds the same mean by 2.
A real fault is far above it: a swapped channel, a wrong colour transform (CMYK, YCCK), a shifted row or a
buffer overwritten while it was written (the decode race of pytorch/vision PR 9606) moves the mean by tens of
levels."""
FAR_LEVELS = 32
"""A value "far off": more than this many levels from PIL's. Chroma upsampling alone moves a pixel next to a
sharp colour edge by up to ~25 levels (a quarter of the chroma step, times 1.77 from Cb to blue, for the
samples' block edge), so a single value's bound cannot be tighter without failing sound decoders."""
FAR_SHARE = 0.01
"""Largest share of an image's values that may be far off: an edge's few pixels pass, a corrupted patch (a
tile written by another batch, garbage in a block of rows) does not, even where it is too small to move the
mean past MEAN_LEVELS."""


def device_only(images: list[torch.Tensor], device: torch.device) -> tuple[list[torch.Tensor | None], dict[int, str]]:
    """The loader's decode (batch_decode.decode_batch) without the CPU fallback of its device route."""
    return decode_batch(images, device, fallback=False)


def cpu_route() -> list[str]:
    """The kinds decode_batch decodes on the CPU by design, whatever the device (not batch_decode.on_device)."""
    return sorted(s.kind for s in samples().values() if not on_device(encoded([s])[0]))


def encoded(items: Sequence[Sample]) -> list[torch.Tensor]:
    """The samples' bytes as 1-D uint8 CPU tensors (what the loader's workers hand the decoder)."""
    return [torch.frombuffer(bytearray(s.data), dtype=torch.uint8) for s in items]


def reference(sample: Sample) -> torch.Tensor:
    """[3, H, W] uint8: PIL's RGB decode of ``sample`` (the CPU decoder's)."""
    from PIL import Image

    with Image.open(io.BytesIO(sample.data)) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous()


def difference(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """{"mean", "max", "far"}: mean and largest absolute difference in levels, share of values off by more
    than FAR_LEVELS; both [3, H, W] uint8 of the same shape."""
    d = (got.to(torch.int16) - want.to(torch.int16)).abs()
    return {
        "mean": round(float(d.float().mean()), 3),
        "max": int(d.max()),
        "far": round(float((d > FAR_LEVELS).float().mean()), 4),
    }


def agrees(diff: dict[str, float]) -> bool:
    """Within the stated tolerance (MEAN_LEVELS, FAR_SHARE)."""
    return diff["mean"] <= MEAN_LEVELS and diff["far"] <= FAR_SHARE


def _fault(sample: Sample, image: torch.Tensor | None, reason: str | None, device: torch.device) -> str | None:
    """Why ``image`` cannot be compared with the reference at all (missing, wrong place, type or shape)."""
    if image is None:
        return f"{sample.kind}: not decoded ({reason or 'no reason given'})"
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        what = f"{image.dtype} {tuple(image.shape)}" if isinstance(image, torch.Tensor) else type(image).__name__
        return f"{sample.kind}: decoded as {what}, not [3, H, W] uint8"
    if image.device.type != device.type:
        return f"{sample.kind}: decoded on {image.device.type}, not on {device.type}"
    return None


def _unavailable(device: torch.device) -> Verdict | None:
    if device.type == "cuda" and not torch.cuda.is_available():
        return Verdict.cannot_run("no CUDA device here (torch.cuda.is_available() is False)")
    return None


def _decode(decode: DecodeFn, items: Sequence[Sample], device: torch.device):
    """(images, failed) or a failed Verdict when the decoder raises or answers out of shape."""
    try:
        images, failed = decode(encoded(items), device)
    except Exception as e:  # a decoder fault of any type is a failed probe, never a failed run
        return Verdict.failed(f"the device decoder raised {type(e).__name__}: {_first_line(e)}")
    if len(images) != len(items):
        return Verdict.failed(f"the device decoder returned {len(images)} images for {len(items)}")
    return images, failed


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else "(no message)"


def probe_device_decoder(device: torch.device | str, decode: DecodeFn | None = None) -> Verdict:
    """Every sample kind decoded on ``device`` agrees with PIL within MEAN_LEVELS / FAR_SHARE. Two calls: the JPEG
    kinds in one batch (nvJPEG's batched path), then every kind in one batch (a set with a PNG or a BMP among
    its JPEGs), as the loader meets them; the device route never falls back to the CPU (module docstring).
    The detail names the kinds of the CPU route (cpu_route)."""
    device = torch.device(device)
    if (skip := _unavailable(device)) is not None:
        return skip
    decode = decode or device_only
    batches = {"jpeg batch": list(jpeg_samples().values()), "mixed batch": list(samples().values())}
    detail: dict[str, dict] = {}
    for name, items in batches.items():
        got = _decode(decode, items, device)
        if isinstance(got, Verdict):
            return Verdict.failed(f"{got.why} ({name})", **detail)
        images, failed = got
        for k, (sample, image) in enumerate(zip(items, images, strict=True)):
            fault = _fault(sample, image, failed.get(k), device)
            if fault is not None:
                return Verdict.failed(f"{fault} ({name})", **detail)
            want = reference(sample)
            if image.shape != want.shape:
                return Verdict.failed(
                    f"{sample.kind}: decoded as {tuple(image.shape)}, PIL gives {tuple(want.shape)} ({name})", **detail
                )
            diff = difference(image.cpu(), want)
            detail.setdefault(name, {})[sample.kind] = diff
            if not agrees(diff):
                return Verdict.failed(
                    f"{sample.kind}: differs from PIL by {diff['mean']} levels on average, {diff['far']:.1%} of "
                    f"values by more than {FAR_LEVELS} (allowed: {MEAN_LEVELS}, {FAR_SHARE:.0%}; {name})",
                    **detail,
                )
    worst = max(d["mean"] for batch in detail.values() for d in batch.values())
    n = sum(len(b) for b in batches.values())
    return Verdict.passed(
        f"{n} images of {len(samples())} kinds decoded on {device.type} agree with PIL "
        f"(worst mean difference {worst} levels, allowed {MEAN_LEVELS})",
        **detail,
        cpu_route=cpu_route(),
    )


def probe_decoder_repeats(device: torch.device | str, decode: DecodeFn | None = None, copies: int = 4) -> Verdict:
    """Two decodes on ``device`` of one batch (``copies`` of each JPEG kind: large enough for nvJPEG's batched
    path) give the same bits: what a deterministic run needs of its decoder."""
    device = torch.device(device)
    if (skip := _unavailable(device)) is not None:
        return skip
    decode = decode or device_only
    items = [s for s in jpeg_samples().values() for _ in range(copies)]
    runs = []
    for _ in range(2):
        got = _decode(decode, items, device)
        if isinstance(got, Verdict):
            return got
        images, failed = got
        faults = [_fault(s, im, failed.get(k), device) for k, (s, im) in enumerate(zip(items, images, strict=True))]
        if any(faults):
            return Verdict.failed(next(f for f in faults if f))
        runs.append([im.cpu() for im in images])
    differ = [s.kind for s, a, b in zip(items, *runs, strict=True) if a.shape != b.shape or not torch.equal(a, b)]
    if differ:
        return Verdict.failed(
            f"two decodes on {device.type} differ in {len(differ)} of {len(items)} images ({', '.join(sorted(set(differ)))})",
            differ=sorted(set(differ)),
        )
    return Verdict.passed(f"two decodes of {len(items)} images on {device.type} are bit-identical", images=len(items))
