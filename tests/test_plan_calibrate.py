"""Calibration on one CPU host: the fit on model-generated rows, cache and core terms, the recorded sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from torus_train.errors import UserError
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import (
    cache_miss_fraction,
    calibrate,
    compare,
    local_coefficients,
    machine_llc_bytes,
    nonnegative_lstsq,
    parse_cache_size,
    read_benches,
)

MiB = 1 << 20


def _rows(
    algo: str,
    grid: str,
    alpha_us: float,
    cache_gbs: float,
    memory_gbs: float,
    cores: int,
    llc: int,
    background: float = 0.0,
    sizes=tuple(2**k for k in range(10, 27)),
) -> list[dict]:
    """Bench rows whose times follow the calibration model exactly, with known parameters."""
    g = Grid(*map(int, grid.split("x")))
    steps, coeff = local_coefficients(algo, g)
    o = max(1.0, (g.size + background) / cores)
    rows = []
    for s in sizes:
        miss = max(0.0, 1 - llc / (g.size * s))
        per_byte = (1 - miss) / (cache_gbs * 1e3) + miss / (memory_gbs * 1e3)  # us per byte
        rows.append(
            {
                "algo": algo,
                "backend": "gloo",
                "grid": grid,
                "size_bytes": s,
                "wrong": 0,
                "time_us": o * (steps * alpha_us + coeff * s * per_byte),
            }
        )
    return rows


def test_calibration_recovers_alpha_and_both_bandwidths_from_model_generated_rows():
    alpha, cache_gbs, memory_gbs, cores, llc = 80.0, 2.5, 0.9, 2, 8 * MiB
    g = Grid(2, 2)
    steps, coeff = local_coefficients("torus", g)
    assert (steps, coeff) == (4, pytest.approx(1.5))
    rows = _rows("torus", "2x2", alpha, cache_gbs, memory_gbs, cores, llc)
    rows.append({"algo": "torus", "grid": "2x2", "size_bytes": 1 << 20, "time_us": 1.0, "wrong": 3})
    rows.append({"algo": "flat", "grid": "2x2", "size_bytes": 1 << 20, "time_us": 5.0, "wrong": 0})
    cal = calibrate(rows, cores=cores, llc_bytes=llc)
    assert cal.alpha_us == pytest.approx(alpha, rel=1e-6)
    assert cal.cache_gbytes_per_s == pytest.approx(cache_gbs, rel=1e-6)
    assert cal.memory_gbytes_per_s == pytest.approx(memory_gbs, rel=1e-6)
    assert cal.rms_relative_error == pytest.approx(0, abs=1e-9)
    assert cal.rows_skipped == 2 and len(cal.rows_used) == 17
    assert cal.rows_beyond_cache == 5  # 4 ranks x size > 8 MiB: 4, 8, 16, 32 and 64 MiB
    # Prediction on 2x4: twice the oversubscription, the 2x4 torus's own steps and bytes, and 8 ranks' buffers
    # against the cache: at 4 MiB, 32 MiB of buffers, a quarter of them fit.
    s8, c8 = local_coefficients("torus", Grid(2, 4))
    n = 4 * MiB
    per_byte = 0.25 / (cache_gbs * 1e9) + 0.75 / (memory_gbs * 1e9)
    assert cal.predict_seconds(Grid(2, 4), n) == pytest.approx(4 * (s8 * alpha * 1e-6 + c8 * n * per_byte))
    assert cal.predict_busbw(Grid(2, 4), n) == pytest.approx(n / cal.predict_seconds(Grid(2, 4), n) * 2 * 7 / 8 / 1e9)


def test_calibration_without_rows_beyond_the_cache_takes_the_memory_figure_equal():
    rows = _rows("flat", "2x2", 30.0, 4.0, 1.0, 2, 1 << 30, sizes=(1 << 12, 1 << 16, 1 << 20))
    cal = calibrate(rows, cores=2, llc_bytes=1 << 30)
    assert cal.rows_beyond_cache == 0
    assert cal.memory_gbytes_per_s == pytest.approx(cal.cache_gbytes_per_s) == pytest.approx(4.0)
    assert "no row's buffers exceeded the cache" in " ".join(cal.describe())


def test_calibration_latency_is_not_negative_and_bad_rows_are_named():
    # Times that would need a negative alpha: it is clipped to 0 and the bandwidth still fitted.
    rows = [
        {"algo": "torus", "grid": "2x2", "size_bytes": s, "time_us": t, "wrong": 0}
        for s, t in ((1 << 10, 0.1), (1 << 20, 600.0), (1 << 22, 2600.0))
    ]
    cal = calibrate(rows, cores=2, llc_bytes=1 << 30)
    assert cal.alpha_us == 0.0 and cal.cache_gbytes_per_s > 0
    shrinking = [
        {"algo": "torus", "grid": "2x2", "size_bytes": s, "time_us": t, "wrong": 0}
        for s, t in ((1024, 100.0), (4096, 80.0), (8192, 50.0))
    ]
    with pytest.raises(UserError, match="do not grow with size"):
        calibrate(shrinking, cores=2, llc_bytes=1 << 30)
    with pytest.raises(UserError, match="two or more sizes"):
        calibrate(shrinking[:1], cores=2, llc_bytes=1 << 30)
    with pytest.raises(UserError, match="--llc-mib"):
        calibrate(rows, cores=2, llc_bytes=0)
    with pytest.raises(UserError, match="no rows for algo 'tree'"):
        calibrate(rows, algo="tree", cores=2, llc_bytes=1 << 30)


def test_nonnegative_lstsq_clips_to_the_best_face():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nonnegative_lstsq(a, np.array([1.0, 2.0, 3.0])) == pytest.approx([0.0, 1.0], abs=1e-12)
    assert nonnegative_lstsq(a, np.array([3.0, 2.0, 1.0])) == pytest.approx([2.0, 0.0])  # slope -1 clipped


def test_cache_miss_fraction_and_cache_sizes():
    assert cache_miss_fraction(4, 1 * MiB, 48 * MiB) == 0.0
    assert cache_miss_fraction(8, 12 * MiB, 48 * MiB) == pytest.approx(0.5)
    assert cache_miss_fraction(4, 0, 48 * MiB) == 0.0
    assert parse_cache_size("49152K") == 48 * MiB
    assert parse_cache_size("48 MiB") == 48 * MiB and parse_cache_size("32768") == 32768
    with pytest.raises(UserError, match="cache size 'lots'"):
        parse_cache_size("lots")


def test_machine_llc_reads_the_largest_data_or_unified_level(tmp_path):
    for i, (level, kind, size) in enumerate(
        [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1280K"), (3, "Unified", "49152K")]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert machine_llc_bytes(str(tmp_path)) == 48 * MiB


# (sweep files, the 2x4 sizes where the prediction is known to miss by more than 30%)
REAL_SWEEPS = {
    "gloo 2026-12-01": ("allreduce_gloo_{}.json", ()),
    "mpi 2026-12-01, shared-memory rows": ("2026-12-01-mpi-shm-rows/allreduce_mpi_{}.json", ()),
    # 64 MiB: measured 0.39 GB/s in this sweep, 0.43 in a repeat of 16-64 MiB; predicted 0.51 (1.31x)
    "mpi 2026-12-02, point-to-point rows": ("2026-12-02-mpi-p2p-uncached/allreduce_mpi_{}.json", (64 * MiB,)),
    # 1-4 MiB: predicted 1.49-1.54x the measured busbw (flat and hierarchical miss alike in this pair)
    "mpi 2026-12-02, point-to-point rows, cached views": (
        "2026-12-02-mpi-p2p-cached/allreduce_mpi_{}.json",
        (MiB, 2 * MiB, 4 * MiB),
    ),
    # the remedy for such run-to-run drift: three runs per grid, recorded alternately, median time per size
    "mpi 2026-12-02, 3 alternating runs, median": (
        ",".join(f"2026-12-02-mpi-alternating/mpi_{{}}_{i}.json" for i in (1, 2, 3)),
        (),
    ),
    # the same, with the all-reduce replayed from C (comm/native.c)
    "mpi 2026-12-02, native replay, 3 alternating runs": (
        ",".join(f"2026-12-02-mpi-native/mpi_{{}}_{i}.json" for i in (1, 2, 3)),
        (),
    ),
}


@pytest.mark.parametrize("sweep", list(REAL_SWEEPS))
def test_calibration_on_the_real_2x2_bench_predicts_2x4_within_30_percent(sweep):
    # The acceptance check on the sweeps in docs/bench (recorded on 2-core machines with a 48 MiB L3):
    # fitted on the 2x2 file only, the 2x4 torus busbw is predicted within 30% at every size from 1 MiB,
    # except the listed sizes, which must still miss (so the list cannot go stale).
    pattern, misses = REAL_SWEEPS[sweep]
    bench = Path(__file__).resolve().parent.parent / "docs" / "bench"
    rows22 = read_benches(",".join(str(bench / p) for p in pattern.replace("{}", "2x2").split(",")))
    rows24 = read_benches(",".join(str(bench / p) for p in pattern.replace("{}", "2x4").split(",")))
    cal = calibrate(rows22, algo="torus", cores=2, llc_bytes=48 * MiB)
    assert cal.grid == "2x2" and cal.rms_relative_error < 0.25
    comp = compare(cal, rows24, min_bytes=MiB)
    assert [c.size_bytes for c in comp] == [MiB << k for k in range(7)] and {c.grid for c in comp} == {"2x4"}
    outside = [c.size_bytes for c in comp if abs(c.ratio - 1) > 0.30]
    assert outside == list(misses), [(c.size_bytes, round(c.ratio, 2)) for c in comp]


def test_calibration_background_load_term():
    # Rows generated with 3 other runnable threads on 2 cores: o(4) = 3.5; the fit must undo it when told.
    alpha, beta_gbs = 50.0, 2.0
    rows = _rows("flat", "2x2", alpha, beta_gbs, beta_gbs, 2, 1 << 30, background=3, sizes=(1 << 16, 1 << 20, 1 << 24))
    cal = calibrate(rows, cores=2, background=3, llc_bytes=1 << 30)
    assert (cal.alpha_us, cal.cache_gbytes_per_s) == (pytest.approx(alpha), pytest.approx(beta_gbs))
    quiet = cal.predict_seconds(Grid(2, 4), 1 << 24, background=0)
    busy = cal.predict_seconds(Grid(2, 4), 1 << 24)  # background as during the fit
    assert busy / quiet == pytest.approx((8 + 3) / 8)
    with pytest.raises(UserError, match="background"):
        calibrate(rows, cores=2, background=-1, llc_bytes=1 << 30)


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
