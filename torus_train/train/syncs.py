"""Count the device-to-host reads of the training loop, step by step (scripts/dev/check_step_syncs.py, the GPU check,
tests/test_step_syncs.py).

A read of a device value by the host (``.item()``, ``bool(t)``, ``.tolist()``, a data-dependent shape) makes the
CPU wait for everything queued before it; on a GPU step of 30 ms the next forward then cannot be queued while
backward and the exchange run. ``SyncCounter`` sees them on CPU too, where nothing waits: at the dispatcher
(``aten::_local_scalar_dense`` and the ops whose output shape depends on values) and, for the reads that do not
reach the dispatcher on CPU tensors, at ``Tensor.tolist``/``numpy``/``cpu``. Only the thread that entered the
counter is counted (the training thread; the gloo exchange thread of the torus hook is not the step's host).

``count_loop_syncs`` runs the real loop (train/loop.py: start, switch_stage, run_epoch, on a world of one with
the torus hook) with the autocast dtype and loss scaler of a precision forced on CPU, and attributes each read to
the step in progress; steps at which the loop reads on purpose (a logging interval, a replica check, a
checkpoint) are counted apart.
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torus_train.train import loop
from torus_train.train.stop import StopRequest

# ops that read a device value on the host: a scalar, or an output whose size depends on the values
HOST_READ_OPS = (
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "equal",
    "is_nonzero",
    "allclose",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
)
# indexing with a boolean mask: the output's size is the mask's count (a nonzero below the dispatcher)
MASK_INDEX_OPS = ("index", "index_put", "index_put_", "_index_put_impl_")
# Tensor methods that read to the host without reaching the dispatcher for CPU tensors
HOST_READ_METHODS = ("tolist", "numpy", "cpu")

PRECISIONS = ("fp32", "bf16", "fp16-scaler")


def _op_name(func) -> str:
    return func.name().split("::")[-1].split(".")[0]


def _has_mask(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _to_host(name: str, args, kwargs) -> bool:
    """A blocking copy of a device tensor into host memory (``.cpu()``, ``.to("cpu")``, ``cpu_t.copy_(cuda_t)``)."""

    def on_device(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")

    if name == "_to_copy":
        target = kwargs.get("device")
        return bool(args) and on_device(args[0]) and target is not None and torch.device(target).type == "cpu"
    return (
        len(args) > 1
        and isinstance(args[0], torch.Tensor)
        and args[0].device.type == "cpu"
        and on_device(args[1])
        and not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    )


def _caller() -> str:
    """The innermost torus_train frame (or the first outside torch) that caused the read."""
    frames = [
        f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename and "train/syncs.py" not in f.filename
    ]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename.rsplit('torus_train/', 1)[-1]}:{f.lineno} {f.name}"


class SyncCounter(TorchDispatchMode):
    """Counts host reads on the entering thread; ``where`` keeps (op, caller) of each."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.where: Counter = Counter()
        self.on_read: Callable[[str], None] | None = None
        """Called with "op at file:line function" for each read."""
        self._thread = None
        self._saved: dict = {}

    def _record(self, what: str) -> None:
        if threading.get_ident() != self._thread:
            return
        self.count += 1
        at = f"{what} at {_caller()}"
        self.where[at] += 1
        if self.on_read is not None:
            self.on_read(at)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _op_name(func)
        if (
            name in HOST_READ_OPS
            or (name in MASK_INDEX_OPS and _has_mask(args))
            or (name in ("_to_copy", "copy_") and _to_host(name, args, kwargs or {}))
        ):
            self._record(f"aten::{name}")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._thread = threading.get_ident()
        for name in HOST_READ_METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapper(t, *a, _original=original, _name=name, **k):
                self._record(f"Tensor.{_name}")
                return _original(t, *a, **k)

            setattr(torch.Tensor, name, wrapper)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved = {}
        return super().__exit__(*exc)


def force_precision(rs, precision: str) -> None:
    """The autocast dtype and loss scaler of ``precision`` on this rank's device, also on CPU (where
    build.amp_settings runs fp32): the same code path as on a GPU."""
    device = rs.boot.device.type
    rs.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16-scaler": torch.float16}[precision]
    rs.scaler = torch.amp.GradScaler(device) if precision == "fp16-scaler" else None


@contextmanager
def _patched(module, name: str, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def count_loop_syncs(spec, boot, out, precision: str, warmup: int = 1) -> dict:
    """Run ``spec.schedule.steps`` steps of the real loop in ``precision`` and count host reads per step.

    Returns {"steps": steps counted, "syncs": reads in them, "interval_steps": steps where the loop read on
    purpose (not counted), "where": {"op at file:line": count} of the counted reads}. The first ``warmup``
    steps are not counted (DDP rebuilds its buckets and the scaler creates its state there)."""
    rs = loop.start(spec, boot, out, StopRequest())
    force_precision(rs, precision)
    step_of = {"now": 0}
    per_step: dict[int, Counter] = {}
    interval: set[int] = set()
    counter = SyncCounter()

    def on_read(at: str) -> None:
        per_step.setdefault(step_of["now"], Counter())[at] += 1

    def step_starts(original):
        def train_step(rs_, *a, **k):
            step_of["now"] = rs_.pos.global_step + 1
            return original(rs_, *a, **k)

        return train_step

    def on_purpose(original):
        def reads(rs_, *a, **k):
            interval.add(step_of["now"])
            return original(rs_, *a, **k)

        return reads

    counter.on_read = on_read
    with (
        _patched(loop, "train_step", step_starts),
        _patched(loop, "log_interval", on_purpose),
        _patched(loop, "check_replicas", on_purpose),
        _patched(loop, "save", on_purpose),
        counter,
    ):
        loop.switch_stage(rs, 0)
        loop.run_epoch(rs, 0)
    rs.loader.close()
    hook_state = getattr(rs.ddp, "torus_hook_state", None)
    if hook_state is not None:
        hook_state.close()
    counted = [s for s in range(warmup + 1, rs.pos.global_step + 1) if s not in interval]
    where = sum((per_step.get(s, Counter()) for s in counted), Counter())
    return {
        "steps": len(counted),
        "syncs": sum(where.values()),
        "interval_steps": sorted(interval),
        "where": dict(where),
    }
