"""Small images of every kind real ImageNet-style data sets hold, made in memory by PIL (no torch, no files).

    samples()["cmyk"].data      the encoded bytes of a 48x40 CMYK JPEG
    for s in samples().values() baseline, progressive, grayscale, CMYK, 4:4:4 JPEGs, a JPEG with bytes after its
                                end marker, RGB and RGBA PNGs, and the other formats the index accepts
    cpu_only_samples()          files PIL reads that DALI's decoder refuses (GIF named .JPEG, bilevel TIFF)

They serve two readers: the decoder probe (a device decoder is used only when it agrees with the CPU's on
these) and the tests (a folder made of one file of each kind must check, pack and train). Every image is a
function of its kind alone: the same bytes on every rank and every run.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

SIZE = (48, 40)
"""(width, height): not square and not a multiple of 16, so crops, padding and MCU edges are exercised."""


@dataclass(frozen=True)
class Sample:
    kind: str
    """Short name: baseline, progressive, grayscale, cmyk, ..."""
    suffix: str
    """The file name extension such a file carries in a data set (a PNG named .JPEG keeps .JPEG)."""
    jpeg: bool
    """True where the content is a JPEG (what a device JPEG decoder is asked to read)."""
    data: bytes
    """The encoded file."""


def _picture(mode: str = "RGB"):
    """A smooth gradient with a sharp-edged block: decoders agree on it to a few levels, and a swapped channel,
    a shifted row or a wrong colour transform shows as a large difference."""
    from PIL import Image

    w, h = SIZE
    img = Image.new("RGB", SIZE)
    img.putdata(
        [
            (int(255 * x / (w - 1)), int(255 * y / (h - 1)), 96 if 12 <= x < 30 and 8 <= y < 24 else 200)
            for y in range(h)
            for x in range(w)
        ]
    )
    return img.convert(mode)


def _encode(img, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def _jpeg(mode: str = "RGB", **options) -> bytes:
    return _encode(_picture(mode), "JPEG", quality=95, **options)


_MAKERS = {
    # kind: (suffix, is a JPEG, maker)
    "baseline": (".JPEG", True, lambda: _jpeg()),
    "progressive": (".JPEG", True, lambda: _jpeg(progressive=True)),
    "grayscale": (".JPEG", True, lambda: _jpeg("L")),
    "cmyk": (".JPEG", True, lambda: _jpeg("CMYK")),
    "yuv444": (".JPEG", True, lambda: _jpeg(subsampling=0)),
    # web-scraped sets: bytes after the end-of-image marker (a decoder stops at the marker)
    "trailing": (".JPEG", True, lambda: _jpeg() + b"\x00" * 7 + b"trailing bytes after EOI"),
    # ILSVRC-2012's n02105855_2933.JPEG is a PNG
    "png_named_jpeg": (".JPEG", False, lambda: _encode(_picture(), "PNG")),
    "png_rgba": (".png", False, lambda: _encode(_picture("RGBA"), "PNG")),
    "bmp": (".bmp", False, lambda: _encode(_picture(), "BMP")),
    "tiff": (".tif", False, lambda: _encode(_picture(), "TIFF")),
    "webp": (".webp", False, lambda: _encode(_picture(), "WEBP", lossless=True)),
}


_CPU_ONLY = {
    # PIL and torchvision read these, DALI 2.4's decoder refuses them: the DALI loader decodes them on the CPU
    "gif_named_jpeg": (".JPEG", False, lambda: _encode(_picture().convert("P"), "GIF")),
    "tiff_bilevel": (".tif", False, lambda: _encode(_picture("1"), "TIFF")),
}


@functools.cache
def samples() -> dict[str, Sample]:
    """Every kind, made once per process."""
    return {kind: Sample(kind, suffix, jpeg, make()) for kind, (suffix, jpeg, make) in _MAKERS.items()}


def jpeg_samples() -> dict[str, Sample]:
    """The kinds whose content is a JPEG."""
    return {k: s for k, s in samples().items() if s.jpeg}


@functools.cache
def cpu_only_samples() -> dict[str, Sample]:
    """Kinds PIL reads that a device-side or DALI decoder may refuse (a GIF named .JPEG, a bilevel TIFF): the
    loaders must decode them on the CPU, never refuse them. Kept out of samples(), which a decoder must read."""
    return {kind: Sample(kind, suffix, jpeg, make()) for kind, (suffix, jpeg, make) in _CPU_ONLY.items()}
