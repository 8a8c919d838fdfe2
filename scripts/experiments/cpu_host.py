"""The model of one CPU host whose ranks outnumber its cores: what this project's 2-core test machines needed
to predict their own benches and runs (not part of the package: on a cluster or a laptop a rank has a core, or
a GPU, to itself; `torus-train plan calibrate` fits plain alpha and beta there). Used by check_calibration.py,
step_profile.py, compare_run.py and scripts/bench/plan_vs_run.py; docs/plan.md, "The CPU test host".

An all-reduce, fitted on one grid's `bench allreduce --json` rows and used to predict another grid:

    time = o * (steps * alpha + coeff * n * (beta_cache + miss * beta_extra))
    o    = max(1, (ranks + background) / cores)       ranks time-share the cores
    miss = 1 - min(1, llc / (ranks * n))              share of the working set the last-level cache cannot hold

steps and coeff come from torus_train.plan.calibrate.local_coefficients (every rank on one host). All ranks of an
all-reduce work at once, so their CPU time per step and per byte is shared by the cores: o. The ranks' buffers
(ranks * n bytes) share one last-level cache; while they fit, a byte costs beta_cache (copy and sum in cache),
the share that does not fit costs beta_extra more (DRAM). llc is the machine's, read from the OS, not fitted.

A training step of R ranks of one thread each on C cores with B other runnable threads (predict_host_step):
forward, backward and optimizer from a one-rank step profile (StepProfile, measured in CPU time by
step_profile.py), each stretched by o; the run's buckets (torus_train.plan.timeline) exchanged in the calibrated
time; the step is the larger of the timeline (the critical path) and the cores' work, o x (forward + backward +
optimizer) + the exchanges: with R + B >= C an exchange thread takes its core from the backward pass and
nothing hides. The training loop's own work per step (StepProfile.loop_seconds) comes after the optimizer.
Stated simplification: an exchange on loopback gloo or shared memory is CPU work throughout, latency included.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torus_train.errors import UserError, check_number
from torus_train.job.algorithms import DEFAULT
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import (
    busbw_gbytes_per_s,
    check_bandwidth,
    fit_relative,
    host_grid,
    local_coefficients,
    rows_to_fit,
)
from torus_train.plan.predict import MAX_PROFILE_SECONDS, check_module_seconds
from torus_train.plan.timeline import Layer, layers_with_profile, timeline
from torus_train.userfiles import Field, check, read_json

MAX_CORES = 1 << 20
"""--cores: at most a million (beyond any one host)."""
MAX_BACKGROUND = float(1 << 20)
"""--background, --run-background: at most a million other runnable processes (beyond any host; keeps the
model's oversubscription finite)."""
LLC_MIB_RANGE = (1 / 1024, float(1 << 20))
"""--llc-mib: from 1 KiB to 1 TiB of last-level cache."""


def check_host_options(background: float, llc_mib: float | None, run_background: float | None = None) -> None:
    """The host model's number options (check_calibration.py, compare_run.py) finite and in range, naming the flag."""
    check_number(background, "--background", 0.0, low_ok=True, high=MAX_BACKGROUND)
    check_number(run_background, "--run-background", 0.0, low_ok=True, high=MAX_BACKGROUND)
    check_number(llc_mib, "--llc-mib", 0.0, high=LLC_MIB_RANGE[1])
    if llc_mib is not None and llc_mib < LLC_MIB_RANGE[0]:
        raise UserError(f"--llc-mib: {llc_mib:g} MiB is less than 1 KiB; give the cache size in MiB, e.g. 32")


def oversubscription(ranks: int, cores: int, background: float = 0.0) -> float:
    """Stated model of a CPU host: max(1, (ranks + background) / cores)."""
    return max(1.0, (ranks + background) / cores)


def cache_miss_fraction(ranks: int, nbytes: float, llc_bytes: float) -> float:
    """Share of the ranks' buffers (ranks * nbytes) that a last-level cache of llc_bytes cannot hold."""
    footprint = ranks * nbytes
    return 0.0 if footprint <= llc_bytes else 1.0 - llc_bytes / footprint


def parse_cache_size(text: str) -> int:
    """'49152K', '48M', '32768' (as /sys and lscpu write them, powers of 1024) -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t.rstrip("KMG")) * mult)
    except ValueError:
        raise UserError(f"cache size {text!r}: not a size such as 49152K or 48M") from None


def machine_llc_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of this machine's last-level data or unified cache, or None where the OS does not say."""
    best: tuple[int, int] | None = None
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError, UserError):
            continue
        if kind != "Instruction" and size > 0 and (best is None or level > best[0]):
            best = (level, size)
    if best is None and hasattr(os, "sysconf"):
        try:
            l3 = os.sysconf("SC_LEVEL3_CACHE_SIZE")
        except (ValueError, OSError):
            l3 = 0
        return l3 if l3 > 0 else None
    return None if best is None else best[1]


def fit_terms(algo: str, grid: Grid, nbytes: float, cores: int, background: float, llc_bytes: float) -> np.ndarray:
    """Seconds per unit of (alpha, beta_cache, beta_extra) for one all-reduce: the row of the fit's design
    matrix, so time = terms @ (alpha, beta_cache, beta_extra)."""
    steps, coeff = local_coefficients(algo, grid)
    o = oversubscription(grid.size, cores, background)
    per_byte = o * coeff * nbytes
    return np.array([o * steps, per_byte, per_byte * cache_miss_fraction(grid.size, nbytes, llc_bytes)])


@dataclass
class HostCalibration:
    """alpha and the per-byte costs in and beyond the cache fitted for one algorithm on this host, from bench rows
    on one grid."""

    algo: str
    """The algorithm whose rows were fitted."""
    grid: str
    """The grid the rows came from."""
    backend: str
    """Backend of the rows (gloo, mpi, nccl)."""
    alpha_us: float
    """Fitted per-step latency, microseconds (at one rank per core)."""
    cache_gbytes_per_s: float
    """Fitted per-rank bandwidth 1/beta_cache, GB/s (one rank per core), while the ranks' buffers fit the cache."""
    memory_gbytes_per_s: float
    """Fitted per-rank bandwidth 1/(beta_cache + beta_extra), GB/s, for the bytes that do not fit the cache;
    equal to the cache figure when no row's buffers exceeded the cache (nothing to fit it on)."""
    llc_bytes: int
    """Last-level cache size used for the miss fraction (the machine's, or --llc-mib)."""
    cores: int
    """CPU cores of the machine; ranks beyond one per core slow both terms by ranks/cores (stated model)."""
    background: float
    """Other runnable processes sharing the cores while the bench ran (0 = the ranks had the machine)."""
    rows_used: list
    """(size_bytes, time_us) of the rows used."""
    rows_skipped: int
    """Rows left out (other algo/grid/backend, or wrong != 0)."""
    rows_beyond_cache: int
    """Rows used whose buffers (ranks x size) exceeded the cache: the ones that fix the memory figure."""
    rms_relative_error: float
    """Root-mean-square of (fit - measured) / measured over the rows used (the quantity minimised)."""

    @property
    def coefficients(self) -> np.ndarray:
        """(alpha, beta_cache, beta_extra) in seconds and seconds per byte."""
        beta_c = 1.0 / (self.cache_gbytes_per_s * 1e9)
        return np.array([self.alpha_us * 1e-6, beta_c, 1.0 / (self.memory_gbytes_per_s * 1e9) - beta_c])

    def oversubscription(self, ranks: int, background: float | None = None) -> float:
        """max(1, (ranks + background) / cores): ranks time-share the cores with each other and with other
        runnable processes, so per-step and per-byte work stretch alike. background defaults to the fit's."""
        return oversubscription(ranks, self.cores, self.background if background is None else background)

    def predict_seconds(
        self, grid: Grid, nbytes: float, algo: str | None = None, background: float | None = None
    ) -> float:
        """Predicted time of one all-reduce of nbytes on `grid` on this host (with `background` other runnable
        processes; default: as during the fit)."""
        bg = self.background if background is None else background
        return float(fit_terms(algo or self.algo, grid, nbytes, self.cores, bg, self.llc_bytes) @ self.coefficients)

    def predict_busbw(self, grid: Grid, nbytes: int, algo: str | None = None, background: float | None = None) -> float:
        """Predicted nccl-tests busbw in GB/s."""
        return busbw_gbytes_per_s(grid.size, nbytes, self.predict_seconds(grid, nbytes, algo, background))

    def describe(self) -> list[str]:
        """Printable lines: the model, the fitted figures with units, and the fit's error."""
        memory = (
            f"1/(beta_cache + beta_extra) = {self.memory_gbytes_per_s:.4f} GB/s per rank beyond the cache "
            f"({self.rows_beyond_cache} rows beyond it)"
            if self.rows_beyond_cache
            else "no row's buffers exceeded the cache: the memory figure is taken equal to the cache figure"
        )
        model = (
            f"model: time = o * (steps * alpha + coeff * n * (beta_cache + miss * beta_extra)), "
            f"o = max(1, (ranks + {self.background:g} background) / {self.cores} cores), "
            f"miss = 1 - min(1, {self.llc_bytes / 2**20:g} MiB cache / (ranks * n))"
        )
        fit = (
            f"fit on {self.algo} {self.grid} ({self.backend}), minimising the relative error: "
            f"alpha = {self.alpha_us:.2f} us per step, 1/beta_cache = {self.cache_gbytes_per_s:.4f} GB/s per "
            f"rank in cache, {memory}"
        )
        return [
            model,
            fit,
            f"fit error on the calibration rows: rms {self.rms_relative_error * 100:.1f}% of the measured time",
        ]


def _llc(llc_bytes: int | None) -> int:
    if llc_bytes is None:
        llc_bytes = machine_llc_bytes()
        if llc_bytes is None:
            raise UserError("--llc-mib: the OS does not say this machine's last-level cache size; give it")
    if not llc_bytes > 0:
        raise UserError(f"--llc-mib: {llc_bytes / 2**20:g} must be > 0")
    return int(llc_bytes)


def host_calibrate(
    rows: Sequence[dict],
    algo: str | None = None,
    grid: str | None = None,
    cores: int | None = None,
    background: float = 0.0,
    llc_bytes: int | None = None,
    flag: str = "--calibrate",
) -> HostCalibration:
    """Fit alpha, beta_cache and beta_extra (all >= 0) of the model above to the rows of one algorithm on one
    grid (the first present unless named) with wrong == 0, minimising the relative error of the time.

    Relative, not absolute: bench rows span several decades of time, and a fit on seconds would follow the
    largest rows alone and leave alpha undetermined. llc_bytes: default this machine's. flag: what errors about
    the rows name (the option or argument that gave them).
    """
    cores = cores or os.cpu_count() or 1
    if background < 0:
        raise UserError(f"--background: {background} must be >= 0")
    llc = _llc(llc_bytes)
    algo, grid, used = rows_to_fit(rows, algo, grid, flag)
    backends = sorted({str(r.get("backend", "?")) for r in used})
    g = host_grid(grid)
    t = np.array([r["time_us"] * 1e-6 for r in used])
    n = np.array([float(r["size_bytes"]) for r in used])
    a = np.stack([fit_terms(algo, g, s, cores, background, llc) for s in n])
    alpha, beta_c, extra = fit_relative(a, t, f"{flag}: {algo} on {grid}")
    check_bandwidth(beta_c, n, t, f"{flag}: {algo} on {grid}")
    beyond = int((a[:, 2] > 0).sum())
    fit = a @ np.array([alpha, beta_c, extra])
    rms = float(np.sqrt(np.mean(((fit - t) / t) ** 2)))
    return HostCalibration(
        algo,
        grid,
        ",".join(backends),
        float(alpha * 1e6),
        float(1.0 / beta_c / 1e9),
        float(1.0 / (beta_c + extra) / 1e9),
        llc,
        cores,
        background,
        [(int(r["size_bytes"]), float(r["time_us"])) for r in used],
        len(rows) - len(used),
        beyond,
        rms,
    )


@dataclass
class StepProfile:
    """One rank's step on this machine, measured alone (step_profile.py)."""

    model: str
    """torchvision model name."""
    image_size: int
    """Image side in pixels."""
    batch: int
    """Images per step."""
    num_classes: int
    """Classifier outputs (decides fc's size)."""
    threads: int
    """torch threads used (a run's CPU ranks use 1 each here)."""
    forward_seconds: float
    """Forward pass and loss, median."""
    backward_seconds: float
    """Backward pass, median."""
    optimizer_seconds: float
    """Optimizer step (SGD with momentum and weight decay), median."""
    modules: dict = field(default_factory=dict)
    """Backward seconds per module with parameters: from the stamp of the module's last gradient back to the
    previous module's (what `plan --layer-profile` reads)."""
    cores: int = 1
    """CPU cores of the machine when measured."""
    background: float = 0.0
    """Other runnable threads while it was measured (its own oversubscription: max(1, (1 + background) / cores))."""
    colocated: int = 1
    """Copies of the same step that ran at once on the machine while it was measured (1 = alone): the ranks of a
    run share the memory bandwidth and the cache, which stretches even their CPU time."""
    loop_seconds: float | None = None
    """CPU seconds per step of a one-rank `torus-train run` of the same job (the training loop as it runs:
    DDP, its hook, the finiteness check, the loop's bookkeeping), when measured; the prediction then adds
    loop_seconds - (forward + backward + optimizer), at least 0, as the loop's own work, after the optimizer."""
    clock: str = "cpu"
    """"cpu": the seconds are the thread's CPU time (time-sharing does not count); "wall": wall-clock seconds,
    divided by the measurement's own oversubscription to get a rank alone."""

    @property
    def own_oversubscription(self) -> float:
        """How much the measurement itself was slowed by time-sharing: 1 for CPU time, else
        max(1, (threads + background) / cores)."""
        return 1.0 if self.clock == "cpu" else max(1.0, (self.threads + self.background) / self.cores)

    def alone(self) -> tuple[float, float, float]:
        """(forward, backward, optimizer) seconds of one rank with a core to itself."""
        o = self.own_oversubscription
        return self.forward_seconds / o, self.backward_seconds / o, self.optimizer_seconds / o

    def loop_overhead(self) -> float:
        """The training loop's work per step beyond forward, backward and optimizer (0 when not measured)."""
        if self.loop_seconds is None:
            return 0.0
        return max(0.0, self.loop_seconds - sum(self.alone()))


PROFILE_FIELDS = (
    Field("model", "str"),
    Field("image_size", "int", 1, 1 << 20),
    Field("batch", "int", 1, 1 << 30),
    Field("num_classes", "int", 1, 1 << 31),
    Field("threads", "int", 1, 1 << 16),
    Field("forward_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("backward_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("optimizer_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("modules", "dict"),
    Field("cores", "int", 1, 1 << 20, optional=True),
    Field("background", "number", 0, 1 << 20, optional=True),
    Field("colocated", "int", 1, 1 << 20, optional=True),
    Field("loop_seconds", "number", 0, MAX_PROFILE_SECONDS, optional=True),
    Field("clock", "str", optional=True, choices=("cpu", "wall")),
)
"""A step profile's JSON (``profile_to_json``): every field the prediction reads."""


def read_step_profile(path: str, flag: str = "--layer-profile") -> StepProfile:
    """A StepProfile from its JSON file; one line naming the flag, the file and the field when it cannot be used."""
    where = f"{flag}: {path}"
    d = read_json(path, where)
    if isinstance(d, dict) and "forward_seconds" not in d:
        raise UserError(
            f"{where}: not a step profile (no 'forward_seconds'); measure one with "
            f"`python scripts/experiments/step_profile.py MODEL OUT.json --image-size N --batch B`"
        )
    values = {k: v for k, v in check(d, PROFILE_FIELDS, where).items() if v is not None}
    values["modules"] = check_module_seconds(values["modules"], f"{where}: modules")
    if not values["forward_seconds"] + values["backward_seconds"] > 0:
        raise UserError(f"{where}: forward_seconds + backward_seconds must be > 0")
    return StepProfile(**values)


@dataclass
class HostPrediction:
    """Predicted step of a run on this host, with both bounds and what decided."""

    grid: str
    """XxY of the run."""
    ranks: int
    """R."""
    cores: int
    """C."""
    background: float
    """B during the run."""
    oversubscription: float
    """o = max(1, (R + B) / C)."""
    per_rank_batch: int
    """Images per rank per step."""
    forward_seconds: float
    """o x the profile's forward, scaled to the run's batch."""
    backward_seconds: float
    """o x the profile's backward, scaled to the run's batch."""
    optimizer_seconds: float
    """o x the profile's optimizer step, and o x the loop's own work when measured (StepProfile.loop_seconds)."""
    bucket_bytes: list
    """Bytes exchanged per bucket, in exchange order."""
    bucket_seconds: list
    """Calibrated exchange time per bucket."""
    communication_seconds: float
    """Sum of the exchanges."""
    timeline_step_seconds: float
    """The critical path: forward + backward + exposed exchanges + optimizer."""
    cores_step_seconds: float
    """The cores' work: o x (forward + backward + optimizer) + the exchanges."""
    step_seconds: float
    """The larger of the two: the prediction."""
    bound: str
    """Which bound decided: "timeline" or "cores"."""
    timeline: dict = field(default_factory=dict)
    """The bucket timeline (torus_train.plan.timeline.Timeline.to_json)."""


def predict_host_step(
    cal: HostCalibration,
    profile: StepProfile,
    grid: Grid,
    per_rank_batch: int,
    bucket_cap_bytes: int,
    exchange_bytes: int,
    layers: Sequence[Layer],
    background: float,
) -> HostPrediction:
    """The step of R = grid.size ranks on this host (cal.cores cores, `background` other runnable threads).

    cal: a HostCalibration of the torus; layers: the model's parameter tensors
    (timeline.model_layers) for the run's buckets; exchange_bytes: bytes per gradient value on the wire (4 for fp32)."""
    r, c = grid.size, cal.cores
    o = max(1.0, (r + background) / c)
    scale = per_rank_batch / profile.batch  # stated: compute linear in the batch around the profile's
    fwd, bwd, opt = (x * o * s for x, s in zip(profile.alone(), (scale, scale, 1.0), strict=True))
    opt += o * profile.loop_overhead()
    shared = layers_with_profile(layers, profile.modules)
    t = timeline(
        shared,
        fwd + bwd + opt,
        bwd / (fwd + bwd + opt),
        lambda n: cal.predict_seconds(grid, n, background=background),
        exchange_bytes,
        DEFAULT,
        bucket_cap_bytes,
    )
    comm = t.communication_seconds
    critical = t.step_seconds
    cores = fwd + bwd + opt + comm
    step, bound = (critical, "timeline") if critical >= cores else (cores, "cores")
    return HostPrediction(
        str(grid),
        r,
        c,
        background,
        o,
        per_rank_batch,
        fwd,
        bwd,
        opt,
        [b.nbytes for b in t.buckets],
        [b.allreduce_seconds for b in t.buckets],
        comm,
        critical,
        cores,
        step,
        bound,
        t.to_json(),
    )
