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
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torus_train.errors import UserError
from torus_train.job.legs import Leg, leg_spec
from torus_train.job.spec import JobSpec, input_size_problem


def preflight(spec: JobSpec, legs: list[Leg], first: int, first_plan, make_plan: Callable, elastic: bool,
              max_restarts: int, strict: bool) -> list[str]:
    """Run every check; the report lines (a later leg's plan is built again when it starts: a fresh port).

    first_plan: the launch plan of leg ``first``; make_plan(leg_spec, strict) builds a later leg's plan;
    strict=False (the dry run) lets a leg that cannot start on this machine through with a note, as the first
    leg's plan does."""
    lines = check_legs(spec, legs, first, first_plan, make_plan, strict)
    lines.append(check_elastic(elastic, legs, max_restarts))
    lines.append(check_model_input(spec))
    lines.append(check_data_classes(spec, strict))
    return [line for line in lines if line]


def check_legs(spec: JobSpec, legs: list[Leg], first: int, first_plan, make_plan: Callable,
               strict: bool) -> list[str]:
    """Each leg's plan built (its grid placed on the launcher's hosts) and its stages' batches split."""
    lines = []
    for i in range(first, len(legs)):
        lspec = leg_spec(spec, legs[i])
        where = f"grid stage {i + 1} (epochs {legs[i].start_epoch}-{legs[i].until_epoch}" + \
            (f" on grid {legs[i].grid})" if legs[i].grid else ")")
        try:
            plan = first_plan if i == first else make_plan(lspec, strict)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        lspec.schedule.at(plan.world_size)  # its errors name the stage's field
        cannot = next((n for n in plan.notes if n.startswith("cannot start here")), "")
        lines.append(f"epochs {legs[i].start_epoch}-{legs[i].until_epoch}: grid {plan.grid}, {plan.world_size} "
                     f"ranks, {plan.launcher} launcher" + (f" ({cannot})" if cannot else ", fits"))
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
    source = spec.data.source
    if not strict and source not in ("synthetic", "demo") and not Path(source).exists():
        return f"data: {source} is not on this machine, its classes are not checked"
    found = data_classes(spec)
    if found is None:
        return ""
    root, classes = found
    train, val = classes["train"], classes["val"]
    if len(train) != spec.model.num_classes:
        raise UserError(f"model.num_classes: {spec.model.num_classes} but {root}: train/ has {len(train)} class "
                        f"folders; set --set model.num_classes={len(train)} (or give the data set it was meant for)")
    if val != train:
        extra, missing = sorted(set(val) - set(train)), sorted(set(train) - set(val))
        what = "; ".join(x for x in (
            f"not in train/: {', '.join(extra[:3])}" if extra else "",
            f"missing in val/: {', '.join(missing[:3])}" if missing else "") if x) or "another order"
        raise UserError(f"data.source: {root}: val/ has other classes than train/ ({what}); the labels "
                        f"would not match: make both hold the same class folders")
    return f"data: {len(train)} classes in train/ and val/, as model.num_classes"


def data_classes(spec: JobSpec) -> tuple[str, dict] | None:
    """(the data's name for messages, {split: classes}); None for synthetic data. A missing folder, or staging
    asked for a folder that is not a packed set, is a UserError."""
    from torus_train.data.index import SPLITS, DataError, default_location, list_classes

    source = spec.data.source
    if source == "synthetic":
        return None
    if source == "demo":
        from torus_train.data.demo import CLASSES, class_dir

        names = tuple(class_dir(c) for c in range(len(CLASSES)))
        return "the demo data set", {s: names for s in SPLITS}
    root = Path(source)
    if not root.is_dir():
        raise UserError(f"data.source: {source}: no such folder (expected train/ and val/ inside, or a packed set)"
                        if not root.exists() else f"data.source: {source}: not a folder")
    from torus_train.data.packed import is_packed, split_classes

    if spec.data.stage != "none" and not is_packed(root):
        raise UserError(f"data.stage = {spec.data.stage} needs a packed set (torus-train data pack --data DIR --out "
                        f"SHARDS, then --data SHARDS); data.source is {source}")

    if is_packed(root):  # a packed set: its classes per split are in packed.json
        return str(root), split_classes(root)
    if not any((root / s).is_dir() for s in SPLITS):
        raise UserError(f"data.source: {root}: neither an ImageNet-layout folder (train/CLASS/*, val/CLASS/*) nor "
                        f"a packed set (packed.json; torus-train data pack)")
    index = Path(spec.data.index) if spec.data.index else default_location(root)
    indexed = _indexed_classes(index)
    try:
        return str(root), indexed or {s: list_classes(root, s) for s in SPLITS}
    except DataError:
        raise
    except OSError as e:
        raise UserError(f"data.source: {root}: {e.strerror or e}") from None


def _indexed_classes(index: Path) -> dict | None:
    """{split: classes} from an index's meta.json (None when there is none; the launcher checks it whole)."""
    import json

    try:
        meta = json.loads((index / "meta.json").read_text())
        return {s: tuple(meta["splits"][s]["classes"]) for s in ("train", "val")}
    except (OSError, ValueError, KeyError, TypeError):
        return None

