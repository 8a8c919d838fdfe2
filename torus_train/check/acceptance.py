"""`torus-train check --acceptance`: the acceptance test for one GPU, the production configuration shrunk to it
(shrunk.py). Pure: no torch import here (probe() reaches it inside).

Each part is a function ``part(s: Shrunk) -> {CHECK: {field: value, "ok": bool}}`` filling the checks CHECKS
names (the JSON's schema 3: names and fields stay, so recorded results stay comparable). Each runs in a process
of its own (``python -m torus_train.check PART OUT``) under its time limit: a part that hangs, runs out of memory
or leaves the GPU in a bad state costs only its own checks, and every part starts from a fresh process (its peak
memory is its own). docs/check.md documents every check's fields and pass line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torus_train.check.environment import dali_version
from torus_train.check.parts import PARTS, named, run_parts, stderr_say
from torus_train.check.report import WRITER, document, failed
from torus_train.check.shrunk import ROOT, Shrunk
from torus_train.errors import UserError, shown_path
from torus_train.outfiles import write_json
from torus_train.registry import Registry
from torus_train.train.determinism import with_deterministic_env
from torus_train.userfiles import read_json

SCHEMA = 3
"""The JSON document's "gpu_check" field: its version."""
REHEARSAL_SLOWER = 5
"""A rehearsal's parts may take this many times their limits (a shared CPU is slow)."""


@dataclass(frozen=True)
class Work:
    """What a part does on one GPU, counted: its time limit is sized from these (docs/check.md's table), since
    no part has been timed on a GPU yet. The first GPU run's seconds replace UNIT_SECONDS' guesses."""

    starts: int
    """Processes that load Python, torch and CUDA (a `torus-train run` is two: its launcher and its rank)."""
    builds: int
    """Models built, placed on the device and wrapped (ResNet-50, or the check's small ResNet)."""
    autotunes: int
    """cuDNN autotuning rounds: the first forward and backward at a new batch shape or dtype."""
    captures: int
    """CUDA graph captures: two for each graphed loop run (its probe), one for the bare step graphed."""
    steps: int
    """Training steps at any batch, warm-up, probe and evaluation included."""
    other_s: int = 0
    """Seconds of anything else: generating the photo-like set, DALI's pipelines, the decoders' start."""

    @property
    def seconds(self) -> float:
        """The expected seconds on one H100 or H200 (UNIT_SECONDS per item, plus other_s)."""
        counted = (self.starts, self.builds, self.autotunes, self.captures, self.steps)
        return sum(n * unit for n, unit in zip(counted, UNIT_SECONDS.values(), strict=True)) + self.other_s


UNIT_SECONDS = {"starts": 10.0, "builds": 2.0, "autotunes": 10.0, "captures": 3.0, "steps": 0.05}
"""Seconds each counted item is taken to cost on one H100 or H200 at 224 px (ResNet-50): a process start
(imports, CUDA's context, NCCL's world of one), a model built, a cuDNN autotuning round, a capture with its
probe's replay and state copies, a step (the measured 5,700 img/s at batch 256 is 0.045 s a step)."""
LIMIT_MARGIN = 2
"""A part's limit is this many times its expected seconds (rounded up to 10 s): room for a slower GPU and for
guesses that were low, while a part that hangs still ends in minutes."""


@dataclass(frozen=True)
class AcceptancePart:
    """One part: its function ("module:function"), what it does (its time limit is sized from it), the checks
    it fills, what it shows, and whether it may turn determinism on (its process then starts with
    train/determinism.py's variables: cuBLAS reads them at the process's first gemm, before any part code could
    set them in time)."""

    ref: str
    work: Work
    checks: tuple[str, ...]
    shows: str
    deterministic: bool = False

    @property
    def limit(self) -> int:
        """Seconds the part may run on a GPU: LIMIT_MARGIN x its work's expected seconds, rounded up to 10 s."""
        return 10 * math.ceil(LIMIT_MARGIN * self.work.seconds / 10)


ACCEPTANCE: Registry[AcceptancePart] = Registry("acceptance part")
for _name, _part in (
    (
        "check",
        # `torus-train check` but throughput: NCCL's world of one, the graphs part's small ResNet (one autotuning
        # round, its probe's two captures, 6 steps), two deterministic runs of 4 steps; environment (mpirun,
        # DALI's import) and the decoders (nvJPEG's start, 17 images twice) are other_s
        AcceptancePart(
            "acceptance:machine",
            Work(1, 3, 1, 2, 14, 20),
            ("machine",),
            "`torus-train check`'s parts but throughput",
            deterministic=True,
        ),
    ),
    (
        "syncs",
        # one loop run of 12 steps at batch 32 in fp16, its probe's two captures; autotuning counted for the
        # ETA's timed step and for the warm-up (they share cuDNN's cache now that both run fp16: room); torch's
        # sync debug mode watching every launch is other_s
        AcceptancePart(
            "accept_loop:syncs", Work(1, 1, 2, 2, 12, 10), ("host_syncs",), "host reads per step of the loop in fp16"
        ),
    ),
    (
        "speed",
        # 7 models: the loop twice at 256 in fp16, once in bf16, once at 32 (each graphed: two captures), the
        # bare loop twice in fp16 and once in bf16; autotuning at (256, fp16), (256, bf16), (32, fp16);
        # 30 steps each
        AcceptancePart(
            "accept_loop:speed",
            Work(1, 7, 3, 8, 210),
            ("speed_vs_bare", "bf16_vs_fp16", "peak_memory"),
            "the loop against a bare PyTorch loop at the large batch, fp16 and bf16; peak memory",
        ),
    ),
    (
        "production",
        # the part, then `torus-train run` (launcher and rank); autotuning for training and evaluation at each
        # stage's batch, each stage graphed (two captures); about 60 steps with evaluation; the photo-like set
        # written first and DALI's pipelines per stage are other_s
        AcceptancePart(
            "accept_production:production",
            Work(3, 1, 4, 4, 60, 30),
            ("production", "data_wait"),
            "`torus-train run` of the shrunk spec on photo-like JPEGs, two stages, evaluation",
        ),
    ),
    (
        "digest",
        # two `torus-train run --deterministic` of 8 steps (launcher and rank each, graphed), then the loop at
        # 256 autotuned and deterministic (20 steps each, graphed): cuBLAS's workspace set before the first
        AcceptancePart(
            "accept_loop:digest",
            Work(5, 4, 1, 8, 56),
            ("digest",),
            "two --deterministic runs: equal digests; the mode's cost",
            deterministic=True,
        ),
    ),
    (
        "graphs",
        # per batch (16, 32, 256) and round (2): the loop graphed (two captures) and eager, the bare step eager
        # and graphed (one capture), 28 steps each; then agree's four deterministic runs of 12 steps at 32, three
        # of them graphed: 28 models, 24 captures, an autotuning round per batch, 720 steps
        AcceptancePart(
            "accept_graphs:graphs",
            Work(1, 28, 3, 24, 720),
            ("graphs",),
            "the loop graphed and eager against the bare step eager and graphed; graphed against eager",
            deterministic=True,
        ),
    ),
):
    ACCEPTANCE.add(_name, dataclasses.replace(_part, ref=f"torus_train.check.{_part.ref}"))

BOTH_STAGES = "both shares <= 0.10, each over >= 20 steps after the first 3 of its stage"
CHECKS: dict[str, dict[str, Any]] = {
    "machine": {"parts": None, "pass_if": "no part of `torus-train check` failed"},
    "host_syncs": {"steps": None, "syncs_per_step": None, "pass_if": "syncs_per_step == 0"},
    "speed_vs_bare": {
        "batch": 256,
        "torus_train_img_s": None,
        "bare_img_s": None,
        "ratio": None,
        "pass_if": "ratio >= 0.90",
    },
    "bf16_vs_fp16": dict.fromkeys(("bf16_img_s", "bare_bf16_img_s", "ratio", "fp16_img_s", "bf16_over_fp16"))
    | {"pass_if": "ratio >= 0.90"},
    "peak_memory": dict.fromkeys(("gib_batch_32", "gib_batch_256", "gpu_gib"))
    | {"pass_if": "gib_batch_256 <= 0.9 x gpu_gib"},
    "production": dict.fromkeys(
        ("backend", "loader", "dali_checked", "note", "steps", "evaluations", "images_per_s", "replicas_agree")
    )
    | {
        "pass_if": "backend nccl, loader dali (mixed) or without nvidia.dali torchvision (gpu), "
        "2 evaluations, replicas agree"
    },
    "data_wait": dict.fromkeys(("share_batch_32", "share_batch_256", "steps_batch_32", "steps_batch_256"))
    | {"pass_if": BOTH_STAGES},
    "digest": dict.fromkeys(("first", "second", "default_img_s", "deterministic_img_s", "deterministic_cost"))
    | {"pass_if": "first == second (both runs --deterministic)"},
    "graphs": dict.fromkeys(("batches", "eager_ratio_batch_32", "agree"))
    | {
        "pass_if": "ratio >= 0.85 at 16 and 32, >= 0.95 at 256; eager_ratio_batch_32 >= 0.90; agree: "
        "eager_vs_graphed_max_rel <= 0.005, graphed runs equal, the NaN step skipped"
    },
}
"""Every check: its fields (null until its part fills them) and its pass line."""


def machine(s: Shrunk) -> dict[str, Any]:
    """`torus-train check`'s parts in this process, throughput left out (graphs measures it with more columns);
    its own document is written to OUT/machine.json."""
    names = [n for n in PARTS.names() if n != "throughput"]
    t0 = time.perf_counter()
    found = run_parts(names, stderr_say)
    write_json(s.out / "machine.json", document(found, time.perf_counter() - t0), WRITER)
    parts = {name: {"ok": v.ok, "why": v.why} for name, (v, _) in found.items()}
    return {"machine": {"parts": parts, "ok": not failed(found) and len(parts) == len(names)}}


def part_list(value: str | None) -> list[str]:
    """The acceptance parts named in --parts (comma-separated), every part when None."""
    return named(value, ACCEPTANCE, "an acceptance part")


def claim_out(out: str | None, flag: str = "--out") -> Path:
    """The run's folder: a new one under the temporary folder, or ``out`` when it is absent, empty or an earlier
    acceptance run's (its summary.json says so); anything else is refused (a part clears its own folder there)."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="gpu-check-"))
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {shown_path(out)}: is a file; give a folder")
    if path.is_dir() and any(path.iterdir()) and not ours(path / "summary.json"):
        raise UserError(
            f"{flag} {shown_path(out)}: holds files an acceptance check did not write (no summary.json of "
            "`torus-train check --acceptance`); give a new or empty folder"
        )
    return path


def ours(summary: Path) -> bool:
    try:  # through the door: OUT is the user's folder; a FIFO at summary.json is refused, not opened
        doc = read_json(summary, "--out", 64 << 20)
    except UserError:
        return False
    return WRITER.owns_json(doc) and doc.get("gpu_check") == SCHEMA


def accept(names: list[str], s: Shrunk, say: Callable[[str], None]) -> dict[str, Any]:
    """Run the parts named, in registry order, each in its process; the schema-3 document, also written to
    OUT/summary.json (first with status "running": the folder is the check's from then on)."""
    t0 = time.monotonic()
    info = probe()
    (s.out / "parts").mkdir(parents=True, exist_ok=True)
    write_json(s.out / "summary.json", summary(s, info, "running", [], t0), WRITER)
    no_gpu = not s.rehearsal and info["gpu"] is None
    if no_gpu:
        say(
            "no CUDA GPU here (torch.cuda.is_available() is False): nothing to check; the checks stay null "
            "(`torus-train check` says what this machine can run; --rehearse runs the parts on the CPU)"
        )
        ran: list[str] = []
    else:
        ran = [n for n in ACCEPTANCE.names() if n in names]
        for name in ran:
            run_part(name, s, lambda text: say(f"gpu_check [{time.monotonic() - t0:.0f}s]: {text}"))
    status = "no-gpu" if no_gpu else "rehearsal" if s.rehearsal else "done"
    doc = summary(s, info, status, ran, t0)
    write_json(s.out / "summary.json", doc, WRITER)
    return doc


def summary(s: Shrunk, info: dict, status: str, ran: list[str], t0: float) -> dict[str, Any]:
    """The schema-3 document: the skeleton, the parts' results merged in, the status."""
    checks = merged(s.out, ran)
    asked = [checks[c] for p in ran for c in ACCEPTANCE.get(p).checks]
    if status == "done":
        passed = all(c["ok"] for c in asked)
        status = ("ok" if len(ran) == len(ACCEPTANCE.names()) else "partial") if passed else "failed"
    elif status == "rehearsal":  # every part asked for ran: no error, every field filled
        filled = all("error" not in c and None not in c.values() for c in asked)
        status = "rehearsal" if filled else "failed"
    return {
        "gpu_check": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "status": status,
        **info,
        "wall_seconds": int(time.monotonic() - t0),
        "out": str(s.out),
        "parts": ran,
        "checks": checks,
    }


def merged(out: Path, ran: list[str]) -> dict[str, dict[str, Any]]:
    """CHECKS with each part's parts/NAME.json merged in; a part that failed as a whole fails each of its
    checks with its error; the checks of a part not run stay null."""
    checks = {k: {"ok": None, "seconds": None, **v} for k, v in CHECKS.items()}
    for part in ran:
        path = out / "parts" / f"{part}.json"
        found: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"error": "no result"}
        for name in ACCEPTANCE.get(part).checks:
            checks[name].update(found.get(name) or {"ok": False, "error": found.get("error", "no result")})
            checks[name]["seconds"] = found.get("seconds")
    return checks


def run_part(name: str, s: Shrunk, say: Callable[[str], None]) -> None:
    """One part in its own process (and process group) under its limit; parts/NAME.json holds its checks, or
    {"error"} when it wrote none, and "seconds". Its results and runs of an earlier run are removed first."""
    part = ACCEPTANCE.get(name)
    limit = part.limit * (REHEARSAL_SLOWER if s.rehearsal else 1)
    result, log = clear_part(name, s.out)
    say(f"{name} (limit {limit}s): {part.shows}")
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "torus_train.check", name, str(s.out)]
    argv += ["--rehearse"] * s.rehearsal + ["--quick"] * s.quick
    with open(log, "w") as f:
        why = wait_limited(
            subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=part_env(part, s), start_new_session=True),
            limit,
        )
    found = json.loads(result.read_text()) if result.exists() and result.stat().st_size else {}
    if not found:
        found = {"error": f"{why}; see {log}"}
    found["seconds"] = int(time.monotonic() - t0)
    result.write_text(json.dumps(found))
    say(f"{name}: {json.dumps(found)[:400]}")


def clear_part(name: str, out: Path) -> tuple[Path, Path]:
    """Remove what the part wrote into ``out`` on an earlier run (its result, its own folder of runs: a run
    would refuse results already there, and their old figures would be read); (its result, its log)."""
    result = out / "parts" / f"{name}.json"
    result.unlink(missing_ok=True)
    shutil.rmtree(out / name, ignore_errors=True)  # only the part's own folder, in a folder claim_out let us use
    return result, out / "parts" / f"{name}.log"


def wait_limited(proc: subprocess.Popen, limit: int) -> str:
    """Wait for ``proc`` at most ``limit`` seconds; then, or on an interrupt, kill its process group (the
    ranks a part started too). Returns what ended it."""
    try:
        return f"exit {proc.wait(timeout=limit)}"
    except subprocess.TimeoutExpired:
        return f"over its {limit}s limit"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def part_env(part: AcceptancePart, s: Shrunk) -> dict[str, str]:
    """The part's environment: this package first on the path, cuBLAS's deterministic workspace where the part
    may turn determinism on (read at the process's first gemm), no GPU in a rehearsal."""
    env = dict(os.environ)
    if part.deterministic:
        with_deterministic_env(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    if s.rehearsal:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the rehearsal's ranks stay on the CPU, GPU or not
    return env


def probe() -> dict[str, Any]:
    """torch's and CUDA's versions, DALI's, and the first GPU (None without one)."""
    import torch

    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {
            "name": p.name,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(),
            "capability": f"sm_{p.major}{p.minor}",
        }
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "dali": dali_version(), "gpu": gpu}


def exit_code(doc: dict[str, Any]) -> int:
    """0: every check asked for passed, or no GPU, or a rehearsal ran; 1: a check failed."""
    return 0 if doc["status"] in ("ok", "partial", "rehearsal", "no-gpu") else 1


def table(doc: dict[str, Any]) -> str:
    """One row per check (ok / FAILED / n/a, its part's seconds, its pass line), then the status."""
    width = max(len(n) for n in doc["checks"])
    lines = [f"{'check':<{width}}  {'result':<6}  {'sec':>5}  pass if"]
    for name, c in doc["checks"].items():
        word = "n/a" if c["ok"] is None else "ok" if c["ok"] else "FAILED"
        sec = "" if c["seconds"] is None else str(c["seconds"])
        lines.append(f"{name:<{width}}  {word:<6}  {sec:>5}  {c['pass_if']}")
    lines.append(
        f"status {doc['status']}: {len(doc['parts'])} parts in {doc['wall_seconds']} s, results in {doc['out']}"
    )
    return "\n".join(lines)
