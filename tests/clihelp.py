"""The real entry point run in process, and the shape every user error must have (one line, exit 2)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from torus_train.cli import main


def invoke(*args: str) -> tuple[int, str, str]:
    """Run ``torus-train ARGS`` in this process; (exit code, stdout, stderr)."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        code = 0
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        return code, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def assert_one_line_error(code: int, stderr: str, message: str = "") -> None:
    assert code == 2, stderr
    assert stderr.startswith("torus-train: error:") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    assert message in stderr, stderr


def tree_digest(root, skip: str = "", exclude=None, folders: bool = True) -> str:
    """Every entry below ``root``: its path and kind, a link's target, a regular file's content (links are not
    followed, a FIFO is named, never opened); folders named ``skip`` and the path ``exclude`` left out; with
    ``folders`` false the folders themselves are not entries (one made on the way changes nothing)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != skip and Path(dirpath, d) != exclude)
        for name in sorted(filenames) + (dirnames if folders else []):
            p = Path(dirpath, name)
            if p == exclude:
                continue
            mode = os.lstat(p).st_mode
            h.update(f"{p}:{stat.S_IFMT(mode)}".encode(errors="surrogateescape"))
            if stat.S_ISLNK(mode):
                h.update(os.readlink(p).encode(errors="surrogateescape"))
            elif stat.S_ISREG(mode):
                h.update(p.read_bytes())
    return h.hexdigest()
