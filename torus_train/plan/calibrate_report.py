"""`torus-train plan calibrate`: fit this machine from `bench allreduce --json` rows (torus_train.plan.calibrate),
print the fit, then predict other grids or hold another bench file against the fit (pure, no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torus_train.errors import UserError
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import Calibration, calibrate, compare, host_grid, read_benches

BENCH_ARG = "BENCH.json"
"""What errors about the fitted bench file name: the command's argument."""

DEFAULT_TARGET = "2x4"
"""The grid predicted when neither --grid nor --compare is given."""


@dataclass(frozen=True)
class CalibrateRequest:
    """What `plan calibrate` takes."""

    bench: str
    """`bench allreduce --json` file(s) to fit, comma-separated: the median time per point."""
    grid: str | None = None
    """XxY to predict (all ranks on this machine); None: DEFAULT_TARGET unless `compare` is given."""
    algo: str | None = None
    """Which algorithm's rows to fit; None: torus if present, else the first."""
    compare: str | None = None
    """Bench file(s) of another grid whose measured busbw is printed beside the predicted one."""


def calibrate_report(req: CalibrateRequest, echo: Callable[[str], None] = print) -> dict:
    """Fit, echo the fit and its rows measured against fitted, then the predictions (--grid, or 2x4 without
    --compare) and the comparison (--compare). Returns {calibration, predictions?, comparison?} for JSON."""
    check_given(req)
    rows = read_benches(req.bench, BENCH_ARG)
    other = read_benches(req.compare, "--compare") if req.compare is not None else None
    targets = [target_grid(req.grid)] if req.grid is not None else ([] if other else [host_grid(DEFAULT_TARGET)])
    cal = calibrate(rows, algo=req.algo, flag=BENCH_ARG)
    for line in fit_lines(cal, req.bench):
        echo(line)
    out: dict = {"calibration": cal.__dict__}
    if targets:
        out["predictions"] = predictions(cal, targets, [s for s, _ in cal.rows_used], echo)
    if other is not None and req.compare is not None:
        out["comparison"] = comparison(cal, other, req.compare, echo)
    return out


def check_given(req: CalibrateRequest) -> None:
    """An option given as '' is refused, not read as not given (--algo '' would fit the default algorithm,
    --compare '' would compare nothing)."""
    for flag, value, example in (
        ("--algo", req.algo, "torus"),
        ("--grid", req.grid, "2x4"),
        ("--compare", req.compare, "other.json"),
    ):
        if value is not None and not value.strip():
            raise UserError(f"{flag} {value!r}: empty; give a value (e.g. {flag} {example}) or leave {flag} out")


def target_grid(text: str) -> Grid:
    """--grid: a grid of two ranks or more (one rank exchanges nothing: there is no time to predict)."""
    try:
        g = host_grid(text)
    except UserError as e:
        raise UserError(f"--grid: {e}") from None
    if g.size < 2:
        raise UserError(
            f"--grid {text}: one rank exchanges nothing, so there is no all-reduce time to predict; give a grid of 2 ranks or more"
        )
    return g


def fit_lines(cal: Calibration, bench: str) -> list[str]:
    """The rows used, the model and its fitted figures, and every row measured against fitted."""
    sizes = [s for s, _ in cal.rows_used]
    lines = [
        f"# calibration from {bench}: {cal.algo} on {cal.grid} ({cal.backend}), "
        f"{len(cal.rows_used)} rows used ({min(sizes)}..{max(sizes)} bytes, wrong == 0), "
        f"{cal.rows_skipped} rows left out (other algo/grid or wrong != 0)"
    ]
    lines += [f"# {line}" for line in cal.describe()]
    g0 = host_grid(cal.grid)
    lines.append(f"{'grid':>6} {'size (B)':>10} {'measured us':>12} {'fitted us':>12} {'fit/meas':>9}")
    for s, t in cal.rows_used:
        f = cal.predict_seconds(g0, s) * 1e6
        lines.append(f"{cal.grid:>6} {s:>10} {t:>12.1f} {f:>12.1f} {f / t:>9.2f}")
    return lines


def predictions(cal: Calibration, grids: list[Grid], sizes: list[int], echo: Callable[[str], None]) -> list[dict]:
    """Predicted time and busbw of cal.algo on each grid (all ranks on this host) at each size, echoed; returns
    them as JSON rows."""
    rows = []
    echo(f"{'grid':>6} {'size (B)':>10} {'predicted us':>13} {'busbw GB/s':>11}")
    for g in grids:
        for s in sizes:
            t, bw = cal.predict_seconds(g, s), cal.predict_busbw(g, s)
            rows.append({"algo": cal.algo, "grid": str(g), "size_bytes": s, "time_us": t * 1e6, "busbw_gbps": bw})
            echo(f"{g!s:>6} {s:>10} {t * 1e6:>13.1f} {bw:>11.4f}")
    echo(f"# summary: predicted {cal.algo} on {', '.join(str(g) for g in grids)} from a fit on {cal.grid}")
    return rows


def comparison(cal: Calibration, rows: list[dict], path: str, echo: Callable[[str], None]) -> list[dict]:
    """Measured against predicted busbw for the rows of cal.algo in another bench file, echoed with how many
    sizes >= 1 MiB are within 30%; returns them as JSON rows."""
    comp = compare(cal, rows)
    if not comp:
        raise UserError(f"--compare: {path} has no rows of {cal.algo} on 2 ranks or more with wrong == 0")
    echo(f"{'grid':>6} {'size (B)':>10} {'measured GB/s':>14} {'predicted GB/s':>15} {'pred/meas':>10}")
    for c in comp:
        echo(f"{c.grid:>6} {c.size_bytes:>10} {c.measured_busbw:>14.4f} {c.predicted_busbw:>15.4f} {c.ratio:>10.2f}")
    big = [c.ratio for c in comp if c.size_bytes >= 1 << 20]
    tail = (
        f"; at >= 1 MiB pred/meas {min(big):.2f} to {max(big):.2f}, {sum(abs(r - 1) <= 0.3 for r in big)} of "
        f"{len(big)} within 30%"
        if big
        else ""
    )
    echo(f"# summary: {cal.algo} fitted on {cal.grid}, compared with {len(comp)} rows of {path}{tail}")
    return [c.__dict__ | {"ratio": c.ratio} for c in comp]
