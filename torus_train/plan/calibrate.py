"""Calibration of the cost model on one CPU host from `torus-train bench allreduce --json` rows (pure).

The model of one host, fitted on one grid's bench rows and used to predict another grid:

    time = o * (steps * alpha + coeff * n * (beta_cache + miss * beta_extra))
    o    = max(1, (ranks + background) / cores)       ranks time-share the cores
    miss = 1 - min(1, llc / (ranks * n))              share of the working set the last-level cache cannot hold

steps and coeff (bytes each rank sends per byte all-reduced) come from the general model (torus_train.plan.cost)
with every rank on one host. All ranks of an all-reduce work at once, so the CPU time per step and per byte of
all of them is shared by the cores: o. The ranks' buffers (ranks * n bytes) share one last-level cache; while
they fit, a byte costs beta_cache (copy and sum in cache), the share that does not fit costs beta_extra more
(DRAM). llc is the machine's cache size, read from the OS, not fitted. The fit minimises the relative error.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torus_train.errors import UserError, check_number
from torus_train.job.algorithms import DEFAULT
from torus_train.job.topology import Grid, parse_grid
from torus_train.plan.cost import allreduce_cost
from torus_train.plan.networks import Link, Network
from torus_train.userfiles import Field, check, read_json

MAX_CORES = 1 << 20
"""--cores: at most a million (beyond any one host)."""
MAX_BACKGROUND = float(1 << 20)
"""--background, --run-background: at most a million other runnable processes (beyond any host; keeps the
model's oversubscription finite)."""
LLC_MIB_RANGE = (1 / 1024, float(1 << 20))
"""--llc-mib: from 1 KiB to 1 TiB of last-level cache."""


def check_host_options(background: float, llc_mib: float | None, run_background: float | None = None) -> None:
    """The host model's number options (plan calibrate, plan compare-run) finite and in range, naming the flag."""
    check_number(background, "--background", 0.0, low_ok=True, high=MAX_BACKGROUND)
    check_number(run_background, "--run-background", 0.0, low_ok=True, high=MAX_BACKGROUND)
    check_number(llc_mib, "--llc-mib", 0.0, high=LLC_MIB_RANGE[1])
    if llc_mib is not None and llc_mib < LLC_MIB_RANGE[0]:
        raise UserError(f"--llc-mib: {llc_mib:g} MiB is less than 1 KiB; give the cache size in MiB, e.g. 32")


def local_coefficients(algo: str, grid: Grid) -> tuple[int, float]:
    """(steps, bytes coefficient) of `algo` on one machine: time = steps*alpha + coefficient*n*beta.

    On one host every edge is alike, so the general model collapses to these two numbers; the reduction
    (gamma) is folded into beta because a CPU sums while it copies and one grid cannot tell them apart.
    """
    net = Network("unit", grid.size, Link(1.0, 1.0), Link(1.0, 1.0), 1, reduce_gbytes_per_s=1e30)
    # Evaluate the general model at two sizes on a unit network: steps*alpha and bytes*beta fall out exactly.
    c0 = allreduce_cost(algo, Grid(grid.x, grid.y, grid.size), net, 0)
    c1 = allreduce_cost(algo, Grid(grid.x, grid.y, grid.size), net, 10**9)  # 1e9 bytes at 1 GB/s
    return c0.steps, (c1.seconds - c0.seconds)


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


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| over x >= 0, for a few columns: the best least-squares solution over every support
    set whose solution is non-negative (the optimum lies on one of them)."""
    cols = a.shape[1]
    best, best_res = np.zeros(cols), float(np.sum(b**2))
    for mask in range(1, 1 << cols):
        keep = [j for j in range(cols) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (x < 0).any():
            continue
        res = float(np.sum((a[:, keep] @ x - b) ** 2))
        if res < best_res - 1e-15 * max(1.0, best_res):
            best, best_res = np.zeros(cols), res
            best[keep] = x
    return best


@dataclass
class Calibration:
    """alpha and the per-byte costs fitted for one algorithm on this machine, from bench rows on one grid."""

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


def busbw_gbytes_per_s(ranks: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth: nbytes / seconds * 2(N-1)/N, in GB/s."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


BENCH_ROW_FIELDS = (
    Field("algo", "str"),
    Field("grid", "str"),
    Field("size_bytes", "int", 0, 1 << 50),
    Field("time_us", "number", 1e-3, 1e12),
    Field("wrong", "int", 0, 1 << 62, optional=True),
    Field("backend", "str", optional=True),
)
"""What the fit reads from each row of a `bench allreduce --json` file (a time from 1 ns to 11 days: the fit
divides by it, so nothing outside overflows)."""


def read_bench(path: str, flag: str = "--calibrate") -> list[dict]:
    """Rows of a `bench allreduce --json` file, each checked for the fields the fit needs and reduced to them
    (converted: int counts, float times; a missing or null ``wrong`` is 0)."""
    where = f"{flag}: {path}"
    data = read_json(path, where)
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        data = data["rows"]
    if not isinstance(data, list) or not data:
        raise UserError(f"{where} must hold a non-empty JSON list of bench rows (`bench allreduce --json`)")
    rows = []
    for i, row in enumerate(data):
        values = check(row, BENCH_ROW_FIELDS, f"{where}: row[{i}]")
        try:
            parse_grid(values["grid"])
        except UserError as e:
            raise UserError(f"{where}: row[{i}].grid: {e}") from None
        values["wrong"] = values["wrong"] or 0  # null, like a missing field: not counted
        if values["backend"] is None:
            del values["backend"]
        rows.append(values)
    return rows


def read_benches(paths: str, flag: str = "--calibrate") -> list[dict]:
    """Rows of one or more bench files (comma-separated); several -> the median time per (algo, grid, size).

    On a shared machine one run's noise can be as large as the band a prediction is held to: record the grids
    in alternating runs and merge them."""
    groups: dict = {}
    files = [p for p in paths.split(",") if p]
    if not files:
        raise UserError(f"{flag}: no file named (give BENCH.json, or several separated by commas)")
    for path in files:
        for r in read_bench(path, flag):
            groups.setdefault((r["algo"], r["grid"], r["size_bytes"]), []).append(r)
    out = []
    for rows in groups.values():
        good = [r for r in rows if int(r.get("wrong", 0)) == 0]
        use = good or rows
        merged = dict(use[0])
        merged["time_us"] = statistics.median(r["time_us"] for r in use)
        merged["wrong"] = 0 if good else merged.get("wrong", 1)
        merged["runs"] = len(use)
        out.append(merged)
    return out


def _llc(llc_bytes: int | None) -> int:
    if llc_bytes is None:
        llc_bytes = machine_llc_bytes()
        if llc_bytes is None:
            raise UserError("--llc-mib: the OS does not say this machine's last-level cache size; give it")
    if not llc_bytes > 0:
        raise UserError(f"--llc-mib: {llc_bytes / 2**20:g} must be > 0")
    return int(llc_bytes)


def calibrate(
    rows: Sequence[dict],
    algo: str | None = None,
    grid: str | None = None,
    cores: int | None = None,
    background: float = 0.0,
    llc_bytes: int | None = None,
    flag: str = "--calibrate",
) -> Calibration:
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
    algo, grid, used = _rows_to_fit(rows, algo, grid, flag)
    backends = sorted({str(r.get("backend", "?")) for r in used})
    g = host_grid(grid)
    t = np.array([r["time_us"] * 1e-6 for r in used])
    n = np.array([float(r["size_bytes"]) for r in used])
    a = np.stack([fit_terms(algo, g, s, cores, background, llc) for s in n])
    alpha, beta_c, extra = _fit(a, t, f"{flag}: {algo} on {grid}")
    if beta_c <= 0 or not np.isfinite(1.0 / beta_c):
        raise UserError(
            f"{flag}: times of {algo} on {grid} do not grow with size "
            f"({', '.join(f'{int(s)} B: {x * 1e6:.0f} us' for s, x in zip(n, t, strict=True))}); "
            f"cannot fit a bandwidth: rerun the bench with more iterations (-n) on a quieter machine"
        )
    beyond = int((a[:, 2] > 0).sum())
    fit = a @ np.array([alpha, beta_c, extra])
    rms = float(np.sqrt(np.mean(((fit - t) / t) ** 2)))
    return Calibration(
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


def _fit(a: np.ndarray, t: np.ndarray, where: str) -> np.ndarray:
    """(alpha, beta_cache, beta_extra) >= 0 minimising the relative error of a @ x against t; one line when
    the rows give no finite fit (times and sizes too far apart for floating point)."""
    try:
        with np.errstate(all="ignore"):
            x = nonnegative_lstsq(a / t[:, None], np.ones_like(t))
    except np.linalg.LinAlgError as e:
        raise UserError(f"{where}: the fit failed ({e}); check the rows' times and sizes") from None
    if not np.isfinite(x).all():
        raise UserError(f"{where}: the fit gave no finite figures; check the rows' times and sizes")
    return x


def _rows_to_fit(
    rows: Sequence[dict], algo: str | None, grid: str | None, flag: str = "--calibrate"
) -> tuple[str, str, list[dict]]:
    """(algo, grid, rows) that calibrate fits: torus (else the first algorithm) unless named, its first grid
    unless named, the rows with wrong == 0; raise UserError unless they hold two sizes or more."""
    algos = [r["algo"] for r in rows]
    algo = algo or (DEFAULT if DEFAULT in algos else algos[0])
    grids = [r["grid"] for r in rows if r["algo"] == algo]
    if not grids:
        raise UserError(f"{flag}: no rows for algo {algo!r} (present: {', '.join(sorted(set(algos)))})")
    grid = grid or grids[0]
    used = [r for r in rows if r["algo"] == algo and r["grid"] == grid and int(r.get("wrong", 0)) == 0]
    if len({r["size_bytes"] for r in used}) < 2:
        raise UserError(
            f"{flag}: need rows at two or more sizes for {algo} on {grid} with wrong == 0, found {len(used)}"
        )
    return algo, grid, used


def host_grid(text: str) -> Grid:
    """Grid `text` (XxY) with all its ranks on this one host, as the bench ran them."""
    g = parse_grid(text)
    return Grid(g.x, g.y, g.size)


@dataclass
class Comparison:
    """One bench row held against the calibrated prediction."""

    algo: str
    """Algorithm of the row."""
    grid: str
    """Grid of the row."""
    size_bytes: int
    """Bytes all-reduced."""
    measured_busbw: float
    """busbw from the row's time, GB/s."""
    predicted_busbw: float
    """busbw the calibration predicts, GB/s."""

    @property
    def ratio(self) -> float:
        """predicted / measured busbw (= measured / predicted time)."""
        return self.predicted_busbw / self.measured_busbw


def compare(
    cal: Calibration, rows: Sequence[dict], min_bytes: int = 0, background: float | None = None
) -> list[Comparison]:
    """The rows of cal's algorithm with wrong == 0 and size >= min_bytes, measured against predicted busbw,
    sorted by grid and size. background: of the compared bench (default: the fit's)."""
    out = []
    for r in rows:
        if r["algo"] != cal.algo or r["size_bytes"] < max(min_bytes, 1) or int(r.get("wrong", 0)) != 0:
            continue
        g = host_grid(r["grid"])
        measured = busbw_gbytes_per_s(g.size, r["size_bytes"], r["time_us"] * 1e-6)
        out.append(
            Comparison(
                cal.algo,
                str(g),
                int(r["size_bytes"]),
                measured,
                cal.predict_busbw(g, r["size_bytes"], background=background),
            )
        )
    return sorted(out, key=lambda c: (c.grid, c.size_bytes))
