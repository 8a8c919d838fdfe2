"""`torus-train plan compare-run`: a finished CPU run's measured step, per stage, against the host prediction
(torus_train.plan.host) from this machine's calibration and a measured step profile (pure, no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torus_train.errors import UserError
from torus_train.job.algorithms import measured_as
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import Calibration, calibrate, check_host_options, host_grid, read_benches
from torus_train.plan.host import RunRecord, StepProfile, predict_host_step, read_run, read_step_profile
from torus_train.plan.timeline import Layer, model_layers


@dataclass(frozen=True)
class CompareRunRequest:
    """What `plan compare-run` takes; checked when made."""

    run_out: str
    """The finished run's --out folder (job.json, summary.json, metrics.jsonl)."""
    calibrate: str | None = None
    """This machine's `bench allreduce --json` file(s), comma-separated: the calibration (required)."""
    layer_profile: str | None = None
    """A step profile from `python -m torus_train.plan.host` (required)."""
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
    cal: Calibration
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
            f"plan compare-run: {req.run_out} ran on {rec.device}; only runs on CPU ranks of one host are "
            f"predicted (from this machine's --calibrate)"
        )
    if req.calibrate is None:
        raise UserError(
            "plan compare-run needs this machine's calibration: --calibrate BENCH.json (from `torus-train "
            f"bench allreduce --grid {rec.grid} --algo torus --json BENCH.json`)"
        )
    if req.layer_profile is None:
        raise UserError(
            "plan compare-run needs a measured step profile: --layer-profile PROF.json (from `python -m "
            "torus_train.plan.host MODEL PROF.json --image-size N --batch B`)"
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
    cal = calibrate(
        read_benches(req.calibrate),
        algo=algo,
        cores=req.cores,
        background=req.background,
        llc_bytes=None if req.llc_mib is None else int(req.llc_mib * 2**20),
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
    """The run, the calibration and the profile, as compare-run prints them before its table."""
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
        f"# compare-run {req.run_out}: {m.grid.size} CPU ranks on {rec.grid}, {spec['model']['arch']} at "
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
