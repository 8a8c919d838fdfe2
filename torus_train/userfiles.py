"""The one door for the files a user names: every such file is opened here, refused by name when it is not a
regular file (a FIFO would block the open or the read, a device never end it, a socket not open) and read up to
a cap (a file larger than any of its kind is refused, not read into memory); each error is one line that names
the flag or the part, and the file. No torch import.

    check_regular   a path is a regular file (links followed), before anything opens it
    open_regular    a regular file opened to read (without blocking, checked again on the open descriptor);
                    for archives and shards that are read in parts, never whole
    open_fd         the same as a raw descriptor, for ``os.pread``
    read_bytes, read_text, read_json, read_json_lines
                    a whole file, at most ``limit`` bytes

Beside them, the JSON readers' checks: a reader describes its format as a tuple of ``Field``s and calls
``check``; values come back converted (``int`` for counts, ``float`` for times), so no caller meets a string
where a number belongs. tests/test_floors.py fails when code under torus_train/ opens a file to read outside
this module without a reason in scripts/dev/measure_structure.py's NOT_USER_FILES.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from torus_train.errors import UserError, shown_path

MAX_READ_BYTES = 1 << 30
"""The most a whole-file read takes when its caller names no smaller cap (a run's metrics.jsonl of a long job
is megabytes; a file past this is no input of ours, and is not read into memory)."""


class UserFileError(UserError):
    """A user file the door refuses or cannot read: one line naming ``where`` and the file; ``why`` is what is
    wrong with it without its name, for a caller that names the file itself."""

    def __init__(self, where: str, path: str | os.PathLike, why: str):
        self.why = why
        sep = " " if why.startswith(("is ", "does ")) else ": "
        super().__init__(f"{where}: {shown_path(path)}{sep}{why}")


@dataclass(frozen=True)
class Field:
    """One field of a JSON object: its dotted path, its kind and its range."""

    path: str
    """Dotted path inside the object ("spec.model.arch")."""
    kind: str
    """"int", "number" (finite int or float), "str", "dict" or "list"."""
    low: float | None = None
    """Smallest allowed value (numbers), inclusive unless ``low_open``."""
    high: float | None = None
    """Largest allowed value (numbers), inclusive."""
    low_open: bool = False
    """True: the value must be above ``low``, not equal to it."""
    optional: bool = False
    """True: a missing field (or null) passes and comes back as None."""
    choices: tuple = ()
    """Allowed values ("str" fields), when not empty."""


KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "dict": ("an object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
}


def file_type(mode: int) -> str:
    """What a file that is not a regular file is, for messages ("a FIFO", "a symbolic link", ...)."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike, where: str) -> None:
    """Refuse, by name and before opening it, a path that is not a regular file (a FIFO would block the read,
    a device never end it); symbolic links are followed."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise UserFileError(where, p, "does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise UserFileError(where, p, str(getattr(e, "strerror", None) or e)) from None
    if stat.S_ISDIR(mode):
        raise UserFileError(where, p, "is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UserFileError(where, p, f"is {file_type(mode)}, not a regular file")


def open_regular(path: str | os.PathLike, where: str) -> BinaryIO:
    """A regular user file opened to read in binary. Refused by name before the open when it is not a regular
    file; opened without blocking (a FIFO put there since does not wait for a writer) and checked again on the
    open descriptor, so what is read is the regular file that was checked."""
    return os.fdopen(open_fd(path, where), "rb")


def open_fd(path: str | os.PathLike, where: str) -> int:
    """``open_regular`` as a raw descriptor (for ``os.pread``); the caller closes it."""
    check_regular(path, where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as e:
        raise UserFileError(where, path, str(getattr(e, "strerror", None) or e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserFileError(where, path, f"is {file_type(mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike, where: str, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a regular user file of at most ``limit`` bytes; one line (prefixed ``where``) when missing,
    not a regular file, larger or unreadable."""
    try:
        with open_regular(path, where) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UserFileError(where, path, str(e.strerror or e)) from None
    if len(data) > limit:
        raise UserFileError(where, path, f"is larger than {limit:,} bytes, more than such a file holds")
    return data


def read_text(path: str | os.PathLike, where: str, limit: int = MAX_READ_BYTES) -> str:
    """The UTF-8 text of a user file (at most ``limit`` bytes); one line (prefixed ``where``) when missing, a
    folder, not a regular file, larger, unreadable or not UTF-8."""
    data = read_bytes(path, where, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(where, path, f"byte {e.start} is not UTF-8 text") from None


def read_json(path: str | os.PathLike, where: str, limit: int = MAX_READ_BYTES) -> Any:
    """A user file's JSON value; one line when it is not JSON (empty, truncated, NaN literals allowed by
    Python's parser are kept and caught by the field checks)."""
    text = read_text(path, where, limit)
    try:
        return json.loads(text)
    except ValueError as e:
        what = "is empty" if not text.strip() else f"is not JSON ({e})"
        raise UserError(f"{where}: {shown_path(path)} {what}") from None
    except RecursionError:
        raise UserError(f"{where}: {shown_path(path)} is nested too deeply") from None


def read_json_lines(path: str | os.PathLike, where: str) -> list:
    """The records of a JSON Lines file; a line that is not JSON is named by its number (a last line cut short
    by a run still writing, or killed, is dropped: it is the one line such a run may leave half-written)."""
    lines = read_text(path, where).split("\n")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError) as e:
            if n == len(lines):  # no newline after it: still being written, or cut by a kill
                break
            raise UserError(f"{where}: {shown_path(path)}: line {n} is not JSON ({e})") from None
    return records


def check(obj: Any, fields: tuple[Field, ...], where: str) -> dict:
    """Check ``obj`` against ``fields``; {path: value} with ints as int and numbers as float."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: must hold a JSON object, not {_kind_of(obj)}")
    return {f.path: _check_field(obj, f, where) for f in fields}


def _check_field(obj: dict, f: Field, where: str) -> Any:
    v: Any = obj
    for part in f.path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    if v is None:
        if f.optional:
            return None
        raise UserError(f"{where}: {f.path}: missing")
    name, ok = KINDS[f.kind]
    if not ok(v):
        raise UserError(f"{where}: {f.path}: {_short(v)} must be {name}")
    if f.kind in ("int", "number"):
        return _check_range(v, f, where)
    if f.choices and v not in f.choices:
        raise UserError(f"{where}: {f.path}: {_short(v)} must be one of {', '.join(map(str, f.choices))}")
    return v


def _check_range(v: float, f: Field, where: str) -> float:
    if f.kind == "number" and not finite(v):
        raise UserError(f"{where}: {f.path}: {_short(v)} must be a finite number")
    if f.low is not None and (v < f.low or (f.low_open and v == f.low)):
        raise UserError(f"{where}: {f.path}: {_short(v)} must be {'>' if f.low_open else '>='} {f.low:g}")
    if f.high is not None and v > f.high:
        raise UserError(f"{where}: {f.path}: {_short(v)} must be <= {f.high:g}")
    return int(v) if f.kind == "int" else float(v)


def finite(v: Any) -> bool:
    """True for an int or float (not a bool) that is a finite float: 10**400 is not (it overflows a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _kind_of(v: Any) -> str:
    return next((name for name, ok in KINDS.values() if ok(v)), "null" if v is None else type(v).__name__)


# What a path holds when it is not a regular file or a folder: opening a FIFO blocks until a writer comes, a
# device reads forever, a socket does not open; each is refused by name before any open.
SPECIAL_MODES = (stat.S_ISFIFO, stat.S_ISCHR, stat.S_ISBLK, stat.S_ISSOCK)


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is a FIFO, a device or a socket (one stat, following links); None otherwise,
    or when it cannot be stat'ed (the open that follows names that error)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return file_type(mode) if any(test(mode) for test in SPECIAL_MODES) else None


def refuse_special(path: str | os.PathLike, where: str) -> None:
    """Refuse, before it is opened, a path that is a FIFO, a device or a socket: one line naming it. A missing
    path passes (the caller's open or fallback names it); check_regular refuses that too."""
    what = special_kind(path)
    if what:
        raise UserError(f"{where}: {shown_path(path)} is {what}, not a regular file")
