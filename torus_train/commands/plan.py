"""`torus-train plan`: the main plan (predict, choose a grid, verdict against NCCL), `plan calibrate` (fit this
machine from a bench file) and `plan rehearse` (torus_train.commands.rehearse).

Each command parses its options, builds its request, calls one function of torus_train.plan and writes --json.
No torch here: the bucket timeline imports it inside torus_train.plan.timeline, `plan rehearse` in its ranks.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES
from torus_train.commands.optionchecks import grid_text as check_grid
from torus_train.commands.outputs import OutputFile
from torus_train.commands.rehearse import rehearse_command
from torus_train.errors import UserError
from torus_train.job.sections import CommSection
from torus_train.outfiles import Writer, check_distinct, write_json
from torus_train.plan.calibrate_report import CalibrateRequest, calibrate_report
from torus_train.plan.plots import WRITER
from torus_train.plan.predict import PlanRequest, predict

MOVED = {
    "--calibrate": "calibrate BENCH.json",
    "--calibrate-algo": "calibrate BENCH.json --algo NAME",
    "--compare": "calibrate BENCH.json --compare OTHER.json",
}
"""Options of the main plan that became subcommands' options: a usage error names the new spelling."""
REPLACED = {
    "--check-groups": "`torus-train plan rehearse --spec JOB.toml`: it builds the grid's groups inside each "
    "rehearsed rank at the job's full world size and checks every collective (docs/rehearse.md)",
}
"""Options of the main plan that another command does better: a usage error names that command."""


class PlanGroup(click.Group):
    """The main plan's options on the group itself (so `plan --gpus N ...` is the main plan), and a usage error
    that names the subcommand an old option moved to, or the command that replaced it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            if e.option_name in MOVED:
                raise click.UsageError(
                    f"{e.option_name} belongs to a subcommand: torus-train plan {MOVED[e.option_name]}", ctx
                ) from None
            if e.option_name in REPLACED:
                raise click.UsageError(f"{e.option_name} was replaced by {REPLACED[e.option_name]}", ctx) from None
            raise


CALIBRATE_WRITER = Writer("plan calibrate")
"""Each plan command's --json (and the main plan's pictures, plots.WRITER) replaces only its own earlier output."""


def _json_option(writer: Writer):
    """--json FILE of a plan command: refused as parsed unless free or ``writer``'s own earlier output."""
    return click.option(
        "--json", "json_path", type=OutputFile(writer), default=None, metavar="FILE", help="Write the result as JSON."
    )


def _write_json(path: str | None, doc: dict, writer: Writer) -> None:
    if path is not None:
        write_json(path, doc, writer)
        click.echo(f"# wrote {path}")


@click.group("plan", cls=PlanGroup, invoke_without_command=True)
@click.option("--gpus", type=click.IntRange(min=1), default=None, help="World size N to plan for.")
@click.option(
    "--grid",
    default=None,
    callback=check_grid,
    metavar="XxY",
    help="Grid to evaluate (X ranks per row); default: the fastest predicted grid for N.",
)
@click.option(
    "--network",
    default="abci-v100",
    show_default=True,
    metavar="NAME|FILE",
    help="Network preset (abci-v100, dgx-h100, goyal-p100-50gbe, jia-p40-100gbe) or a TOML file.",
)
@click.option("--model", default="resnet50", show_default=True, help="Model whose gradients are exchanged.")
@click.option("--per-gpu-batch", type=int, default=32, show_default=True, help="Images per GPU per step.")
@click.option(
    "--grad-dtype",
    type=click.Choice(["fp16", "bf16", "fp32"]),
    default="fp16",
    show_default=True,
    help="Dtype the gradients are exchanged in.",
)
@click.option(
    "--images-per-second",
    type=float,
    default=None,
    help="Single-GPU training throughput; default: the network preset's figure for the model.",
)
@click.option(
    "--overlap",
    type=float,
    default=None,
    help="OVERRIDE: fraction of the backward pass that hides communication, 0..1 (the gradient as one "
    "all-reduce); default: derived from the bucket timeline of DDP's buckets.",
)
@click.option(
    "--step-overhead",
    type=float,
    default=None,
    help="Fraction of the single-GPU compute every step also pays unhidden (stragglers, waits, data "
    "loading); default: the model's one fitted constant (printed with the plan; docs/plan.md); 0 "
    "removes it.",
)
@click.option(
    "--placement",
    type=click.Choice(["rows", "columns"]),
    default="rows",
    show_default=True,
    help="How ranks fill nodes: rows (a node's GPUs sit in one row, as in the paper) or columns.",
)
@click.option(
    "--bucket-cap-mb",
    type=float,
    default=None,
    help=f"The run's bucket size, comm.bucket_mb, for the bucket timeline (MiB of fp32 parameters; the first "
    f"bucket at most {FIRST_BUCKET_BYTES / 2**20:g} MiB) [default: the spec's {CommSection.bucket_mb:g} with "
    f"--grid; without --grid, chosen with the grid by the predicted step].",
)
@click.option(
    "--layer-profile",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.json",
    help="Backward seconds per module ({module: seconds}, or a step profile whose `modules` holds them) to "
    "share the backward pass by, instead of layer FLOPs.",
)
@click.option(
    "--simulate",
    is_flag=True,
    help="Run the torus's exact data movement on N virtual ranks with ragged integer tensors.",
)
@_json_option(WRITER)
@click.option(
    "--plot",
    type=OutputFile(WRITER, "plot"),
    default=None,
    metavar="FILE.png",
    help="PNG of predicted all-reduce time against GPU count (64..4096) per algorithm.",
)
@click.option(
    "--png",
    type=OutputFile(WRITER, "plot"),
    default=None,
    metavar="FILE.png",
    help="PNG of one step's bucket timeline: backward per bucket, each bucket's exchange per algorithm.",
)
@click.pass_context
def plan(ctx: click.Context, json_path, **options) -> None:
    """Predict all-reduce time, step time and scaling efficiency per algorithm (NCCL's beside the torus) and
    whether the torus beats NCCL; choose a grid for N GPUs.

    \b
    Examples:
      torus-train plan --gpus 1088 --network abci-v100 --per-gpu-batch 32
      torus-train plan --gpus 2176 --grid 32x68 --simulate
      torus-train plan calibrate bench_2x2.json --grid 2x4
      torus-train plan calibrate bench_2x2.json --compare bench_2x4.json
    """
    if ctx.invoked_subcommand is not None:
        _no_plan_options(ctx)
        return
    check_distinct({"--json": json_path, "--plot": options["plot"], "--png": options["png"]})
    _write_json(json_path, predict(PlanRequest(**options), click.echo), WRITER)


def _no_plan_options(ctx: click.Context) -> None:
    """A subcommand takes its own options after its name; the main plan's given before it would be ignored."""
    given = [p.opts[0] for p in ctx.command.params if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    if given:
        raise UserError(
            f"{', '.join(given)}: an option of the main plan, not of `plan {ctx.invoked_subcommand}`; "
            f"give the subcommand's options after its name (see 'torus-train plan "
            f"{ctx.invoked_subcommand} --help')"
        )


@plan.command("calibrate", short_help="Fit this machine from bench files; predict a grid or compare another.")
@click.argument("bench", metavar="BENCH.json")
@click.option(
    "--grid",
    default=None,
    callback=check_grid,
    metavar="XxY",
    help="Grid to predict, all ranks on this machine [default: 2x4 unless --compare is given].",
)
@click.option("--algo", default=None, help="Which algorithm's rows to fit [default: torus if present].")
@click.option(
    "--compare",
    default=None,
    metavar="OTHER.json",
    help="A bench file (or comma-separated files) of another grid: its measured busbw beside the predicted one.",
)
@_json_option(CALIBRATE_WRITER)
def calibrate(json_path, **options) -> None:
    """Fit this machine's alpha and beta from `bench allreduce --json` rows (several comma-separated files: the
    median time per point), then predict --grid or hold --compare against the fit.

    \b
    Examples:
      torus-train plan calibrate bench_2x2.json --grid 2x4
      torus-train plan calibrate bench_2x2.json --compare bench_2x4.json
    """
    _write_json(json_path, calibrate_report(CalibrateRequest(**options), click.echo), CALIBRATE_WRITER)


plan.add_command(rehearse_command)
