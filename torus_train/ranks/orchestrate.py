"""`torus-train run`'s job, from a validated spec to its summary (no torch import: torch runs in the ranks).

``run_job`` is the one call: it checks the user's paths, chooses the output folder, cuts the job into legs
(consecutive stages on one grid, job/legs.py), plans the first leg's launch and runs the preflight. A dry run
ends there with its report (job/dryrun.py). Otherwise the data is prepared once (demo set, index), and each
leg's ranks are launched (ranks/runner.py); after a failure that a restart may cure they are started again
from the latest checkpoint while ``--max-restarts`` lasts, and with ``--elastic`` a node that fails twice in a
row is dropped (job/elastic.py). Lines of the run's story go to stdout, restarts and failures to stderr
(docs/run.md, docs/faults.md).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from torus_train.errors import RunFailed, UserError
from torus_train.job import gpus
from torus_train.job.dryrun import dry_run_report
from torus_train.job.elastic import shrink
from torus_train.job.launch import fixed_grid, inside_launched_rank, plan_launch, usable_cpus
from torus_train.job.legs import leg_at, leg_spec, legs_text, plan_legs
from torus_train.job.noise import NoisePoint, learnability_lines
from torus_train.job.sources import source_of
from torus_train.job.spec import JobSpec
from torus_train.job.work import train_images
from torus_train.ranks.bootstrap import free_port, rank_info
from torus_train.ranks.claim import claim_out, job_of
from torus_train.ranks.diagnosis import RanksFailed, command_failed, reset_rank_files
from torus_train.ranks.preflight import preflight
from torus_train.ranks.rundir import (
    check_out,
    check_user_paths,
    choose_out,
    continues_attempt,
    latest_checkpoint_text,
    prepare_out,
    read_summary,
    record_attempt,
    resume_epoch,
    resume_starts,
    write_hosts,
    write_job,
)
from torus_train.ranks.runner import echo_err, run_command, run_local
from torus_train.ranks.watchdog import new_watch, watchdog_limits
from torus_train.ranks.worker import execute


@dataclass(frozen=True)
class RunOptions:
    """How `run` treats the job beyond its spec (the command line's flags)."""

    resume: bool = False
    """Continue from the latest complete checkpoint in the output folder."""
    overwrite: bool = False
    """Delete earlier results in the output folder first."""
    dry_run: bool = False
    """Plan and check only; start nothing."""
    max_restarts: int = 0
    """Restarts from the latest checkpoint after failures that a restart may cure, over the whole job."""
    elastic: bool = False
    """Drop a node whose ranks failed in two attempts in a row and continue on the others."""
    noise: tuple[list[NoisePoint], str] | None = None
    """A finished run's measured noise scale and its name (--noise-from): the dry run predicts each stage's
    efficiency from it."""


@dataclass
class JobResult:
    """What `run_job` ends with (a failure raises UserError or RunFailed instead)."""

    out: Path
    """The output folder."""
    summary: dict | None = None
    """summary.json of a finished job (its replicas agreed); None for a dry run or a rank started by hand."""
    dry_run: str | None = None
    """The dry run's report."""
    problem: UserError | None = None
    """What the preflight refused in a dry run (the report shows the whole plan first)."""


def say(text: str) -> None:
    """A line of the run's story on stdout, where rank 0's progress lines go too."""
    print(text, flush=True)


def run_job(spec: JobSpec, options: RunOptions) -> JobResult:
    """Plan, check and run the job (docs/run.md); a dry run returns its report. Started as one rank of
    mpirun/srun by hand (`mpirun -n 4 torus-train run`), this process trains as that rank."""
    resume, overwrite, dry_run = options.resume, options.overwrite, options.dry_run
    check_user_paths(spec)
    if not dry_run and spec.launch.launcher == "auto" and inside_launched_rank(dict(os.environ)):
        run_as_rank(spec, resume, overwrite)
        return JobResult(Path(spec.job.out))
    out = choose_out(spec, resume, overwrite)
    if out != spec.out_dir.resolve() and not dry_run:
        say(
            f"{spec.out_dir.resolve()} holds an earlier run; writing this one to {out} (--out to choose, "
            "--resume to continue)"
        )
    spec.job.out = str(out)
    legs = plan_legs(spec, resume_starts(out) if resume else ())
    first = leg_at(legs, resume_epoch(out)) if resume else 0
    first_spec = leg_spec(spec, legs[first])
    plan = make_plan(first_spec, out / "job.json", strict=not dry_run)
    try:
        checked = run_preflight(spec, legs, first, plan, out, options.elastic, options.max_restarts, dry_run)
    except UserError as e:
        if dry_run:  # the whole plan first, then what stops it
            return JobResult(out, dry_run=dry_run_report(first_spec, plan, legs, problem=e), problem=e)
        raise
    if dry_run:
        return JobResult(out, dry_run=dry_run_report(first_spec, plan, legs, checked, noise=options.noise))
    claim = claim_out(out)  # one run per folder, held until this process ends (ranks/claim.py)
    try:
        check_out(out, resume, overwrite)  # refused before the data is prepared; nothing removed yet
        prepare_data(spec, log=echo_err)  # a data fault found here leaves the output folder as it was
        prepare_out(out, resume, overwrite)
        run_legs(spec, legs, first, plan, out, resume, Restarts(options.max_restarts, options.elastic))
        return JobResult(out, summary=read_summary(out))
    finally:
        claim.release()


@dataclass
class Restarts:
    """The job's restart budget (--max-restarts), shared by its legs."""

    allowed: int
    elastic: bool = False
    used: int = 0
    last_node: int | None = None
    """The node of the previous failure's root-cause rank (--elastic drops a node that fails twice in a row)."""


def run_preflight(
    spec: JobSpec, legs, first: int, plan, out: Path, elastic: bool, max_restarts: int, dry_run: bool
) -> list[str]:
    """torus_train.ranks.preflight over the job, reusing the first leg's plan; the report lines."""

    def plan_of(lspec: JobSpec, strict: bool):
        return make_plan(lspec, out / "job.json", strict)

    return preflight(spec, legs, first, plan, plan_of, elastic, max_restarts, strict=not dry_run)


def make_plan(spec: JobSpec, job_file: Path, strict: bool):
    return plan_launch(
        spec,
        dict(os.environ),
        job_file=str(job_file),
        python=sys.executable,
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        master_port=free_port(),
        cpu_count=usable_cpus(),
        local_gpus=gpus.rank_gpus(spec.comm.backend, gpus.local_gpu_count()),
        strict=strict,
    )


def prepare_data(spec: JobSpec, log=None) -> None:
    """Once, before any rank starts, what the data source needs (job/sources.py): the demo set generated, a
    data folder's index built (when missing) and checked (the ranks are handed its place in spec.data.index),
    or a packed set's index and shards checked."""
    source_of(spec.data.source).prepare_data(spec, log)


def run_legs(spec: JobSpec, legs, first: int, plan, out: Path, resume: bool, restarts: Restarts) -> None:
    """Each leg (the stages on one grid) in turn: its ranks stop at its end with a checkpoint and the next
    leg's ranks start on their grid from it (docs/faults.md, "Moving a job between grids"). Where the
    schedule's control decided a stage start, the legs left are planned again from the checkpoint's starts."""
    i = first
    while True:
        lspec = leg_spec(spec, legs[i])
        if i > first:
            plan = make_plan(lspec, out / "job.json", strict=True)
            say(
                f"grid stage: epochs {resume_epoch(out)}-{legs[i].until_epoch} on {plan.world_size} ranks, "
                f"grid {plan.grid}, from {latest_checkpoint_text(out)}"
            )
        schedule = lspec.schedule.at(plan.world_size)
        write_job(out / "job.json", lspec, plan.grid, resume or i > first, regrid=len(legs) > 1)
        if i == first:
            announce(lspec, plan, schedule, out)
            if len(legs) > 1:
                say(f"grid stages: {legs_text(legs)}; the launcher checkpoints and moves the job at each change")
        launch_with_restarts(lspec, plan, out, restarts)
        if (legs[i].last and not lspec.schedule.stop_stage) or leg_finished_run(spec, out):
            break
        done, legs = resume_epoch(out), plan_legs(spec, resume_starts(out))
        if done >= spec.schedule.end_epoch:
            break
        if leg_at(legs, done) <= i:
            raise RunFailed(f"grid stage {i + 1} ended at epoch {done} without moving the job to the next grid")
        i = leg_at(legs, done)


def leg_finished_run(spec: JobSpec, out: Path) -> bool:
    """After a leg: the replicas agreed (else RunFailed) and whether schedule.steps already ended the run."""
    s = read_summary(out)
    return bool(spec.schedule.steps) and s.get("steps", 0) >= spec.schedule.steps


def announce(spec: JobSpec, plan, schedule, out: Path) -> None:
    g = plan.grid
    say(
        f"torus-train run: {g.size} rank{'s' if g.size > 1 else ''} on grid {g} ({g.x} per row, {g.y} per column), "
        f"{plan.launcher} launcher ({plan.why}); comm {spec.comm.algo}; output {out}"
    )
    for note in plan.notes:
        say(note)
    say(schedule.table())
    for line in learnability_lines(spec, schedule, train_images(spec)[0]):
        say(line)


def launch(spec: JobSpec, plan, out: Path) -> None:
    if plan.entry.runs_here:
        run_local(plan, out, echo_err, *watchdog_limits(spec))
        return
    say(f"$ {plan.command_text()}")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    reset_rank_files(out, range(plan.world_size))
    try:
        run_command(plan.argv, plan.env, plan.launcher, out, plan.world_size, new_watch(*watchdog_limits(spec)))
    except RanksFailed:
        raise
    except RunFailed as e:
        raise command_failed(e, out, plan.world_size, plan.entry, host_of(plan)) from None


def host_of(plan):
    """rank -> the host the plan put it on (ranks fill the hosts in order, grid.gpus_per_node each)."""
    per, hosts = plan.grid.gpus_per_node, [h.name for h in plan.hosts]
    return lambda rank: hosts[rank // per] if per and 0 <= rank // per < len(hosts) else ""


def launch_with_restarts(spec: JobSpec, plan, out: Path, restarts: Restarts) -> None:
    """Launch; after a failure that a restart may cure, start the ranks again from the latest checkpoint while
    the budget lasts, saying so. A failure before any rank finished a step is a start-up failure and is never
    restarted (the same start would fail again). With --elastic a node that fails twice in a row is dropped."""
    while True:
        try:
            return launch(spec, plan, out)
        except RanksFailed as e:
            if not restarts.allowed:
                raise
            why_not = no_restart(e, restarts.used, restarts.allowed)
            if why_not:
                raise RanksFailed(f"{e}; {why_not}", e.rank, e.step) from None
            restarts.used += 1
            beat = f" (last heartbeat at step {e.step})" if e.step >= 0 else ""
            echo_err(f"{e.how}{beat}; restart {restarts.used} of {restarts.allowed} from {latest_checkpoint_text(out)}")
            spec = maybe_drop_node(spec, plan, out, restarts, e.rank)
            plan = make_plan(spec, out / "job.json", strict=True)  # locally: a fresh rendezvous port
            write_job(out / "job.json", spec, plan.grid, resume=True, regrid=True)


def maybe_drop_node(spec: JobSpec, plan, out: Path, restarts: Restarts, rank: int) -> JobSpec:
    """--elastic: the spec without the failed rank's node when that node also failed last time (under mpirun
    and srun its host leaves the host list: OUT/hosts.elastic, the job's hosts from now on)."""
    grid = plan.grid
    node = rank // grid.gpus_per_node
    if not restarts.elastic or rank < 0 or node != restarts.last_node or grid.nodes < 2:
        restarts.last_node = node
        return spec
    host = plan.hosts[node].name if not plan.entry.runs_here and node < len(plan.hosts) else ""
    spec, line = shrink(spec, grid, node, host)
    if host:  # mpirun: --hostfile, srun: --nodelist from it
        spec.launch.hostfile = str(write_hosts([h for h in plan.hosts if h.name != host], out / "hosts.elastic"))
    restarts.last_node = None
    echo_err(line)
    return spec


def no_restart(e, attempt: int, max_restarts: int) -> str:
    """Why a failure is not restarted ('' when it is)."""
    if e.rank < 0:
        return "not restarted: the launcher was interrupted"
    if not e.restartable:
        return "not restarted: this failure would repeat (bad input, a full disk, a requested stop or a failed check)"
    if not e.progressed:
        return "not restarted: no rank finished a step in this attempt (a start-up failure)"
    if attempt >= max_restarts:
        return f"gave up after {max_restarts} restart(s)"
    return ""


def run_as_rank(spec: JobSpec, resume: bool, overwrite: bool) -> None:
    """`mpirun -n 4 torus-train run ...`: this process is one rank; rank 0 prepares the output folder."""
    if len(plan_legs(spec)) > 1:
        raise UserError(
            "schedule.stages name more than one grid: start the job with `torus-train run` (it moves "
            "the job between grids), not as ranks of mpirun/srun"
        )
    info = rank_info()
    spec.grid.gpus = spec.grid.gpus or info.world_size
    if spec.grid.gpus != info.world_size:
        raise UserError(f"grid.gpus: {spec.grid.gpus} but the launcher started {info.world_size} ranks")
    if not spec.grid.gpus_per_node:
        spec.grid.gpus_per_node = info.local_world_size
    grid = fixed_grid(spec)
    spec.schedule.at(info.world_size)
    out = spec.out_dir.resolve()
    spec.job.out = str(out)
    if info.rank == 0:  # the job's claim on OUT, held by rank 0 until it exits (execute ends the process)
        claim_out(out, job=job_of(os.environ))
    # `torchrun --max-restarts`: a later attempt continues the folder an earlier attempt of its own job prepared,
    # from its latest checkpoint (or from the start when there is none yet), as `run --max-restarts` does; one
    # whose job never prepared it (the first attempt refused it, or failed before) makes the first attempt's checks
    continues = continues_attempt(out, os.environ)
    if info.rank == 0 and not continues:  # the others wait for it in the rendezvous
        prepare_out(out, resume, overwrite)
        prepare_data(spec)
        if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: what a restart may continue
            record_attempt(out, os.environ)
    if continues:  # its own marks of the earlier attempt (a .failed would call this one failed)
        reset_rank_files(out, [info.rank])
    execute(spec, grid, resume or continues)
