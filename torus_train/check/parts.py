"""The parts of `torus-train check`, in the order they run and print (pure: no torch import here; a part's
module is imported when it runs).

Each part is a function ``part(ctx: Context) -> Verdict``; Verdict.ok is True (shown to work here), False
(shown not to) or None (cannot run on this machine, e.g. a GPU part without CUDA), with a one-line why.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torus_train.errors import UserError
from torus_train.registry import Registry, load
from torus_train.train.determinism import with_deterministic_env
from torus_train.verdict import Verdict


@dataclass(frozen=True)
class Part:
    """One part: the function that checks it ("module:function") and what it shows, for --help and docs."""

    ref: str
    shows: str
    deterministic: bool = False
    """It turns determinism on: the check's process sets cuBLAS's workspace before any part runs a gemm
    (train/determinism.py)."""


PARTS: Registry[Part] = Registry("check part")
for _name, _ref, _shows, *_deterministic in (
    ("environment", "environment:environment", "python, torch, CUDA, cuDNN, NCCL, DALI, MPI, the NVIDIA driver"),
    ("gpus", "environment:gpus", "the GPUs job/gpus.py counts against torch.cuda's count, names and memory"),
    ("nccl", "device:nccl", "an all-reduce on NCCL in a world of one (this process)"),
    ("graphs", "device:graphs", "the step captured as a CUDA graph, one replay against the eager step"),
    ("decoder_cpu", "device:decoder_cpu", "the CPU decoder on the embedded images of every kind, against PIL"),
    ("decoder_gpu", "device:decoder_gpu", "the device decoder (nvJPEG) on the same images, and its repeat"),
    ("deterministic", "device:deterministic", "the step run twice with job.deterministic: equal bits", True),
    ("throughput", "throughput:throughput", "img/s of the loop against the bare step at per-GPU batch 16/32/256"),
):
    PARTS.add(_name, Part(f"torus_train.check.{_ref}", _shows, *_deterministic))


@dataclass
class Context:
    """What the parts share: a scratch folder, the progress line, the world of one (made once, lazily)."""

    scratch: Path
    say: Callable[[str], None]
    quick: bool = False
    """Fewer timed steps (tests)."""
    _boot: Any = field(default=None, repr=False)

    def boot(self) -> Any:
        """A process group of one rank in this process (NCCL with CUDA, else gloo), made on first use."""
        if self._boot is None:
            from torus_train.check.smallrun import world_of_one

            self._boot = world_of_one()
        return self._boot

    def close(self) -> None:
        if self._boot is not None:
            from torus_train.ranks.distributed import shutdown

            shutdown()
            self._boot = None


def run_parts(names: list[str], say: Callable[[str], None], quick: bool = False) -> dict[str, tuple[Verdict, float]]:
    """{name: (verdict, seconds)} of each part named, in registry order; a part that raises is a failure whose
    why is the error's first line (the check goes on with the next part)."""
    found: dict[str, tuple[Verdict, float]] = {}
    if any(PARTS.get(n).deterministic for n in names):  # before the graphs part's gemms: cuBLAS reads it once
        with_deterministic_env(os.environ)
    t_all = time.perf_counter()
    # the loop's progress lines (stdout in a run) go to stderr here: stdout holds the table alone
    with tempfile.TemporaryDirectory(prefix="torus-train-check-") as scratch, contextlib.redirect_stdout(sys.stderr):
        ctx = Context(Path(scratch), say, quick)
        try:
            for name in [n for n in PARTS.names() if n in names]:
                say(f"check [{time.perf_counter() - t_all:.0f}s]: {name}: {PARTS.get(name).shows}")
                t0 = time.perf_counter()
                try:
                    verdict = load(PARTS.get(name).ref)(ctx)
                except Exception as e:  # a part's own failure is that part's verdict, never a traceback
                    text = str(e).strip().splitlines()
                    verdict = Verdict.failed(f"{type(e).__name__}: {text[0] if text else 'no message'}")
                seconds = time.perf_counter() - t0
                found[name] = (verdict, seconds)
                say(f"check [{time.perf_counter() - t_all:.0f}s]: {name}: {verdict.word}: {verdict.why}")
        finally:
            ctx.close()
    return found


def named(value: str | None, registry: Registry[Any], what: str) -> list[str]:
    """The names in --parts (comma-separated) of ``registry``'s entries, every one when None; UserError naming
    an unknown one ("'x' is not WHAT; choose from ...")."""
    if value is None:
        return list(registry.names())
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry]
    if not names or unknown:
        problem = f"{unknown[0]!r} is not {what}" if unknown else "no part named"
        raise UserError(f"--parts: {problem}; choose from {', '.join(registry.names())}")
    return names


def stderr_say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
