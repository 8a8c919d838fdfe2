"""The job spec: one TOML file (plus CLI overrides) -> a validated JobSpec (pure; no torch import).

The type, one small dataclass per section, is job/sections.py's ``JobSpec`` (importable from here too). Loading
rejects unknown keys and wrong types naming the dotted field path (``schedule.stages[1].global_batch``);
``validate(spec)`` checks values the same way. CLI flags become dotted overrides (``--gpus 8`` is ``grid.gpus = 8``; ``--set
comm.algo=flat`` sets any field) applied to the raw TOML table before it is built, so they go through the
same checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import typing
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib  # novermin (3.11+; vermin does not see the fallback)
else:  # Python 3.10: the same parser from PyPI (a dependency there, see pyproject.toml)
    import tomli as tomllib

from torus_train.errors import UserError
from torus_train.job import algorithms
from torus_train.job.control import CONTROLS
from torus_train.job.gpus import BACKENDS
from torus_train.job.launchers import choices as launcher_choices
from torus_train.job.models import CLASSIFICATION_ARCHS, HOUSE_ARCHS
from torus_train.job.schedule import ScheduleError
from torus_train.job.sections import JobSpec
from torus_train.job.sources import DECODERS, choices_text
from torus_train.job.topology import MAX_WORLD, parse_grid
from torus_train.userfiles import read_bytes


class SpecError(UserError):
    """A job spec field that is unknown, of the wrong type, or out of range; the message names its path."""


MAX_IMAGE_SIZE = 8192
MAX_SPEC_BYTES = 1 << 20
MAX_INT = 2**63 - 1
"""Every integer field fits a signed 64-bit integer (what torch and the native code take)."""
MAX_INT32 = 2**31 - 1
"""Counts that reach torch or DALI as sizes, seeds or step numbers (int32 there)."""
MAX_EPOCHS = 1_000_000
"""schedule.epochs: a rank plans its run epoch by epoch (the ETA's epoch ends), so the count is bounded; a
million epochs is 10,000 times an ImageNet recipe (schedule.steps stops a run sooner)."""
MAX_CLASSES = 1_000_000
"""model.num_classes: a classifier of 1M classes over 2,048 features already holds 8 GB of fp32 weights."""
MAX_BUCKET_MB = 1_048_576.0
"""comm.bucket_mb (and plan's --bucket-cap-mb, the same size): 1 TiB, far above any model's gradients (one
bucket then holds them all)."""
MAX_TIMEOUT_S = 31_536_000.0
"""One year: torch turns timeout_s into a timedelta, which overflows far above this."""


def validate(spec: JobSpec) -> JobSpec:
    """Check value ranges and choices; raise SpecError naming the field path and the bad value."""
    _check_choices(spec)
    _check_ranges(spec)
    _check_optimizer(spec)
    _check_names(spec)
    _check_control(spec)
    return spec


def _check_control(spec: JobSpec) -> None:
    """A control that follows the measured noise scale needs the measure (noise.enabled)."""
    if CONTROLS[spec.schedule.control].rule and not spec.noise.enabled:
        raise SpecError(
            f'schedule.control = "{spec.schedule.control}" follows the measured noise scale, but noise.enabled = '
            'false turns the measure off; set noise.enabled = true or schedule.control = "fixed"'
        )


def _check_choices(spec: JobSpec) -> None:
    _choice("launch.launcher", spec.launch.launcher, launcher_choices())
    _choice("launch.container_runtime", spec.launch.container_runtime, ("singularity", "apptainer"))
    _choice("model.precision", spec.model.precision, ("fp32", "fp16", "bf16"))
    _choice("model.cuda_graphs", spec.model.cuda_graphs, ("auto", "off"))
    _choice("data.loader", spec.data.loader, ("auto", "dali", "torchvision"))
    _choice("data.decoder", spec.data.decoder, DECODERS.names())
    _choice("data.on_corrupt", spec.data.on_corrupt, ("fail", "skip"))
    _choice("data.stage", spec.data.stage, ("none", "node"))
    _choice("optimizer.name", spec.optimizer.name, ("sgd", "lars"))
    _choice("comm.algo", spec.comm.algo, algorithms.training_choices())
    _choice("comm.compression", spec.comm.compression, ("none", "fp16", "bf16"))
    _choice("comm.backend", spec.comm.backend, BACKENDS)
    if spec.comm.compression == "fp16" and spec.model.precision != "fp16":
        # divided by the world size before rounding to fp16, small gradients flush to zero without the
        # GradScaler that only model.precision = fp16 brings
        raise SpecError(
            f"comm.compression = fp16 needs model.precision = fp16 (its loss scaler), not "
            f"{spec.model.precision!r}; use comm.compression = bf16 or none"
        )


def _check_ranges(spec: JobSpec) -> None:
    _finite_and_bounded(spec, "")
    for path, value, low, high in (
        ("job.log_every", spec.job.log_every, 1, MAX_INT32),
        ("grid.gpus", spec.grid.gpus, 0, MAX_WORLD),
        ("job.seed", spec.job.seed, 0, MAX_INT32),
        ("job.check_every_steps", spec.job.check_every_steps, 0, MAX_INT32),
        ("job.max_nonfinite_steps", spec.job.max_nonfinite_steps, 1, MAX_INT32),
        ("grid.gpus_per_node", spec.grid.gpus_per_node, 0, MAX_WORLD),
        ("model.num_classes", spec.model.num_classes, 2, MAX_CLASSES),
        ("data.image_size", spec.data.image_size, 8, MAX_IMAGE_SIZE),
        ("data.num_threads", spec.data.num_threads, 0, 4096),
        ("launch.cpus_per_rank", spec.launch.cpus_per_rank, 0, 4096),
        ("data.synthetic_samples", spec.data.synthetic_samples, 0, MAX_INT32),
        ("data.io_workers", spec.data.io_workers, 1, 256),
        ("data.prefetch", spec.data.prefetch, 1, 64),
        ("data.shuffle_buffer", spec.data.shuffle_buffer, 1, MAX_INT32),
        ("checkpoint.every_steps", spec.checkpoint.every_steps, 0, MAX_INT32),
        ("checkpoint.every_epochs", spec.checkpoint.every_epochs, 0, MAX_INT32),
        ("checkpoint.keep", spec.checkpoint.keep, 1, MAX_INT32),
        ("eval.every_epochs", spec.eval.every_epochs, 0, MAX_INT32),
        *_schedule_counts(spec),
    ):
        if value < low:
            raise SpecError(f"{path}: {value!r} must be >= {low}")
        if high is not None and value > high:
            raise SpecError(f"{path}: {value!r} must be <= {high:,}")
    for path, value, high in (
        ("comm.bucket_mb", spec.comm.bucket_mb, MAX_BUCKET_MB),
        ("comm.timeout_s", spec.comm.timeout_s, MAX_TIMEOUT_S),
        ("data.stage_timeout_s", spec.data.stage_timeout_s, MAX_TIMEOUT_S),
        ("noise.average_epochs", spec.noise.average_epochs, MAX_EPOCHS),
    ):
        if not value > 0:
            raise SpecError(f"{path}: {value!r} must be > 0")
        if value > high:
            raise SpecError(f"{path}: {value!r} must be <= {high:,.0f}")
    if spec.launch.watchdog_s < 0:
        raise SpecError(f"launch.watchdog_s: {spec.launch.watchdog_s!r} must be >= 0 (0 = comm.timeout_s + 60)")


def _schedule_counts(spec: JobSpec) -> list[tuple]:
    """The schedule's counts that reach torch (epochs, steps, batches) as (path, value, low, high)."""
    sc = spec.schedule
    rows = [
        ("schedule.epochs", sc.epochs, 0, MAX_EPOCHS),
        ("schedule.steps", sc.steps, 0, MAX_INT32),
        ("schedule.max_per_rank_batch", sc.max_per_rank_batch, 0, MAX_INT32),
    ]
    for i, st in enumerate(sc.stages):
        rows += [
            (f"schedule.stages[{i}].per_rank_batch", st.per_rank_batch, 0, MAX_INT32),
            (f"schedule.stages[{i}].global_batch", st.global_batch, 0, MAX_INT32 * MAX_WORLD),
            (f"schedule.stages[{i}].until_epoch", st.until_epoch, 0, MAX_INT32),
        ]
    return rows


def _check_optimizer(spec: JobSpec) -> None:
    if not 0 <= spec.optimizer.momentum < 1:
        raise SpecError(f"optimizer.momentum: {spec.optimizer.momentum!r} must be in [0, 1)")
    if not spec.optimizer.weight_decay >= 0:
        raise SpecError(f"optimizer.weight_decay: {spec.optimizer.weight_decay!r} must be >= 0")
    if not spec.optimizer.trust_coefficient > 0:
        raise SpecError(f"optimizer.trust_coefficient: {spec.optimizer.trust_coefficient!r} must be > 0")
    if spec.optimizer.nesterov and spec.optimizer.momentum == 0:
        raise SpecError("optimizer.nesterov = true needs optimizer.momentum > 0")
    if not 0 <= spec.eval.target_top1 <= 1:
        raise SpecError(f"eval.target_top1: {spec.eval.target_top1!r} must be a fraction in [0, 1]")


def _check_names(spec: JobSpec) -> None:
    """The model, the data source, the schedule, the grid and the launch environment."""
    if spec.model.arch not in CLASSIFICATION_ARCHS and spec.model.arch not in HOUSE_ARCHS:
        close = difflib.get_close_matches(spec.model.arch, (*CLASSIFICATION_ARCHS, *HOUSE_ARCHS), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. resnet18, resnet50, vit_b_16"
        raise SpecError(f"model.arch: {spec.model.arch!r} is not a torchvision classification model; {hint}")
    if not spec.data.source:
        raise SpecError(f"data.source: must be one of {choices_text()}")
    try:
        spec.schedule.check()
    except ScheduleError as e:
        raise SpecError(str(e)) from None
    if spec.grid.grid:
        try:
            parse_grid(spec.grid.grid)
        except UserError as e:
            raise SpecError(f"grid.grid: {e}") from None
    for i, item in enumerate(spec.launch.env):
        name = item.split("=", 1)[0]
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise SpecError(f"launch.env[{i}]: {item!r} is not NAME or NAME=VALUE")


def _finite_and_bounded(obj: Any, path: str) -> None:
    """Every float field of a section (and of its nested sections and lists) finite, every integer within
    64 bits; the message names the dotted path."""
    items: list[tuple[str, Any]]
    if dataclasses.is_dataclass(obj):
        items = [(f"{path}.{f.name}" if path else f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    elif isinstance(obj, list):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    else:
        return
    for p, v in items:
        if isinstance(v, bool):
            continue
        if isinstance(v, str) and "\0" in v:
            raise SpecError(f"{p}: {_short(v)} contains a NUL character")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{p}: {v!r} must be a finite number")
        if isinstance(v, int) and not -MAX_INT <= v <= MAX_INT:
            raise SpecError(f"{p}: {_short(v)} is out of range (at most {MAX_INT:,})")
        _finite_and_bounded(v, p)


def _short(v: Any) -> str:
    """A value for an error line: long numbers and strings cut in the middle."""
    try:
        text = repr(v)
    except ValueError:  # an int past Python's digit limit
        return "a number too large to print"
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} characters)"


def _choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{path}: {value!r} is not one of {', '.join(allowed)}")


# --------------------------------------------------------------------------------------------------------
# building dataclasses from TOML tables, with dotted-path errors
# --------------------------------------------------------------------------------------------------------
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _build(cls: type, table: Any, path: str) -> Any:
    where = path or "the spec"
    if not isinstance(table, dict):
        raise SpecError(f"{where}: expected a table, got {_shown(table)}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        shown = key if _KEY_PART.match(key) else _short(key)
        p = f"{path}.{shown}" if path else shown
        if key not in known:
            raise SpecError(f"{p}: unknown key (known in {where}: {', '.join(known)})")
        kwargs[key] = _convert(hints[key], value, p)
    return cls(**kwargs)


def _convert(tp: Any, value: Any, path: str) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(f"{path}: expected a list, got {_shown(value)}")
        return [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise SpecError(f"{path}: {_short(value)} is out of range for a number") from None
    if (tp in (int, float) and isinstance(value, bool)) or not isinstance(value, tp):
        raise SpecError(f"{path}: expected {_TYPE_NAMES.get(tp, tp.__name__)}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {_short(value)}"


_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", value); the value is read as TOML (8, 0.5, true, "x", [..]) else as a string.
    A bad token raises SpecError naming it (``--set '=1': ...``)."""
    if "=" not in text:
        raise SpecError(f"--set {_short(text)}: expected FIELD=VALUE, e.g. comm.algo=flat")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key:
        raise SpecError(f"--set {_short(text)}: no field name before '='; expected FIELD=VALUE, e.g. comm.algo=flat")
    if not all(_KEY_PART.match(part) for part in key.split(".")):
        raise SpecError(
            f"--set {_short(text)}: {_short(key)} is not a dotted field name like comm.algo or schedule.epochs"
        )
    value = _parse_toml_value(raw, f"--set {_short(text)}")
    return key, value


def _parse_toml_value(raw: str, where: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    except (RecursionError, MemoryError):
        raise SpecError(f"{where}: the value is nested too deeply") from None
    except ValueError as e:  # an integer past Python's digit limit
        raise SpecError(f"{where}: {_short(str(e))}") from None


def apply_overrides(table: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Set dotted keys in a raw spec table (creating sections); unknown ones fail later when it is built."""
    for key, value in overrides:
        parts = key.split(".")
        node = table
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise SpecError(f"{'.'.join(parts[: i + 1])}: is not a section, cannot set {key}")
            node = nxt
        node[parts[-1]] = value
    return table


def read_spec_table(path: str | Path | None) -> dict[str, Any]:
    """The raw TOML table of a spec file, or of the embedded default spec when path is None; every file or
    decoding problem is a SpecError naming the file."""
    if path is None:
        text = resources.files("torus_train.specs").joinpath("default.toml").read_text()
        source = "default spec"
    else:
        source = f"--spec {_short(str(path))}"
        if "\0" in str(path):
            raise SpecError(f"{source}: the file name contains a NUL character")
        p = Path(path)
        try:
            if not p.exists():
                raise SpecError(f"{source}: no such file")
            if p.stat().st_size > MAX_SPEC_BYTES:
                raise SpecError(f"{source}: {p.stat().st_size:,} bytes; a job spec is at most {MAX_SPEC_BYTES:,}")
            text = read_bytes(p, source, MAX_SPEC_BYTES).decode("utf-8")  # the door: refuses a FIFO, a device
        except UnicodeDecodeError as e:
            raise SpecError(f"{source}: not UTF-8 text (byte {e.start})") from None
        except UserError as e:
            raise SpecError(str(e)) from None
        except OSError as e:
            raise SpecError(f"{source}: {e.strerror or e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{source}: not valid TOML ({e})") from None
    except (RecursionError, MemoryError):
        raise SpecError(f"{source}: values nested too deeply") from None
    except ValueError as e:  # an integer past Python's digit limit
        raise SpecError(f"{source}: not a usable TOML value ({_short(str(e))})") from None


def spec_from_table(table: dict[str, Any]) -> JobSpec:
    """Build and validate a JobSpec from a raw table."""
    return validate(_build(JobSpec, table, ""))


def load_spec(path: str | Path | None = None, overrides: list[tuple[str, Any]] | None = None) -> JobSpec:
    """Spec file (or the embedded default) + dotted overrides -> validated JobSpec."""
    return spec_from_table(apply_overrides(read_spec_table(path), overrides or []))
