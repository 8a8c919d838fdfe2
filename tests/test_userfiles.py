"""torus_train/userfiles.py, the door: a path that is not a regular file is refused by name and never opened to
block, a file larger than its cap is refused unread, and the one line names where and the file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from torus_train.errors import UserError
from torus_train.userfiles import UserFileError, open_fd, open_regular, read_bytes, read_json, read_text


@pytest.mark.parametrize("reader", [read_bytes, read_text, read_json, open_regular, open_fd])
def test_a_fifo_is_refused_by_name_without_blocking(tmp_path, reader):
    os.mkfifo(tmp_path / "f")  # no writer: an open to read would wait forever
    with pytest.raises(UserFileError) as e:
        reader(tmp_path / "f", "--x")
    assert str(e.value) == f"--x: {tmp_path / 'f'} is a FIFO, not a regular file"
    assert e.value.why == "is a FIFO, not a regular file"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a folder, not a file"),
        (lambda p: p.write_bytes(b"x" * 11), "is larger than 10 bytes, more than such a file holds"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "byte 0 is not UTF-8 text"),
    ],
)
def test_what_is_wrong_is_one_line(tmp_path, make, words):
    make(tmp_path / "f")
    with pytest.raises(UserError) as e:
        read_text(tmp_path / "f", "--x", limit=10)
    assert str(e.value) == f"--x: {tmp_path / 'f'}{':' if words.startswith('byte') else ''} {words}"


def test_a_regular_file_is_read_whole_up_to_the_cap_and_opened_blocking(tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789")
    assert read_bytes(tmp_path / "f", "--x", limit=10) == b"0123456789"
    with open_regular(tmp_path / "f", "--x") as f:
        assert os.get_blocking(f.fileno()) and stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        assert f.read() == b"0123456789"
    fd = open_fd(tmp_path / "f", "--x")
    try:
        assert os.pread(fd, 4, 3) == b"3456" and os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def test_a_link_to_a_regular_file_is_followed_and_a_dangling_one_named(tmp_path):
    (tmp_path / "f").write_text("{}")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    (tmp_path / "d").symlink_to(tmp_path / "gone")
    assert read_json(tmp_path / "l", "--x") == {}
    with pytest.raises(UserFileError, match="does not exist"):
        read_json(tmp_path / "d", "--x")


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["run", "--dry-run", "--launcher", "mpirun", "--hostfile", "{fifo}"],
            "--hostfile {fifo}: a FIFO, not a regular file",
        ),
        (["plan", "--gpus", "8", "--network", "{fifo}"], "--network: {fifo} is a FIFO, not a regular file"),
    ],
)
def test_a_hostfile_or_network_file_that_is_a_fifo_is_refused_without_blocking(tmp_path, args, said):
    fifo = tmp_path / "named.toml"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "torus_train", *(a.format(fifo=fifo) for a in args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr == f"torus-train: error: {said.format(fifo=fifo)}\n", done.stderr
