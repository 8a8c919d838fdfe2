"""The host reads of the training thread counted on a CPU, where nothing waits and torch's sync debug mode
(torch.cuda.set_sync_debug_mode, what torus_train/check/syncs.py counts with on CUDA) does not run: for
tests/test_step_syncs.py, scripts/dev/check_step_syncs.py and the acceptance test's rehearsal (which load it by
path from the checkout).

``SyncCounter`` sees the reads at the dispatcher (``aten::_local_scalar_dense`` and the ops whose output shape
depends on values, blocking copies to the host) and, for the reads that do not reach the dispatcher on CPU
tensors, at ``Tensor.tolist``/``numpy``/``cpu``. Only the thread that entered the counter is counted (the
training thread: on a CPU, backward and its gradient hooks run on it; the gloo exchange thread of the torus hook
is not the step's host). On CUDA it would miss backward, which runs on the autograd engine's device thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torus_train.check.syncs import caller

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


class SyncCounter(TorchDispatchMode):
    """Counts host reads on the entering thread; ``where`` keeps "what at file:line function" of each, and
    ``on_read`` is called with it (check/syncs.py's counter contract: ``with SyncCounter(on_read):``)."""

    def __init__(self, on_read: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.count = 0
        self.where: Counter = Counter()
        self.on_read = on_read
        self._thread: int | None = None
        self._saved: dict = {}

    def _record(self, what: str) -> None:
        if threading.get_ident() != self._thread:
            return
        self.count += 1
        at = f"{what} at {caller(__file__)}"
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
