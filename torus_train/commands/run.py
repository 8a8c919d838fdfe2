"""`torus-train run`: flags -> job spec -> ranks.orchestrate.run_job (plan, launch, restarts) -> the result line."""

from __future__ import annotations

import os

import click

from torus_train.commands.optionchecks import input_path
from torus_train.commands.outputs import OutputFolder
from torus_train.errors import UserError
from torus_train.job import gpus
from torus_train.job.gpus import BACKENDS
from torus_train.job.launch import fit_to_local_gpus
from torus_train.job.launchers import choices as launcher_choices
from torus_train.job.sources import choices_text
from torus_train.job.spec import JobSpec, load_spec, parse_override
from torus_train.job.topology import parse_grid
from torus_train.ranks.orchestrate import RunOptions, run_job
from torus_train.train.noise_report import points
from torus_train.train.results import read_run

# CLI flag -> dotted spec field.
FLAG_FIELDS = {
    "gpus": "grid.gpus",
    "grid": "grid.grid",
    "gpus_per_node": "grid.gpus_per_node",
    "launcher": "launch.launcher",
    "hostfile": "launch.hostfile",
    "container": "launch.container",
    "data": "data.source",
    "model": "model.arch",
    "image_size": "data.image_size",
    "steps": "schedule.steps",
    "epochs": "schedule.epochs",
    "out": "job.out",
    "backend": "comm.backend",
    "deterministic": "job.deterministic",
}


@click.command("run")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Job spec (TOML). Default: the embedded demo job (demo data; one rank per GPU here, or 2 "
    "CPU ranks on 2x1 on a machine without GPUs).",
)
@click.option("--gpus", type=int, default=None, help="World size N (grid.gpus); without --grid a grid is chosen for N.")
@click.option("--grid", default=None, help="XxY: X ranks per row (horizontal ring), Y per column.")
@click.option(
    "--gpus-per-node",
    type=int,
    default=None,
    help="Ranks per node (grid.gpus_per_node); 0 = detect: all ranks on this machine for the local "
    "launcher, the slots of the first host under mpirun or srun.",
)
@click.option(
    "--launcher", type=click.Choice(launcher_choices()), default=None, help="How ranks start (launch.launcher)."
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="comm.backend: auto = NCCL, one rank per GPU, where there are GPUs, else gloo; gloo = CPU "
    "ranks even on a GPU machine (more ranks than GPUs).",
)
@click.option("--hostfile", default=None, help="OpenMPI hostfile ('host slots=K') or PBS node file.")
@click.option("--container", default=None, help="Singularity/Apptainer image every rank runs in.")
@click.option("--data", default=None, help=f"{choices_text()} (data.source).")
@click.option(
    "--model", default=None, help="torchvision architecture (model.arch), e.g. resnet50, or the house resnet18_w32."
)
@click.option("--image-size", type=int, default=None, help="Training crop side (data.image_size).")
@click.option("--steps", type=int, default=None, help="Stop after this many optimizer steps (schedule.steps).")
@click.option("--epochs", type=int, default=None, help="Epochs to train (schedule.epochs).")
@click.option("--out", type=OutputFolder(), default=None, help="Output folder (job.out). Default: runs/<job.name>.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Set any spec field, e.g. --set comm.algo=flat (repeatable).",
)
@click.option(
    "--deterministic",
    is_flag=True,
    default=None,
    help="Deterministic cuDNN/cuBLAS kernels (job.deterministic): identical GPU runs, and a resumed run "
    "against a straight one, end with the same bits; slower.",
)
@click.option("--resume", is_flag=True, help="Continue from the latest complete checkpoint in the output folder.")
@click.option("--overwrite", is_flag=True, help="Delete earlier results in the output folder first.")
@click.option("--dry-run", is_flag=True, help="Print the resolved spec, grid, command and batch table; start nothing.")
@click.option(
    "--max-restarts",
    type=click.IntRange(0, 100),
    default=0,
    show_default=True,
    help="When ranks fail after training started, start them again from the latest checkpoint, up to "
    "N times (not for bad input, a requested stop or a failed check; docs/faults.md).",
)
@click.option(
    "--elastic",
    is_flag=True,
    help="A node whose ranks fail in two attempts in a row is dropped and the job continues on the "
    "others (same global batch and LR schedule); uses the --max-restarts budget.",
)
@click.option(
    "--noise-from",
    default=None,
    metavar="RUN",
    callback=input_path,
    help="With --dry-run: each stage's predicted efficiency from the noise scale a finished run measured "
    "(its output folder), at the same fraction of training.",
)
def run(spec_path, sets, resume, overwrite, dry_run, max_restarts, elastic, noise_from, **flags) -> None:
    """Train on N ranks laid out as an XxY grid, exchanging gradients with the 2D-torus all-reduce.

    \b
    torus-train run                                   # the demo job: a rank per GPU, else 2 CPU ranks on 2x1
    torus-train run --gpus 4                          # the same on 4 ranks (a grid is chosen: 2x2)
    torus-train run --backend gloo --gpus 4           # 4 CPU ranks, even on a machine with one GPU
    torus-train run --gpus 4 --grid 2x2 --data synthetic --model resnet18 --image-size 64 --steps 30
    torus-train run --spec job.toml --hostfile hosts.txt --dry-run
    """
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    # a flag not given is None or False (--deterministic): the spec's value stands
    overrides = [(FLAG_FIELDS[k], v) for k, v in flags.items() if v is not None and v is not False]
    overrides += [parse_override(s) for s in sets]
    spec = load_spec(spec_path, overrides)
    given = {f for f, _ in overrides}
    fit_grid_to_flags(spec, spec_path, given)
    if spec_path is None and not given & {"grid.gpus", "grid.grid"}:  # the default job takes this machine's GPUs
        fit_to_local_gpus(spec, os.environ, gpus.local_gpu_count())
    if noise_from is not None and not dry_run:
        raise UserError("--noise-from goes with --dry-run (it predicts each stage's efficiency before a run)")
    noise = _noise_reference(noise_from) if noise_from is not None else None
    result = run_job(spec, RunOptions(resume, overwrite, dry_run, max_restarts, elastic, noise))
    if result.dry_run is not None:
        click.echo(result.dry_run)
        if result.problem is not None:  # the whole plan first, then what stops it
            raise result.problem
    elif result.summary is not None:
        click.echo(
            f"wrote {result.out / 'metrics.jsonl'} and {result.out / 'summary.json'}; plot them with: "
            f"torus-train report {result.out}"
        )


def fit_grid_to_flags(spec: JobSpec, spec_path: str | None, given: set[str]) -> None:
    """A world size or grid given on the command line wins over the spec's other half: --gpus N alone drops
    a spec grid of another size (one is chosen for N), --grid XxY alone drops a spec grid.gpus of another
    size. Said when the dropped value came from the user's spec file."""
    if not spec.grid.grid or not spec.grid.gpus:
        return
    size = parse_grid(spec.grid.grid).size
    if size == spec.grid.gpus:
        return
    if "grid.gpus" not in given and "grid.grid" not in given:  # both from the spec: name its fields, not flags
        raise UserError(
            f"{spec_path or 'the spec'}: grid.grid = {spec.grid.grid} is {size} ranks but grid.gpus = "
            f"{spec.grid.gpus}; make them agree, or remove one of them"
        )
    if ("grid.gpus" in given) == ("grid.grid" in given):
        return
    if "grid.gpus" in given:
        dropped, spec.grid.grid = f"grid.grid = {spec.grid.grid}", ""
    else:
        dropped, spec.grid.gpus = f"grid.gpus = {spec.grid.gpus}", 0
    if spec_path:
        click.echo(
            f"{spec_path}: {dropped} does not fit the command line's "
            f"{'--gpus' if 'grid.gpus' in given else '--grid'}; ignored"
        )


def _noise_reference(path: str) -> tuple:
    """--noise-from's run: its measured noise scale and its name; a folder that is no run is refused naming the
    option (the reader's own refusals name `report`)."""
    try:
        return points(read_run(path)), path
    except UserError as e:
        raise UserError(f"--noise-from: {str(e).removeprefix('report: ')}") from None
