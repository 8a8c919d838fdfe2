"""`plan calibrate`'s fit: alpha and beta of one machine from bench rows, held against another grid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torus_train.errors import UserError
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import calibrate, compare, fit_relative, local_coefficients, read_benches

MiB = 1 << 20


def _rows(algo: str, grid: str, alpha_us: float, gbs: float, sizes=tuple(2**k for k in range(10, 27))) -> list[dict]:
    """Bench rows whose times follow time = steps * alpha + coeff * n * beta exactly, with known figures."""
    g = Grid(*map(int, grid.split("x")))
    steps, coeff = local_coefficients(algo, g)
    return [
        {
            "algo": algo,
            "backend": "nccl",
            "grid": grid,
            "size_bytes": s,
            "wrong": 0,
            "time_us": steps * alpha_us + coeff * s / (gbs * 1e3),
        }
        for s in sizes
    ]


def test_calibration_recovers_alpha_and_beta_from_model_generated_rows():
    g = Grid(2, 2)
    steps, coeff = local_coefficients("torus", g)
    assert (steps, coeff) == (4, pytest.approx(1.5))
    rows = _rows("torus", "2x2", 8.0, 40.0)
    rows.append({"algo": "torus", "grid": "2x2", "size_bytes": 1 << 20, "time_us": 1.0, "wrong": 3})
    rows.append({"algo": "flat", "grid": "2x2", "size_bytes": 1 << 20, "time_us": 5.0, "wrong": 0})
    cal = calibrate(rows)
    assert cal.alpha_us == pytest.approx(8.0, rel=1e-6) and cal.gbytes_per_s == pytest.approx(40.0, rel=1e-6)
    assert cal.rms_relative_error == pytest.approx(0, abs=1e-9)
    assert cal.rows_skipped == 2 and len(cal.rows_used) == 17 and cal.backend == "nccl"
    # Prediction on 2x4: the 2x4 torus's own steps and bytes, the same alpha and beta.
    s8, c8 = local_coefficients("torus", Grid(2, 4))
    n = 4 * MiB
    assert cal.predict_seconds(Grid(2, 4), n) == pytest.approx(s8 * 8e-6 + c8 * n / 40e9)
    assert cal.predict_busbw(Grid(2, 4), n) == pytest.approx(n / cal.predict_seconds(Grid(2, 4), n) * 2 * 7 / 8 / 1e9)
    assert "alpha = 8.00 us per step, 1/beta = 40.0000 GB/s per rank" in " ".join(cal.describe())


def test_the_fit_on_one_grid_predicts_another_of_the_same_machine():
    cal = calibrate(_rows("torus", "2x2", 8.0, 40.0))
    comp = compare(cal, _rows("torus", "2x4", 8.0, 40.0) + _rows("flat", "2x4", 1.0, 1.0), min_bytes=MiB)
    assert [c.size_bytes for c in comp] == [MiB << k for k in range(7)] and {c.grid for c in comp} == {"2x4"}
    assert all(c.ratio == pytest.approx(1) for c in comp)


def test_calibration_latency_is_not_negative_and_bad_rows_are_named():
    # Times that would need a negative alpha: it is clipped to 0 and the bandwidth still fitted.
    rows = [
        {"algo": "torus", "grid": "2x2", "size_bytes": s, "time_us": t, "wrong": 0}
        for s, t in ((1 << 10, 0.1), (1 << 20, 600.0), (1 << 22, 2600.0))
    ]
    cal = calibrate(rows)
    assert cal.alpha_us == 0.0 and cal.gbytes_per_s > 0
    shrinking = [
        {"algo": "torus", "grid": "2x2", "size_bytes": s, "time_us": t, "wrong": 0}
        for s, t in ((1024, 100.0), (4096, 80.0), (8192, 50.0))
    ]
    with pytest.raises(UserError, match="do not grow with size"):
        calibrate(shrinking)
    with pytest.raises(UserError, match="two or more sizes"):
        calibrate(shrinking[:1])
    with pytest.raises(UserError, match="no rows for algo 'tree'"):
        calibrate(rows, algo="tree")


def test_the_fit_is_non_negative_and_names_a_fit_it_cannot_make():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert fit_relative(a, np.array([2.0, 3.0, 4.0]), "w") == pytest.approx([1.0, 1.0])  # relative: exact here
    assert fit_relative(a, np.array([3.0, 2.0, 1.0]), "w")[1] == 0.0  # a falling time: the slope clipped to 0
    with pytest.raises(UserError, match="w: the fit failed"):
        fit_relative(np.array([[np.inf, 1.0], [1.0, 2.0]]), np.array([1.0, 2.0]), "w")


def test_read_benches_takes_the_median_time_per_point(tmp_path):
    def row(t, wrong=0):
        return {
            "algo": "torus",
            "backend": "mpi",
            "grid": "2x2",
            "size_bytes": 1024,
            "count": 256,
            "dtype": "float",
            "time_us": t,
            "algbw_gbps": 0,
            "busbw_gbps": 0,
            "wrong": wrong,
        }

    files = []
    for i, (t, wrong) in enumerate([(10.0, 0), (30.0, 0), (20.0, 0), (1.0, 5)]):
        f = tmp_path / f"b{i}.json"
        f.write_text(json.dumps([row(t, wrong)]))
        files.append(str(f))
    (merged,) = read_benches(",".join(files))
    assert merged["time_us"] == 20.0 and merged["runs"] == 3 and merged["wrong"] == 0  # the wrong run is left out
    assert read_benches(files[0])[0]["time_us"] == 10.0
