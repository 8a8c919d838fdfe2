"""Where a rank's training stands (Position, saved in checkpoints), what it trains with (RunState), and saving
and resuming both."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from torus_train.comm.buckets import BucketedModel
from torus_train.comm.consensus import broadcast_text
from torus_train.comm.groups import partition_groups
from torus_train.errors import RunFailed
from torus_train.job.rank import Bootstrap
from torus_train.job.schedule import BatchSchedule
from torus_train.job.spec import JobSpec
from torus_train.train import checkpoint as ckpt
from torus_train.train.optim import DeviceLR
from torus_train.train.step import check_replicas, sync_buffers
from torus_train.train.stop import StopRequest

log = logging.getLogger("torus_train.train")


@dataclass
class Position:
    """Where training stands; saved in checkpoints."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    images: int = 0
    """Images consumed so far, over all ranks."""
    seconds: float = 0.0
    """Wall seconds of training before this process started (from a resumed checkpoint)."""
    target_epoch: float | None = None
    target_seconds: float | None = None
    best_top1: float | None = None
    stage_starts: list[int] = field(default_factory=list)
    """The epochs at which stages 1, 2, ... started as schedule.control decided (job/control.py); the fixed
    table decides nothing here. Saved so that a resume, a restart and the next grid's ranks continue the same
    schedule (JobSpec.schedule.at(world, stage_starts))."""


@dataclass
class RunState:
    """Everything one rank's loop works with: the spec, the built parts, the position and the counters."""

    spec: JobSpec
    boot: Bootstrap
    out: Path
    stop: StopRequest
    schedule: BatchSchedule
    ddp: BucketedModel
    optimizer: DeviceLR
    loss_fn: nn.Module
    amp_dtype: torch.dtype | None
    scaler: Any
    progress: Any
    """Rank 0's report.Progress; None on the other ranks."""
    pos: Position = field(default_factory=Position)
    t0: float = 0.0
    """time.time() of the first data touch in this process."""
    loader: Any = None
    loader_batch: int = 0
    val_loader: Any = None
    nonfinite_in_a_row: int = 0
    skipped_steps: int = 0
    skip_counts: Any = None
    """Device counters of skipped steps (step.count_skips), read by step.check_nonfinite."""
    stop_agreed: bool = False
    """Some rank got SIGTERM/SIGINT: every rank stops after this logging interval."""
    last_eval: dict | None = None
    times: Any = None
    """timing.StepTimes: this rank's data and compute seconds per step (the straggler report)."""
    corrupt: Any = None
    """data.base.CorruptLog: the files skipped under data.on_corrupt = skip, over every loader of the run."""
    step_now: Any = None
    """The number of the step being taken, a 0-dim int64 device tensor the loop writes before each step
    (step.set_step), which a captured step reads."""
    noise: Any = None
    """noise.NoiseScale: the gradient noise scale's averages on the device (None: noise.enabled off, or one
    rank); ``rs.noise.b_simple()`` is the averaged B_simple as a 0-dim device tensor, alike on every rank."""
    noise_marks: list = field(default_factory=list)
    """Rank 0: the noise scale read at each stage change, for summary.json."""
    graphs: Any = None
    """graphs.StepGraph when the step is replayed from CUDA graphs (model.cuda_graphs = auto on NCCL), else None."""
    decoder: str = "auto"
    """The data.decoder entry the loaders are built with: the spec's, or what its auto resolved to
    (train/decoder.py, once before training)."""
    choices: dict = field(default_factory=dict)
    """What an `auto` setting resolved to on this run and why: {"cuda_graphs": {"choice", "why"}, ...}, for
    summary.json (a StepGraph's own choice is read at the end: a later stage may fall back)."""

    @property
    def rank0(self) -> bool:
        return self.boot.info.rank == 0

    @property
    def model(self) -> nn.Module:
        return self.ddp.module

    @property
    def metrics(self) -> Path:
        return self.out / "metrics.jsonl"

    @property
    def grid_stages_done(self) -> bool:
        """The control started schedule.stop_stage (a stage on the next grid): this grid's ranks stop."""
        stop = self.spec.schedule.stop_stage
        return bool(stop) and len(self.pos.stage_starts) >= stop

    @property
    def steps_done(self) -> bool:
        """schedule.steps reached (0 = no step limit)."""
        limit = self.spec.schedule.steps
        return bool(limit) and self.pos.global_step >= limit

    def wall(self) -> float:
        return self.pos.seconds + (time.time() - self.t0 if self.t0 else 0.0)


def job_identity(spec: JobSpec) -> dict:
    """What makes a checkpoint this job's (saved in its manifest, compared on resume): the model, the optimizer
    whose state it holds, the data and seed that fix its sample order, and a fingerprint of these."""
    ident = {
        "model.arch": spec.model.arch,
        "model.num_classes": spec.model.num_classes,
        "optimizer.name": spec.optimizer.name,
        "data.source": spec.data.source,
        "job.seed": spec.job.seed,
    }
    ident["fingerprint"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


def checkpoint_state(rs: RunState) -> dict | None:
    """The state rank 0 saves (tensors and plain types only, so that it loads with weights_only=True); None on
    the other ranks. No rank's RNG state is in it: every rank's streams are derived from (seed, rank, step) at
    each checkpoint (reseed), so nothing is gathered to rank 0."""
    if not rs.rank0:
        return None
    return {
        "model": rs.model.state_dict(),
        "optimizer": rs.optimizer.state_dict(),
        "scaler": rs.scaler.state_dict() if rs.scaler else None,
        "noise": rs.noise.state.cpu() if rs.noise is not None else None,
        "position": vars(rs.pos).copy(),
        "grid": str(rs.boot.grid),
        "world_size": rs.boot.info.world_size,
        "spec": rs.spec.to_dict(),
    }


def reseed(seed: int, rank: int, step: int) -> None:
    """This rank's random streams (torch, CUDA, Python's, NumPy's) from (seed, rank, step): called after every
    checkpoint and after a resume, so a resumed run draws what the straight run drew, on any grid, without a
    gather of 2,176 RNG states to rank 0 (an object collective over NCCL at every checkpoint)."""
    mixed = int.from_bytes(hashlib.sha256(f"{seed}/{rank}/{step}".encode()).digest()[:8], "little") >> 1
    torch.manual_seed(mixed)  # every device's generator too
    random.seed(mixed)
    np.random.seed(mixed % 2**32)


def save(rs: RunState, why: str) -> bool:
    """A checkpoint of this step, written by rank 0 only after every rank agrees on it (check_replicas);
    False when it was not written (inside a run of non-finite steps)."""
    # fold the time since the last fold into pos.seconds and restart the clock (counted once)
    rs.pos.seconds, rs.t0 = rs.wall(), time.time()
    sync_buffers(rs.model)
    check_replicas(rs, f"the check before the checkpoint ({why})", buffers=True)
    if rs.nonfinite_in_a_row:  # the same count on every rank: the gradients were all-reduced
        skipped_save(rs, why)
        return False
    t0 = time.perf_counter()
    state = checkpoint_state(rs)
    failed = ""
    if rs.rank0:
        assert state is not None  # rank 0 gathers the whole state
        try:
            pt = ckpt.save_checkpoint(
                rs.out / "checkpoints",
                rs.pos.global_step,
                state,
                {
                    "epoch": rs.pos.epoch,
                    "step_in_epoch": rs.pos.step_in_epoch,
                    "world_size": rs.boot.info.world_size,
                    "grid": str(rs.boot.grid),
                    "why": why,
                    "stage_starts": list(rs.pos.stage_starts),  # the launcher's next grid (ranks/rundir.py)
                    "job": job_identity(rs.spec),
                },
                rs.spec.checkpoint.keep,
            )
            log.info("checkpoint %s (%s)", pt, why)
        except RunFailed as e:
            failed = str(e)
        except Exception as e:
            failed = f"checkpoint at step {rs.pos.global_step} was not written ({type(e).__name__}: {e})"
            log.exception("checkpoint at step %d", rs.pos.global_step)
    # nobody runs ahead of a checkpoint that is still being written, and a failed write fails every rank
    said = broadcast_text(failed, 0, rs.boot.device)
    if said:
        raise RunFailed(said)
    reseed(rs.spec.job.seed, rs.boot.info.rank, rs.pos.global_step)
    log.info("checkpoint at step %d: %.3f s in the checkpoint path", rs.pos.global_step, time.perf_counter() - t0)
    return True


def skipped_save(rs: RunState, why: str) -> None:
    """No checkpoint from inside a run of non-finite steps: a warning, or a failure at the end."""
    kept = ckpt.list_checkpoints(rs.out / "checkpoints") if rs.rank0 else []
    text = (
        f"the last {rs.nonfinite_in_a_row} step(s) had non-finite loss or gradients: no checkpoint at step "
        f"{rs.pos.global_step} ({why})" + (f"; the checkpoint at step {kept[0][0]} is kept" if kept else "")
    )
    if why == "end of training":
        raise RunFailed(text)
    log.warning("%s", text)
    if rs.progress:
        rs.progress.say(text)


def agree_on_checkpoint(
    folder: Path, rank: int, local_rank: int, world_size: int, device: Any = "cpu"
) -> ckpt.CheckpointRef | None:
    """Choose the checkpoint to resume from, verified once per node; every rank gets the same answer.

    1. Each node's leader (local rank 0) lists the manifests and verifies the newest intact checkpoint (size and
       sha256, reading the file once); the other ranks read nothing.
    2. Global rank 0 (a node leader) broadcasts its verdict: step, file and manifest, or none, or the reason it
       refused (a dict of a few hundred bytes, one broadcast_object_list).
    3. Every node leader compares rank 0's choice with its own (a node that sees another file, e.g. a stale
       cache of a shared file system, must not load it); one all-reduce (MIN) of one integer names the first
       leader that disagrees, and then every rank refuses alike.
    Cost per rank: leaders: a listing of OUT/checkpoints and one read of the checkpoint, size and sha256 checked
    on the bytes read, which they keep (plus any corrupt newer ones they skip); everyone: one small broadcast and
    one 8-byte all-reduce, which do not grow with the checkpoint. The leaders' bytes are what their node's
    ranks load (hand_to_node): one read of the file per node, 544 at 2,176 ranks with 4 per node.
    Returns the chosen checkpoint, with its bytes on the leaders (ref.data).
    """
    leader = local_rank == 0 or rank == 0
    data: list = []
    mine = ckpt.verdict(folder, warn=log.warning, keep=data) if leader else None
    box: list[Any] = [mine if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    chosen: dict = box[0]
    differs = mine is not None and not ckpt.same_choice(mine, chosen)  # mine: every leader's
    if differs:
        log.error("resume: rank %d (a node leader) sees %s but rank 0 chose %s", rank, mine, chosen)
    first = torch.tensor([rank if differs else world_size], dtype=torch.int64, device=device)  # NCCL: on the GPU
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    if int(first.item()) < world_size:
        raise RunFailed(
            f"resume: the node of rank {int(first.item())} does not see the checkpoint rank 0 chose "
            f"({chosen}); is OUT/checkpoints on a file system every node shares?"
        )
    return ckpt.ref_from_verdict(folder, chosen, data[0] if data else None)


def node_size(info, device: Any = "cpu") -> int:
    """The ranks per node when every node holds that many consecutive global ranks (as srun's block
    distribution and mpirun's ppr mapping give them), else 0; the same answer on every rank. One all-reduce
    (MIN) of three integers, whatever the world."""
    size = info.local_world_size
    aligned = 0 <= info.local_rank < size and info.rank - info.local_rank == info.rank // size * size
    mine = torch.tensor([size, -size, int(aligned)], dtype=torch.int64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MIN)
    low, high, every = (int(v) for v in mine.tolist())
    return size if low == -high and every == 1 and info.world_size % size == 0 else 0


def hand_to_node(ref: ckpt.CheckpointRef, info, device: Any = "cpu") -> ckpt.CheckpointRef:
    """Every rank of a node gets the bytes its leader read and verified: one broadcast inside the node, over
    NVLink with NCCL; the other ranks read nothing from the file. Every rank calls it.

    The nodes' groups are made in one call that every rank joins (one communicator split on NCCL, where a
    group made by its members alone may still split the world's communicator, which every rank must join),
    and are destroyed after the broadcast: a resume leaves no communicator behind. Where the nodes are not
    consecutive ranks, each rank without the bytes loads the file itself."""
    size = node_size(info, device)
    if size == 0:
        log.warning("resume: the ranks of a node are not consecutive; every rank reads the checkpoint itself")
        return ref
    if size == 1:
        return ref
    first = info.rank - info.local_rank
    nodes = [list(range(n, n + size)) for n in range(0, info.world_size, size)]
    group = None if size == info.world_size else partition_groups(nodes, first // size)
    nbytes = int(ref.manifest["bytes"])
    if ref.data is not None:
        buf = torch.frombuffer(bytearray(ref.data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=first, group=group)
    if group is not None:
        dist.destroy_process_group(group)
    if ref.data is not None:
        return ref
    return dataclasses.replace(ref, data=buf.cpu().numpy().tobytes())


def resume(rs: RunState, regrid: bool = False) -> bool:
    """Load the newest intact checkpoint of OUT/checkpoints, verified once per node (agree_on_checkpoint) and
    checked to be this job's (check_identity); every rank decides from the same manifest, so alike."""
    info = rs.boot.info
    folder = rs.out / "checkpoints"
    t0, read0 = time.perf_counter(), ckpt.BYTES_READ[0]
    ref = agree_on_checkpoint(folder, info.rank, info.local_rank, info.world_size, rs.boot.device)
    if ref is None:
        log.info("resume: no checkpoint in %s, starting from scratch", folder)
        return False
    moved = check_identity(ref, rs, regrid)
    ref = hand_to_node(ref, info, rs.boot.device)
    state = ckpt.load_checkpoint(ref)
    try:
        rs.model.load_state_dict(state["model"])
        rs.optimizer.load_state_dict(state["optimizer"])
        if rs.scaler is not None and state.get("scaler"):
            rs.scaler.load_state_dict(state["scaler"])
        if rs.noise is not None and state.get("noise") is not None:  # the averages go on where they were
            rs.noise.state.copy_(state["noise"])
        rs.pos = Position(**state["position"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise RunFailed(f"checkpoint {ref.path} does not fit this job ({first})") from None
    reseed(rs.spec.job.seed, info.rank, rs.pos.global_step)  # as the straight run did after this checkpoint
    rs.schedule = rs.spec.schedule.at(info.world_size, rs.pos.stage_starts)  # the stages the control started
    log.info(
        "resumed from %s: epoch %d, step %d; %d bytes read from checkpoint files by this rank, %.3f s in "
        "the checkpoint path",
        ref.path,
        rs.pos.epoch,
        rs.pos.global_step,
        ckpt.BYTES_READ[0] - read0,
        time.perf_counter() - t0,
    )
    if moved and rs.rank0:
        rs.progress.say(moved)
    if rs.rank0:
        for p in ckpt.prune_orphans(folder):
            log.info("resume: removed %s (left by a save that did not complete)", p.name)
    return True


def check_identity(ref: ckpt.CheckpointRef, rs: RunState, regrid: bool) -> str:
    """RunFailed when the checkpoint is another job's, or another grid's unless regrid; with regrid, the line
    that says the job moves ('' when it does not)."""
    m, name = ref.manifest, ref.path.name
    saved, here = m.get("job"), job_identity(rs.spec)
    if saved is None:
        log.warning("resume: %s has no job identity (written by an older version); loading it", name)
    elif not isinstance(saved, dict):
        raise RunFailed(f"resume: the manifest of {name} is malformed (job is not an object)")
    elif saved.get("fingerprint") != here["fingerprint"]:
        diff = [
            f"{k} {here[k]!r} here, {saved.get(k)!r} in the checkpoint"
            for k in here
            if k != "fingerprint" and saved.get(k) != here[k]
        ]
        raise RunFailed(
            f"resume: {rs.out / 'checkpoints' / name} is from another job "
            f"({'; '.join(diff) or 'another fingerprint'}); use another --out, or run without --resume"
        )
    world, grid = rs.boot.info.world_size, str(rs.boot.grid)
    if (m.get("world_size"), m.get("grid")) in ((world, grid), (None, None)):
        return ""
    was = f"grid {m.get('grid')} ({m.get('world_size')} ranks)"
    if not regrid:
        raise RunFailed(
            f"resume: {name} was written on {was}, this job runs on grid {grid} ({world} ranks); "
            f"resume it on its own grid (--grid {m.get('grid')})"
        )
    return (
        f"resuming step {m['step']} of {was} on grid {grid} ({world} ranks): the global batch stays, "
        "the per-rank batch and the RNG streams change"
    )
