"""Host syncs per step of the real loop: the acceptance test's syncs part (accept_loop.py),
scripts/dev/check_step_syncs.py and tests/test_step_syncs.py; docs/check.md says how they are counted.

A read of a device value by the host (``.item()``, ``bool(t)``, a data-dependent shape, a blocking copy) makes
the CPU wait for everything queued before it, and the next forward cannot be queued while backward and the
exchange run. On CUDA torch reports each such wait itself: ``torch.cuda.set_sync_debug_mode("warn")`` warns in
c10's ``memcpy_and_sync`` and ``stream_synchronize``, which those go through. It misses
``torch.cuda.synchronize()``, ``Event.synchronize()`` and ``non_blocking`` copies into pageable memory; the loop
calls the first two only outside the counted steps (a stage switch, the graph probe, a logging interval's timing
read) and copies ``non_blocking`` only to the device. On a CPU, where nothing
waits and the mode does not run, the CPU test hosts' counter (tests/synccount.py) counts, read from the checkout.

``count_loop_syncs`` gives each read to the step in progress; the steps at which the loop reads on purpose (a
logging interval, a replica check, a checkpoint, the CUDA graph probe) are counted apart.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

from torus_train.check.shrunk import CPU_SYNC_COUNTER
from torus_train.check.smallrun import loop_run
from torus_train.job.rank import Bootstrap
from torus_train.job.spec import JobSpec
from torus_train.train import graphs, loop

SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of torch's warning (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync)."""

OnRead = Callable[[str], None]
"""Called with "what at file:line function" for each read."""
Counting = Callable[[OnRead], AbstractContextManager[Any]]
"""A counter: ``with counter(on_read):`` calls on_read for each host read of the block."""


def caller(*skip: str) -> str:
    """ "file:line function" of the innermost frame outside torch, this module and the files in ``skip``: the
    code that read."""
    for f in reversed(traceback.extract_stack()):
        if "/torch/" not in f.filename and f.filename not in (__file__, *skip):
            return f"{f.filename.rsplit('torus_train/', 1)[-1]}:{f.lineno} {f.name}"
    return "?"


@contextmanager
def cuda_sync_warnings(on_read: OnRead) -> Iterator[None]:
    """torch's sync debug mode ("warn") for the block, each of its warnings a read. Counted on the entering
    thread and on threads Python did not start: on CUDA the autograd engine's device thread runs backward and
    the buckets' gradient hooks (a hook's own warnings are raised there; those of backward's C++ ops are replayed
    on the thread that called backward when it returns). Not counted: the package's own threads (the loader's
    prefetch, the exchange lanes), whose waits are not the step's."""
    training = threading.get_ident()
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_WARNING)  # each one, not once per place
        shown = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if SYNC_WARNING not in str(message):
                shown(message, category, filename, lineno, file, line)
                return
            here = threading.current_thread()
            if here.ident == training or isinstance(here, threading._DummyThread):
                on_read(f"cuda sync at {caller(warnings.__file__)}")

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(before)


@functools.cache
def _cpu_counter() -> Counting:
    """tests/synccount.py's SyncCounter, loaded from the source checkout."""
    spec = importlib.util.spec_from_file_location("synccount", CPU_SYNC_COUNTER)
    if not CPU_SYNC_COUNTER.is_file() or spec is None or spec.loader is None:
        raise FileNotFoundError(f"no {CPU_SYNC_COUNTER}: counting host reads on a CPU needs the source checkout")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SyncCounter


def counter_for(device: torch.device) -> tuple[Counting, str]:
    """(the counter, its name for the JSON): torch's sync debug mode on CUDA, the tests' counter on a CPU."""
    if device.type == "cuda":
        return cuda_sync_warnings, "torch.cuda.set_sync_debug_mode"
    return _cpu_counter(), "tests/synccount.py (CPU)"


@contextmanager
def _patched(owner: Any, name: str, replacement: Callable) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def count_loop_syncs(
    spec: JobSpec, boot: Bootstrap, out: Path, precision: str, counter: Counting, warmup: int = 1, graph: Any = None
) -> dict[str, Any]:
    """Run ``spec.schedule.steps`` steps of the real loop in ``precision`` and count host reads per step with
    ``counter``; ``graph``: a train/graphs.StepGraph to use whatever the device (as loop_run's).

    Returns {"steps": steps counted, "syncs": reads in them, "interval_steps": steps where the loop read on
    purpose (not counted), "where": {"what at file:line function": count} of the counted reads}. The first
    ``warmup`` steps are not counted (the buckets and the scaler make their state there)."""
    now: dict[str, int | None] = {"step": 0}
    per_step: dict[int | None, Counter] = {}
    interval: set[int | None] = set()

    def on_read(at: str) -> None:
        per_step.setdefault(now["step"], Counter())[at] += 1

    def around(step: Callable) -> Callable:
        def train_step(rs: Any, *a: Any, **k: Any) -> Any:
            now["step"] = rs.pos.global_step + 1
            return step(rs, *a, **k)

        return train_step

    def on_purpose(original: Callable) -> Callable:
        def reads(*a: Any, **k: Any) -> Any:
            interval.add(now["step"])
            return original(*a, **k)

        return reads

    def epoch(original: Callable) -> Callable:
        def run_epoch(*a: Any, **k: Any) -> Any:
            try:
                return original(*a, **k)
            finally:
                now["step"] = None  # what follows the epoch (closing, the digest) is no step's

        return run_epoch

    with (
        _patched(loop, "log_interval", on_purpose),
        _patched(loop, "check_replicas", on_purpose),
        _patched(loop, "save", on_purpose),
        _patched(graphs.StepGraph, "_probe", on_purpose),  # max_rel_diff and the ranks' verdicts
        _patched(loop, "run_epoch", epoch),
        counter(on_read),
    ):
        run = loop_run(spec, boot, out, precision=precision, graphs=graph, around=around)
    counted = [s for s in range(warmup + 1, run.steps + 1) if s not in interval]
    where = sum((per_step.get(s, Counter()) for s in counted), Counter())
    return {
        "steps": len(counted),
        "syncs": sum(where.values()),
        "interval_steps": sorted(interval),
        "where": dict(where),
    }
