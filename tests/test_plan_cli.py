"""`torus-train plan` end to end: the real console script in a subprocess, real files, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from clihelp import assert_one_line_error, invoke

from torus_train.commands.plan import plan
from torus_train.job.topology import Grid
from torus_train.plan.calibrate import local_coefficients
from torus_train.plan.cost import ALGORITHMS
from torus_train.plan.grids import BUCKET_CAPS_MB, best_grid
from torus_train.plan.networks import PRESETS
from torus_train.plan.search import make_plan


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "torus_train", "plan", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(120)
def test_sony_point_prints_parameters_table_and_json(tmp_path):
    out = tmp_path / "plan.json"
    r = run_cli(
        "--gpus", "1088", "--network", "abci-v100", "--per-gpu-batch", "32", "--grid", "32x34", "--json", str(out)
    )
    assert r.returncode == 0, r.stderr
    # The parameters the prediction rests on are printed, with their sources.
    for text in ("12.5 GB/s", "2 NIC(s)", "50 GB/s", "1376 img/s", "sources:", "datasheet"):
        assert text in r.stdout, text
    d = json.loads(out.read_text())
    assert d["grid"] == "32x34" and d["gpus"] == 1088 and d["gradient_bytes"] == 25_557_032 * 2
    for algo in ALGORITHMS:
        a = d["algorithms"][algo]
        assert {"steps", "bytes_across_nodes", "allreduce_seconds", "step_seconds", "scaling_efficiency"} <= set(a)
        assert 0 < a["scaling_efficiency"] <= 1
        assert f"{a['scaling_efficiency'] * 100:.2f}%" in r.stdout
    # The CLI's numbers are the library's numbers.
    lib = make_plan(1088, PRESETS["abci-v100"], "resnet50", 32, Grid(32, 34, 4))
    assert d["algorithms"]["torus"]["allreduce_seconds"] == pytest.approx(lib.algorithms["torus"].allreduce_seconds)


def test_step_counts_at_2176():
    r = CliRunner().invoke(plan, ["--gpus", "2176", "--grid", "32x68"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines() if line and not line.startswith("#")}
    assert rows["flat"][1] == "4350" and rows["torus"][1] == "196"


def test_without_grid_the_grid_and_bucket_cap_are_chosen_by_the_step_and_explained(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(plan, ["--gpus", "1088", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    cands = d["candidates"]
    assert cands and all(
        set(c)
        == {"grid", "cap_mb", "buckets", "allreduce_seconds", "exposed_seconds", "step_seconds", "scaling_efficiency"}
        for c in cands
    )
    best = cands[0]
    assert best["step_seconds"] == min(c["step_seconds"] for c in cands)
    assert (d["grid"], d["bucket_cap_bytes"]) == (best["grid"], int(best["cap_mb"] * 2**20))
    assert d["algorithms"]["torus"]["step_seconds"] == pytest.approx(best["step_seconds"])
    # every factor pair of 1088 was compared at every cap
    pairs = {f"{x}x{1088 // x}" for x in (1, 2, 4, 8, 16, 17, 32, 34, 64, 68, 136, 272, 544, 1088)}
    assert {(c["grid"], c["cap_mb"]) for c in cands} == {(g, cap) for g in pairs for cap in BUCKET_CAPS_MB}
    assert f"# grid {best['grid']}: fastest predicted step of {len(cands)} (grid, bucket cap) pairs" in r.output
    # the table of candidates, best first, with the chosen pair on its first row
    rows = [line.split() for line in r.output.splitlines() if line.startswith("# ") and "%" in line]
    assert rows[0][1:3] == [best["grid"], f"{best['cap_mb']:g}"]
    # the fused all-reduce alone would choose another grid: the output says so
    fused, _ = best_grid(1088, PRESETS["abci-v100"], d["gradient_bytes"])
    assert str(fused) != best["grid"] and f"the grid with the fastest single all-reduce, {fused}" in r.output


def test_given_grid_or_overlap_keeps_the_old_choices():
    r = CliRunner().invoke(plan, ["--gpus", "1088", "--overlap", "0.5"])
    best, _ = best_grid(1088, PRESETS["abci-v100"], 25_557_032 * 2)
    assert r.exit_code == 0 and f"# grid {best}: fastest predicted torus" in r.output
    r = CliRunner().invoke(plan, ["--gpus", "1088", "--grid", "32x34"])
    assert r.exit_code == 0 and "then 25 MiB" in r.output and "(grid, bucket cap) pairs" not in r.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpus", "1000", "--grid", "32x68"], "32x68 = 2176"),
        (["--gpus", "64", "--network", "no-such-net"], "'no-such-net'"),
        (["--gpus", "0"], "--gpus"),
        (["--gpus", "64", "--grid", "8by8"], "8by8"),
        (["--gpus", "64", "--overlap", "2"], "--overlap"),
        (["--gpus", "64", "--model", "vgg99"], "vgg99"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torus-train: error:") and needle in lines[0], r.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "section,key,value", [("inter", "bandwidth_gbytes_per_s", -12.5), ("intra", "bandwidth_gbytes_per_s", 0)]
)
def test_bad_network_file_names_the_field(tmp_path, section, key, value):
    links = {"intra": (50, 2), "inter": (12.5, 2)}
    f = tmp_path / "net.toml"
    text = "gpus_per_node = 4\nnics_per_node = 2\n"
    for sec, (bw, lat) in links.items():
        bw = value if sec == section else bw
        text += f"[{sec}]\nbandwidth_gbytes_per_s = {bw}\nlatency_us = {lat}\n"
    f.write_text(text + "[images_per_second]\nresnet50 = 1000\n")
    r = run_cli("--gpus", "64", "--network", str(f))
    assert r.returncode == 2
    assert f"[{section}] {key}: {value}" in r.stderr and str(f) in r.stderr, r.stderr
    f.write_text(text.replace(f"= {value}\n", "= 40\n") + "[images_per_second]\nresnet50 = 1000\n")
    ok = run_cli("--gpus", "64", "--network", str(f))
    assert ok.returncode == 0 and "network net" in ok.stdout, ok.stderr


@pytest.mark.timeout(180)
def test_simulate_at_full_scale(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("--gpus", "2176", "--grid", "32x68", "--simulate", "--json", str(out), timeout=170)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["simulation"]["grid"] == "32x68" and len(d["simulation"]["results"]) == 4
    assert all(x["ok"] and x["wrong_ranks"] == 0 and x["steps"] == 196 for x in d["simulation"]["results"])
    assert "# simulate 32x68: 2176 virtual ranks, 2179 int64 elements each: 196 steps" in r.stdout


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    r = CliRunner().invoke(plan, ["--gpus", "256", "--network", "dgx-h100", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def _bench_rows(
    grid: str, algos=("torus",), alpha_us: float = 15.0, gbs: float = 20.0, sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22)
) -> list[dict]:
    """Rows in `bench allreduce --json` format whose times follow time = steps * alpha + coeff * n * beta."""
    g = Grid(*map(int, grid.split("x")))
    rows = []
    for algo in algos:
        steps, coeff = local_coefficients(algo, g)
        for s in sizes:
            t = steps * alpha_us + coeff * s / (gbs * 1e3)
            rows.append(
                {
                    "algo": algo,
                    "backend": "nccl",
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
def test_calibrate_fits_a_bench_file_and_predicts_2x4(tmp_path):
    # A bench file whose times follow alpha = 15 us per step and 20 GB/s per rank.
    bench = tmp_path / "bench_2x2.json"
    bench.write_text(json.dumps(_bench_rows("2x2")))
    out = tmp_path / "cal.json"
    r = run_cli("calibrate", str(bench), "--grid", "2x4", "--json", str(out))
    assert r.returncode == 0, r.stderr
    for text in (
        "alpha = 15.00 us per step, 1/beta = 20.0000 GB/s per rank",
        "rms 0.0% of the measured time",
        "4 rows used",
        "fit/meas",
    ):
        assert text in r.stdout, text
    d = json.loads(out.read_text())
    assert d["calibration"]["gbytes_per_s"] == pytest.approx(20.0)
    p24 = [p for p in d["predictions"] if p["grid"] == "2x4"]
    s8, c8 = local_coefficients("torus", Grid(2, 4))
    assert p24[-1]["time_us"] == pytest.approx(s8 * 15 + c8 * (1 << 22) / 20e3)
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"algo\": \"torus\"}]")
    r = run_cli("calibrate", str(bad))
    assert r.returncode == 2 and "grid: missing" in r.stderr


@pytest.mark.timeout(120)
def test_calibrate_compare_prints_predicted_against_measured(tmp_path):
    f22, f24 = tmp_path / "b22.json", tmp_path / "b24.json"
    f22.write_text(json.dumps(_bench_rows("2x2")))
    f24.write_text(json.dumps(_bench_rows("2x4")))
    out = tmp_path / "cmp.json"
    r = run_cli("calibrate", str(f22), "--compare", str(f24), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "pred/meas" in r.stdout and "at >= 1 MiB pred/meas 1.00 to 1.00, 2 of 2 within 30%" in r.stdout
    comp = json.loads(out.read_text())["comparison"]
    assert [c["grid"] for c in comp] == ["2x4"] * 4 and all(c["ratio"] == pytest.approx(1) for c in comp)
    r = run_cli("calibrate", str(f22), "--compare", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "missing.json does not exist" in r.stderr
    flat_only = tmp_path / "flat.json"
    flat_only.write_text(json.dumps(_bench_rows("2x4", algos=("flat",))))
    r = run_cli("calibrate", str(f22), "--compare", str(flat_only))
    assert r.returncode == 2 and "--compare" in r.stderr and "no rows of torus" in r.stderr


def test_help_does_not_import_torch():
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from torus_train.cli import cli; "
            "import torus_train.commands.plan, torus_train.plan.predict, torus_train.plan.calibrate_report; "
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "False", r.stderr


def _options(help_text: str) -> set[str]:
    """The long options a --help page lists."""
    section = help_text.split("Options:")[1].split("Commands:")[0]
    rows = [line for line in section.splitlines() if line.startswith("  -") and not line.startswith("   ")]
    return {w.rstrip(",") for line in rows for w in line.split()[:2] if w.startswith("--")}


def test_each_command_lists_only_its_own_options():
    pages = {name: CliRunner().invoke(plan, [*name.split(), "--help"]) for name in ("", "calibrate")}
    assert all(r.exit_code == 0 for r in pages.values())
    main = _options(pages[""].output)
    assert {"--gpus", "--grid", "--network", "--overlap", "--simulate", "--png", "--plot"} <= main
    assert "--check-groups" not in main  # `plan rehearse` builds the groups at the full world size
    assert not main & {"--calibrate", "--compare", "--algo"}
    assert "calibrate" in pages[""].output.split("Commands:")[1]
    assert "compare-run" not in pages[""].output  # the CPU test host's: scripts/experiments/compare_run.py
    assert _options(pages["calibrate"].output) == {"--grid", "--algo", "--compare", "--json", "--help"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--calibrate", "b.json", "--grid", "2x4"], "torus-train plan calibrate BENCH.json"),
        (["--gpus", "8", "--compare", "b.json"], "torus-train plan calibrate BENCH.json --compare OTHER.json"),
        (["--gpus", "8", "--llc-mib", "32"], "No such option '--llc-mib'"),
        (["--gpus", "8", "--check-groups"], "--check-groups was replaced by `torus-train plan rehearse --spec"),
        (["compare-run", "run"], "No such command 'compare-run'"),
        (["--gpus", "8", "calibrate", "b.json"], "--gpus: an option of the main plan, not of `plan calibrate`"),
        (["calibrate", "b.json", "--gpus", "8"], "No such option"),
        (["calibrate"], "Missing argument 'BENCH.json'"),
        (["calibrate", "b.json", "--cores", "2"], "No such option '--cores'"),
        (["calibrate", "missing.json"], "BENCH.json: missing.json"),
    ],
)
def test_old_and_misplaced_options_are_one_line_and_exit_2(args, needle):
    assert_one_line_error(*invoke("plan", *args)[::2], needle)
