"""The training loop of one rank (run by torus_train.ranks.worker), as a sequence of named calls:

rs = start(spec, boot, out, stop)       model, owned gradient buckets exchanged with comm.algo,
                                        optimizer (LR on the device), schedule, AMP, CUDA graphs
resume(rs)                              the latest complete checkpoint of this job, when asked
for each epoch:
    switch_stage(rs, epoch)             a new loader when the batch grows
    run_epoch(rs, epoch)                LR, forward/backward/exchange/update, metrics, replica checks,
                                        agreed stop
    follow_control(rs, epoch, done)     schedule.control = noise: the next stage starts at epoch + 1?
    maybe_evaluate(rs, epoch)           top-1/top-5 all-reduced
    maybe_checkpoint(rs, epoch)         (every save checks the replicas first)
finish(rs)                              replica check, final checkpoint, per-rank step times (stragglers),
                                        summary.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn as nn

from torus_train.comm.consensus import consensus
from torus_train.data.base import CorruptLog
from torus_train.errors import RunFailed
from torus_train.job.rank import Bootstrap
from torus_train.job.spec import JobSpec
from torus_train.train.build import (
    amp_settings,
    build_loader,
    build_model,
    build_optimizer,
    seed_everything,
    set_determinism,
    time_step,
    wrap_ddp,
)
from torus_train.train.checkpoint import write_atomic
from torus_train.train.decoder import choose_decoder
from torus_train.train.eta import Eta
from torus_train.train.faults import Fault, install
from torus_train.train.follow import follow_control
from torus_train.train.graphs import StepGraph, choice_without
from torus_train.train.graphs import wanted as graphs_wanted
from torus_train.train.noise import build_noise, no_estimate
from torus_train.train.report import (
    Progress,
    log_interval,
    new_interval,
    rank_report,
    record_eval,
    record_resume,
    record_stage,
    summary,
    summary_text,
)
from torus_train.train.state import RunState, resume, save
from torus_train.train.step import check_replicas, evaluate, param_digest, set_lr, set_step, sync_buffers, train_step
from torus_train.train.stop import StopRequest, StopRequested
from torus_train.train.timing import StepTimes
from torus_train.train.writer import APPENDER


def run_training(
    spec: JobSpec,
    boot: Bootstrap,
    out: Path,
    resume_run: bool = False,
    stop: StopRequest | None = None,
    regrid: bool = False,
    fault: Fault | None = None,
) -> dict:
    """Train as the spec says; rank 0 writes metrics.jsonl and summary.json. Returns the summary.

    regrid: resuming a checkpoint written on another grid is on purpose (the launcher moved the job);
    without it such a checkpoint is refused. fault: the test's injected fault (train/faults.py), wrapped in
    once here so that the steps hold no fault branch."""
    rs = start(spec, boot, out, stop or StopRequest())
    if fault is not None:
        install(fault, rs)
        if rs.graphs is not None:  # an injected fault acts in Python per step, which a graph replay would not run
            rs.graphs = None
            rs.choices["cuda_graphs"] = {"choice": "eager", "why": "an injected fault acts in Python per step"}
    choice = choose_decoder(spec, boot, rs.progress.say if rs.progress else None, fault)  # before any loader
    rs.decoder, rs.choices["decoder"] = choice.decoder, choice.summary()
    if resume_run:
        record_resume(rs, resume(rs, regrid))
    rs.t0 = time.time()
    rs.stop.in_loop = True
    for epoch in range(rs.pos.epoch, spec.schedule.end_epoch):  # end_epoch: where this grid's stages end
        if rs.steps_done or rs.grid_stages_done:
            break
        switch_stage(rs, epoch)
        epoch_done = run_epoch(rs, epoch)
        follow_control(rs, epoch, epoch_done)  # schedule.control: the next stage may start at epoch + 1
        maybe_evaluate(rs, epoch, epoch_done)
        maybe_checkpoint(rs, epoch, epoch_done)
    rs.stop.in_loop = False  # from here a signal ends the rank at once
    return finish(rs)


def start(spec: JobSpec, boot: Bootstrap, out: Path, stop: StopRequest) -> RunState:
    """Build every part in a fixed order (the same RNG draws on a straight and a resumed run)."""
    set_determinism(spec.job.deterministic, boot.device)
    seed_everything(spec.job.seed, boot.info.rank)
    model = build_model(spec, boot.device)
    ddp = wrap_ddp(model, spec, boot)
    optimizer = build_optimizer(model, spec)
    optimizer.use_device_lr(boot.device)  # written before each step, read by the step on the device
    schedule = spec.schedule.at(boot.info.world_size)
    first = schedule.stages[0]
    prior = time_step(ddp, spec, boot.device, first.micro_batch, first.accumulation)
    amp_dtype, scaler = amp_settings(spec, boot.device)
    progress = Progress(spec.schedule.epochs, out) if boot.info.rank == 0 else None
    if progress:
        progress.prior = (prior, first.global_batch)
    if progress and boot.device.type != "cuda" and spec.model.precision != "fp32":
        progress.say(f"CPU ranks run fp32 (model.precision = {spec.model.precision} applies on GPUs)")
    accumulations = [st.accumulation for st in schedule.stages]
    if progress and no_estimate(spec, boot.info.world_size, accumulations):
        progress.say(no_estimate(spec, boot.info.world_size, accumulations))
    graphs = None
    if graphs_wanted(spec, boot):
        graphs = StepGraph(progress.say if progress else None, agree=lambda why: consensus(why, boot.device))
    rs = RunState(
        spec,
        boot,
        out,
        stop,
        schedule,
        ddp,
        optimizer,
        nn.CrossEntropyLoss(label_smoothing=spec.schedule.label_smoothing),
        amp_dtype,
        scaler,
        progress,
        times=StepTimes(model, boot.device),
        corrupt=CorruptLog(),
        step_now=torch.zeros((), dtype=torch.int64, device=boot.device),
        graphs=graphs,
        noise=build_noise(spec, boot.device, boot.info.world_size, accumulations),
    )
    if graphs is None:
        rs.choices["cuda_graphs"] = choice_without(spec, boot)
    return rs


def switch_stage(rs: RunState, epoch: int) -> None:
    """At the first epoch and at every batch growth: a loader for the stage's per-rank batch."""
    stage = rs.schedule.stage_at(epoch)
    if stage.per_rank_batch != rs.loader_batch:
        if rs.loader is not None:
            rs.loader.close()
        rs.loader = build_loader(rs.spec, rs.boot, "train", stage.per_rank_batch, rs.corrupt, rs.decoder)
        rs.loader_batch = stage.per_rank_batch
        if rs.noise is not None:  # the averages' time constant: noise.average_epochs of the train split
            rs.noise.set_epoch(rs.loader.num_samples)
        record_stage(rs, epoch, stage)
        if rs.graphs is not None:
            rs.graphs.new_stage()  # new shapes: captured again after the stage's warm-up
    if rs.progress:
        announce_eta(rs)


def announce_eta(rs: RunState) -> None:
    """Rank 0: the run's step count and ETA plan for the current loader; the ETA before the first step."""
    n = rs.loader.num_samples
    rs.progress.total = rs.schedule.total_steps(n)
    first = rs.progress.eta is None
    rs.progress.plan(Eta.plan(rs.schedule, n, rs.spec.schedule.end_epoch, rs.spec.schedule.steps))
    if first:
        rs.progress.eta.prior = rs.progress.prior
        rs.progress.say(
            f"ETA {rs.progress.eta_text(rs.pos.global_step)} for {rs.progress.total - rs.pos.global_step} "
            "steps (from one timed step before training; measured per stage from here on)"
        )


def run_epoch(rs: RunState, epoch: int) -> bool:
    """The epoch's steps (from the saved position when resuming inside it); True when the epoch completed."""
    stage = rs.schedule.stage_at(epoch)
    steps = rs.schedule.steps_in_epoch(epoch, rs.loader.num_samples)
    rs.loader.set_epoch(epoch)
    skip = rs.pos.step_in_epoch if epoch == rs.pos.epoch else 0
    interval, batches = new_interval(), iter(rs.loader)
    for i in range(steps):
        t_data = time.time()
        images, labels = next(batches)
        data_seconds = time.time() - t_data
        interval["data"] += data_seconds
        if i < skip:  # resuming inside an epoch: the same order, so skip what was done
            continue
        lr = rs.schedule.lr_at(epoch + i / steps)
        set_lr(rs.optimizer, lr)
        set_step(rs, rs.pos.global_step + 1)
        rs.times.start(data_seconds)
        interval["loss"] += train_step(rs, images, labels, stage.accumulation)
        rs.times.stop()
        advance(rs, interval, i, stage.global_batch)
        rs.stop.beat(rs.pos.global_step)
        last = i == steps - 1 or rs.steps_done
        if rs.pos.global_step % rs.spec.job.log_every == 0 or last:
            log_interval(rs, interval, epoch, stage, lr)
            interval = new_interval()
            if rs.stop_agreed:
                stop_now(rs)
        check = rs.spec.job.check_every_steps
        if check and rs.pos.global_step % check == 0:
            check_replicas(rs, f"the check every {check} steps")
        every = rs.spec.checkpoint.every_steps
        if every and rs.pos.global_step % every == 0 and not last:
            save(rs, f"every {every} steps")
        if rs.steps_done:
            break
    if rs.pos.step_in_epoch < steps:
        return False
    rs.pos.epoch, rs.pos.step_in_epoch = epoch + 1, 0
    return True


def advance(rs: RunState, interval: dict, i: int, global_batch: int) -> None:
    interval["steps"] += 1
    interval["images"] += global_batch
    rs.pos.global_step += 1
    rs.pos.step_in_epoch = i + 1
    rs.pos.images += global_batch


def maybe_evaluate(rs: RunState, epoch: int, epoch_done: bool) -> None:
    every, epochs = rs.spec.eval.every_epochs, rs.spec.schedule.epochs
    if not (epoch_done and every and ((epoch + 1) % every == 0 or epoch + 1 == epochs)):
        return
    if rs.val_loader is None:
        rs.val_loader = build_loader(rs.spec, rs.boot, "val", max(1, rs.loader_batch), rs.corrupt, rs.decoder)
    sync_buffers(rs.model)
    record_eval(rs, evaluate(rs.model, rs.val_loader, rs.amp_dtype), epoch)


def maybe_checkpoint(rs: RunState, epoch: int, epoch_done: bool) -> None:
    """At the end of every checkpoint.every_epochs epochs, except the last of this grid (finish saves that)."""
    every = rs.spec.checkpoint.every_epochs
    if (
        epoch_done
        and every
        and (epoch + 1) % every == 0
        and not (rs.steps_done or rs.grid_stages_done or epoch + 1 == rs.spec.schedule.end_epoch)
    ):
        save(rs, f"end of epoch {epoch}")


def stop_now(rs: RunState) -> None:
    """Every rank got here after the same step: checkpoint (when checkpoints are on) and stop."""
    c = rs.spec.checkpoint
    why = f"stopped by {rs.stop.signal or 'a signal on another rank'}"
    if (c.every_steps or c.every_epochs or c.at_end) and save(rs, why):
        why += f"; checkpoint at step {rs.pos.global_step}, continue with --resume"
    if rs.progress:
        rs.progress.say(why)
        if rs.progress.board:
            rs.progress.board.close()
    raise StopRequested(why)


def finish(rs: RunState) -> dict:
    """Close the loaders, check that the replicas agree, then save the last checkpoint and summary.json."""
    wall = rs.wall()
    for loader in (rs.loader, rs.val_loader):  # loader workers and DALI pipelines go now, not at exit
        if loader is not None:
            loader.close()
    rs.ddp.close()  # the exchange thread joined, the gradient hooks removed
    if rs.spec.checkpoint.at_end:
        save(rs, "end of training")  # checks the replicas before it writes
    else:
        sync_buffers(rs.model)
        check_replicas(rs, "the check at the end", buffers=True)
    rs.times.close()
    result = summary(rs, wall, param_digest(rs.model), True, rank_report(rs))
    if rs.rank0:
        try:
            APPENDER.flush()  # metrics.jsonl complete before summary.json says the run is done
            write_atomic(rs.out / "summary.json", (json.dumps(result, indent=1) + "\n").encode())
        except OSError as e:
            raise RunFailed(
                f"{e.filename or rs.out / 'summary.json'}: {e.strerror or e}; the final checkpoint is kept"
            ) from None
        rs.progress.say(summary_text(result))
        if rs.progress.board:
            rs.progress.board.close()
    return result
