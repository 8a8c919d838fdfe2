"""One rehearsed rank: ``python -m torus_train.plan.rehearse.rank --job J --rank R --trace T`` (imports torch).

The process joins torch's fake process group as rank R of the job's full world, binds a device as NCCL's
init_process_group(device_id=...) would (so the group calls take NCCL's split path), records every group and
collective it issues (record.py), plays the CUDA graph calls on the CPU (cuda.py), and runs the worker's real
path from there: the grid's groups, then train.loop.run_training (start-up, the start-up probes and their
consensus, every stage's steps, evaluation, checkpoints, and with --resume the resume). The phase of the run
each event belongs to comes from the loop's named calls, wrapped here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import pickle
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from torus_train.comm import consensus as consensus_module
from torus_train.comm.groups import GridGroups, build_grid_groups
from torus_train.data import stage
from torus_train.job.rank import Bootstrap, RankInfo
from torus_train.job.spec import JobSpec, spec_from_table
from torus_train.job.topology import Grid
from torus_train.plan.rehearse.cuda import CudaStandIn
from torus_train.plan.rehearse.record import Recorder, span_text
from torus_train.train import build, decoder, graphs, loop, state
from torus_train.train.stop import StopRequest

PHASES = {
    (loop, "start"): "start-up",
    (loop, "choose_decoder"): "start-up",
    (loop, "resume"): "resume",
    (loop, "switch_stage"): "stage switch",
    (loop, "maybe_evaluate"): "evaluation",
    (loop, "maybe_checkpoint"): "checkpoint",
    (loop, "save"): "checkpoint",
    (loop, "finish"): "finish",
}
"""The loop's named calls and the phase of the run their collectives belong to (run_epoch: 'steps (stage k)')."""

SLOW_HOST_WORK = {(build, "stage_on_node"): "staging the data set on the node"}
"""Host work that can outlast the process group's timeout on some ranks (rules.py checks what follows it)."""


def bind_device() -> contextlib.ExitStack:
    """The default group bound to a device, as NCCL's init_process_group(device_id=...) binds it: torch then
    splits communicators (dist.split_group) as it would on the cluster. Undone when the stack closes."""
    stack = contextlib.ExitStack()
    pg = dist.distributed_c10d._get_default_group()
    pg.bound_device_id = torch.device("cuda", 0)
    available = torch.accelerator.is_available
    torch.accelerator.is_available = lambda: True  # split_group asks before it takes the bound device's backend
    stack.callback(setattr, torch.accelerator, "is_available", available)
    return stack


def _in_phase(rec: Recorder, phase, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        before, rec.phase = rec.phase, phase(*args) if callable(phase) else phase
        try:
            return fn(*args, **kwargs)
        finally:
            rec.phase = before

    return wrapped


def _host_work(rec: Recorder, what: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        rec.note("host-work", what, slow=True)
        return fn(*args, **kwargs)

    return wrapped


def _store_barrier(rec: Recorder, fn):
    """data/stage.py's wait for every node's copy, on the rendezvous store: a wait with its own timeout."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        rec.note("store-barrier", "every node staged")
        return fn(*args, **kwargs)

    return wrapped


def _decision(rec: Recorder, fn):
    @functools.wraps(fn)
    def wrapped(why, device):
        found = fn(why, device)
        rec.note("decision", "consensus", ok=found.ok)
        return found

    return wrapped


def _stage_phase(rs, epoch) -> str:
    stage = rs.schedule.stage_at(epoch)
    return f"steps (stage {rs.schedule.stages.index(stage) + 1})"


def _delivered(fn):
    """state.hand_to_node as the cluster delivers it: a rank that receives its node leader's checkpoint bytes
    gets them (the fake backend moves nothing; the leader's bytes are the chosen file's)."""

    @functools.wraps(fn)
    def wrapped(ref, info, device="cpu"):
        out = fn(ref, info, device)
        return out if ref.data is not None else dataclasses.replace(out, data=out.path.read_bytes())

    return wrapped


def install_phases(rec: Recorder) -> contextlib.ExitStack:
    """The loop's named calls wrapped to set the recorder's phase; the probes' consensus and the slow host work
    recorded as events. Undone when the stack closes."""
    stack = contextlib.ExitStack()

    def patch(owner, name, value):
        stack.callback(setattr, owner, name, getattr(owner, name))
        setattr(owner, name, value)

    for (owner, name), phase in PHASES.items():
        patch(owner, name, _in_phase(rec, phase, getattr(owner, name)))
    patch(loop, "run_epoch", _in_phase(rec, _stage_phase, loop.run_epoch))
    probe = _in_phase(rec, lambda *a: rec.phase + ": graph probe", graphs.StepGraph._probe)

    def noted_probe(*args, **kwargs):
        rec.note("probe", "graph probe")
        return probe(*args, **kwargs)

    patch(graphs.StepGraph, "_probe", noted_probe)
    for (owner, name), what in SLOW_HOST_WORK.items():
        patch(owner, name, _host_work(rec, what, getattr(owner, name)))
    patch(state, "hand_to_node", _delivered(state.hand_to_node))
    patch(stage.NodesWait, "wait", _store_barrier(rec, stage.NodesWait.wait))
    for owner in (loop, decoder, consensus_module):
        patch(owner, "consensus", _decision(rec, consensus_module.consensus))
    return stack


def rehearse_rank(job: dict, rank: int, trace: Path, oracle: Path) -> None:
    spec, grid = spec_from_table(job["spec"]), Grid(*job["grid"])
    sent = pickle.loads(oracle.read_bytes()) if rank != 0 and oracle.exists() else None
    rec = Recorder(rank, grid.size, sent)
    standin = CudaStandIn(rec)
    rec.install()
    standin.install()
    try:
        with install_phases(rec):
            boot = bootstrap(spec, grid, rank)
            note_grid_groups(rec, boot.groups)
            with bind_device():
                loop.run_training(spec, boot, spec.out_dir, bool(job.get("resume")), StopRequest())
    finally:
        standin.uninstall()
        rec.uninstall()
        rec.save(trace)
        if rank == 0:
            rec.save_oracle(oracle)
        if dist.is_initialized():
            dist.destroy_process_group()


def bootstrap(spec: JobSpec, grid: Grid, rank: int) -> Bootstrap:
    """ranks/distributed.init_distributed as NCCL's branch takes it, on the fake backend."""
    dist.init_process_group(
        "fake", store=FakeStore(), rank=rank, world_size=grid.size, timeout=timedelta(seconds=spec.comm.timeout_s)
    )
    per_node = grid.gpus_per_node or 1
    info = RankInfo(rank, grid.size, rank % per_node, per_node, "rehearsal")
    with bind_device():
        groups = build_grid_groups(grid, timeout=spec.comm.timeout_s)
    return Bootstrap(info, grid, torch.device("cpu"), "nccl", groups)


def note_grid_groups(rec: Recorder, groups: GridGroups) -> None:
    """This rank's row and column groups as torch made them, beside the grid's row and column (the grid-groups
    rule), at the job's full world size, which the multi-process tests (4 to 6 ranks) never build."""
    grid = groups.grid
    for side, index, group, want in (
        ("row", groups.row, groups.row_group, grid.row_ranks(groups.row)),
        ("column", groups.col, groups.col_group, grid.col_ranks(groups.col)),
    ):
        got = dist.get_process_group_ranks(group) if group is not None else [groups.rank]
        rec.note(
            "grid-group",
            f"{side} group",
            where="comm/groups.py build_grid_groups",
            side=side,
            index=index,
            got=span_text(got),
            want=span_text(want),
            ok=got == want,
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m torus_train.plan.rehearse.rank")
    ap.add_argument("--job", required=True, help="the rehearsal's job.json (plan/rehearse/__init__.py)")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--trace", required=True, help="where the trace goes (JSON)")
    ap.add_argument(
        "--oracle", required=True, help="rank 0's object broadcasts (written by rank 0, read by the others)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=f"rank{args.rank} %(levelname)s %(message)s")
    job = json.loads(Path(args.job).read_text())
    rehearse_rank(job, args.rank, Path(args.trace), Path(args.oracle))


if __name__ == "__main__":
    main()
