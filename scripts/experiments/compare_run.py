#!/usr/bin/env python3
"""A finished CPU run's measured step, per stage, against the CPU-host model's prediction (cpu_host.py) from
this machine's calibration and a measured step profile.

    python scripts/experiments/compare_run.py OUT --calibrate BENCH.json --layer-profile PROF.json \\
        [--cores C] [--background B] [--run-background B] [--llc-mib M] [--json F]

OUT is a `torus-train run --out` folder of CPU ranks on this host (job.json, summary.json, metrics.jsonl);
BENCH.json `torus-train bench allreduce --json` rows of the run's algorithm on this host; PROF.json from
step_profile.py. Prints, per stage (per-rank batch), the measured step (the median step_time of the metrics
records after the first of the stage) against the predicted one, their ratio and which bound decided; --json
writes every term. Exit 0, or 2 with one line on bad input. scripts/bench/plan_vs_run.py runs it end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cpu_host import (
    MAX_CORES,
    HostCalibration,
    StepProfile,
    check_host_options,
    host_calibrate,
    predict_host_step,
    read_step_profile,
)

from torus_train.errors import UserError
from torus_train.job.algorithms import measured_as
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import host_grid, read_benches
from torus_train.plan.timeline import Layer, model_layers
from torus_train.userfiles import Field, check, check_regular, read_json, read_json_lines


@dataclass
class RunRecord:
    """What a finished run's folder says: its spec and grid, and the measured step time per stage."""

    out: str
    """The run's folder."""
    spec: dict
    """job.json's spec."""
    grid: str
    """XxY."""
    device: str
    """summary.json's device (cpu, cuda)."""
    steps: int
    """Optimizer steps done."""
    stages: list
    """[{per_rank_batch, records, records_used, step_seconds (median of the used records' step_time)}]."""


WARMUP_RECORDS = 1
"""metrics.jsonl records skipped at the start of each stage: the first steps warm caches (and a CUDA run captures its graph)."""


JOB_FIELDS = (
    Field("spec.model.arch", "str"),
    Field("spec.model.num_classes", "int", 1, 1 << 31),
    Field("spec.data.image_size", "int", 8, 1 << 16),
    Field("spec.comm.algo", "str"),
    Field("spec.comm.compression", "str"),
    Field("spec.comm.bucket_mb", "number", 0, 1 << 20, low_open=True),
    Field("grid.x", "int", 1, 1 << 20),
    Field("grid.y", "int", 1, 1 << 20),
)
"""What compare_run.py reads from OUT/job.json."""
SUMMARY_FIELDS = (Field("device", "str"), Field("steps", "int", 0))
"""What compare_run.py reads from OUT/summary.json."""
STEP_FIELDS = (Field("per_rank_batch", "int", 1, 1 << 30), Field("step_time", "number", 0, low_open=True))
"""What compare_run.py reads from each step record of OUT/metrics.jsonl."""


def read_run(out: str, flag: str = "compare_run.py") -> RunRecord:
    """OUT/job.json, OUT/summary.json and OUT/metrics.jsonl of a finished run, each field checked; one line
    naming the file and the field when one cannot be used."""
    d = Path(out)
    for name in ("job.json", "summary.json", "metrics.jsonl"):
        if not (d / name).exists():
            raise UserError(f"{flag}: {d / name} is missing: give the --out folder of a finished `torus-train run`")
        check_regular(d / name, flag)  # a FIFO or device is named, never opened
    where = {name: f"{flag}: {d / name}" for name in ("job.json", "summary.json", "metrics.jsonl")}
    job_json = read_json(d / "job.json", where["job.json"])
    job = check(job_json, JOB_FIELDS, where["job.json"])
    summary = check(read_json(d / "summary.json", where["summary.json"]), SUMMARY_FIELDS, where["summary.json"])
    by_batch: dict[int, list] = {}
    for n, m in enumerate(read_json_lines(d / "metrics.jsonl", where["metrics.jsonl"]), 1):
        if isinstance(m, dict) and "event" not in m and "step_time" in m:
            rec = check(m, STEP_FIELDS, f"{where['metrics.jsonl']}: record {n}")
            by_batch.setdefault(rec["per_rank_batch"], []).append(rec["step_time"])
    stages = []
    for batch, times in by_batch.items():
        used = times[WARMUP_RECORDS:] or times
        stages.append(
            {
                "per_rank_batch": batch,
                "records": len(times),
                "records_used": len(used),
                "step_seconds": statistics.median(used),
            }
        )
    if not stages:
        raise UserError(
            f"{flag}: {d / 'metrics.jsonl'} has no step records (a run of a few steps with "
            f"job.log_every above them logs none: rerun with --set job.log_every=N)"
        )
    return RunRecord(
        str(d), job_json["spec"], f"{job['grid.x']}x{job['grid.y']}", summary["device"], summary["steps"], stages
    )


@dataclass(frozen=True)
class CompareRunRequest:
    """What compare_run.py takes; checked when made."""

    run_out: str
    """The finished run's --out folder (job.json, summary.json, metrics.jsonl)."""
    calibrate: str | None = None
    """This machine's `bench allreduce --json` file(s), comma-separated: the calibration (required)."""
    layer_profile: str | None = None
    """A step profile from step_profile.py (required)."""
    cores: int | None = None
    """CPU cores for the oversubscription term; None: this machine's."""
    background: float = 0.0
    """Other runnable processes that shared the cores during the bench."""
    run_background: float | None = None
    """Other runnable threads while the run ran; None: `background`."""
    llc_mib: float | None = None
    """Last-level cache (MiB) the ranks' buffers share; None: this machine's, from /sys."""

    def __post_init__(self) -> None:
        check_host_options(self.background, self.llc_mib, self.run_background)

    @property
    def during_run(self) -> float:
        """The background while the run ran."""
        return self.background if self.run_background is None else self.run_background


@dataclass
class RunModel:
    """What the prediction of one run rests on, read from the run's spec, the bench and the profile."""

    grid: Grid
    cal: HostCalibration
    profile: StepProfile
    layers: Sequence[Layer]
    bucket_cap_bytes: int
    exchange_bytes: int
    """Bytes per gradient element exchanged: 4, or 2 with compression."""


def compare_run(req: CompareRunRequest, echo: Callable[[str], None] = print) -> dict:
    """Echo the run, the calibration and the profile, then per stage the measured and predicted step with what
    bounds it; returns {run, grid, ranks, device, steps, calibration, profile, run_background, stages} for JSON."""
    rec = _cpu_run(req)
    m = _run_model(req, rec)
    for line in head_lines(req, rec, m):
        echo(line)
    echo(
        f"{'batch/rank':>10} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'bound':>9} "
        f"{'timeline ms':>12} {'cores ms':>9} {'exchanges ms':>13}"
    )
    stages = [_stage(st, m, req.during_run, echo) for st in rec.stages]
    ratios = ", ".join(f"{s['ratio']:.2f}" for s in stages)
    echo(
        f"# summary: predicted / measured step {ratios} "
        f"(measured: median step_time of metrics.jsonl records after the first of each stage)"
    )
    return {
        "run": req.run_out,
        "grid": rec.grid,
        "ranks": m.grid.size,
        "device": rec.device,
        "steps": rec.steps,
        "calibration": m.cal.__dict__,
        "profile": m.profile.__dict__,
        "run_background": req.during_run,
        "stages": stages,
    }


def _cpu_run(req: CompareRunRequest) -> RunRecord:
    """The run's record; UserError unless it ran on CPU and the calibration and profile are given."""
    rec = read_run(req.run_out)
    if rec.device != "cpu":
        raise UserError(
            f"compare_run.py: {req.run_out} ran on {rec.device}; only runs on CPU ranks of one host are "
            f"predicted (from this machine's --calibrate)"
        )
    if req.calibrate is None:
        raise UserError(
            "compare_run.py needs this machine's calibration: --calibrate BENCH.json (from `torus-train "
            f"bench allreduce --grid {rec.grid} --algo torus --json BENCH.json`)"
        )
    if req.layer_profile is None:
        raise UserError(
            "compare_run.py needs a measured step profile: --layer-profile PROF.json (from `python "
            "scripts/experiments/step_profile.py MODEL PROF.json --image-size N --batch B`)"
        )
    return rec


def _run_model(req: CompareRunRequest, rec: RunRecord) -> RunModel:
    """The run's grid, model, buckets and exchange dtype from its spec; the profile (of the run's model) and the
    calibration of the run's algorithm."""
    assert req.calibrate is not None and req.layer_profile is not None  # _cpu_run refused it without them
    spec = rec.spec
    arch, size = spec["model"]["arch"], int(spec["data"]["image_size"])
    prof = read_step_profile(req.layer_profile)
    if (prof.model, prof.image_size) != (arch, size):
        raise UserError(
            f"--layer-profile: {req.layer_profile} is {prof.model} at {prof.image_size} px; the run is "
            f"{arch} at {size} px: measure the run's model"
        )
    algo = measured_as(spec["comm"]["algo"])  # bench rows of the algorithm the run's comm.algo exchanges with
    cal = host_calibrate(
        read_benches(req.calibrate, "--calibrate"),
        algo=algo,
        cores=req.cores,
        background=req.background,
        llc_bytes=None if req.llc_mib is None else int(req.llc_mib * 2**20),
        flag="--calibrate",
    )
    return RunModel(
        host_grid(rec.grid),
        cal,
        prof,
        model_layers(arch, size, int(spec["model"]["num_classes"])),
        int(float(spec["comm"]["bucket_mb"]) * 2**20),
        4 if spec["comm"]["compression"] == "none" else 2,
    )


def head_lines(req: CompareRunRequest, rec: RunRecord, m: RunModel) -> list[str]:
    """The run, the calibration and the profile, as compare_run.py prints them before its table."""
    spec, cal, prof = rec.spec, m.cal, m.profile
    a = prof.alone()
    how = (
        "CPU time"
        if prof.clock == "cpu"
        else f"wall time with background {prof.background:g}, divided by its own oversubscription "
        f"{prof.own_oversubscription:.2f}"
    )
    loop = (
        f"; the loop's own work {prof.loop_overhead() * 1e3:.1f} ms (a one-rank run used "
        f"{prof.loop_seconds * 1e3:.1f} ms of CPU per step)"
        if prof.loop_seconds is not None
        else ""
    )
    return [
        f"# compare_run {req.run_out}: {m.grid.size} CPU ranks on {rec.grid}, {spec['model']['arch']} at "
        f"{int(spec['data']['image_size'])} px, comm {spec['comm']['algo']}, buckets of "
        f"{m.bucket_cap_bytes / 2**20:g} MiB, {rec.steps} steps",
        f"# calibration: {cal.algo} on {cal.grid} from {req.calibrate} (alpha {cal.alpha_us:.1f} us, "
        f"{cal.cache_gbytes_per_s:.3f} / {cal.memory_gbytes_per_s:.3f} GB/s per rank in / beyond the cache, "
        f"{cal.cores} cores, bench background {req.background:g}); run background {req.during_run:g}",
        f"# profile {req.layer_profile}: one rank alone at batch {prof.batch}, {prof.threads} thread(s): forward "
        f"{a[0] * 1e3:.1f} ms, backward {a[1] * 1e3:.1f} ms, optimizer {a[2] * 1e3:.1f} ms ({how}){loop}",
    ]


def _stage(st: dict, m: RunModel, run_background: float, echo: Callable[[str], None]) -> dict:
    """One stage of the run: its measured step against the host prediction, echoed as a row of the table."""
    h = predict_host_step(
        m.cal, m.profile, m.grid, st["per_rank_batch"], m.bucket_cap_bytes, m.exchange_bytes, m.layers, run_background
    )
    ratio = h.step_seconds / st["step_seconds"]
    echo(
        f"{st['per_rank_batch']:>10} {st['step_seconds'] * 1e3:>12.1f} {h.step_seconds * 1e3:>13.1f} "
        f"{ratio:>10.2f} {h.bound:>9} {h.timeline_step_seconds * 1e3:>12.1f} "
        f"{h.cores_step_seconds * 1e3:>9.1f} {' + '.join(f'{x * 1e3:.1f}' for x in h.bucket_seconds):>13}"
    )
    return st | {
        "measured_step_seconds": st["step_seconds"],
        "predicted_step_seconds": h.step_seconds,
        "ratio": ratio,
        "prediction": h.__dict__,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_out", metavar="OUT", help="the finished run's --out folder")
    ap.add_argument("--calibrate", metavar="BENCH.json", help="this machine's bench file(s), comma-separated")
    ap.add_argument("--layer-profile", metavar="PROF.json", help="a step profile of the run's model")
    ap.add_argument("--cores", type=int, default=None, help="CPU cores for the oversubscription term")
    ap.add_argument("--background", type=float, default=0.0, help="other runnable processes during the bench")
    ap.add_argument("--run-background", type=float, default=None, help="the same during the run [--background]")
    ap.add_argument("--llc-mib", type=float, default=None, help="last-level cache in MiB [this machine's]")
    ap.add_argument("--json", metavar="F", default=None, help="write the result as JSON")
    a = ap.parse_args(argv)
    try:
        if a.cores is not None and not 1 <= a.cores <= MAX_CORES:
            raise UserError(f"--cores: {a.cores} must be in [1, {MAX_CORES}]")
        req = CompareRunRequest(
            a.run_out, a.calibrate, a.layer_profile, a.cores, a.background, a.run_background, a.llc_mib
        )
        doc = compare_run(req)
    except UserError as e:
        print(f"compare_run.py: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"# wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
