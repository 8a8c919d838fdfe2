"""Calibration of the cost model on one machine from `torus-train bench allreduce --json` rows (pure).

The model of one machine, every rank on it and every link alike, fitted on one grid's bench rows and used to
predict another grid of the same machine:

    time = steps * alpha + coeff * n * beta

steps and coeff (bytes each rank sends per byte all-reduced) come from the general model (torus_train.plan.cost)
with every rank on one host; alpha is the cost of one step, beta of one byte (the reduction, gamma, folded in:
one grid cannot tell a copy from a sum). The fit is non-negative (scipy.optimize.nnls) and minimises the
relative error of the time: bench rows span several decades of time, and a fit on seconds would follow the
largest rows alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from torus_train.errors import UserError
from torus_train.job.algorithms import DEFAULT
from torus_train.job.topology import Grid, parse_grid
from torus_train.plan.cost import allreduce_cost
from torus_train.plan.networks import Link, Network
from torus_train.userfiles import Field, check, read_json


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


@dataclass
class Calibration:
    """alpha and beta fitted for one algorithm on this machine, from bench rows on one grid."""

    algo: str
    """The algorithm whose rows were fitted."""
    grid: str
    """The grid the rows came from."""
    backend: str
    """Backend of the rows (gloo, mpi, nccl)."""
    alpha_us: float
    """Fitted per-step latency, microseconds."""
    gbytes_per_s: float
    """Fitted per-rank bandwidth 1/beta, GB/s."""
    rows_used: list
    """(size_bytes, time_us) of the rows used."""
    rows_skipped: int
    """Rows left out (other algo/grid/backend, or wrong != 0)."""
    rms_relative_error: float
    """Root-mean-square of (fit - measured) / measured over the rows used (the quantity minimised)."""

    def predict_seconds(self, grid: Grid, nbytes: float, algo: str | None = None) -> float:
        """Predicted time of one all-reduce of nbytes on `grid`, every rank on this machine."""
        steps, coeff = local_coefficients(algo or self.algo, grid)
        return steps * self.alpha_us * 1e-6 + coeff * nbytes / (self.gbytes_per_s * 1e9)

    def predict_busbw(self, grid: Grid, nbytes: int, algo: str | None = None) -> float:
        """Predicted nccl-tests busbw in GB/s."""
        return busbw_gbytes_per_s(grid.size, nbytes, self.predict_seconds(grid, nbytes, algo))

    def describe(self) -> list[str]:
        """Printable lines: the model, the fitted figures with units, and the fit's error."""
        return [
            "model: time = steps * alpha + coeff * n * beta (every rank on this machine, every link alike)",
            f"fit on {self.algo} {self.grid} ({self.backend}), minimising the relative error: "
            f"alpha = {self.alpha_us:.2f} us per step, 1/beta = {self.gbytes_per_s:.4f} GB/s per rank",
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


def read_bench(path: str, flag: str = "BENCH.json") -> list[dict]:
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


def read_benches(paths: str, flag: str = "BENCH.json") -> list[dict]:
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
        good = [r for r in rows if r["wrong"] == 0]  # read_bench made it an int
        use = good or rows
        merged = dict(use[0])
        merged["time_us"] = statistics.median(r["time_us"] for r in use)
        merged["wrong"] = 0 if good else merged.get("wrong", 1)
        merged["runs"] = len(use)
        out.append(merged)
    return out


def calibrate(
    rows: Sequence[dict], algo: str | None = None, grid: str | None = None, flag: str = "BENCH.json"
) -> Calibration:
    """Fit alpha and beta (both >= 0) of the model above to the rows of one algorithm on one grid (the first
    present unless named) with wrong == 0, minimising the relative error of the time. flag: what errors about
    the rows name (the option or argument that gave them)."""
    algo, grid, used = rows_to_fit(rows, algo, grid, flag)
    g = host_grid(grid)
    steps, coeff = local_coefficients(algo, g)
    t = np.array([r["time_us"] * 1e-6 for r in used])
    n = np.array([r["size_bytes"] for r in used], dtype=np.float64)  # read_bench gave ints (BENCH_ROW_FIELDS)
    a = np.stack([np.array([float(steps), coeff * s]) for s in n])
    alpha, beta = fit_relative(a, t, f"{flag}: {algo} on {grid}")
    check_bandwidth(beta, n, t, f"{flag}: {algo} on {grid}")
    fit = a @ np.array([alpha, beta])
    return Calibration(
        algo,
        grid,
        ",".join(sorted({str(r.get("backend", "?")) for r in used})),
        float(alpha * 1e6),
        float(1.0 / beta / 1e9),
        [(r["size_bytes"], r["time_us"]) for r in used],
        len(rows) - len(used),
        float(np.sqrt(np.mean(((fit - t) / t) ** 2))),
    )


def check_bandwidth(beta: float, n: np.ndarray, t: np.ndarray, where: str) -> None:
    """One line when the fitted cost per byte is 0: the times do not grow with size, so no bandwidth is fitted."""
    if beta <= 0 or not np.isfinite(1.0 / beta):
        raise UserError(
            f"{where}: times do not grow with size "
            f"({', '.join(f'{int(s)} B: {x * 1e6:.0f} us' for s, x in zip(n, t, strict=True))}); "
            f"cannot fit a bandwidth: rerun the bench with more iterations (-n) on a quieter machine"
        )


def fit_relative(a: np.ndarray, t: np.ndarray, where: str) -> np.ndarray:
    """x >= 0 minimising the relative error of a @ x against t (a: one row of seconds per unit of each
    figure per bench row); one line when the rows give no finite fit (times and sizes too far apart)."""
    # scipy.optimize takes 0.4 to 1.2 s to import: only a fit pays it, not every `torus-train plan`
    from scipy.optimize import nnls

    try:
        with np.errstate(all="ignore"):
            x, _ = nnls(a / t[:, None], np.ones_like(t))
    except (ValueError, RuntimeError, np.linalg.LinAlgError) as e:  # non-finite terms; no convergence
        raise UserError(f"{where}: the fit failed ({e}); check the rows' times and sizes") from None
    if not np.isfinite(x).all():
        raise UserError(f"{where}: the fit gave no finite figures; check the rows' times and sizes")
    return x


def rows_to_fit(
    rows: Sequence[dict], algo: str | None, grid: str | None, flag: str = "BENCH.json"
) -> tuple[str, str, list[dict]]:
    """(algo, grid, rows) that calibrate fits: torus (else the first algorithm) unless named, its first grid of
    two ranks or more unless named, the rows with wrong == 0; raise UserError unless they hold two sizes or more."""
    algos = [r["algo"] for r in rows]
    if algo is None:
        algo = DEFAULT if DEFAULT in algos else algos[0]
    grids = [r["grid"] for r in rows if r["algo"] == algo]
    if not grids:
        raise UserError(f"{flag}: no rows for algo {algo!r} (present: {', '.join(sorted(set(algos)))})")
    grid = grid or next((g for g in grids if host_grid(g).size > 1), grids[0])
    if host_grid(grid).size < 2:
        raise UserError(
            f"{flag}: {algo} on {grid}: one rank exchanges nothing, there is no time to fit; use rows of 2 ranks or more"
        )
    used = [r for r in rows if r["algo"] == algo and r["grid"] == grid and r["wrong"] == 0]
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


class Fitted(Protocol):
    """What compare holds against bench rows: a Calibration, or another model fitted on them."""

    algo: str

    def predict_busbw(self, grid: Grid, nbytes: int) -> float: ...


def compare(cal: Fitted, rows: Sequence[dict], min_bytes: int = 0) -> list[Comparison]:
    """The rows of cal's algorithm with wrong == 0 and size >= min_bytes, measured against predicted busbw,
    sorted by grid and size."""
    out = []
    for r in rows:
        if r["algo"] != cal.algo or r["size_bytes"] < max(min_bytes, 1) or r["wrong"] != 0:
            continue
        g = host_grid(r["grid"])
        if g.size < 2:  # one rank: no exchange, no bus bandwidth (nccl-tests prints 0) to compare
            continue
        measured = busbw_gbytes_per_s(g.size, r["size_bytes"], r["time_us"] * 1e-6)
        out.append(
            Comparison(
                cal.algo,
                str(g),
                r["size_bytes"],
                measured,
                cal.predict_busbw(g, r["size_bytes"]),
            )
        )
    return sorted(out, key=lambda c: (c.grid, c.size_bytes))
