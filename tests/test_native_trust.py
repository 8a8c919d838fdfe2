"""The native replay's library is loaded only from a folder and file of this user that nobody else may write;
otherwise it is built anew in a private folder (scripts/experiments/mpi_native.py: trusted_folder, private)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))
import mpi_native as native  # scripts/experiments/mpi_native.py, as the scripts beside it import it

NOBODY = 65534


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORUS_TRAIN_NATIVE", raising=False)
    monkeypatch.delenv("TORUS_TRAIN_MPICC", raising=False)
    monkeypatch.setattr(native.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "cache" / "native"


def test_private_cache_folder_is_used(cache):
    folder, note = native.trusted_folder()
    assert folder == cache and note == "" and (cache.stat().st_mode & 0o777) == 0o700


def test_a_folder_others_may_write_is_not_used(cache, tmp_path):
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    folder, note = native.trusted_folder()
    assert folder == tmp_path / "tmp" / f"torus-train-native-{os.getuid()}" and native.private(folder)
    assert note == f"{cache} is not private to this user; built in {folder}"
    folder.chmod(0o775)  # the fallback taken too (say, made by someone else in /tmp): a new private folder
    again, note = native.trusted_folder()
    assert again.parent == tmp_path / "tmp" and again.name.startswith("torus-train-native-") and again != folder
    assert native.private(again) and note == f"{cache} is not private to this user"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another user")
def test_a_file_of_another_user_or_a_link_is_not_private(tmp_path):
    mine = tmp_path / "mine.so"
    mine.write_bytes(b"x")
    mine.chmod(0o755)
    assert native.private(mine)
    link = tmp_path / "link.so"
    link.symlink_to(mine)
    assert not native.private(link)
    os.chown(mine, NOBODY, NOBODY)
    assert not native.private(mine)


def _mpi_version() -> str:
    code = "from mpi4py import MPI; print(MPI.Get_library_version().strip(chr(0)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("mpicc") is None or os.geteuid() != 0, reason="needs mpicc and root")
def test_a_planted_library_is_never_loaded(cache, tmp_path):
    """A .so under the cached name, owned by someone else: rebuilt in a new private folder, the planted one is
    left alone and not loaded (it is not even a library here: loading it would fail)."""
    version = _mpi_version()
    lib, how = native._load(version)  # learn the cached name
    assert lib is not None, how
    built = next(cache.glob("*.so"))
    # a new file under the name, not the loaded one rewritten: its pages are mapped in this process, and
    # overwriting them in place ends the process with SIGBUS when the library's code next runs (at exit)
    built.unlink()
    built.write_bytes(b"planted")
    os.chown(built, NOBODY, NOBODY)
    lib, how = native._load(version)
    assert lib is not None, how
    assert f"({built} may have been written by someone else; rebuilt)" in how
    assert str(tmp_path / "tmp") in how.split(" built with ")[0]
    assert built.read_bytes() == b"planted"
