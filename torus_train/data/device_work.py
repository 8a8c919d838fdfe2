"""A gate between the input pipeline's threads that work on the GPU and a CUDA graph capture (pure: no torch).

    with DEVICE_WORK.work():    a loader thread's device work (the decode prefetcher's batch, the pin thread's
                                copy to page-locked memory): waits while a capture holds the gate
    with DEVICE_WORK.held():    train/graphs.py around a capture: waits for the work under way, then keeps new
                                work out until the capture ends

A capture in ``thread_local`` mode allows other threads' CUDA calls, but a call that is unsafe during a capture
(an allocation, an event query, nvJPEG's host synchronisation) made by another thread while one runs has no
tested behaviour on every driver; keeping those threads out of the window costs one batch's wait, once per stage.
Any number of workers may run together; a hold waits for all of them and is re-entrant across threads (a count).
Only device work goes inside ``work()``: a worker never blocks on its queue while inside, so a hold cannot wait on
a consumer that waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class DeviceWorkGate:
    """Many workers or one holder at a time (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0  # workers inside work()
        self._holds = 0  # holders inside (or waiting to enter) held()
        self.waits = 0
        """Times a worker found the gate held and waited (tests and diagnostics)."""

    @contextmanager
    def work(self) -> Iterator[None]:
        with self._cond:
            if self._holds:
                self.waits += 1
            self._cond.wait_for(lambda: self._holds == 0)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._cond:
            self._holds += 1  # new work waits from here on
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    @property
    def busy(self) -> int:
        """Workers inside work() now."""
        return self._active


DEVICE_WORK = DeviceWorkGate()
"""The process's gate: every loader thread that touches the GPU and every capture use this one."""
