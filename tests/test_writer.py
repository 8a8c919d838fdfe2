"""metrics.jsonl lines go through a writer thread: an append never waits on the file; flush does, and says
what failed."""

from __future__ import annotations

import builtins
import threading
import time

import pytest

from torus_train.train import writer


def test_an_append_does_not_wait_for_a_hung_file_system(tmp_path, monkeypatch):
    stuck, real_open = threading.Event(), builtins.open

    def slow_open(*a, **k):
        stuck.wait(10)
        return real_open(*a, **k)

    w = writer.BackgroundAppender()
    monkeypatch.setattr(writer, "open", slow_open, raising=False)
    t = time.perf_counter()
    for i in range(1000):
        w.append(tmp_path / "m.jsonl", f"{i}\n")
    assert time.perf_counter() - t < 2  # the file system is stuck for 10 s: waiting on it would show
    assert w.flush(timeout=0.2) is False  # still stuck: a bounded wait comes back
    stuck.set()
    assert w.flush() is True
    assert (tmp_path / "m.jsonl").read_text() == "".join(f"{i}\n" for i in range(1000))  # in order


def test_a_failed_write_is_raised_by_flush(tmp_path):
    w = writer.BackgroundAppender()
    w.append(tmp_path / "no-such-folder" / "m.jsonl", "x\n")
    with pytest.raises(FileNotFoundError):
        w.flush()
    w.append(tmp_path / "m.jsonl", "y\n")
    assert w.flush() and (tmp_path / "m.jsonl").read_text() == "y\n"
