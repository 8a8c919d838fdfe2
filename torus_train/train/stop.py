"""A stop request from a signal, handed by the worker to the training loop (no torch import)."""

from __future__ import annotations

from collections.abc import Callable

from torus_train.errors import RunFailed


class StopRequested(RunFailed):
    """SIGTERM/SIGINT reached the ranks; they stopped together at a logging interval (after a checkpoint)."""


class StopRequest:
    """What the worker's signal handler saw. While the loop runs, it reads this at every logging interval and
    the ranks agree on it (a flag in the loss all-reduce), so that all stop after the same step and can
    checkpoint together; outside the loop the handler must end the rank itself."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.in_loop = False
        # the worker may set a callable(global_step) called after every step (heartbeat)
        self.on_step: Callable[[int], None] | None = None

    def beat(self, global_step: int) -> None:
        """Called by the loop after every optimizer step."""
        if self.on_step is not None:
            self.on_step(global_step)

    def request(self, name: str) -> bool:
        """Record the signal; True when the loop will stop by itself, False when the caller must."""
        self.signal = name
        return self.in_loop
