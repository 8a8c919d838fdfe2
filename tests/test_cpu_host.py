"""The CPU test host's model (scripts/experiments/cpu_host.py): the fit with its core, cache and background
terms, the recorded sweeps of this project's 2-core machines, check_calibration.py and measure_background.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS / "experiments"))  # cpu_host.py, as the scripts beside it import it

from cpu_host import (  # noqa: E402
    cache_miss_fraction,
    check_host_options,
    fit_terms,
    host_calibrate,
    machine_llc_bytes,
    parse_cache_size,
)

from torus_train.errors import UserError  # noqa: E402
from torus_train.job.topology import Grid  # noqa: E402
from torus_train.plan.calibrate import compare, local_coefficients, read_benches  # noqa: E402

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
    cal = host_calibrate(rows, cores=cores, llc_bytes=llc)
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
    cal = host_calibrate(rows, cores=2, llc_bytes=1 << 30)
    assert cal.rows_beyond_cache == 0
    assert cal.memory_gbytes_per_s == pytest.approx(cal.cache_gbytes_per_s) == pytest.approx(4.0)
    assert "no row's buffers exceeded the cache" in " ".join(cal.describe())


def test_host_calibration_names_a_bad_cache_or_load():
    rows = _rows("torus", "2x2", 80.0, 2.5, 0.9, 2, 8 * MiB)
    with pytest.raises(UserError, match="--llc-mib"):
        host_calibrate(rows, cores=2, llc_bytes=0)
    with pytest.raises(UserError, match="background"):
        host_calibrate(rows, cores=2, background=-1, llc_bytes=1 << 30)
    for args, message in (
        ((0.0, 1e308), "--llc-mib: 1e+308 must be <="),
        ((1e308, None), "--background: 1e+308 must be <="),
        ((0.0, 1e-300), "--llc-mib: 1e-300 MiB is less than 1 KiB"),
        ((float("nan"), None), "--background: nan must be a finite number"),
        ((0.0, None, 1e308), "--run-background: 1e+308 must be <="),
    ):
        with pytest.raises(UserError, match=message.replace("+", "[+]")):
            check_host_options(*args)


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
    # the same, with the all-reduce replayed from C (now scripts/experiments/mpi_native.c)
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
    bench = ROOT / "docs" / "bench"
    rows22 = read_benches(",".join(str(bench / p) for p in pattern.replace("{}", "2x2").split(",")))
    rows24 = read_benches(",".join(str(bench / p) for p in pattern.replace("{}", "2x4").split(",")))
    cal = host_calibrate(rows22, algo="torus", cores=2, llc_bytes=48 * MiB)
    assert cal.grid == "2x2" and cal.rms_relative_error < 0.25
    comp = compare(cal, rows24, min_bytes=MiB)
    assert [c.size_bytes for c in comp] == [MiB << k for k in range(7)] and {c.grid for c in comp} == {"2x4"}
    outside = [c.size_bytes for c in comp if abs(c.ratio - 1) > 0.30]
    assert outside == list(misses), [(c.size_bytes, round(c.ratio, 2)) for c in comp]


def test_calibration_background_load_term():
    # Rows generated with 3 other runnable threads on 2 cores: o(4) = 3.5; the fit must undo it when told.
    alpha, beta_gbs = 50.0, 2.0
    rows = _rows("flat", "2x2", alpha, beta_gbs, beta_gbs, 2, 1 << 30, background=3, sizes=(1 << 16, 1 << 20, 1 << 24))
    cal = host_calibrate(rows, cores=2, background=3, llc_bytes=1 << 30)
    assert (cal.alpha_us, cal.cache_gbytes_per_s) == (pytest.approx(alpha), pytest.approx(beta_gbs))
    quiet = cal.predict_seconds(Grid(2, 4), 1 << 24, background=0)
    busy = cal.predict_seconds(Grid(2, 4), 1 << 24)  # background as during the fit
    assert busy / quiet == pytest.approx((8 + 3) / 8)


def _bench_rows(
    grid: str,
    algos=("torus",),
    alpha_us: float = 150.0,
    cache_gbs: float = 0.5,
    memory_gbs: float = 0.25,
    cores: int = 2,
    llc: int = 1 << 20,
    background: float = 0.0,
    sizes=(1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22),
) -> list[dict]:
    """Rows in `bench allreduce --json` format whose times follow the CPU-host model with known figures."""
    g = Grid(*map(int, grid.split("x")))
    coefficients = [alpha_us * 1e-6, 1 / (cache_gbs * 1e9), 1 / (memory_gbs * 1e9) - 1 / (cache_gbs * 1e9)]
    rows = []
    for algo in algos:
        for s in sizes:
            t = float(fit_terms(algo, g, s, cores, background, llc) @ coefficients) * 1e6
            rows.append(
                {
                    "algo": algo,
                    "backend": "gloo",
                    "grid": grid,
                    "size_bytes": s,
                    "count": s // 4,
                    "dtype": "float32",
                    "time_us": t,
                    "algbw_gbps": s / t / 1e3,
                    "busbw_gbps": s / t / 1e3 * 2 * (g.size - 1) / g.size,
                    "wrong": 0,
                }
            )
    return rows


@pytest.mark.timeout(120)
def test_check_calibration_script_on_bench_files(tmp_path):
    # Two bench files whose times follow the model with different background loads: the script must say
    # 10 of 10 within 30% when told the loads, and name what falls outside when it is not.
    kw = {
        "algos": ("flat", "torus"),
        "alpha_us": 120.0,
        "cache_gbs": 1.1,
        "memory_gbs": 0.6,
        "llc": 4 << 20,
        "sizes": (1 << 16, 1 << 20, 1 << 22, 1 << 23, 1 << 24),
    }
    f22, f24 = tmp_path / "b22.json", tmp_path / "b24.json"
    f22.write_text(json.dumps(_bench_rows("2x2", background=3.0, **kw)))
    f24.write_text(json.dumps(_bench_rows("2x4", background=15.0, **kw)))
    script = [
        sys.executable,
        str(SCRIPTS / "experiments" / "check_calibration.py"),
        str(f22),
        str(f24),
        "--cores",
        "2",
        "--llc-mib",
        "4",
    ]
    ok = subprocess.run(
        [*script, "--fit-background", "3", "--check-background", "15"], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "8 of 8 predictions within 30%" in ok.stdout, ok.stdout + ok.stderr
    assert "pred/meas" in ok.stdout and " 1.00" in ok.stdout and "1/beta_cache = 1.1000 GB/s" in ok.stdout
    off = subprocess.run(script, capture_output=True, text=True, timeout=60)  # loads ignored: 2x4 over-predicted
    assert off.returncode == 1 and "outside" in off.stdout
    merged = subprocess.run(
        [
            *script[:2],
            f"{f22},{f22}",
            f"{f24},{f24}",
            "--cores",
            "2",
            "--llc-mib",
            "4",
            "--fit-background",
            "3",
            "--check-background",
            "15",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert merged.returncode == 0 and "     2 " in merged.stdout
    bad = subprocess.run([*script, "--llc-mib", "-1"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--llc-mib" in bad.stderr


@pytest.mark.timeout(60)
def test_measure_background_runs_the_command_and_reports(tmp_path):
    out = tmp_path / "bg.json"
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "dev" / "measure_background.py"),
            "--json",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1.0)",
        ],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert r.returncode == 0 and r.stdout.startswith("background: "), r.stdout + r.stderr
    d = json.loads(out.read_text())
    assert d["samples"] >= 3 and d["background"] >= 0 and d["rc"] == 0
    bad = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "dev" / "measure_background.py"),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(3)",
        ],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert bad.returncode == 3
