"""The preflight: everything about a job that can be known before any rank starts, checked by `run` and by
`run --dry-run` alike (pure; no torch import).

A check that fails raises a UserError (one line, exit 2) that names the field or flag; each check that passes
adds one short line to the report that `--dry-run` prints. What it covers:

* every leg's grid (a stage that names its own grid) against the GPU count, the hostfile's slots or the
  allocation, and every stage's global batch against its leg's world size, so a second stage that cannot run
  is refused before the first one trains;
* ``--elastic`` and ``--max-restarts`` together;
* the model's input size (models with a fixed or a minimum input size);
* the data's classes against ``model.num_classes``, and ``val/``'s against ``train/``'s (from the index when
  one exists, else two directory reads: no per-file work).
* ``data.stage = node``: a node-local folder named and writable (else the ranks fail after the launch).
* our environment variables that the ranks read as numbers (TORUS_TRAIN_SHM_PIECE_MB).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from torus_train.comm.shm_size import PIECE_VARIABLE, piece_bytes
from torus_train.errors import UserError
from torus_train.job.legs import Leg, leg_spec
from torus_train.job.models import input_size_problem
from torus_train.job.sources import class_difference, source_of
from torus_train.job.spec import JobSpec
from torus_train.job.stagedir import check_stage_base


def preflight(
    spec: JobSpec,
    legs: list[Leg],
    first: int,
    first_plan,
    make_plan: Callable,
    elastic: bool,
    max_restarts: int,
    strict: bool,
) -> list[str]:
    """Run every check; the report lines (a later leg's plan is built again when it starts: a fresh port).

    first_plan: the launch plan of leg ``first``; make_plan(leg_spec, strict) builds a later leg's plan;
    strict=False (the dry run) lets a leg that cannot start on this machine through with a note, as the first
    leg's plan does."""
    lines = check_legs(spec, legs, first, first_plan, make_plan, strict)
    lines.append(check_elastic(elastic, legs, max_restarts))
    lines.append(check_model_input(spec))
    lines.append(check_data_classes(spec, strict))
    lines.append(check_data_stage(spec, strict))
    lines.append(check_environment(os.environ))
    return [line for line in lines if line]


def check_environment(environ: Mapping[str, str]) -> str:
    """Our variables that the ranks read as numbers, refused by name here rather than in every rank after the
    launch (TORUS_TRAIN_SHM_PIECE_MB=abc crashed each rank as it made its shared-memory row)."""
    piece = piece_bytes(environ)
    return "" if piece is None else f"{PIECE_VARIABLE}: shared-memory row slots of {piece:,} bytes"


def check_legs(spec: JobSpec, legs: list[Leg], first: int, first_plan, make_plan: Callable, strict: bool) -> list[str]:
    """Each leg's plan built (its grid placed on the launcher's hosts) and its stages' batches split."""
    lines = []
    for i in range(first, len(legs)):
        lspec = leg_spec(spec, legs[i])
        where = f"grid stage {i + 1} (epochs {legs[i].start_epoch}-{legs[i].until_epoch}" + (
            f" on grid {legs[i].grid})" if legs[i].grid else ")"
        )
        try:
            plan = first_plan if i == first else make_plan(lspec, strict)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        lspec.schedule.at(plan.world_size)  # its errors name the stage's field
        cannot = next((n for n in plan.notes if n.startswith("cannot start here")), "")
        lines.append(
            f"epochs {legs[i].start_epoch}-{legs[i].until_epoch}: grid {plan.grid}, {plan.world_size} "
            f"ranks, {plan.launcher} launcher" + (f" ({cannot})" if cannot else ", fits")
        )
    return lines


def check_elastic(elastic: bool, legs: list[Leg], max_restarts: int) -> str:
    if not elastic:
        return ""
    if len(legs) > 1:
        raise UserError("--elastic cannot be combined with stages that name their own grid")
    if max_restarts < 2:
        raise UserError("--elastic needs --max-restarts 2 or more: a node is dropped at its second failure in a row")
    return f"--elastic with --max-restarts {max_restarts}"


def check_model_input(spec: JobSpec) -> str:
    problem = input_size_problem(spec.model.arch, spec.data.image_size)
    if problem:
        raise UserError(problem)
    return f"{spec.model.arch} takes {spec.data.image_size} px images"


def check_data_classes(spec: JobSpec, strict: bool = True) -> str:
    """The data's classes per split against model.num_classes and each other. strict=False (the dry run, often
    on a login node that does not mount the data): a missing data folder is noted instead of refused."""
    source = source_of(spec.data.source)
    if not strict and source.takes_path and not Path(spec.data.source).exists():
        return f"data: {spec.data.source} is not on this machine, its classes are not checked"
    found = data_classes(spec)
    if found is None:
        return ""
    root, classes = found
    train = classes["train"]
    if len(train) != spec.model.num_classes:
        raise UserError(
            f"model.num_classes: {spec.model.num_classes} but {root}: train/ has {len(train)} class "
            f"folders; set --set model.num_classes={len(train)} (or give the data set it was meant for)"
        )
    differ = class_difference(classes)
    if differ:
        raise UserError(f"data.source: {root}: {differ}: make both hold the same class folders")
    return f"data: {len(train)} classes in train/ and val/, as model.num_classes"


def check_data_stage(spec: JobSpec, strict: bool = True) -> str:
    """data.stage = node: a node-local folder is named (data.stage_dir or a scheduler's variable) and is a
    writable folder here. strict=False (the dry run, often on a login node without the job's variables): a
    fault is noted instead of refused."""
    if spec.data.stage != "node":
        return ""
    try:
        base = check_stage_base(spec.data.stage_dir)
    except UserError as e:
        if strict:
            raise
        return f"{e} (checked again at launch)"
    return f"data.stage = node: copies go to {base}/torus-train-stage on each node"


def data_classes(spec: JobSpec) -> tuple[str, dict] | None:
    """(the data's name for messages, {split: classes}) as the data source's entry reads them (job/sources.py);
    None for a source without classes (synthetic). A missing folder, or staging asked for a source that cannot
    be staged, is a UserError."""
    source = source_of(spec.data.source)
    source.check(spec)
    return source.class_names(spec)
