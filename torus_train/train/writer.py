"""Files appended to from a thread of their own, so that the training thread never waits on a file system.

Rank 0 appends a metrics.jsonl line at every logging interval; on a shared file system under load one append can
take longer than a step, and every rank waits for rank 0 at the next collective. ``append`` hands the text to
one writer thread (lines keep their order) and returns; ``flush`` waits until everything handed over is written
and raises the first error of a write (a full disk), so that the loop reports it where it reads files or ends.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path


class BackgroundAppender:
    """One daemon thread appending (path, text) items in the order given."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._error: OSError | None = None

    def append(self, path: str | Path, text: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="file-appender", daemon=True)
                self._thread.start()
        self._queue.put((Path(path), text))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every item handed over is written (False when ``timeout`` seconds passed first); OSError of
        the first write that failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        error, self._error = self._error, None
        if error is not None:
            raise error
        return True

    def _run(self) -> None:
        while True:
            path, text = self._queue.get()
            try:
                with open(path, "a") as f:
                    f.write(text)
            except OSError as e:
                if self._error is None:
                    self._error = e
            finally:
                self._queue.task_done()


APPENDER = BackgroundAppender()
"""The process's appender (metrics.jsonl)."""
