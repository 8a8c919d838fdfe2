"""Whether an image file can train, judged by its content, never by its name (pure: PIL at most, no torch).

    sniff(data)            the format its first bytes say: jpeg, png, bmp, tiff, webp, gif, or None
    content_problem(data)  the cheap check every reader makes on the bytes it has read (a whole file is not
                           decoded): a Problem when the file is empty, cut short, or no decoder knows its
                           format; None for every file a decoder reads, whatever its extension
    decode_problem(data)   the full check: PIL decodes every pixel (`data check --decode`)
    scan(root, split)      a folder split listed as the index lists it; ``verify`` also checks every file

A JPEG is whole when an end-of-image marker follows its last scan (bytes after the marker are ignored, as
every decoder ignores them). A PNG is whole when its image-data chunks are, a WebP when the file is as long
as its RIFF header says, an uncompressed BMP when it holds all its rows. A file these walks call cut short
is decoded by PIL before it is called truncated (a JPEG missing only its end marker may still read). A file
of another format that PIL recognises passes the cheap check: the decoder judges it. "Corrupt" means no
decoder reads it; a PNG named .JPEG is a readable PNG.
Ranks never scan: they read the index (data/index.py); `data check` sweeps a whole set with data/sweep.py.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torus_train.data.index import IMAGE_EXTENSIONS, DataError, Split, list_split  # noqa: F401  (re-exported)
from torus_train.userfiles import UserFileError, read_bytes

MAX_IMAGE_BYTES = 256 << 20
"""The largest image file read (ImageNet's largest is about 15 MB): a file past it is refused unread."""

KINDS = {
    "empty": "0 bytes",
    "truncated": "the image data stops before its end (a download or copy cut short)",
    "corrupt": "a known format whose data no decoder reads",
    "not an image": "no image format that a decoder knows (text, HTML, an archive, ...)",
    "unreadable": "the file could not be read (permissions, an I/O error, a vanished file)",
}
"""What makes a file unusable for training, by kind: the kinds `data check` counts."""

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)
_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
"""The next marker of a JPEG: 0xFF then a code; FF00 is a stuffed byte of scan data, FFD0-FFD7 are restart
markers inside a scan and FFFF is fill before a marker."""
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD8)))
"""JPEG markers without a length field (TEM, RST0-7); SOI is skipped before the walk."""


@dataclass(frozen=True)
class Problem:
    """Why one file cannot train: its kind (a key of KINDS) and the detail for the message."""

    kind: str
    why: str

    def __str__(self) -> str:
        return self.why


def sniff(data: bytes | np.ndarray) -> str | None:
    """The image format the first bytes of ``data`` say (jpeg, png, bmp, tiff, webp, gif), or None."""
    head = bytes(data[:16])  # also takes a uint8 numpy array
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return next((fmt for magic, fmt in _MAGIC if head.startswith(magic)), None)


def content_problem(data: bytes | np.ndarray) -> Problem | None:
    """The cheap check of an encoded file (bytes, or a uint8 numpy array as the readers hold it): None when a
    decoder reads it, else why not. It walks the bytes once and never refuses a file for its format; only a
    file the walk finds cut short is decoded (by PIL), so that one a decoder still reads passes."""
    if isinstance(data, np.ndarray):
        data = data.tobytes()  # one copy; the walks below run in C (re, bytes.find)
    if not data:
        return Problem("empty", "empty file")
    fmt = sniff(data)
    if fmt is None:
        return _unknown_format(data)
    check = _WHOLE.get(fmt)
    problem = check(data) if check else None
    if problem is not None and _pil_reads(data):
        return None  # a cut the decoder does not need (a JPEG's last marker, a PNG's checksums): it reads
    return problem


def _jpeg_problem(data: bytes) -> Problem | None:
    """A JPEG's markers walked from its start: None once an end-of-image marker follows a scan. Segments are
    skipped by their length (an Exif thumbnail's markers inside APP1 are not mistaken for the image's), and
    a scan's data by searching for the next marker (its own FF bytes are stuffed, so the search is exact)."""
    n, pos, scans = len(data), 2, 0
    while True:
        m = _JPEG_MARKER.search(data, pos)
        if m is None:
            break
        pos, code = m.start(), data[m.start() + 1]
        if code == 0xD9:
            if scans:
                return None
            return Problem("corrupt", "corrupt JPEG (an end-of-image marker before any image data)")
        if code in _STANDALONE or code == 0xD8:
            pos += 2
            continue
        if pos + 4 > n:
            break
        if code == 0xDA:
            if not scans and data.endswith(b"\xff\xd9"):
                return None  # the common file: scan data cannot hold FFD9, so its last two bytes are the EOI
            scans += 1
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    if scans:
        return Problem("truncated", "truncated JPEG (no end-of-image marker after its last scan)")
    return Problem("truncated", "truncated JPEG (it ends before its image data)")


def _png_problem(data: bytes) -> Problem | None:
    """A PNG's chunks walked by their lengths: truncated when the file ends before an image-data (IDAT) chunk
    is whole, or before any. A file that ends between chunks after its image data (no IEND) still reads."""
    n, pos, idat = len(data), 8, False
    while pos + 8 <= n:
        length, kind = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4 : pos + 8]
        if kind == b"IEND":
            return None
        if kind == b"IDAT":
            if pos + 8 + length > n:
                return Problem("truncated", "truncated PNG (it ends inside its image data)")
            idat = True
        pos += 12 + length
    return None if idat else Problem("truncated", "truncated PNG (it ends before its image data)")


def _webp_problem(data: bytes) -> Problem | None:
    declared = 8 + int.from_bytes(data[4:8], "little")
    if declared > len(data):  # libwebp refuses a file shorter than its RIFF header says
        return Problem("truncated", f"truncated WebP ({len(data):,} of the {declared:,} bytes its header declares)")
    return None


def _bmp_problem(data: bytes) -> Problem | None:
    """An uncompressed BMP is truncated when it is shorter than its pixel offset plus its rows; the file size
    in its header is not used (writers get it wrong, and decoders ignore it)."""
    if len(data) < 30:
        return Problem("truncated", "truncated BMP (shorter than its header)")
    offset, header = int.from_bytes(data[10:14], "little"), int.from_bytes(data[14:18], "little")
    needed = offset
    if header >= 40 and int.from_bytes(data[30:34], "little") in (0, 3):  # BI_RGB, BI_BITFIELDS: no compression
        width, height = (abs(int.from_bytes(data[k : k + 4], "little", signed=True)) for k in (18, 22))
        bits = int.from_bytes(data[28:30], "little")
        needed += (width * bits + 31) // 32 * 4 * height
    if needed > len(data):
        return Problem("truncated", f"truncated BMP ({len(data):,} bytes, its pixels need {needed:,})")
    return None


_WHOLE = {"jpeg": _jpeg_problem, "png": _png_problem, "webp": _webp_problem, "bmp": _bmp_problem}
"""Per format, the cheap check that the file is whole; TIFF and GIF have none (their decoder judges)."""


def _pil_reads(data: bytes) -> bool:
    """Whether PIL decodes the whole image: asked only of a file the walks above call cut short (rare), so
    that the cheap check never refuses a file a decoder reads."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except Exception:  # PIL raises several types for a bad file
        return False
    return True


def _unknown_format(data: bytes) -> Problem | None:
    """A file without a known magic: PIL's format detection decides (header only, nothing decoded), so a
    format this module does not list is never refused for it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)):
            return None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        head = data[:8]
        return Problem("not an image", f"not an image (no image format starts with {head!r})")


def decode_problem(data: bytes | np.ndarray) -> Problem | None:
    """The full check: the cheap one, then PIL decodes every pixel; None when PIL reads the whole image."""
    problem = content_problem(data)
    if problem is not None:
        return problem
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            im.load()
    except UnidentifiedImageError:
        return Problem("corrupt", f"does not decode (PIL finds no image in its {sniff(data)} header)")
    except Exception as e:  # PIL raises several types for a bad file (OSError, SyntaxError, ValueError, ...)
        text = str(e).splitlines()[0] if str(e) else ""
        kind = "truncated" if "truncated" in text else "corrupt"
        return Problem(kind, f"does not decode ({type(e).__name__}: {text[:120]})")
    return None


def file_problem(path: str, decode: bool = False) -> Problem | None:
    """The file at ``path`` read and checked: the cheap check, or with ``decode`` the full one."""
    try:  # through the door: a FIFO or a device put among the images since they were listed is not opened
        data = read_bytes(path, "--data", MAX_IMAGE_BYTES)
    except UserFileError as e:
        return Problem("unreadable", f"cannot read ({e.why})")
    return decode_problem(data) if decode else content_problem(data)


def check_file(path: str) -> None:
    """Raise DataError naming ``path`` unless it passes the cheap check."""
    problem = file_problem(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}")


def scan(data_root: str | os.PathLike, split: str, verify: bool = True) -> Split:
    """List ``data_root/split`` as the index does; ``verify`` also reads and checks every file (the first
    unusable one is a DataError; `data check` reports them all)."""
    classes, names, labels = list_split(data_root, split)
    root = Path(data_root) / split
    files = [str(root / n) for n in names]
    for p in files:
        if not os.path.isfile(p):
            raise DataError(f"{p}: not an image file (a folder or a broken link)")
        if verify:
            check_file(p)
    return Split(root, classes, tuple(files), tuple(labels))


def verify_files(split: Split) -> None:
    """Every file of ``split`` exists and passes the cheap check; DataError naming the first that fails."""
    for p in split.files:
        if not os.path.isfile(p):
            raise DataError(
                f"{p}: missing (listed in the index); rebuild it with: torus-train data index "
                f"--data {split.root.parent}"
            )
        check_file(p)
