"""The training step replayed as one CUDA graph per batch-size stage (model.cuda_graphs = auto; docs/graphs.md).

At the run's per-GPU batch (16-32 images) a step is a few milliseconds of GPU work and launching it kernel by
kernel from Python costs more than the work. step.step_body has no host read and takes everything that
changes per step from device tensors (LR, step number, loss scale, skip counts), so PyTorch's whole-network
capture recipe applies to it unchanged:

1. warm-up: the stage's first ``warmup`` steps run eagerly on a side stream (real steps, counted as any:
   cuDNN picks its kernels, NCCL makes its communicators, the optimizer and the loss scaler their state);
2. probe, on the next step's real batch: the step's state is copied aside (StepState) and the batch goes into
   static input buffers. Every rank first captures step_body without its exchange (no NCCL call in that graph)
   and the ranks agree on the verdicts (one all-reduce of a flag): whether a collective is captured must be the
   same on every rank of its communicator, so no rank captures one before all agreed. Then step_body(static
   inputs) is captured with its exchange into a graph with its own memory pool (the side stream and its NCCL
   calls inside it); the state is put back after each capture (a capture runs nothing on the device, but it
   leaves host-side state half-stepped: bucket counts, the GradScaler's per-optimizer state, the optimizer's
   found_inf); a capture that fails only now ends the run on every rank. Then one replay, its parameters kept
   aside, the state put back, and the step run eagerly: this step's result is the eager one. The replay must
   agree with it (max |difference| / max |parameter| <= AGREE_TOLERANCE, again one all-reduce of a flag), else
   the run goes on eagerly, said in one line. A device synchronisation separates every switch between captured
   and uncaptured collectives on a communicator (NCCL_GRAPH_MIXING_SUPPORT=0, set by ranks/worker.py);
3. replay: every later step copies its batch into the static buffers and replays; the returned loss is the
   graph's static output, added to the interval's sum on the device before the next replay.
Everything that needs the host (logging, replica checks, checkpoints, stop requests, the heartbeat) runs
between replays, on the same parameters and optimizer state the graph holds. A stage switch (new shapes)
drops the graph and probes again; a failed probe at any stage makes the rest of the run eager. A step of
another shape (none in the loaders' full batches) and stages with gradient accumulation run eagerly, said once.
A graph launch holding NCCL calls is a collective: every rank replays the same graph, which holds because every
rank captures at the same step of the same stage and the verdicts are all-reduced.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

from torus_train.comm.consensus import Consensus
from torus_train.data.device_work import DEVICE_WORK
from torus_train.errors import RunFailed
from torus_train.train.step import step_body

log = logging.getLogger("torus_train.train")

WARMUP_STEPS = 3
"""Eager steps of each stage before its capture (the recipe's warm-up; torch's docs use 3 as well)."""
AGREE_TOLERANCE = 5e-3
"""The replay against the eager step: max |difference| / max |parameter| at most this (fp16 arithmetic; the
same line as gpu_check's graphs.agree)."""


def wanted(spec, boot) -> bool:
    """model.cuda_graphs = auto on a CUDA rank whose exchange runs on NCCL (a host backend stages buckets
    through host memory, which a graph cannot hold)."""
    return spec.model.cuda_graphs == "auto" and boot.device.type == "cuda" and boot.backend == "nccl"


def choice_without(spec, boot) -> dict:
    """summary["choices"]["cuda_graphs"] of a run that does not try a graph, and why."""
    if spec.model.cuda_graphs == "off":
        why = "model.cuda_graphs = off"
    elif boot.device.type != "cuda":
        why = f"auto: the ranks run on the {boot.device.type.upper()} (a graph needs a CUDA rank)"
    else:
        why = f"auto: the exchange runs on {boot.backend} (a graph needs NCCL)"
    return {"choice": "eager", "why": why}


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (two flat float tensors); inf where either holds a non-finite value."""
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return float("inf")
    return float((a - b).abs().max()) / max(float(a.abs().max()), 1e-30) if a.numel() else 0.0


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


class StepState:
    """The state one step changes, copied aside (take) and put back in place (restore): parameters, buffers,
    optimizer state, the GradScaler's scale and growth tracker, the skip counts and step number on the device;
    on the host the bucket counts, the GradScaler's per-optimizer state and the optimizer's found_inf /
    grad_scale. In place, because a captured graph holds these tensors' addresses."""

    def __init__(self, rs):
        self.live = _step_tensors(rs)
        self.saved = [t.detach().clone() for t in self.live]
        self.optimizer_keys = {id(p): set(s) for p, s in rs.optimizer.state.items()}
        self.had_skip_counts = rs.skip_counts is not None
        self.had_scale = rs.scaler is None or getattr(rs.scaler, "_scale", None) is not None

    def grew(self, rs) -> bool:
        """The step made new state since take (a stage's first step: optimizer state, skip counters, the
        GradScaler's scale), which a graph would hold but the run would not."""
        now = {id(p): set(s) for p, s in rs.optimizer.state.items()}
        made_scale = not self.had_scale and getattr(rs.scaler, "_scale", None) is not None
        return now != self.optimizer_keys or (rs.skip_counts is not None) != self.had_skip_counts or made_scale

    def restore(self, rs) -> None:
        """Every tensor back to its copy, in place; state made since take dropped; the host-side step state
        (GradScaler, optimizer flags, bucket counts) as at the start of a step."""
        with torch.no_grad():
            for t, saved in zip(self.live, self.saved, strict=True):
                t.copy_(saved)
        for p in list(rs.optimizer.state):  # state made since take goes (never a graph's: see grew)
            keys = self.optimizer_keys.get(id(p), set())
            for k in set(rs.optimizer.state[p]) - keys:
                del rs.optimizer.state[p][k]
        if not self.had_skip_counts:
            rs.skip_counts = None
        if not self.had_scale:  # the GradScaler makes its scale on first use
            rs.scaler._scale = rs.scaler._growth_tracker = None
        for attr in ("found_inf", "grad_scale"):  # set by GradScaler.step or step_unless for one step
            rs.optimizer.__dict__.pop(attr, None)
        scaler = rs.scaler
        if scaler is not None:
            scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        rs.ddp.reset()  # bucket counts and futures for the next backward


def _step_tensors(rs) -> list[torch.Tensor]:
    model = rs.model
    found = [*model.parameters(), *model.buffers()]
    for state in rs.optimizer.state.values():
        found += [v for v in state.values() if isinstance(v, torch.Tensor)]
    scaler = rs.scaler
    if scaler is not None:
        found += [
            t for t in (getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None)) if t is not None
        ]
    found += [t for t in (rs.skip_counts, getattr(rs, "step_now", None)) if t is not None]
    found += [rs.noise.state] if getattr(rs, "noise", None) is not None else []
    return found


class StepGraph:
    """One captured step per stage, replayed after a probe (see the module docstring)."""

    def __init__(
        self,
        say: Callable[[str], None] | None = None,
        warmup: int = WARMUP_STEPS,
        agree: Callable[[str | None], Consensus] | None = None,
    ):
        self.say = say or (lambda text: None)
        """Rank 0's progress line (report.Progress.say); the others log only."""
        self.warmup = warmup
        self.agree = agree or Consensus.alone
        """This rank's failure (None: it passed) -> every rank's verdict (comm/consensus.py over the run's
        world), naming the first failing rank's reason."""
        self.graph: Any = None
        self.pool: Any = None
        self.static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        """(images, labels, loss) of the captured step."""
        self.eager_steps = 0
        """Steps of this stage run eagerly so far (the warm-up)."""
        self.capture_seconds: list[float] = []
        """Seconds of each capture kept (one per stage), for the summary and gpu_check."""
        self.choice = {"choice": "eager", "why": f"auto: no step reached the capture (after {warmup} warm-up steps)"}
        """summary["choices"]["cuda_graphs"]: graphed or eager, and why."""
        self.eager = False
        """A probe failed: every step from here on runs eagerly."""
        self.last_rel_diff: float | None = None
        """The last probe's max |replay - eager| / max |parameter| (None: no replay compared)."""
        self._said: set = set()
        self._side: torch.cuda.Stream | None = None

    def new_stage(self) -> None:
        """New shapes from here on: the graph goes (its pool with it) and the next steps warm up again, once the
        last replay's collectives are done (eager ones follow on the same communicators)."""
        if self.graph is not None:
            torch.cuda.synchronize()
        self.graph = self.static = self.pool = None
        self.eager_steps = 0
        if not self.eager:
            torch.cuda.empty_cache()

    def step(self, rs, images, labels, accumulation: int) -> torch.Tensor:
        if self.eager:
            return step_body(rs, images, labels, accumulation)
        if accumulation > 1:
            self._once(
                "accumulation",
                f"CUDA graphs: a stage with gradient accumulation ({accumulation} "
                "micro-batches) runs its steps eagerly",
            )
            return step_body(rs, images, labels, accumulation)
        if self.graph is None and self.eager_steps < self.warmup:
            self.eager_steps += 1
            return self._on_side_stream(rs, images, labels)
        if self.graph is None or self.static is None:
            return self._probe(rs, images, labels)
        x, y, loss = self.static
        if images.shape != x.shape or labels.shape != y.shape or images.dtype != x.dtype:
            self._once(
                ("shape", tuple(images.shape)),
                f"CUDA graphs: a batch of shape {tuple(images.shape)} (the graph's is {tuple(x.shape)}) runs eagerly",
            )
            return step_body(rs, images, labels, 1)
        x.copy_(images)
        y.copy_(labels)
        self.graph.replay()
        return loss

    def _on_side_stream(self, rs, images, labels) -> torch.Tensor:
        """An eager step on a side stream (the recipe's warm-up: lazy state is made off the default stream)."""
        if self._side is None:
            self._side = torch.cuda.Stream(device=images.device)
        main = torch.cuda.current_stream(images.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            loss = step_body(rs, images, labels, 1)
        main.wait_stream(self._side)
        loss.record_stream(main)  # used on the main stream after this
        return loss

    def _probe(self, rs, images, labels) -> torch.Tensor:
        """Decide with every rank, then capture this step, replay it once, run it eagerly from the same state;
        keep the graph when the replay agreed. Returns the eager step's loss (this step's result).

        NCCL counts whether a collective is captured as a property of the collective, the same on every rank
        of its communicator: so every rank first captures the step without its exchange (no collective in that
        graph) and the ranks agree on the verdicts before any rank captures a collective. A capture that still
        fails after that ends the run on every rank (the others' graphs hold collectives this rank never
        issued), with one line saying to run with model.cuda_graphs = off."""
        at = rs.pos.global_step + 1
        if rs.times is not None:
            rs.times.whole_step()  # no per-gradient timing hook inside the graph
        saved = StepState(rs)
        x, y = images.clone(), labels.clone()  # clone keeps the memory format (channels_last)
        decided = self.agree(self._dry_capture(rs, x, y, saved))
        if not decided.ok:
            self._fall_back(at, f"the capture failed {_on(decided)}({decided.why})")
            return self._on_side_stream(rs, images, labels)
        t0 = time.perf_counter()
        graph, pool, loss, error = self._capture(rs, x, y)
        seconds = time.perf_counter() - t0
        if error is None and saved.grew(rs):
            error = "the step made new optimizer or counter state inside the capture (no warm-up step)"
        saved.restore(rs)
        captured = self.agree(error)
        if not captured.ok:
            raise RunFailed(
                f"CUDA graph: at step {at} the capture with the exchange failed {_on(captured)}({captured.why}) "
                "after every rank's capture without it had passed; run again with model.cuda_graphs = off"
            )
        return self._compare(rs, images, labels, at, (graph, pool, x, y, loss), saved, seconds)

    def _dry_capture(self, rs, x, y, saved: StepState) -> str | None:
        """The step captured without its exchange (no NCCL call in the graph, which is thrown away): this
        rank's error, or None."""
        with rs.ddp.no_sync():
            graph, _, _, error = self._capture(rs, x, y)
        if error is None and saved.grew(rs):
            error = "the step made new optimizer or counter state inside the capture (no warm-up step)"
        del graph
        saved.restore(rs)
        return error

    def _compare(self, rs, images, labels, at: int, captured: tuple, saved: StepState, seconds: float):
        """One replay against the eager step from the same state; the graph kept when every rank's agreed.
        The synchronisations keep each communicator's captured and uncaptured collectives apart
        (NCCL_GRAPH_MIXING_SUPPORT=0, ranks/worker.py)."""
        graph, pool, x, y, loss = captured
        graph.replay()
        torch.cuda.synchronize()
        replayed = flat_params(rs.model)
        saved.restore(rs)
        eager_loss = self._on_side_stream(rs, images, labels)
        torch.cuda.synchronize()
        rel = max_rel_diff(flat_params(rs.model), replayed)
        self.last_rel_diff = rel
        differed = None if rel <= AGREE_TOLERANCE else f"by {_rel(rel)} (over {AGREE_TOLERANCE})"
        agreed = self.agree(differed)
        if not agreed.ok:
            self._fall_back(at, f"one replay differed from the eager step {_on(agreed)}{agreed.why}")
            return eager_loss
        self.graph, self.pool, self.static = graph, pool, (x, y, loss)
        self.capture_seconds.append(seconds)
        self.choice = {
            "choice": "graphed",
            "why": f"auto: captured at step {at}; one replay agreed with the eager step ({_rel(rel)})",
        }
        self._tell(
            f"CUDA graph: step {at} captured in {seconds:.2f} s (batch {tuple(x.shape)}), one replay agreed "
            f"with the eager step ({_rel(rel)}); replayed from here until the next stage"
        )
        return eager_loss

    def _capture(self, rs, x, y):
        """(graph, pool, static loss, None) or (None, None, None, the error's first line): a capture runs
        nothing on the device, so a failed one leaves only host-side state to put back (the caller does)."""
        torch.cuda.synchronize()  # nothing of the eager steps in flight (NCCL's watchdog included)
        graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
        try:
            # DEVICE_WORK.held(): the loader threads' GPU work (decode prefetch, pinning) waits out the capture
            with DEVICE_WORK.held(), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                loss = step_body(rs, x, y, 1)
            torch.cuda.synchronize()
        except Exception as e:  # any error of the capture: nothing ran on the device, the eager step can
            text = str(e).strip()
            return None, None, None, text.splitlines()[0] if text else type(e).__name__
        return graph, pool, loss, None

    def _fall_back(self, at: int, why: str) -> None:
        """Eager for the rest of the run (the state is already back as it was before the probe)."""
        self.graph = self.static = self.pool = None
        self.eager = True
        self.choice = {"choice": "eager", "why": f"auto: at step {at} {why}"}
        self._tell(f"CUDA graph: at step {at} {why}; the run goes on with the eager step")

    def _tell(self, text: str) -> None:
        log.info("%s", text)
        self.say(text)

    def _once(self, key, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._tell(text)


def _on(found: Consensus) -> str:
    """ "on rank R " where the world has more than one rank (the first rank that failed)."""
    return "" if found.world == 1 else f"on rank {found.first} "


def _rel(rel: float) -> str:
    return f"max relative difference {rel:.2g}"
