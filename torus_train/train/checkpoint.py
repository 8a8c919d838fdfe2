"""Checkpoints: atomic save, verification, and finding the latest complete one (torch imported inside).

Layout under OUT/checkpoints/:  ``step-00000120.pt`` (torch.save of model, optimizer, scaler, schedule position,
every rank's RNG state: tensors and plain Python types only, loaded with ``weights_only=True`` so that a
checkpoint cannot run code) and ``step-00000120.json`` (its manifest: step, size, sha256, the job identity).
Both are written in full to temporary files and fsynced before either is renamed (a full disk fails there,
before anything is replaced); then the data is renamed, the folder fsynced, the manifest renamed, the folder
fsynced. The manifest is the commit point: a checkpoint whose manifest is missing was never completed, is
never loaded, and is deleted by ``prune_orphans``. On resume the newest checkpoint whose file matches its
manifest's size and sha256 is used; a corrupt or malformed newer one is skipped with a warning naming it.

The sha256 is computed from the bytes as they are written (``_HashingFile``), not by reading the file back.
At scale one rank per node reads the file once (``read_verified``: size and sha256 checked on the bytes read,
kept in ``CheckpointRef.data``), shares its choice (``verdict``, a small picklable dict) and hands the bytes to
its node's ranks, which read nothing; see train/state.resume. ``BYTES_READ`` counts the checkpoint bytes this
process read from files (the resume's log line and docs/faults.md's table).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from torus_train.errors import RunFailed

_NAME = re.compile(r"^step-(\d{8,19})\.json$")
"""A manifest's name: 8 digits, more past step 99,999,999 (schedule.steps allows 2^31 - 1; 19 bounds int())."""
BYTES_READ = [0]
"""Checkpoint data bytes this process read from files (hashing and loading), for the resume's report."""


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    step: int
    """Optimizer steps done when it was written."""
    path: Path
    """The .pt file."""
    manifest: dict
    """Its manifest (step, epoch, sha256, bytes, world_size, grid)."""
    data: bytes | None = field(default=None, compare=False, repr=False)
    """The file's verified bytes where this process read them (read_verified), else None."""


class _HashingFile:
    """A write-only file that hashes and counts what goes through it (torch.save writes sequentially)."""

    def __init__(self, f) -> None:
        self.f, self.sha256, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.bytes += len(memoryview(data).cast("B"))
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, write: Callable[[Any], None]) -> Path:
    """Write path's content to a temporary name beside it and fsync it; the temporary goes on any error."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_atomic(path: str | Path, data: bytes) -> None:
    """A result file (summary.json, a manifest) replaced in one step: temporary, fsync, rename, fsync folder."""
    path = Path(path)
    os.replace(_write_temp(path, lambda f: f.write(data)), path)
    _fsync_dir(path.parent)


def save_checkpoint(folder: str | Path, step: int, state: dict, info: dict, keep: int) -> Path:
    """Write state as step-NNNNNNNN.pt, then its manifest (the commit point); prune to `keep`.

    RunFailed with one line when the folder cannot take it (full, read-only): the temporaries are removed and
    the previous checkpoints stay as they were."""
    import torch

    folder = Path(folder)
    pt, man = folder / f"{step_name(step)}.pt", folder / f"{step_name(step)}.json"
    temps: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written: list[_HashingFile] = []

        def save(f: BinaryIO) -> None:
            # the hash of the bytes as torch.save writes them (no seek: the wrapper has none), not read back
            written.append(_HashingFile(f))
            torch.save(state, written[0])  # type: ignore[arg-type]  # torch.save needs only write(), not all of IO

        temps.append(_write_temp(pt, save))
        manifest = {
            "step": step,
            "file": pt.name,
            "bytes": written[0].bytes,
            "sha256": written[0].sha256.hexdigest(),
            **info,
        }
        temps.append(_write_temp(man, lambda f: f.write(json.dumps(manifest, indent=1).encode())))
        man.unlink(missing_ok=True)  # a checkpoint of this step from before: uncommitted while its data changes
        os.replace(temps[0], pt)
        _fsync_dir(folder)
        os.replace(temps[1], man)
        _fsync_dir(folder)
    except Exception as e:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        cause = _os_error(e)
        if cause is None:
            raise
        raise RunFailed(_save_failure(folder, cause)) from None
    prune(folder, keep)
    return pt


def step_name(step: int) -> str:
    """'step-00000120': the stem of a checkpoint's two files, zero-padded to 8 digits and longer past them."""
    return f"step-{step:08d}"


def _named_step(pattern: re.Pattern, name: str) -> int | None:
    """The step a checkpoint file's name holds, if it is one save_checkpoint writes (step-0120.json or
    step-000000120.json, which no save writes, are not checkpoints)."""
    m = pattern.match(name)
    if m is None or step_name(int(m.group(1))) != name.split(".")[0]:
        return None
    return int(m.group(1))


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind e: torch.save's zip writer turns a failed write into a RuntimeError of its own."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


NO_SPACE = "no space left"
"""The words a failed save uses for a full file system (the rank's failure kind "no space" is read from them)."""


def _save_failure(folder: Path, e: OSError) -> str:
    why = NO_SPACE if e.errno == errno.ENOSPC else (e.strerror or str(e)).lower()
    try:
        kept = list_checkpoints(folder)
    except OSError:
        kept = []
    previous = f"the previous checkpoint at step {kept[0][0]} is kept" if kept else "no earlier checkpoint"
    return f"checkpoint folder {folder}: {why}; {previous}"


def list_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, manifest path) of every committed checkpoint, newest first (not yet verified)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(s, folder / p.name) for p in folder.iterdir() if (s := _named_step(_NAME, p.name)) is not None]
    return sorted(found, reverse=True)


_MANIFEST_TYPES = {"step": int, "file": str, "bytes": int, "sha256": str}


def read_manifest(manifest_path: Path) -> dict:
    """The manifest as a dict of the expected shape; RunFailed naming the file otherwise."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise RunFailed(f"checkpoint manifest {manifest_path} is unreadable ({e})") from None
    if not isinstance(manifest, dict):
        raise RunFailed(
            f"checkpoint manifest {manifest_path} is malformed (a JSON {type(manifest).__name__}, not an object)"
        )
    for key, kind in _MANIFEST_TYPES.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise RunFailed(
                f"checkpoint manifest {manifest_path} is malformed ({key!r} missing or not {kind.__name__})"
            )
    if manifest["file"] != manifest_path.with_suffix(".pt").name:  # no path of its choosing is ever opened
        raise RunFailed(f"checkpoint manifest {manifest_path} is malformed (file {manifest['file']!r})")
    return manifest


def read_verified(manifest_path: Path) -> CheckpointRef:
    """Read a checkpoint once and check it against its manifest (size, sha256 of the bytes read); the ref keeps
    the bytes (ref.data). RunFailed naming the file when it does not match."""
    manifest = read_manifest(manifest_path)
    pt = manifest_path.with_name(manifest["file"])
    try:
        if not pt.is_file():
            raise RunFailed(f"checkpoint {pt} is missing (its manifest {manifest_path.name} is there)")
        data = pt.read_bytes()
    except OSError as e:
        raise RunFailed(f"checkpoint {pt} cannot be read ({e.strerror or e})") from None
    BYTES_READ[0] += len(data)
    if len(data) != manifest["bytes"]:
        raise RunFailed(f"checkpoint {pt} has {len(data)} bytes, its manifest says {manifest['bytes']} (truncated?)")
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise RunFailed(f"checkpoint {pt} does not match the sha256 in its manifest (corrupt)")
    return CheckpointRef(manifest["step"], pt, manifest, data)


def find_latest(folder: str | Path, warn: Callable[[str], None] = print) -> CheckpointRef | None:
    """The newest checkpoint that verifies, its bytes held (each candidate read whole once: read_verified); None
    if none was ever committed; RunFailed if all are corrupt."""
    entries = list_checkpoints(folder)
    problems: list[str] = []
    for _, manifest_path in entries:
        try:
            ref = read_verified(manifest_path)
        except RunFailed as e:
            problems.append(str(e))
            warn(f"skipping a bad checkpoint: {e}")
            continue
        return ref
    if problems:
        raise RunFailed(f"no checkpoint in {folder} is intact ({len(problems)} bad: {problems[0]})")
    return None


def verdict(folder: str | Path, warn: Callable[[str], None] = print, keep: list | None = None) -> dict:
    """find_latest as a small picklable verdict to share with other ranks: {"step", "file", "manifest"} for the
    chosen checkpoint, {"step": None} when none was ever committed, {"error": why} when none is intact.
    keep: a list that receives the chosen file's verified bytes (read once, whole, by find_latest)."""
    try:
        ref = find_latest(folder, warn=warn)
    except RunFailed as e:
        return {"error": str(e)}
    except OSError as e:  # an unreadable folder: a verdict too, so that no rank is left waiting
        return {"error": f"checkpoints in {folder} cannot be read ({e})"}
    if ref is None:
        return {"step": None}
    if keep is not None:
        keep.append(ref.data)
    return {"step": ref.step, "file": ref.path.name, "manifest": ref.manifest}


def same_choice(a: dict, b: dict) -> bool:
    """Two verdicts choose the same checkpoint (step and sha256), or both choose none."""
    key = lambda v: (v.get("error") is None, v.get("step"), (v.get("manifest") or {}).get("sha256"))  # noqa: E731
    return key(a) == key(b)


def ref_from_verdict(folder: str | Path, v: dict, data: bytes | None = None) -> CheckpointRef | None:
    """The checkpoint a verdict chose (None: start from scratch), with its verified bytes where this rank holds
    them; RunFailed with the verdict's reason if it refused. Nothing is read or hashed here: the rank(s) that
    gave the verdict did that."""
    if v.get("error"):
        raise RunFailed(v["error"])
    if v.get("step") is None:
        return None
    return CheckpointRef(int(v["step"]), Path(folder) / v["file"], v["manifest"], data)


def load_checkpoint(ref: CheckpointRef, map_location: Any = "cpu") -> dict:
    """torch.load with weights_only=True: tensors and plain types; a pickled object is refused, not run.
    From ref.data where the bytes are held (verified, or handed over by the node's leader), else the file."""
    import torch

    try:
        if ref.data is not None:
            state = torch.load(io.BytesIO(ref.data), map_location=map_location, weights_only=True)
        else:
            BYTES_READ[0] += ref.path.stat().st_size  # torch.load reads every record of the zip file
            state = torch.load(ref.path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise RunFailed(
            f"checkpoint {ref.path} holds more than tensors and plain values and is not loaded "
            f"(loading it could run code): {first}"
        ) from None
    except Exception as e:  # a file that passed sha256 but still does not load
        raise RunFailed(f"checkpoint {ref.path} does not load: {e}") from None
    if not isinstance(state, dict) or not all(isinstance(state.get(k), dict) for k in ("model", "position")):
        raise RunFailed(f"checkpoint {ref.path} is not a torus-train checkpoint (no model and position)")
    return state


def prune(folder: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` committed checkpoints, and orphans; return what went."""
    folder = Path(folder)
    gone: list[Path] = []
    for _, manifest_path in list_checkpoints(folder)[max(1, keep) :]:
        pt = manifest_path.with_suffix(".pt")
        manifest_path.unlink(missing_ok=True)  # uncommit first, then the data
        pt.unlink(missing_ok=True)
        gone.append(pt)
    return gone + prune_orphans(folder)


_DATA = re.compile(r"^step-(\d{8,19})\.pt$")


def prune_orphans(folder: str | Path) -> list[Path]:
    """Temporaries of other processes and data files without a manifest (a save that was killed) go."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = []
    for p in folder.iterdir():
        temp = ".tmp" in p.name and not p.name.endswith(f".tmp{os.getpid()}")
        if temp or (_named_step(_DATA, p.name) is not None and not p.with_suffix(".json").exists()):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone
