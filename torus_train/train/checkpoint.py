"""Checkpoints: atomic save, verification, and finding the latest complete one (torch imported inside).

Layout under OUT/checkpoints/:  ``step-00000120.pt`` (torch.save of model, optimizer, scaler, schedule position,
every rank's RNG state) and ``step-00000120.json`` (its manifest: step, size, sha256). Both are written to a
temporary file, fsynced and renamed; the manifest is renamed last and is the commit point, so a checkpoint
whose manifest is missing was never completed and is never loaded. On resume the newest checkpoint whose file
matches its manifest's size and sha256 is used; a corrupt newer one is skipped with a warning naming it.

At scale one rank per node verifies (``verdict``: the choice as a small picklable dict) and every rank loads
what the verdict names (``ref_from_verdict``), without hashing the file again; see train/state.resume.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torus_train.errors import RunFailed

_NAME = re.compile(r"^step-(\d{8})\.json$")


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    step: int
    """Optimizer steps done when it was written."""
    path: Path
    """The .pt file."""
    manifest: dict
    """Its manifest (step, epoch, sha256, bytes, world_size, grid)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(folder: str | Path, step: int, state: dict, info: dict, keep: int) -> Path:
    """Write state atomically as step-NNNNNNNN.pt, then its manifest (the commit point); prune to `keep`."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pt = folder / f"step-{step:08d}.pt"
    _write_atomic(pt, lambda f: torch.save(state, f))
    manifest = {"step": step, "file": pt.name, "bytes": pt.stat().st_size, "sha256": _sha256(pt), **info}
    _write_atomic(folder / f"step-{step:08d}.json", lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    _fsync_dir(folder)
    prune(folder, keep)
    return pt


def list_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, manifest path) of every committed checkpoint, newest first (not yet verified)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), folder / p.name) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def verify(manifest_path: Path) -> CheckpointRef:
    """Check a checkpoint against its manifest; raise RunFailed naming the file when it does not match."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise RunFailed(f"checkpoint manifest {manifest_path} is unreadable ({e})") from None
    pt = manifest_path.with_name(manifest.get("file", ""))
    if not pt.is_file():
        raise RunFailed(f"checkpoint {pt} is missing (its manifest {manifest_path.name} is there)")
    size = pt.stat().st_size
    if size != manifest.get("bytes"):
        raise RunFailed(f"checkpoint {pt} has {size} bytes, its manifest says {manifest.get('bytes')} (truncated?)")
    if _sha256(pt) != manifest.get("sha256"):
        raise RunFailed(f"checkpoint {pt} does not match the sha256 in its manifest (corrupt)")
    return CheckpointRef(int(manifest["step"]), pt, manifest)


def find_latest(folder: str | Path, warn: Callable[[str], None] = print) -> CheckpointRef | None:
    """The newest checkpoint that verifies; None if none was ever committed; RunFailed if all are corrupt."""
    entries = list_checkpoints(folder)
    problems: list[str] = []
    for _, manifest_path in entries:
        try:
            ref = verify(manifest_path)
        except RunFailed as e:
            problems.append(str(e))
            warn(f"skipping a bad checkpoint: {e}")
            continue
        return ref
    if problems:
        raise RunFailed(f"no checkpoint in {folder} is intact ({len(problems)} bad: {problems[0]})")
    return None


def verdict(folder: str | Path, warn: Callable[[str], None] = print) -> dict:
    """find_latest as a small picklable verdict to share with other ranks: {"step", "file", "manifest"} for the
    chosen checkpoint, {"step": None} when none was ever committed, {"error": why} when none is intact."""
    try:
        ref = find_latest(folder, warn=warn)
    except RunFailed as e:
        return {"error": str(e)}
    except OSError as e:  # an unreadable folder: a verdict too, so that no rank is left waiting
        return {"error": f"checkpoints in {folder} cannot be read ({e})"}
    if ref is None:
        return {"step": None}
    return {"step": ref.step, "file": ref.path.name, "manifest": ref.manifest}


def same_choice(a: dict, b: dict) -> bool:
    """Two verdicts choose the same checkpoint (step and sha256), or both choose none."""
    key = lambda v: (v.get("error") is None, v.get("step"), (v.get("manifest") or {}).get("sha256"))  # noqa: E731
    return key(a) == key(b)


def ref_from_verdict(folder: str | Path, v: dict) -> CheckpointRef | None:
    """The checkpoint a verdict chose (None: start from scratch); RunFailed with the verdict's reason if it
    refused. Nothing is read or hashed here: the rank(s) that gave the verdict did that."""
    if v.get("error"):
        raise RunFailed(v["error"])
    if v.get("step") is None:
        return None
    return CheckpointRef(int(v["step"]), Path(folder) / v["file"], v["manifest"])


def load_checkpoint(ref: CheckpointRef, map_location: Any = "cpu") -> dict:
    import torch

    try:
        return torch.load(ref.path, map_location=map_location, weights_only=False)
    except Exception as e:  # a file that passed sha256 but still does not load
        raise RunFailed(f"checkpoint {ref.path} does not load: {e}") from None


def prune(folder: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` committed checkpoints, and stale temporary files; return what went."""
    folder = Path(folder)
    gone: list[Path] = []
    for _, manifest_path in list_checkpoints(folder)[max(1, keep):]:
        pt = manifest_path.with_suffix(".pt")
        manifest_path.unlink(missing_ok=True)  # uncommit first, then the data
        pt.unlink(missing_ok=True)
        gone.append(pt)
    for tmp in folder.glob("*.tmp*"):
        if not tmp.name.endswith(f".tmp{os.getpid()}"):
            tmp.unlink(missing_ok=True)
    return gone
