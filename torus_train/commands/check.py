"""`torus-train check`: what this machine can run (environment, GPUs, NCCL, the graphed step, the decoders,
the deterministic repeat, throughput), one verdict per part; with --acceptance, the acceptance test for one GPU
(the production configuration shrunk to it, check/acceptance.py). A table on stdout, progress on stderr."""

from __future__ import annotations

import time

import click

from torus_train.check import acceptance as gpu
from torus_train.check.parts import PARTS, named, run_parts, stderr_say
from torus_train.check.report import WRITER, document, failed, table
from torus_train.check.shrunk import Shrunk
from torus_train.commands.outputs import OutputFile, OutputFolder
from torus_train.errors import UserError
from torus_train.outfiles import write_json


def part_list(value: str | None) -> list[str]:
    """The parts named in --parts (comma-separated), every part when None; UserError naming an unknown one."""
    return named(value, PARTS, "a part")


@click.command(
    "check",
    epilog="Parts: "
    + "; ".join(f"{n}: {p.shows}" for n, p in PARTS.items())
    + ". Acceptance parts (--acceptance): "
    + "; ".join(f"{n}: {p.shows}" for n, p in gpu.ACCEPTANCE.items())
    + ". See docs/check.md.",
)
@click.option("--json", "json_path", type=OutputFile(WRITER), help="Write every part's verdict here.")
@click.option("--parts", default=None, help="Only these parts, comma-separated (default: all).")
@click.option("--quick", is_flag=True, help="Fewer timed steps in the throughput (acceptance: timed) parts.")
@click.option(
    "--acceptance", "acceptance", is_flag=True, help="The acceptance test for one GPU instead (docs/check.md)."
)
@click.option("--rehearse", is_flag=True, help="With --acceptance: every part on the CPU at toy size.")
@click.option("--out", "out", type=OutputFolder(), help="With --acceptance: the run's folder.")
def check(
    json_path: str | None, parts: str | None, quick: bool, acceptance: bool, rehearse: bool, out: str | None
) -> int:
    """What this machine can run: ok, FAILED or n/a (cannot run here) per part, and why.

    Exit 0 when no part failed (n/a is not a failure), 1 when one did."""
    if not acceptance and (rehearse or out is not None):
        raise UserError(f"{'--rehearse' if rehearse else '--out'} goes with --acceptance")
    names = gpu.part_list(parts) if acceptance else part_list(parts)
    if acceptance:
        return accept(names, Shrunk(gpu.claim_out(out), rehearse, quick), json_path)
    t0 = time.perf_counter()
    found = run_parts(names, stderr_say, quick)
    wall = time.perf_counter() - t0
    click.echo(table(found, wall))
    if json_path is not None:
        write_json(json_path, document(found, wall), WRITER)
    return 1 if failed(found) else 0


def accept(names: list[str], s: Shrunk, json_path: str | None) -> int:
    """The acceptance parts named: the checks' table on stdout, the schema-3 document at --json."""
    doc = gpu.accept(names, s, stderr_say)
    click.echo(gpu.table(doc))
    if json_path is not None:
        write_json(json_path, doc, WRITER)
    return gpu.exit_code(doc)
