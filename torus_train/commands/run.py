"""`torus-train run`: job spec + flags -> launch plan -> ranks -> training (torch only inside the ranks)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from torus_train.errors import RunFailed, UserError
from torus_train.job.launchers import choices as launcher_choices
from torus_train.job.spec import JobSpec, load_spec, parse_override
from torus_train.job.sources import choices_text, source_of

# CLI flag -> dotted spec field.
FLAG_FIELDS = {
    "gpus": "grid.gpus", "grid": "grid.grid", "gpus_per_node": "grid.gpus_per_node",
    "launcher": "launch.launcher", "hostfile": "launch.hostfile", "container": "launch.container",
    "data": "data.source", "model": "model.arch", "image_size": "data.image_size",
    "steps": "schedule.steps", "epochs": "schedule.epochs", "out": "job.out",
}
RESULT_FILES = ("summary.json", "metrics.jsonl", "checkpoints", "tensorboard")
RUN_ENTRIES = {*RESULT_FILES, "logs", "job.json", "job.tmp", "hosts.elastic", "report.png", "report.json"}
"""Everything a run writes at the top of its output folder: a folder holding anything else is not a run's."""


@click.command("run")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), default=None,
              help="Job spec (TOML). Default: the embedded demo job (2 ranks on 2x1, demo data).")
@click.option("--gpus", type=int, default=None,
              help="World size N (grid.gpus); without --grid a grid is chosen for N.")
@click.option("--grid", default=None, help="XxY: X ranks per row (horizontal ring), Y per column.")
@click.option("--gpus-per-node", type=int, default=None,
              help="Ranks per node (grid.gpus_per_node); 0 = detect: all ranks on this machine for the local "
                   "launcher, the slots of the first host under mpirun or srun.")
@click.option("--launcher", type=click.Choice(launcher_choices()), default=None,
              help="How ranks start (launch.launcher).")
@click.option("--hostfile", default=None, help="OpenMPI hostfile ('host slots=K') or PBS node file.")
@click.option("--container", default=None, help="Singularity/Apptainer image every rank runs in.")
@click.option("--data", default=None, help=f"{choices_text()} (data.source).")
@click.option("--model", default=None, help="torchvision architecture (model.arch), e.g. resnet50, or the house resnet18_w32.")
@click.option("--image-size", type=int, default=None, help="Training crop side (data.image_size).")
@click.option("--steps", type=int, default=None, help="Stop after this many optimizer steps (schedule.steps).")
@click.option("--epochs", type=int, default=None, help="Epochs to train (schedule.epochs).")
@click.option("--out", default=None, help="Output folder (job.out). Default: runs/<job.name>.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Set any spec field, e.g. --set comm.algo=flat (repeatable).")
@click.option("--resume", is_flag=True, help="Continue from the latest complete checkpoint in the output folder.")
@click.option("--overwrite", is_flag=True, help="Delete earlier results in the output folder first.")
@click.option("--dry-run", is_flag=True, help="Print the resolved spec, grid, command and batch table; start nothing.")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=0, show_default=True,
              help="When ranks fail after training started, start them again from the latest checkpoint, up to "
                   "N times (not for bad input, a requested stop or a failed check; docs/faults.md).")
@click.option("--elastic", is_flag=True,
              help="A node whose ranks fail in two attempts in a row is dropped and the job continues on the "
                   "others (same global batch and LR schedule); uses the --max-restarts budget.")
def run(spec_path, sets, resume, overwrite, dry_run, max_restarts, elastic, **flags) -> None:
    """Train on N ranks laid out as an XxY grid, exchanging gradients with the 2D-torus all-reduce.

    \b
    torus-train run                                   # the demo job: 2 local ranks on 2x1
    torus-train run --gpus 4                          # the same on 4 ranks (a grid is chosen: 2x2)
    torus-train run --gpus 4 --grid 2x2 --data synthetic --model resnet18 --image-size 64 --steps 30
    torus-train run --spec job.toml --hostfile hosts.txt --dry-run
    """
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    overrides = [(FLAG_FIELDS[k], v) for k, v in flags.items() if v is not None]
    overrides += [parse_override(s) for s in sets]
    spec = load_spec(spec_path, overrides)
    fit_grid_to_flags(spec, spec_path, {f for f, _ in overrides})
    check_user_paths(spec)

    from torus_train.job.launch import inside_launched_rank
    from torus_train.job.legs import leg_at, leg_spec, plan_legs

    if not dry_run and spec.launch.launcher == "auto" and inside_launched_rank(dict(os.environ)):
        return _run_as_rank(spec, resume, overwrite)
    out = choose_out(spec, resume, overwrite)
    if out != spec.out_dir.resolve() and not dry_run:
        click.echo(f"{spec.out_dir.resolve()} holds an earlier run; writing this one to {out} (--out to choose, "
                   "--resume to continue)")
    spec.job.out = str(out)
    legs = plan_legs(spec)
    first = leg_at(legs, resume_epoch(out)) if resume else 0
    first_spec = leg_spec(spec, legs[first])
    plan = make_plan(first_spec, out / "job.json", strict=not dry_run)
    try:
        checked = run_preflight(spec, legs, first, plan, out, elastic, max_restarts, dry_run)
    except UserError as e:
        if dry_run:  # the whole plan first, then what stops it
            dry_run_report(first_spec, plan, legs, problem=e)
        raise
    if dry_run:
        return dry_run_report(first_spec, plan, legs, checked)
    prepare_out(out, resume, overwrite)
    from torus_train.ranks.supervisor import echo_err

    prepare_data(spec, log=echo_err)
    run_legs(spec, legs, first, plan, out, resume, Restarts(max_restarts, elastic))
    check_outcome(out)


def fit_grid_to_flags(spec: JobSpec, spec_path: str | None, given: set[str]) -> None:
    """A world size or grid given on the command line wins over the spec's other half: --gpus N alone drops
    a spec grid of another size (one is chosen for N), --grid XxY alone drops a spec grid.gpus of another
    size. Said when the dropped value came from the user's spec file."""
    from torus_train.job.topology import parse_grid

    if not spec.grid.grid or not spec.grid.gpus:
        return
    size = parse_grid(spec.grid.grid).size
    if size == spec.grid.gpus:
        return
    if "grid.gpus" not in given and "grid.grid" not in given:  # both from the spec: name its fields, not flags
        raise UserError(f"{spec_path or 'the spec'}: grid.grid = {spec.grid.grid} is {size} ranks but grid.gpus = "
                        f"{spec.grid.gpus}; make them agree, or remove one of them")
    if ("grid.gpus" in given) == ("grid.grid" in given):
        return
    if "grid.gpus" in given:
        dropped, spec.grid.grid = f"grid.grid = {spec.grid.grid}", ""
    else:
        dropped, spec.grid.gpus = f"grid.gpus = {spec.grid.gpus}", 0
    if spec_path:
        click.echo(f"{spec_path}: {dropped} does not fit the command line's "
                   f"{'--gpus' if 'grid.gpus' in given else '--grid'}; ignored")


@dataclass
class Restarts:
    """The job's restart budget (--max-restarts), shared by its legs."""

    allowed: int
    elastic: bool = False
    used: int = 0
    last_node: int | None = None
    """The node of the previous failure's root-cause rank (--elastic drops a node that fails twice in a row)."""


def run_preflight(spec: JobSpec, legs, first: int, plan, out: Path, elastic: bool, max_restarts: int,
                  dry_run: bool) -> list[str]:
    """torus_train.ranks.preflight over the job, reusing the first leg's plan; the report lines."""
    from torus_train.ranks.preflight import preflight

    def plan_of(lspec: JobSpec, strict: bool):
        return make_plan(lspec, out / "job.json", strict)

    return preflight(spec, legs, first, plan, plan_of, elastic, max_restarts, strict=not dry_run)


def run_legs(spec: JobSpec, legs, first: int, plan, out: Path, resume: bool, restarts: Restarts) -> None:
    """Each leg (the stages on one grid) in turn: its ranks stop at its end with a checkpoint and the next
    leg's ranks start on their grid from it (docs/faults.md, "Moving a job between grids")."""
    from torus_train.job.legs import leg_spec, legs_text

    for i in range(first, len(legs)):
        lspec = leg_spec(spec, legs[i])
        if i > first:
            plan = make_plan(lspec, out / "job.json", strict=True)
            click.echo(f"grid stage: epochs {legs[i].start_epoch}-{legs[i].until_epoch} on {plan.world_size} ranks, "
                       f"grid {plan.grid}, from {latest_checkpoint_text(out)}")
        schedule = lspec.schedule.at(plan.world_size)
        write_job(out / "job.json", lspec, plan.grid, resume or i > first, regrid=len(legs) > 1)
        if i == first:
            announce(lspec, plan, schedule, out)
            if len(legs) > 1:
                click.echo(f"grid stages: {legs_text(legs)}; the launcher checkpoints and moves the job at each change")
        launch_with_restarts(lspec, plan, out, restarts)
        if not legs[i].last and leg_finished_run(spec, out):
            break


def leg_finished_run(spec: JobSpec, out: Path) -> bool:
    """After a leg: the replicas agreed (else RunFailed) and whether schedule.steps already ended the run."""
    s = read_summary(out)
    return bool(spec.schedule.steps) and s.get("steps", 0) >= spec.schedule.steps


def resume_epoch(out: Path) -> int:
    """The epoch of the newest checkpoint's manifest (0 when there is none or it cannot be read); it picks
    the leg to start with, the ranks verify and agree on the checkpoint themselves."""
    from torus_train.train.checkpoint import list_checkpoints

    found = list_checkpoints(out / "checkpoints")
    try:
        return int(json.loads(found[0][1].read_text()).get("epoch", 0)) if found else 0
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def check_user_paths(spec: JobSpec) -> None:
    """Before anything is planned or launched: the output folder can be made and the hostfile is readable
    UTF-8 text; each problem is one UserError naming the flag and the path."""
    from torus_train.errors import check_output_folder, shown_path

    flag = "--out" if spec.job.out else "job.name"
    check_output_folder(spec.out_dir, flag)
    check_not_foreign(spec.out_dir, flag)
    if spec.launch.hostfile:
        hf = spec.launch.hostfile
        try:
            Path(hf).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"--hostfile {shown_path(hf)}: not UTF-8 text (byte {e.start})") from None
        except FileNotFoundError:
            raise UserError(f"--hostfile {shown_path(hf)}: no such file") from None
        except OSError as e:
            raise UserError(f"--hostfile {shown_path(hf)}: {e.strerror or e}") from None


def check_not_foreign(out: Path, flag: str) -> None:
    """A run writes job.json, logs/ and its results into its output folder: a folder that holds anything else
    (the user's own files) is refused, so that nothing there is overwritten or mixed with a run."""
    from torus_train.errors import shown_path

    try:
        entries = sorted(os.listdir(out)) if out.is_dir() else []
    except OSError as e:
        raise UserError(f"{flag} {shown_path(out)}: {e.strerror or e}") from None
    foreign = [e for e in entries if e not in RUN_ENTRIES]
    if foreign:
        raise UserError(f"{flag} {shown_path(out)}: the folder holds files that are not a torus-train run's "
                        f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); they are left untouched: "
                        f"give a new or empty folder")


def make_plan(spec: JobSpec, job_file: Path, strict: bool):
    from torus_train.job.launch import plan_launch, usable_cpus
    from torus_train.ranks.bootstrap import free_port

    return plan_launch(spec, dict(os.environ), job_file=str(job_file), python=sys.executable,
                       as_root=hasattr(os, "geteuid") and os.geteuid() == 0, master_port=free_port(),
                       cpu_count=usable_cpus(), local_gpus=local_gpu_count(), strict=strict)


def dry_run_report(spec: JobSpec, plan, legs, checked: list[str] | None = None,
                   problem: UserError | None = None) -> None:
    """The whole plan is printed even when the preflight fails (for example the batch schedule does not fit
    the world size); the caller then ends the output with the error (exit 2), as it would stop a real run
    before any rank starts. With grid stages: the first leg's plan, then the legs. Without a problem: what
    the preflight checked."""
    from torus_train.job.legs import legs_text

    try:
        schedule, why = spec.schedule.at(plan.world_size), None
    except UserError as e:
        schedule, why = None, e
    click.echo(dry_run_text(spec, plan, schedule, why))
    if len(legs) > 1:
        click.echo(f"grid stages: {legs_text(legs)}; the launcher checkpoints and moves the job at each change")
    if problem is None:
        click.echo("# preflight passed: " + "; ".join(checked or []))


def prepare_data(spec: JobSpec, log=None) -> None:
    """Once, before any rank starts, what the data source needs (job/sources.py): the demo set generated, a
    data folder's index built (when missing) and checked (the ranks are handed its place in spec.data.index),
    or a packed set's index and shards checked."""
    source_of(spec.data.source).prepare_data(spec, log)


def announce(spec: JobSpec, plan, schedule, out: Path) -> None:
    g = plan.grid
    click.echo(f"torus-train run: {g.size} ranks on grid {g} ({g.x} per row, {g.y} per column), "
               f"{plan.launcher} launcher ({plan.why}); comm {spec.comm.algo}; output {out}")
    for note in plan.notes:
        click.echo(note)
    click.echo(schedule.table())


WATCHDOG_MARGIN_S = 60.0
"""Added to comm.timeout_s for the watchdog's default limit: the ranks' own timeout should fire first."""


def watchdog_limits(spec: JobSpec) -> tuple[float, float]:
    """(limit once every rank has finished a step, limit before that) in seconds."""
    startup = spec.comm.timeout_s + WATCHDOG_MARGIN_S
    return spec.launch.watchdog_s or startup, startup


def launch(spec: JobSpec, plan, out: Path) -> None:
    from torus_train.ranks.supervisor import (RanksFailed, command_failed, echo_err, new_watch, reset_rank_files,
                                              run_command, run_local)

    if plan.launcher == "local":
        run_local(plan, out, echo_err, *watchdog_limits(spec))
        return
    click.echo(f"$ {plan.command_text()}")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    reset_rank_files(out, plan.world_size)
    try:
        run_command(plan.argv, plan.env, plan.launcher, out, plan.world_size, new_watch(*watchdog_limits(spec)))
    except RanksFailed:
        raise
    except RunFailed as e:
        raise command_failed(e, out, plan.world_size) from None


def launch_with_restarts(spec: JobSpec, plan, out: Path, restarts: Restarts) -> None:
    """Launch; after a failure that a restart may cure, start the ranks again from the latest checkpoint while
    the budget lasts, saying so. A failure before any rank finished a step is a start-up failure and is never
    restarted (the same start would fail again). With --elastic a node that fails twice in a row is dropped."""
    from torus_train.ranks.supervisor import RanksFailed

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
            click.echo(f"{e.how}{beat}; restart {restarts.used} of {restarts.allowed} from "
                       f"{latest_checkpoint_text(out)}", err=True)
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
    from torus_train.job.elastic import shrink

    host = plan.hosts[node].name if plan.launcher != "local" and node < len(plan.hosts) else ""
    spec, line = shrink(spec, grid, node, host)
    if host:  # mpirun: --hostfile, srun: --nodelist from it
        spec.launch.hostfile = str(write_hosts([h for h in plan.hosts if h.name != host], out / "hosts.elastic"))
    restarts.last_node = None
    click.echo(line, err=True)
    return spec


def write_hosts(hosts, path: Path) -> Path:
    """An OpenMPI hostfile ('host slots=K' lines)."""
    path.write_text("".join(f"{h.name} slots={h.slots}\n" for h in hosts))
    return path


def no_restart(e, attempt: int, max_restarts: int) -> str:
    """Why a failure is not restarted ('' when it is)."""
    if e.rank < 0:
        return "not restarted: the launcher was interrupted"
    if not e.restartable:
        return "not restarted: this failure would repeat (bad input, a requested stop or a failed check)"
    if not e.progressed:
        return "not restarted: no rank finished a step in this attempt (a start-up failure)"
    if attempt >= max_restarts:
        return f"gave up after {max_restarts} restart(s)"
    return ""


def latest_checkpoint_text(out: Path) -> str:
    """'the checkpoint at step 30' or 'the start (no checkpoint yet)', from the manifests' names (the ranks
    verify and agree on the checkpoint themselves)."""
    from torus_train.train.checkpoint import list_checkpoints

    found = list_checkpoints(out / "checkpoints")
    return f"the checkpoint at step {found[0][0]}" if found else "the start (no checkpoint yet)"


def local_gpu_count() -> int:
    """GPUs on this machine, without importing torch (CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def holds_results(out: Path) -> list[str]:
    return [name for name in RESULT_FILES if (out / name).exists()]


def choose_out(spec: JobSpec, resume: bool, overwrite: bool) -> Path:
    """The output folder. A folder the user named (job.out / --out) that holds results is refused later
    unless --resume or --overwrite; the default runs/<name> moves on to a fresh runs/<name>-<timestamp>."""
    out = spec.out_dir.resolve()
    if spec.job.out or resume or overwrite or not holds_results(out):
        return out
    import time

    return out.with_name(f"{out.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def prepare_out(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to mix a new run into an output folder that holds results, unless --resume or --overwrite."""
    present = holds_results(out)
    if present and not resume:
        if not overwrite:
            raise UserError(f"{out} already holds results ({', '.join(present)}); pass --resume to continue, "
                            "--overwrite to replace them, or --out for another folder")
        for name in (*present, "logs"):
            p = out / name
            if not p.exists():
                continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if resume and not (out / "checkpoints").is_dir():
        raise UserError(f"--resume: {out / 'checkpoints'} does not exist; nothing to resume")
    (out / "logs").mkdir(parents=True, exist_ok=True)


def write_job(path: Path, spec: JobSpec, grid, resume: bool, regrid: bool = False) -> None:
    """job.json for the ranks; regrid: a checkpoint of another grid is resumed on purpose (the job moved)."""
    job = {"spec": spec.to_dict(), "grid": {"x": grid.x, "y": grid.y, "gpus_per_node": grid.gpus_per_node},
           "resume": resume, "regrid": regrid}
    job["spec"]["job"]["out"] = str(path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(job, indent=1))
    os.replace(tmp, path)


def read_summary(out: Path) -> dict:
    """summary.json of ranks that exited 0; RunFailed when it is missing, unreadable or the replicas differ."""
    summary = out / "summary.json"
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        raise RunFailed(unfinished(out)) from None
    if not isinstance(s, dict) or not s.get("param_digests_agree"):
        raise RunFailed(f"replicas differ: see {summary}")
    return s


def unfinished(out: Path) -> str:
    """Why there is no summary although the launcher reported success: mpirun can exit 0 when a node's daemon
    is lost with its ranks. Counted once from the ranks' markers (every rank that started left a heartbeat)."""
    logs = out / "logs"
    done, started = len(list(logs.glob("rank*.done"))), len(list(logs.glob("rank*.beat")))
    if started and done < started:
        return (f"the launcher ended without an error, but only {done} of {started} ranks finished and no "
                f"summary.json was written: a node or rank was lost; see {logs}/ (resume with --resume)")
    return f"the ranks exited but {out / 'summary.json'} was not written or cannot be read"


def check_outcome(out: Path) -> None:
    read_summary(out)
    click.echo(f"wrote {out / 'metrics.jsonl'} and {out / 'summary.json'}; plot them with: torus-train report {out}")


def _run_as_rank(spec: JobSpec, resume: bool, overwrite: bool) -> None:
    """`mpirun -n 4 torus-train run ...`: this process is one rank; rank 0 prepares the output folder."""
    from torus_train.ranks.bootstrap import rank_info
    from torus_train.job.launch import resolve_grid
    from torus_train.ranks.worker import execute

    from torus_train.job.legs import plan_legs

    if len(plan_legs(spec)) > 1:
        raise UserError("schedule.stages name more than one grid: start the job with `torus-train run` (it moves "
                        "the job between grids), not as ranks of mpirun/srun")
    info = rank_info()
    spec.grid.gpus = spec.grid.gpus or info.world_size
    if spec.grid.gpus != info.world_size:
        raise UserError(f"grid.gpus: {spec.grid.gpus} but the launcher started {info.world_size} ranks")
    if not spec.grid.gpus_per_node:
        spec.grid.gpus_per_node = info.local_world_size
    grid = resolve_grid(spec, "local", [], 0)
    spec.schedule.at(info.world_size)
    out = spec.out_dir.resolve()
    spec.job.out = str(out)
    if info.rank == 0:  # the others wait for it in the rendezvous
        prepare_out(out, resume, overwrite)
        prepare_data(spec)
    execute(spec, grid, resume)


# --------------------------------------------------------------------------------------------------------
# --dry-run
# --------------------------------------------------------------------------------------------------------
def _span(nodes: list[int]) -> str:
    """Node indices compactly: 0-7, or 0, 8, ..., 536 (every 8th), or a short list."""
    if len(nodes) == 1:
        return str(nodes[0])
    steps = {b - a for a, b in zip(nodes, nodes[1:])}
    if steps == {1}:
        return f"{nodes[0]}-{nodes[-1]}"
    if len(steps) == 1 and len(nodes) > 3:
        return f"{nodes[0]}, {nodes[1]}, ..., {nodes[-1]} (stride {steps.pop()})"
    return ", ".join(map(str, nodes[:8])) + (", ..." if len(nodes) > 8 else "")


def _names(plan, nodes: list[int]) -> str:
    if plan.launcher == "local":
        return "this machine"
    hs = [plan.hosts[i].name for i in (nodes if len(nodes) <= 3 else [nodes[0], nodes[-1]])]
    return ", ".join(hs) if len(nodes) <= 3 else f"{hs[0]} .. {hs[1]}"


def grid_text(plan) -> str:
    g = plan.grid
    lines = [f"grid {g}: {g.size} ranks = X {g.x} per row (horizontal ring) x Y {g.y} per column (vertical ring); "
             f"{g.gpus_per_node} per node, {g.nodes} node(s)",
             f"sequential steps: torus 2({g.x}-1) + 2({g.y}-1) = {g.torus_steps}, flat ring 2({g.size}-1) = "
             f"{g.ring_steps}"]
    show = lambda n: list(range(n)) if n <= 4 else [0, 1, n - 1]  # noqa: E731
    lines.append(f"rows ({g.y}), each spans {len(g.row_nodes(0))} node(s):")
    for i, r in enumerate(show(g.y)):
        if i and r != show(g.y)[i - 1] + 1:
            lines.append("  ...")
        nodes = g.row_nodes(r)
        lines.append(f"  row {r}: ranks {g.row_ranks(r)[0]}-{g.row_ranks(r)[-1]} on node(s) {_span(nodes)} "
                     f"({_names(plan, nodes)})")
    lines.append(f"columns ({g.x}), each spans {len(g.col_nodes(0))} node(s):")
    for i, c in enumerate(show(g.x)):
        if i and c != show(g.x)[i - 1] + 1:
            lines.append("  ...")
        nodes = g.col_nodes(c)
        ranks = g.col_ranks(c)
        lines.append(f"  column {c}: ranks {_span(ranks)} on node(s) {_span(nodes)} ({_names(plan, nodes)})")
    if not g.rows_inside_nodes:
        lines.append(f"  note: rows of {g.x} do not line up with nodes of {g.gpus_per_node}; some rows cross nodes")
    return "\n".join(lines)


def dry_run_text(spec: JobSpec, plan, schedule, problem: Exception | None = None) -> str:
    from torus_train.job.hosts import total_slots
    from torus_train.job.work import work_text

    launch = [f"launcher: {plan.launcher} ({plan.why})"]
    if plan.hostfile:
        launch.append(f"hosts: {plan.hostfile}: {len(plan.hosts)} used of the listed hosts, "
                      f"{total_slots(plan.hosts)} slots used for {plan.world_size} ranks")
    launch += plan.notes
    launch.append("command:")
    launch.append("  " + plan.command_text())
    return "\n".join([
        "# resolved spec", spec.to_toml().rstrip(), "",
        "# grid", grid_text(plan), "",
        "# launch", *launch, "",
        "# batch schedule",
        schedule.table() if schedule is not None else
        f"cannot be built for {plan.world_size} ranks: {problem}\n(every stage's global_batch must be a multiple "
        f"of the world size; set them with --spec or --set schedule.stages=[...])",
        work_text(spec, schedule),
        f"(dry run: nothing started; output would go to {spec.out_dir.resolve()})",
    ])
