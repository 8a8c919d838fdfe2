"""Files the commands write on request (`report --json/--png`, `plan --json/--plot/--png`, `bench allreduce
--json/--plot`): a writer replaces only what it wrote.

The rule (outdir.py's, for single files): before any work, the path a user names for an output must be free,
or hold a regular file this same command wrote earlier, recognised by its content:

- JSON: an object whose ``written_by`` field is "torus-train COMMAND" (the writer adds it); a format that is a
  list (bench rows, read as a list by other tools) is recognised by its shape instead (``Writer.recognise``);
- a plot: the marker "torus-train COMMAND" in the metadata matplotlib writes for PNG (a tEXt chunk), PDF, SVG,
  PS and EPS. The other formats matplotlib writes (jpg, tif, webp, ...) hold no metadata: an existing file there
  is never replaced.

Anything else (a run's metrics.jsonl or summary.json, another command's output, the user's file, a link, a FIFO,
a folder) is refused in one line and left as it was. The file is written under a temporary name beside the
target and renamed over it (atomic on one file system), after checking the target once more. No torch import;
matplotlib only when a figure is saved.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torus_train.errors import UserError, check_output_file, shown_path
from torus_train.outdir import terminate_unwinds
from torus_train.userfiles import file_type, read_bytes

MARKER_FIELD = "written_by"
"""The field of a JSON output that names its writer."""
MAX_RECOGNISED_BYTES = 64 << 20
"""An existing file larger than this is not read to recognise it (no output of ours is that large)."""
PLOT_FORMATS = (
    "eps",
    "gif",
    "jpeg",
    "jpg",
    "pdf",
    "pgf",
    "png",
    "ps",
    "raw",
    "rgba",
    "svg",
    "svgz",
    "tif",
    "tiff",
    "webp",
)
"""Suffixes matplotlib's Agg canvas writes, used when matplotlib is not installed (it is asked otherwise)."""
PLOT_METADATA = {
    "png": ("Software", b"tEXtSoftware\x00{m}"),
    "pdf": ("Creator", b"/Creator ({m})"),
    "svg": ("Creator", b"<dc:title>{m}</dc:title>"),
    "ps": ("Creator", b"%%Creator: {m}\n"),
    "eps": ("Creator", b"%%Creator: {m}\n"),
}
"""format -> (matplotlib metadata key, the bytes that key leaves in the file): the formats whose files carry
the writer's marker and may therefore be replaced by the next run of the same command."""


@dataclass(frozen=True)
class Writer:
    """A command that writes output files: its name (the marker) and, for a JSON output that is not an object,
    how to recognise one it wrote."""

    command: str
    """The command as typed after torus-train ("report", "plan calibrate", "bench allreduce")."""
    recognise: Callable[[Any], bool] | None = None
    """For a JSON output that cannot carry the marker field (a list): True when a document is one of ours."""

    @property
    def marker(self) -> str:
        return f"torus-train {self.command}"

    def owns_json(self, doc: Any) -> bool:
        if isinstance(doc, dict):
            return doc.get(MARKER_FIELD) == self.marker
        return self.recognise is not None and bool(self.recognise(doc))

    def owns_plot(self, data: bytes, fmt: str) -> bool:
        pattern = PLOT_METADATA.get(fmt, (None, None))[1]
        return pattern is not None and pattern.replace(b"{m}", self.marker.encode()) in data


def plot_formats() -> tuple[str, ...]:
    """The suffixes a plot may have: what matplotlib's canvas writes (the static list without matplotlib)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        return tuple(sorted(FigureCanvasAgg.get_supported_filetypes()))
    except ImportError:
        return PLOT_FORMATS


def plot_format(path: str | os.PathLike, flag: str) -> str:
    """The format of a plot path from its suffix; UserError unless matplotlib writes it."""
    fmt = Path(os.fspath(path)).suffix.lower().lstrip(".")
    formats = plot_formats()
    if fmt not in formats:
        what = f"'.{fmt}' is not a format matplotlib writes" if fmt else "the name has no suffix"
        raise UserError(f"{flag} {shown_path(path)}: {what}; end it in one of {', '.join('.' + f for f in formats)}")
    return fmt


def check_json_output(path: str | os.PathLike, writer: Writer, flag: str = "--json") -> None:
    """Before any work: ``path`` can be written by ``writer`` (free, or its own earlier JSON output)."""
    check_output_file(path, flag)
    data = _existing(path, writer, flag)
    if data is None:
        return
    try:
        doc, parsed = json.loads(data), True
    except (ValueError, RecursionError):
        doc, parsed = None, False
    if not writer.owns_json(doc):
        why = (
            "it is not JSON"
            if not parsed
            else f"its JSON has no {MARKER_FIELD} {writer.marker!r}"
            if writer.recognise is None
            else "its JSON is not of that command's form"
        )
        _refuse(path, writer, flag, why)


def check_plot_output(path: str | os.PathLike, writer: Writer, flag: str) -> str:
    """Before any work: ``path`` names a format matplotlib writes and can be written by ``writer`` (free, or its
    own earlier plot of that format), and matplotlib is there to draw it. Returns the format."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(f"{flag} needs matplotlib: pip install 'torus-train[plot]'") from None
    fmt = plot_format(path, flag)
    check_output_file(path, flag)
    data = _existing(path, writer, flag)
    if data is not None and not writer.owns_plot(data, fmt):
        why = (
            f"its metadata does not name {writer.marker!r}"
            if fmt in PLOT_METADATA
            else f".{fmt} files carry no metadata, so such a plot is only written to a new name"
        )
        _refuse(path, writer, flag, why)
    return fmt


def check_distinct(paths: dict[str, str | os.PathLike | None]) -> None:
    """Two output flags of one command must not name the same file (the second would replace the first)."""
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if path is None:
            continue
        key = os.path.abspath(os.fspath(path))
        if key in seen:
            raise UserError(f"{seen[key]} and {flag} name the same file {shown_path(path)}; give two names")
        seen[key] = flag


def write_json(path: str | os.PathLike, doc: Any, writer: Writer, flag: str = "--json") -> None:
    """Write ``doc`` (an object gets the marker field first) over nothing or over ``writer``'s own output."""
    if isinstance(doc, dict):
        doc = {MARKER_FIELD: writer.marker, **doc}
    text = json.dumps(doc, indent=1) + "\n"
    _replace(
        path,
        writer,
        lambda tmp: Path(tmp).write_text(text, encoding="utf-8"),
        lambda: check_json_output(path, writer, flag),
    )


def save_figure(fig, path: str | os.PathLike, writer: Writer, flag: str, **savefig: Any) -> None:
    """``fig.savefig`` with the writer's marker in the metadata, over nothing or over its own earlier plot."""
    fmt = plot_format(path, flag)
    if fmt in PLOT_METADATA:
        savefig["metadata"] = {PLOT_METADATA[fmt][0]: writer.marker}
    _replace(
        path, writer, lambda tmp: fig.savefig(tmp, format=fmt, **savefig), lambda: check_plot_output(path, writer, flag)
    )


def _replace(path, writer: Writer, fill: Callable[[str], object], recheck: Callable[[], object]) -> None:
    """Fill a temporary beside ``path``, check the target once more (something may have appeared), rename."""
    recheck()
    target = Path(os.fspath(path))
    # beside the target (one file system: the rename is atomic); a short name, whatever the target's length
    tmp = target.with_name(f".{writer.marker.replace(' ', '-')}.partial-{os.getpid()}")
    try:
        with terminate_unwinds():  # a SIGTERM while writing removes the temporary too
            fill(str(tmp))
            recheck()
            os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _existing(path, writer: Writer, flag: str) -> bytes | None:
    """The bytes of the file at ``path`` (None when nothing is there); refuses a link, a FIFO, a device and
    anything too large to be ours, without opening it."""
    try:
        st = os.lstat(os.fspath(path))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UserError(f"{flag} {shown_path(path)}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        _refuse(path, writer, flag, f"it is {file_type(st.st_mode)}")
    if st.st_size > MAX_RECOGNISED_BYTES:
        _refuse(path, writer, flag, "it is larger than any output of ours")
    return read_bytes(path, flag, MAX_RECOGNISED_BYTES)  # the door: checked again on the open descriptor


def _refuse(path, writer: Writer, flag: str, why: str) -> None:
    raise UserError(
        f"{flag} {shown_path(path)}: a file is there that `{writer.marker}` did not write ({why}); "
        f"it is left untouched: give a new file name"
    )
