"""`torus-train plan rehearse`: the whole job at its full world size, rank by rank, on this machine's CPU.

    result = rehearse(RehearsalRequest(spec, ranks=[0, 31, 32, 1087, 2175], folder=F), echo)

Each chosen rank runs the worker's real path in a process of its own (plan/rehearse/rank.py) as that rank of
the job's full world on torch's fake backend, taking the branch the spec's backend takes on the cluster (NCCL:
split groups, the exchange's three collectives, the graphed step with its probes), and records every group it
makes and every collective it issues. The run is the spec's, made short: synthetic images of a small side, one
epoch per stage with as many images as STEPS_PER_STAGE largest global batches (the graphed step's warm-up,
probe and replays in every stage),
an evaluation and a checkpoint after every epoch. Two legs: the first stops after one step (and saves), the
second resumes from that checkpoint and runs to the end. Rank 0 runs first in each leg; what it broadcasts as
objects is handed to the others (record.py). rules.py then checks the traces against NCCL's rules and the costs
that grow with the world; report.py prints a table per phase and one verdict.

What it cannot show: time, the network, NCCL's own algorithms, channels and memory (estimated from its
documented defaults), or data that only exists on the cluster (docs/rehearse.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from torus_train.errors import RunFailed, UserError
from torus_train.job.models import input_size_problem
from torus_train.job.spec import JobSpec
from torus_train.job.topology import Grid, check_grid_size, parse_grid
from torus_train.plan.rehearse.rules import check_traces
from torus_train.plan.rehearse.summary import communicator_counts, phase_table
from torus_train.usernumbers import int_of

IMAGE_SIZE = 32
"""Rehearsed images are this many pixels a side: the model and its parameters are the job's, the arithmetic small."""
STEPS_PER_STAGE = 5
"""Steps of the last stage (earlier, smaller batches take more): the graphed step's 3 warm-up steps, its probe
and one replay (train/graphs.py)."""
LEGS = ("straight", "resumed")
RANK_TIMEOUT_S = 900.0


@dataclass
class RehearsalRequest:
    spec: JobSpec
    ranks: list[int]
    folder: Path
    """Where the rehearsal's run, traces and logs go (a fresh folder)."""
    image_size: int = IMAGE_SIZE
    parallel: int = 2
    """Rehearsed ranks run this many at a time (after rank 0)."""
    gpu_memory_gib: float = 16.0
    """The GPU memory the communicators' buffers are weighed against (V100: 16)."""
    extra_env: dict = field(default_factory=dict)


def job_grid(spec: JobSpec) -> Grid:
    """The spec's grid; UserError when the spec names none (the rehearsal needs the full world)."""
    if not spec.grid.grid:
        raise UserError(
            "plan rehearse: the spec has no grid.grid (e.g. grid = \"32x68\"); the rehearsal plays its ranks"
        )
    g = parse_grid(spec.grid.grid)  # load_spec checked it, naming grid.grid
    if spec.grid.gpus:  # as `run` refuses it: the world is grid.gpus ranks, and the grid must hold them
        check_grid_size(g, spec.grid.gpus, "grid.gpus")
    return Grid(g.x, g.y, spec.grid.gpus_per_node or 1)


def check_image_size(spec: JobSpec, image_size: int) -> None:
    """Before any rank starts: the job's model takes the rehearsal's images (the run's preflight check,
    naming --image-size); otherwise every rank would fail in its first forward pass."""
    problem = input_size_problem(spec.model.arch, image_size, "--image-size")
    if problem:
        raise UserError(problem)


def parse_ranks(text: str, world: int) -> list[int]:
    """'0,31,32' -> [0, 31, 32] (rank 0 always included: it runs first); UserError naming a bad entry."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UserError(
            f"--ranks {text!r}: names no rank; give ranks of this world (0 to {world - 1}), e.g. 0,{world - 1}"
        )
    return sorted({int_of(part, "--ranks", 0, world - 1) for part in parts} | {0})


def rehearsal_table(spec: JobSpec, world: int, image_size: int, out: Path) -> dict:
    """The spec as rehearsed: same model, grid, algorithm, precision, optimizer and stage batches; synthetic
    images, one epoch per stage, evaluation and checkpoint every epoch."""
    t = spec.to_dict()
    stages = t["schedule"]["stages"]
    biggest = max(st.global_batch for st in spec.schedule.at(world).stages)
    for i, s in enumerate(stages):
        s["until_epoch"] = i + 1
        s.pop("grid", None)
    t["schedule"].update(epochs=len(stages), warmup_epochs=0, steps=0)
    samples = biggest * STEPS_PER_STAGE
    t["data"].update(source="synthetic", synthetic_samples=samples, image_size=image_size, loader="auto")
    t["eval"]["every_epochs"] = 1
    t["checkpoint"].update(every_epochs=1, every_steps=0, at_end=True)
    t["job"]["out"] = str(out)
    return t


def rehearse(req: RehearsalRequest, echo: Callable[[str], None]) -> dict:
    """Both legs for every chosen rank, the rules over their traces, the table; RunFailed when a rank's
    rehearsal failed (its log named)."""
    grid = job_grid(req.spec)
    check_image_size(req.spec, req.image_size)
    req.folder.mkdir(parents=True, exist_ok=True)
    table = rehearsal_table(req.spec, grid.size, req.image_size, req.folder / "run")
    (req.folder / "run" / "logs").mkdir(parents=True, exist_ok=True)  # as `run` makes it before the ranks start
    t0 = time.perf_counter()
    traces: dict[str, dict[int, dict]] = {}
    for leg in LEGS:
        traces[leg] = _run_leg(req, grid, table, leg, echo)
    seconds = time.perf_counter() - t0
    findings = [f | {"leg": leg} for leg in LEGS for f in check_traces(traces[leg], req.gpu_memory_gib)]
    tables = {leg: phase_table(traces[leg]) for leg in LEGS}
    rehearsed = len(req.ranks)
    return {
        "spec": req.spec.job.name,
        "grid": str(grid),
        "world": grid.size,
        "ranks": req.ranks,
        "image_size": req.image_size,
        "legs": list(LEGS),
        "seconds": round(seconds, 1),
        "seconds_per_rank": round(seconds / rehearsed, 1),
        "phases": tables,
        "communicators": {leg: communicator_counts(traces[leg]) for leg in LEGS},
        "findings": findings,
        "ok": not findings,
        "folder": str(req.folder),
    }


def _run_leg(req: RehearsalRequest, grid: Grid, table: dict, leg: str, echo: Callable[[str], None]) -> dict[int, dict]:
    resume = leg == "resumed"
    leg_table = json.loads(json.dumps(table))
    if not resume:
        leg_table["schedule"]["steps"] = 1
    job = req.folder / f"job-{leg}.json"
    job.write_text(json.dumps({"spec": leg_table, "grid": [grid.x, grid.y, grid.gpus_per_node], "resume": resume}))
    oracle = req.folder / f"oracle-{leg}.pkl"
    oracle.unlink(missing_ok=True)
    checkpoints, kept = Path(leg_table["job"]["out"]) / "checkpoints", req.folder / "checkpoints-before"
    if resume:  # the others resume from what rank 0 resumed from (rank 0 writes, and prunes, the checkpoints)
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(checkpoints, kept)
    done = {0: _run_rank(req, job, leg, 0, oracle, echo)}
    if resume:
        shutil.rmtree(checkpoints)
        shutil.copytree(kept, checkpoints)
    with ThreadPoolExecutor(max_workers=max(1, req.parallel)) as pool:
        rest = [r for r in req.ranks if r != 0]
        for r, trace in zip(rest, pool.map(lambda r: _run_rank(req, job, leg, r, oracle, echo), rest), strict=True):
            done[r] = trace
    return done


def _run_rank(req: RehearsalRequest, job: Path, leg: str, rank: int, oracle: Path, echo: Callable[[str], None]) -> dict:
    trace, log = req.folder / f"trace-{leg}-rank{rank}.json", req.folder / f"rank{rank}-{leg}.log"
    # NAME=VALUE: a --keep folder named "-1" must not read as an option to the rank's parser
    cmd = [sys.executable, "-m", "torus_train.plan.rehearse.rank", f"--job={job}", f"--rank={rank}"]
    cmd += [f"--trace={trace}", f"--oracle={oracle}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORUS_TRAIN_SLOW_TESTS": "", **req.extra_env}
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=RANK_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = -1
    if code != 0 or not trace.exists():
        last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["(no output)"]
        raise RunFailed(f"plan rehearse: rank {rank} ({leg} leg) failed: {last[0][:300]} (log: {log})")
    doc = json.loads(trace.read_text())
    echo(f"# rehearsed rank {rank} ({leg}): {len(doc['events'])} events in {time.perf_counter() - t0:.1f} s")
    return doc
