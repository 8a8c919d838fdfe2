"""`torus-train plan rehearse`: the job at its full world size, rank by rank, checked against NCCL's rules."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from torus_train.commands.outputs import OutputFile, OutputFolder
from torus_train.errors import RunFailed, UserError
from torus_train.job.spec import load_spec, parse_override
from torus_train.outfiles import Writer, write_json
from torus_train.plan.rehearse import (
    IMAGE_SIZE,
    RehearsalRequest,
    check_image_size,
    job_grid,
    parse_ranks,
    rehearse,
)
from torus_train.plan.rehearse.summary import report_text
from torus_train.usernumbers import float_value

WRITER = Writer("plan rehearse")
DEFAULT_RANKS = (0, 31, 32, 1087, 2175)
MAX_GPU_MEMORY_GIB = 1 << 16
"""The most GPU memory --gpu-memory-gib takes (no GPU has 64 TiB)."""


def default_ranks(world: int) -> str:
    """DEFAULT_RANKS less those past the world."""
    return ",".join(str(r) for r in DEFAULT_RANKS if r < world)


def check_keep(keep: str | None, json_path: str | None) -> None:
    """Before any rank starts: --keep names a new or empty folder, and --json is not inside it (the rehearsal
    fills that folder with files of its own, which a JSON of the same name would collide with after the run)."""
    if keep is None:
        return
    if Path(keep).exists() and any(Path(keep).iterdir()):
        raise UserError(f"--keep {keep}: the folder is not empty; name a new one")
    if json_path is not None and Path(keep).resolve() in Path(json_path).resolve().parents:
        raise UserError(
            f"--json {json_path}: is inside --keep {keep}, which the rehearsal fills; name a file elsewhere"
        )


@click.command("rehearse", short_help="Rehearse the job at its full world size on the CPU; check NCCL's rules.")
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False), help="The job spec (TOML).")
@click.option(
    "--ranks",
    default=None,
    metavar="R,R,...",
    help=f"Ranks to rehearse (rank 0 is always one) [default: {','.join(map(str, DEFAULT_RANKS))} where the world has them: the "
    "first and last of a row, the next row's first, a middle and the last rank].",
)
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Set any spec field (repeatable).")
@click.option(
    "--image-size",
    type=click.IntRange(8, 4096),
    default=IMAGE_SIZE,
    show_default=True,
    help="Side of the rehearsal's synthetic images (the model and its parameters are the job's).",
)
@click.option(
    "--gpu-memory-gib",
    type=float,
    default=16.0,
    show_default=True,
    help="GPU memory the communicators' estimated NCCL buffers are weighed against (V100: 16).",
)
@click.option(
    "--keep",
    "keep",
    type=OutputFolder(),
    default=None,
    metavar="DIR",
    help="Keep the traces and logs in DIR (a new folder) [default: a temporary folder, removed].",
)
@click.option(
    "--json",
    "json_path",
    type=OutputFile(WRITER),
    default=None,
    metavar="FILE",
    help="Write the result as JSON.",
)
def rehearse_command(spec_path, ranks, sets, image_size, gpu_memory_gib, keep, json_path) -> None:
    """Run the job's real worker path as chosen ranks of its full world, each in its own process on torch's
    fake backend (NCCL's branch: split groups, the torus's collectives, the graphed step), and check every
    group and collective they issue: same order on every communicator, same groups on every rank, no fan-in
    to one rank after start-up, nothing slow inside a device collective's wait, one capture decision before
    any rank captures. Prints a table per phase and one verdict; exit 1 when a rule is broken.

    \b
    Example:
      torus-train plan rehearse --spec scripts/specs/imagenet_2176.toml --json rehearsal.json
    """
    gpu_memory_gib = float_value(gpu_memory_gib, "--gpu-memory-gib", 1, MAX_GPU_MEMORY_GIB)
    spec = load_spec(spec_path, [parse_override(s) for s in sets])
    grid = job_grid(spec)
    check_image_size(spec, image_size)
    chosen = parse_ranks(ranks if ranks is not None else default_ranks(grid.size), grid.size)
    check_keep(keep, json_path)
    with tempfile.TemporaryDirectory(prefix="torus-rehearse-") as tmp:
        folder = Path(keep) if keep is not None else Path(tmp)
        result = rehearse(RehearsalRequest(spec, chosen, folder, image_size, gpu_memory_gib=gpu_memory_gib), click.echo)
    click.echo(report_text(result))
    if json_path is not None:
        write_json(json_path, result, WRITER)
        click.echo(f"# wrote {json_path}")
    if not result["ok"]:
        raise RunFailed(f"plan rehearse: {len(result['findings'])} rule(s) broken (listed above)")
