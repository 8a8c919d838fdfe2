"""`run --dry-run`'s report: the resolved spec, the grid (which nodes form each row and column), the launch
command, the batch table and the work, then what the preflight checked (pure; no torch import)."""

from __future__ import annotations

import itertools

from torus_train.errors import UserError
from torus_train.job.control import CONTROLS
from torus_train.job.hosts import total_slots
from torus_train.job.launchers.base import LaunchPlan
from torus_train.job.legs import Leg, legs_text
from torus_train.job.noise import NoisePoint, learnability_lines, stage_lines
from torus_train.job.schedule import BatchSchedule
from torus_train.job.spec import JobSpec
from torus_train.job.work import train_images, work_text


def dry_run_report(
    spec: JobSpec,
    plan: LaunchPlan,
    legs: list[Leg],
    checked: list[str] | None = None,
    problem: UserError | None = None,
    noise: tuple[list[NoisePoint], str] | None = None,
) -> str:
    """The whole plan, even when the preflight fails (for example the batch schedule does not fit the world
    size); the caller then ends the output with the error (exit 2), as it would stop a real run before any
    rank starts. With grid stages: the first leg's plan, then the legs. Without a problem: what the preflight
    checked. noise: a reference run's measured B_simple and its name (`--noise-from`), for each stage's
    predicted efficiency."""
    try:
        schedule, why = spec.schedule.at(plan.world_size), None
    except UserError as e:
        schedule, why = None, e
    lines = [dry_run_text(spec, plan, schedule, why)]
    if schedule is not None and noise is not None:
        lines += stage_lines(noise[0], schedule, noise[1])
    if len(legs) > 1:
        lines.append(f"grid stages: {legs_text(legs)}; the launcher checkpoints and moves the job at each change")
        if CONTROLS[spec.schedule.control].rule:
            lines.append(
                f'(schedule.control = "{spec.schedule.control}": each grid ends where the rule starts the next '
                "grid's first stage; the epochs above are the latest it may end)"
            )
    if problem is None:
        lines.append("# preflight passed: " + "; ".join(checked or []))
    return "\n".join(lines)


def _span(nodes: list[int]) -> str:
    """Node indices compactly: 0-7, or 0, 8, ..., 536 (every 8th), or a short list."""
    if len(nodes) == 1:
        return str(nodes[0])
    steps = {b - a for a, b in itertools.pairwise(nodes)}
    if steps == {1}:
        return f"{nodes[0]}-{nodes[-1]}"
    if len(steps) == 1 and len(nodes) > 3:
        return f"{nodes[0]}, {nodes[1]}, ..., {nodes[-1]} (stride {steps.pop()})"
    return ", ".join(map(str, nodes[:8])) + (", ..." if len(nodes) > 8 else "")


def _names(plan: LaunchPlan, nodes: list[int]) -> str:
    if plan.entry.runs_here:
        return "this machine"
    hs = [plan.hosts[i].name for i in (nodes if len(nodes) <= 3 else [nodes[0], nodes[-1]])]
    return ", ".join(hs) if len(nodes) <= 3 else f"{hs[0]} .. {hs[1]}"


def grid_text(plan: LaunchPlan) -> str:
    g = plan.grid
    lines = [
        f"grid {g}: {g.size} ranks = X {g.x} per row (horizontal ring) x Y {g.y} per column (vertical ring); "
        f"{g.gpus_per_node} per node, {g.nodes} node(s)",
        f"sequential steps: torus 2({g.x}-1) + 2({g.y}-1) = {g.torus_steps}, flat ring 2({g.size}-1) = {g.ring_steps}",
    ]
    show = lambda n: list(range(n)) if n <= 4 else [0, 1, n - 1]  # noqa: E731
    lines.append(f"rows ({g.y}), each spans {len(g.row_nodes(0))} node(s):")
    for i, r in enumerate(show(g.y)):
        if i and r != show(g.y)[i - 1] + 1:
            lines.append("  ...")
        nodes = g.row_nodes(r)
        lines.append(
            f"  row {r}: ranks {g.row_ranks(r)[0]}-{g.row_ranks(r)[-1]} on node(s) {_span(nodes)} "
            f"({_names(plan, nodes)})"
        )
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


def dry_run_text(
    spec: JobSpec, plan: LaunchPlan, schedule: BatchSchedule | None, problem: Exception | None = None
) -> str:
    launch = [f"launcher: {plan.launcher} ({plan.why})"]
    if plan.hostfile:
        launch.append(
            f"hosts: {plan.hostfile}: {len(plan.hosts)} used of the listed hosts, "
            f"{total_slots(plan.hosts)} slots used for {plan.world_size} ranks"
        )
    launch += plan.notes
    launch.append("command:")
    launch.append("  " + plan.command_text())
    return "\n".join(
        [
            "# resolved spec",
            spec.to_toml().rstrip(),
            "",
            "# grid",
            grid_text(plan),
            "",
            "# launch",
            *launch,
            "",
            "# batch schedule",
            schedule.table()
            if schedule is not None
            else f"cannot be built for {plan.world_size} ranks: {problem}\n(set the stages with --spec or --set "
            f"schedule.stages=[...])",
            work_text(spec, schedule),
            *(learnability_lines(spec, schedule, train_images(spec)[0]) if schedule is not None else []),
            f"(dry run: nothing started; output would go to {spec.out_dir.resolve()})",
        ]
    )
