"""Folders the project writes whole (a data index, a packed data set): written beside the target, renamed in.

The rule: a writer never deletes what it did not write. The new folder is filled under a temporary name next
to the target (same file system, so the rename is atomic) and moved into place only when the target is absent
or is itself a folder of the same kind made by this project, recognised by its metadata file, that holds only
what such a writer makes (the files its metadata lists): an older output is replaced whole or not at all.
Anything else at the target (a file, the user's notes, a data folder, an older output the user added a file
to) is refused in one line before any work, and again just before the rename, and is left untouched. A writer
interrupted half-way leaves only its temporary, whose name never looks like a finished folder. No torch import.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torus_train.errors import UserError, shown_path
from torus_train.userfiles import read_json, refuse_special

MAX_MARKER_BYTES = 64 << 20
"""The largest marker file read to recognise a folder (a packed set's, listing its shards, is ~150 KB)."""


@dataclass(frozen=True)
class FolderKind:
    """A kind of folder this project writes and may replace: its name in messages and how to recognise one."""

    name: str
    """What the folder is, for messages ("data index", "packed data set")."""
    marker: str
    """The metadata file (JSON) inside every folder of this kind."""
    recognise: Callable[[dict], bool]
    """True when the marker's content is one this project wrote."""
    files: Callable[[dict], Iterable[str]]
    """The names of the files a writer of this kind puts beside the marker, given the marker's content."""

    def read_marker(self, folder: Path) -> dict | None:
        """The marker's content when ``folder`` is a folder of this kind; None otherwise (also when the marker
        is a FIFO or a device: refused before opening, so nothing blocks)."""
        try:  # through the door: a FIFO or a device is refused unopened, a huge file unread
            meta = read_json(folder / self.marker, self.name, MAX_MARKER_BYTES)
        except UserError:
            return None
        return meta if isinstance(meta, dict) and self.recognise(meta) else None

    def holds(self, folder: Path) -> bool:
        """True when ``folder`` is a folder of this kind (its marker reads as one of ours)."""
        return self.read_marker(folder) is not None

    def claims(self, folder: Path, flag: str = "--data") -> bool:
        """``holds``, for a path a user named: a marker that is a FIFO, a device or a socket is refused by name
        (UserError naming ``flag``) rather than taken for a folder of another kind."""
        refuse_special(folder / self.marker, flag)
        return self.holds(folder)

    def foreign(self, folder: Path) -> str | None:
        """The first entry of ``folder`` (a folder of this kind) that its writer did not make: not the marker,
        not a file its marker lists, or not a plain file; None when every entry is the writer's own. UserError
        when the marker is too damaged to list its files (nothing there can be told to be the writer's)."""
        try:
            own = {self.marker, *self.files(self.read_marker(folder) or {})}
        except (KeyError, TypeError, AttributeError, ValueError):
            raise UserError(
                f"{shown_path(folder)}: an older {self.name} whose {self.marker} is damaged (it does "
                f"not list its files); it is left untouched: remove it yourself, or give a new folder "
                f"name"
            ) from None
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        return next((e.name for e in entries if e.name not in own or not e.is_file(follow_symlinks=False)), None)


def resolve_target(path: str | os.PathLike, flag: str) -> Path:
    """The absolute target for ``path`` (``.`` and ``..`` resolved, so it has a name to put a temporary beside)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise UserError(f"{flag}: the folder name contains a NUL character")
    if not text.strip():
        raise UserError(f"{flag}: empty folder name")
    try:
        target = Path(text).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop on older Pythons
        raise UserError(f"{flag} {shown_path(text)}: {getattr(e, 'strerror', None) or e}") from None
    if target == target.parent:
        raise UserError(f"{flag} {shown_path(text)}: the file system's root cannot be replaced; name a new folder")
    return target


def check_target(target: Path, kind: FolderKind, flag: str) -> None:
    """Refuse, before any work, a target that holds something this writer must not replace."""
    try:
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise UserError(
                f"{flag} {shown_path(target)}: a file is there, not a {kind.name}; it is left "
                f"untouched: give a new folder name"
            )
        if target.is_dir() and any(target.iterdir()):
            if not kind.holds(target):
                raise UserError(
                    f"{flag} {shown_path(target)}: the folder exists and is not a {kind.name} of "
                    f"torus-train ({kind.marker} missing or foreign); it is left untouched: give a new "
                    f"folder name"
                )
            try:
                extra = kind.foreign(target)
            except UserError as e:
                raise UserError(f"{flag} {e}") from None
            if extra:
                raise UserError(
                    f"{flag} {shown_path(target)}: an older {kind.name} that also holds "
                    f"{shown_path(extra, 40)}, which torus-train did not write there; the folder is "
                    f"left untouched: move that out first, or give a new folder name"
                )
        for q in target.parents:
            if q.exists():
                if not q.is_dir():
                    raise UserError(f"{flag} {shown_path(target)}: {shown_path(q)} is a file; give a folder")
                break
    except OSError as e:
        raise UserError(f"{flag} {shown_path(target)}: {e.strerror or e}") from None


def write_folder(target: Path, kind: FolderKind, flag: str, fill: Callable[[Path], None]) -> Path:
    """Fill a temporary folder beside ``target`` with ``fill(tmp)``, then rename it into place (replacing an
    older folder of the same kind only). The temporary is removed on any failure."""
    check_target(target, kind, flag)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    try:
        with terminate_unwinds():
            tmp.mkdir(parents=True, exist_ok=False)
            fill(tmp)
            check_target(target, kind, flag)  # something may have appeared there while we wrote
            _swap(tmp, target, old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return target


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, `kill`) raised as SystemExit(143) while a folder is written, so the
    temporary is removed as on any failure: Python's default for SIGTERM ends the process unwound, leaving it.
    Only in the main thread and only where nothing else handles SIGTERM (a rank's own handler is kept)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not (
        signal.SIG_DFL
    ):
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _swap(tmp: Path, target: Path, old: Path) -> None:
    """Move ``tmp`` to ``target``; an existing target (checked to be ours) goes aside first and back on failure."""
    if target.exists():
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except OSError:
            os.replace(old, target)
            raise
    else:
        os.replace(tmp, target)
