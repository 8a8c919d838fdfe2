"""Fault injection for the launcher's and the loop's own tests, from TORUS_TRAIN_FAULT (docs/faults.md).

The variable is read and parsed once, by `from_environ`, into one `Fault`; `install` then wraps the parts of
this rank that the fault acts on (the loss function, the after-step callback). Without the variable nothing
is installed, so the step's code holds no fault branch. Values:

    KIND:R:S   rank R (or ``all``) at step S: step (SIGKILL after the step), stop (SIGSTOP), exit0 (exit code
               0), hang (block after the exchange, before the heartbeat records the step), nan (a NaN loss in
               step S), nanfrom (NaN losses from step S on), diverge (nudge a parameter after step S),
               nanparam (a NaN in a parameter after step S)
    slow:R:X   rank R sleeps X seconds in each step, before backward (a straggler)
    start:R    rank R fails during start-up
    wrongimage:R, decoderaises:R
               every rank runs the data.decoder probe (CPU ranks too); on rank R its decoder returns inverted
               images, or raises
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from torus_train.errors import UserError
from torus_train.registry import Registry

_Num = TypeVar("_Num", int, float)

VARIABLE = "TORUS_TRAIN_FAULT"


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: how its value reads and what it wraps."""

    name: str
    takes: str  # what the third field is: "step", "seconds" or "" (none)
    install: Callable | None  # install(fault, rs) wraps what the fault acts on; None: acted on at start-up
    probe: Callable | None = None
    """A decoder fault: the decode function the start-up probe of data.decoder uses on the ranks named
    (train/decoder.py); with one, every rank probes, CPU ranks included."""


KINDS: Registry[FaultKind] = Registry("fault kind")


@dataclass(frozen=True)
class Fault:
    """One parsed TORUS_TRAIN_FAULT."""

    kind: FaultKind
    rank: int | None  # None: every rank
    at: float  # the step (or from-step), or the seconds of a straggler

    def targets(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


def parse(value: str) -> Fault:
    """KIND:R[:X] as a Fault; UserError with one line naming what is wrong."""
    name, _, rest = value.partition(":")
    if name not in KINDS:
        raise UserError(f"{VARIABLE}={value!r}: unknown fault kind {name!r}; choose one of {', '.join(KINDS.names())}")
    kind = KINDS.get(name)
    fields = rest.split(":") if rest else []
    if len(fields) != (2 if kind.takes else 1):
        form = f"{name}:RANK" + (f":{kind.takes.upper()}" if kind.takes else "")
        raise UserError(f"{VARIABLE}={value!r} should read {form}")
    rank = None if fields[0] == "all" else _number(value, "rank", fields[0], int)
    at = _number(value, kind.takes, fields[1], float) if kind.takes else 0.0
    if kind.takes == "seconds" and not 0 < at < 3600:
        raise UserError(f"{VARIABLE}={value!r}: a straggler's seconds must lie between 0 and 3600")
    return Fault(kind, rank, at)


def _number(value: str, what: str, text: str, cast: Callable[[str], _Num]) -> _Num:
    try:
        n = cast(text)
    except ValueError:
        raise UserError(f"{VARIABLE}={value!r}: the {what} {text!r} is not a number") from None
    if n < 0 or n != n or n == float("inf"):
        raise UserError(f"{VARIABLE}={value!r}: the {what} must be a finite number of at least 0")
    return n


def from_environ(environ=os.environ) -> Fault | None:
    """The fault this process was asked for, or None: the one place that reads the variable."""
    value = environ.get(VARIABLE, "")
    return parse(value) if value else None


def fails_at_start(fault: Fault | None, rank: int) -> bool:
    return fault is not None and fault.kind.name == "start" and fault.targets(rank)


def install(fault: Fault, rs) -> None:
    """Wrap what ``fault`` acts on in this rank's run state, when it is aimed at this rank."""
    if fault.kind.install is not None and fault.targets(rs.boot.info.rank):
        fault.kind.install(fault, rs)


# --- what each kind wraps -------------------------------------------------------------------------------


def _wrap_loss(rs, change: Callable) -> None:
    """rs.loss_fn(out, y) -> change(loss, step) for the step being taken."""
    inner = rs.loss_fn

    def loss_fn(out, y):
        return change(inner(out, y), rs.pos.global_step + 1)

    rs.loss_fn = loss_fn


def _nan_loss(fault: Fault, rs, from_on: bool) -> None:
    def change(loss, step):
        hit = step >= fault.at if from_on else step == fault.at
        return loss * float("nan") if hit else loss  # a non-finite gradient on this rank only

    _wrap_loss(rs, change)


def _straggler(fault: Fault, rs) -> None:
    slept = [-1]

    def change(loss, step):
        if slept[0] != step:  # once per step, before the first micro-batch's backward
            slept[0] = step
            time.sleep(fault.at)
        return loss

    _wrap_loss(rs, change)


def _after_step(fault: Fault, rs, act: Callable, before_beat: bool = False) -> None:
    """Chain ``act(rs)`` onto the loop's after-step callback at step ``fault.at``: before the heartbeat records
    the step (a hang) or after it."""
    inner = rs.stop.on_step

    def on_step(step: int) -> None:
        if before_beat and step == fault.at:
            act(rs)
        if inner is not None:
            inner(step)
        if not before_beat and step == fault.at:
            act(rs)

    rs.stop.on_step = on_step


def _nudge(value: float) -> Callable:
    def act(rs) -> None:
        import torch

        with torch.no_grad():
            next(rs.model.parameters()).view(-1)[0] += value

    return act


def _hang(rs) -> None:
    while True:
        time.sleep(3600)


def _wrong_images(encoded, device):
    """The loader's decode with every image's colours inverted: a device decoder that returns other pixels."""
    from torus_train.data.batch_decode import decode_batch

    images, failed = decode_batch(encoded, device)
    return [None if im is None else 255 - im for im in images], failed


def _raise_decoding(encoded, device):
    raise RuntimeError("injected decoder failure (TORUS_TRAIN_FAULT)")


for _kind in (
    FaultKind("step", "step", lambda f, rs: _after_step(f, rs, lambda _: os.kill(os.getpid(), signal.SIGKILL))),
    FaultKind("stop", "step", lambda f, rs: _after_step(f, rs, lambda _: os.kill(os.getpid(), signal.SIGSTOP))),
    FaultKind("exit0", "step", lambda f, rs: _after_step(f, rs, lambda _: os._exit(0))),
    FaultKind("hang", "step", lambda f, rs: _after_step(f, rs, _hang, before_beat=True)),
    FaultKind("nan", "step", lambda f, rs: _nan_loss(f, rs, from_on=False)),
    FaultKind("nanfrom", "step", lambda f, rs: _nan_loss(f, rs, from_on=True)),
    FaultKind("diverge", "step", lambda f, rs: _after_step(f, rs, _nudge(1e-3))),
    FaultKind("nanparam", "step", lambda f, rs: _after_step(f, rs, _nudge(float("nan")))),
    FaultKind("slow", "seconds", _straggler),
    FaultKind("start", "", None),
    FaultKind("wrongimage", "", None, probe=_wrong_images),
    FaultKind("decoderaises", "", None, probe=_raise_decoding),
):
    KINDS.add(_kind.name, _kind)
