"""`torus-train report OUT [OUT2 ...]`: a run's summary, its curves by epoch, per-rank work and noise scale as a PNG
and JSON, and with --batch what its noise scale says of another global batch (every scalar against step and wall
time is TensorBoard's: OUT/tensorboard/, train/board.py)."""

from __future__ import annotations

from pathlib import Path

import click

from torus_train.commands.outputs import OutputFile
from torus_train.errors import UserError
from torus_train.outfiles import check_distinct, check_plot_output
from torus_train.train import results
from torus_train.train.noise_report import predictions


@click.command("report")
@click.argument("outs", nargs=-1, required=True, metavar="OUT [OUT2 ...]")
@click.option(
    "--png",
    type=OutputFile(results.WRITER, "plot"),
    default=None,
    metavar="FILE",
    help="Write the plot here. Default: OUT/report.png for one run, report.png here for several.",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(results.WRITER),
    default=None,
    metavar="FILE",
    help="Also write every figure read (checked) as JSON.",
)
@click.option("--no-png", is_flag=True, help="Write no PNG (with --json: the figures only; no matplotlib needed).")
@click.option(
    "--batch",
    "batches",
    type=click.IntRange(1, 2**40),
    multiple=True,
    metavar="N",
    help="Predict, from the run's measured noise scale, the steps and examples a global batch of N would take "
    "against their minimum (McCandlish et al. 2018; repeatable).",
)
def report(outs, png, json_path, no_png, batches) -> None:
    """Summarise and plot a run from its metrics.jsonl and summary.json: loss and top-1 against epoch with the
    batch-size stages and the target, each rank's own work (the stragglers), and the measured noise scale
    against the global batch with the stage starts. Every scalar against step and
    wall time: tensorboard --logdir OUT. Unusable lines of metrics.jsonl are skipped and counted. --png and
    --json replace only a file an earlier report wrote.

    Works on a finished run, a run in progress and a run that failed; several OUT folders are drawn together.

    \b
    torus-train report runs/default
    torus-train report runs/default --batch 69632     # what the run's noise scale says of that batch
    torus-train report runs/a runs/b --png compare.png --json compare.json
    """
    for out in outs:  # '' is not the current folder
        if not out.strip():
            raise UserError(f"OUT {out!r}: an empty folder name; give a run's output folder, e.g. runs/default")
    if no_png and png is not None:
        raise UserError("--png and --no-png exclude each other")
    if not no_png and png is None:  # the default place, checked as a given --png is when parsed
        png = str(Path(outs[0]) / "report.png") if len(outs) == 1 else "report.png"
        _require_matplotlib()
        check_plot_output(png, results.WRITER, "--png")
    check_distinct({"--png": png, "--json": json_path})
    runs, notes = results.report(list(outs), None if no_png else png, json_path)
    for run in runs:
        click.echo(f"{run.out}: {run.status}")
        for line in results.summary_lines(run):
            click.echo(f"  {line}")
        if run.skipped_lines:
            click.echo(f"  {run.skipped_lines} line(s) of metrics.jsonl skipped (unusable; named below)")
        for line in predictions(run, batches) if batches else ():
            click.echo(f"  {line}")
    for line in notes + [f"{r.name}: {s}" for r in runs for s in r.skipped]:
        click.echo(f"left out: {line}")
    for path in (png, json_path):
        if path:
            click.echo(f"wrote {path}")
    boards = [r.out for r in runs if (r.out / "tensorboard").is_dir()]
    if boards:  # every scalar against step and wall time (speed, LR and batch too) is TensorBoard's
        where = (
            f"--logdir {boards[0]}"
            if len(boards) == 1
            else "--logdir_spec " + ",".join(f"{b.name}:{b}" for b in boards)
        )
        click.echo(f"every scalar: tensorboard {where}")


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "report: the PNG needs matplotlib: pip install 'torus-train[plot]' (or pass --no-png --json FILE)"
        ) from None
