"""A C replay of the MPI transport's recorded all-reduces: mpi_native.c, built with mpicc and loaded by ctypes.

An experiment, not part of the package: with ranks outnumbering cores (this project's 2-core test hosts),
every Python-side step between two MPI calls costs many times its own duration, and replaying the recorded
calls from C removed that (figures in docs/comm.md). With a core per rank the Python between the calls is
noise, so the package replays in Python only; this file keeps the recorded C figures reproducible
(`NativeMpiGrid`, used by mpi_replay_bench.py beside it and by tests/dist/test_transports.py).

The library is built once per (source, MPI library, mpicc, machine) into $TORUS_TRAIN_CACHE/native (default
~/.cache/torus-train/native), under a file lock so that the ranks of one node build it once, and loaded only if
it reports the same MPI library version as mpi4py. A library is loaded only when it and its folder belong to
this user and nobody else may write them (loading a .so runs its code): otherwise it is built anew in a
private folder (``$TMPDIR/torus-train-native-UID``, or a fresh one) and the reason is said. Anything that
fails (no mpicc, no compiler, another MPI) leaves the Python replay in place and says why: `load()` returns
(None, reason). TORUS_TRAIN_NATIVE=0 turns it off; TORUS_TRAIN_MPICC names the compiler wrapper (default:
mpicc on PATH).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from torus_train.cache import cache_root
from torus_train.comm.mpi import transport as T

SOURCE = Path(__file__).with_name("mpi_native.c")

# the op kinds of mpi_native.c (the same numbers as torus_train.comm.mpi.transport's step kinds)
SENDRECV, ISEND, IRECV, WAITALL, ALLREDUCE, REDUCE, BCAST, ADD = range(8)
MAX_COMMS, MAX_REQS = 4, 256


class Op(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("comm", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("peer", ctypes.c_int32),
        ("src", ctypes.c_int32),
        ("tag", ctypes.c_int32),
        ("count", ctypes.c_int64),
        ("count2", ctypes.c_int64),
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
    ]


_loaded: tuple | None = None


def cache_dir() -> Path:
    return cache_root() / "native"


def load(mpi_version: str) -> tuple[ctypes.CDLL | None, str]:
    """(the library, how it was found) or (None, why not). `mpi_version`: MPI.Get_library_version()."""
    global _loaded
    if _loaded is None:
        _loaded = _load(mpi_version)
    return _loaded


def _load(mpi_version: str) -> tuple[ctypes.CDLL | None, str]:
    mpi_version = mpi_version.strip("\x00 \t\r\n")  # mpi4py's string can end in the C terminator
    if os.environ.get("TORUS_TRAIN_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "native replay off (TORUS_TRAIN_NATIVE=0)"
    mpicc = shutil.which(os.environ.get("TORUS_TRAIN_MPICC", "mpicc"))
    if mpicc is None:
        return None, "native replay unavailable: no mpicc on PATH (set TORUS_TRAIN_MPICC)"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, mpi_version.encode(), os.path.realpath(mpicc).encode(), platform.machine().encode()])
    ).hexdigest()[:16]
    try:
        folder, note = trusted_folder()
        lib_path = folder / f"torus_native_{key}.so"
        if lib_path.exists() and not private(lib_path):
            note = f"{lib_path} may have been written by someone else; rebuilt"
            lib_path = Path(tempfile.mkdtemp(prefix="torus-train-native-")) / lib_path.name
        if not lib_path.exists():
            _build(mpicc, lib_path)
        if not private(lib_path):
            raise OSError(f"{lib_path} is not private to this user after the build")
        lib = ctypes.CDLL(str(lib_path))
    except (OSError, subprocess.SubprocessError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"native replay unavailable: {first[:200]}"
    if lib.tt_op_size() != ctypes.sizeof(Op):
        return None, "native replay unavailable: op layout differs between mpi_native.c and mpi_native.py"
    text = ctypes.create_string_buffer(8192)
    lib.tt_library_version(text, len(text))
    if text.value.decode(errors="replace").strip() != mpi_version:
        return None, f"native replay unavailable: {mpicc} builds for another MPI than mpi4py's"
    lib.tt_run.argtypes = [ctypes.POINTER(Op), ctypes.c_int, ctypes.POINTER(ctypes.c_int32), ctypes.c_int]
    lib.tt_run.restype = ctypes.c_int
    return lib, f"{lib_path} built with {mpicc}" + (f" ({note})" if note else "")


def private(path: Path) -> bool:
    """Owned by this user, not a symbolic link, not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def trusted_folder() -> tuple[Path, str]:
    """(the folder to build into and load from, why it is not the cache folder or ''): the cache folder when it
    is private, else $TMPDIR/torus-train-native-UID when that is, else a new private temporary folder."""
    first = cache_dir()
    fallback = Path(tempfile.gettempdir()) / f"torus-train-native-{os.getuid()}"
    for folder in (first, fallback):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue
        if private(folder):
            return folder, "" if folder == first else f"{first} is not private to this user; built in {folder}"
    return Path(tempfile.mkdtemp(prefix="torus-train-native-")), f"{first} is not private to this user"


def _build(mpicc: str, lib_path: Path) -> None:
    """Compile mpi_native.c into lib_path, once per node: the other ranks wait on the lock, then find it built."""
    with open(lib_path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib_path.exists():
            return
        tmp = lib_path.with_name(f"{lib_path.name}.{os.getpid()}.tmp")
        proc = subprocess.run(
            [mpicc, "-O3", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise OSError(f"{mpicc} failed: {(proc.stderr or proc.stdout).strip()}")
        os.chmod(tmp, 0o755)  # whatever the umask: writable by this user only (see private)
        os.replace(tmp, lib_path)


_INT_MAX = 2**31 - 1  # MPI counts are C ints


class NativeMpiGrid(T.MpiGrid):
    """MpiGrid whose recorded float32/float64 all-reduces replay from C (one ctypes call), the rest in Python.

    Both replays issue the same MPI calls and adds in the same order, so their results are bitwise identical.
    required: raise ValueError when the library cannot be had, instead of replaying in Python."""

    def __init__(self, grid, comm=None, required: bool = False):
        super().__init__(grid, comm)
        self.native, why = load(T._MPI().Get_library_version())
        if required and self.native is None:
            raise ValueError(why)
        self.notes.append(f"replay: C for float32/float64 ({why})" if self.native else f"replay: Python; {why}")

    def _compile(self, steps):
        ops = _native_ops(steps) if self.native is not None and steps else None
        if ops is None:
            return super()._compile(steps)
        fcomms = (ctypes.c_int32 * len(self._comms))(*[c.py2f() for c in self._comms])
        run, n, nc = self.native.tt_run, len(ops), len(self._comms)
        arr = (Op * n)(*ops)

        def call():
            rc = run(arr, n, fcomms, nc)
            if rc:
                raise RuntimeError(f"native all-reduce replay failed: {_error_string(rc)}")

        return T._Program([(call, ())], steps, "native")


def _native_ops(steps) -> list | None:
    """The steps as mpi_native.c ops, or None when one of them is not float32/float64 with MPI_SUM."""
    MPI = T._MPI()
    codes = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
    ops, open_reqs = [], 0
    for s in steps:
        arrays = [x for x in (s.a, s.b) if x is not None]
        if s.kind == T._HALF_ADD or (s.op is not None and s.op != MPI.SUM):
            return None
        if any(x.dtype not in codes or x.shape[0] > _INT_MAX for x in arrays):
            return None
        open_reqs = 0 if s.kind == WAITALL else open_reqs + (s.kind in (ISEND, IRECV))
        if open_reqs > MAX_REQS:
            return None
        ops.append(
            Op(
                s.kind,
                s.comm,
                codes[arrays[0].dtype] if arrays else 0,
                s.peer,
                s.src,
                s.tag,
                s.a.shape[0] if s.a is not None else (s.b.shape[0] if s.b is not None else 0),
                s.b.shape[0] if s.b is not None else 0,
                s.a.ctypes.data if s.a is not None else None,
                s.b.ctypes.data if s.b is not None else None,
            )
        )
    return ops


def _error_string(rc: int) -> str:
    try:
        return T._MPI().Get_error_string(rc)
    except Exception:
        return f"code {rc} (a malformed program)" if rc == -1 else f"MPI error code {rc}"
