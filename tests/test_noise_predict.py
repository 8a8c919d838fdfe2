"""What a measured noise scale says of another batch (job/noise.py), the warnings for a schedule that cannot
learn, `report --batch`, the report's noise panel and `run --dry-run --noise-from`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from torus_train.cli import cli
from torus_train.job.noise import Cost, NoisePoint, averaged, curve, over, prediction_lines
from torus_train.train.results import read_run


def test_the_cost_is_the_papers_trade_off():
    for batch, b_crit in ((256, 1000.0), (69_632, 4000.0), (4000, 4000.0), (1, 3.5)):
        c = Cost(batch, b_crit)
        # (S/S_min - 1)(E/E_min - 1) = 1, and B_crit = E_min / S_min: at B = B_crit both cost 2x
        assert (c.steps - 1) * (c.examples - 1) == pytest.approx(1.0)
    at = Cost(4000, 4000.0)
    assert (at.steps, at.examples) == (2.0, 2.0)
    big = Cost(69_632, 4352.0)  # 16x the critical batch: nearly the fewest steps, 17x the fewest examples
    assert big.steps == pytest.approx(1.0625) and big.examples == pytest.approx(17.0)
    assert "17.00x the fewest examples (5.88% of the examples do work)" in big.text()


def test_the_curve_keeps_finite_positive_values_at_their_fraction_of_training():
    recs = [
        {"epoch": 0, "noise_scale": 100.0},
        {"epoch": 0},  # before the first estimate
        {"epoch": 1, "noise_scale": None},  # |G|^2 average not positive yet
        {"epoch": 1, "noise_scale": -5.0},
        {"epoch": 2, "noise_scale": float("nan")},
        {"epoch": 3, "noise_scale": 400.0},
    ]
    pts = curve(recs, 4)
    assert pts == [NoisePoint(0.125, 100.0), NoisePoint(0.875, 400.0)]
    assert averaged(pts) == 250.0 and averaged([]) is None
    assert over(pts, 0.5, 1.0) == 400.0 and over(pts, 0.25, 0.5) == 100.0  # the nearest earlier value
    assert over(pts, 0.0, 0.1) is None


def test_prediction_lines_say_both_averages_and_where_the_model_is_rough():
    pts = [NoisePoint(0.25, 1000.0), NoisePoint(0.75, 3000.0)]
    lines = prediction_lines(pts, [69_632])
    assert lines[0] == "B_simple measured: 2 values, 1,000 to 3,000, averaged over the run 2,000, last 3,000"
    assert lines[1].startswith("averaged: global batch 69,632 against B_crit ~ 2,000: 1.03x the fewest steps")
    assert "35.82x the fewest examples" in lines[1]
    assert lines[2].startswith("last:     global batch 69,632 against B_crit ~ 3,000")
    assert lines[-1].startswith("rough: B_simple stands in for B_crit")
    assert "nothing to predict from" in prediction_lines([], [128])[0]


def write_noise_run(out: Path) -> Path:
    """A finished 4-epoch run folder with the noise scale rising 100 -> 800 and one decided stage start."""
    out.mkdir(parents=True)
    lines, step = [], 0
    for e in range(4):
        batch = 128 if e < 2 else 256
        if e in (0, 2):
            lines.append(
                {
                    "event": "stage",
                    "epoch": e,
                    "stage": e // 2,
                    "global_batch": batch,
                    "per_rank_batch": batch // 2,
                    "accumulation": 1,
                    "step": step,
                }
            )
        if e == 2:
            lines.append(
                {
                    "event": "stage_decision",
                    "step": step,
                    "epoch": 2,
                    "stage": 1,
                    "noise_scale": 400.0,
                    "threshold": 256.0,
                    "why": "noise scale",
                }
            )
        for _ in range(2):
            step += 2
            lines.append(
                {
                    "step": step,
                    "epoch": e,
                    "global_batch": batch,
                    "per_rank_batch": batch // 2,
                    "lr": 0.1,
                    "loss": 2.0 / step,
                    "images_per_second": 250.0,
                    "data_time": 0.01,
                    "step_time": 0.5,
                    "wall_seconds": float(step),
                    "noise_scale": 100.0 * 2**e,
                    "noise_g2": 1.0,
                    "noise_trace": 100.0 * 2**e,
                }
            )
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = {"steps": step, "wall_seconds": float(step), "world_size": 2, "grid": "2x1", "ranks": []}
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_report_reads_the_noise_scale_and_the_decisions_and_predicts_a_batch(tmp_path):
    out = write_noise_run(tmp_path / "run")
    run = read_run(out)
    assert [r["noise_scale"] for r in run.intervals] == [100.0, 100.0, 200.0, 200.0, 400.0, 400.0, 800.0, 800.0]
    assert run.decisions == [
        {"step": 8, "epoch": 2, "stage": 1, "noise_scale": 400.0, "threshold": 256.0, "why": "noise scale"}
    ]
    r = CliRunner().invoke(cli, ["report", str(out), "--no-png", "--batch", "69632", "--batch", "128"])
    assert r.exit_code == 0, r.output
    assert "B_simple measured: 8 values, 100 to 800, averaged over the run 375, last 800" in r.output
    assert "averaged: global batch 69,632 against B_crit ~ 375: 1.01x the fewest steps, 186.69x" in r.output
    assert "last:     global batch 128 against B_crit ~ 800: 7.25x the fewest steps, 1.16x" in r.output
    assert "rough:" in r.output
    bad = CliRunner().invoke(cli, ["report", str(out), "--no-png", "--batch", "0"])
    assert bad.exit_code == 2


def test_report_draws_the_noise_panel(tmp_path):
    pytest.importorskip("matplotlib")
    out = write_noise_run(tmp_path / "run")
    png = tmp_path / "r.png"
    r = CliRunner().invoke(cli, ["report", str(out), "--png", str(png)])
    assert r.exit_code == 0, r.output
    from PIL import Image

    width, _ = Image.open(png).size
    assert width == 24 * 90  # four panels (loss, top-1, ranks, noise scale) at 90 dpi; three are 18 inches wide


def test_dry_run_noise_from_prints_each_stages_predicted_efficiency(tmp_path):
    ref = write_noise_run(tmp_path / "ref")
    argv = [sys.executable, "-m", "torus_train", "run", "--dry-run", "--out", str(tmp_path / "o")]
    r = subprocess.run(
        [*argv, "--epochs", "4", "--noise-from", str(ref)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    text = r.stdout.split(f"# predicted efficiency of each stage's batch (noise scale from {ref})")[1]
    # default stages at 2 ranks: 128 for epochs 0-2, 256 for 2-4 (the third stage is cut by --epochs 4)
    assert "stage 0 (epochs 0-2): global batch 128 against B_crit ~ 150: 2.17x the fewest steps" in text
    assert "stage 1 (epochs 2-4): global batch 256 against B_crit ~ 600: 3.34x the fewest steps" in text
    refused = subprocess.run(
        [sys.executable, "-m", "torus_train", "run", "--noise-from", str(ref), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--noise-from goes with --dry-run" in refused.stderr


def test_the_missions_dry_run_warns_that_its_schedule_cannot_learn(tmp_path):
    """The embedded demo set on 2,176 ranks: a global batch of 139,264 on 10,000 images, a peak LR of 435
    from linear scaling with plain SGD. The dry run still prints the plan (README's command), with the lines."""
    argv = [sys.executable, "-m", "torus_train", "run", "--dry-run", "--out", str(tmp_path / "o")]
    r = subprocess.run([*argv, "--gpus", "2176", "--grid", "32x68"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    warn = [line for line in r.stdout.splitlines() if line.startswith("warning:")]
    assert len(warn) == 2, r.stdout
    assert "stage(s) 0, 1, 2 take a global batch larger than the 10,000 training images" in warn[0]
    assert "smaller per-rank batch" in warn[0] and "larger data set" in warn[0]
    assert "linear LR scaling with plain SGD up to a global batch of 557,056 (peak LR 435.2)" in warn[1]
    assert 'optimizer.name = "lars"' in warn[1] and "about 8,192" in warn[1]
    assert "# preflight passed" in r.stdout
    # LARS answers the second line; the default job on 2 ranks has neither
    lars = subprocess.run(
        [*argv, "--gpus", "2176", "--grid", "32x68", "--set", "optimizer.name=lars"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert [line for line in lars.stdout.splitlines() if line.startswith("warning:")] == warn[:1]
    small = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert small.returncode == 0 and "warning:" not in small.stdout


def test_the_control_table_script_reads_run_folders(tmp_path):
    """scripts/experiments/control_table.py on a recipe_seeds-style folder holding one toy run."""
    run = write_noise_run(tmp_path / "noise" / "seed0-t1")
    evals = [
        {"event": "eval", "epoch": e, "step": 4 * (e + 1), "top1": 0.5 + 0.15 * e, "top5": 1.0, "wall_seconds": 4.0 * e}
        for e in range(4)
    ]
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in evals))
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**s, "target_top1": 0.9, "param_digest": "ab" * 32}))
    script = Path(__file__).resolve().parents[1] / "scripts" / "experiments" / "control_table.py"
    r = subprocess.run(
        [sys.executable, str(script), f"noise={tmp_path / 'noise'}", "--json", str(tmp_path / "rows.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert (row["stage_starts"], row["decided_by"], row["steps_to_target"], row["target_epoch"]) == (
        [0, 2],
        ["noise scale"],
        16,
        4,
    )
    assert "| noise | seed0-t1 | 0, 2 | noise scale | 16 (4) | 12.0 | 95.0% | 16 | 16.0 |" in r.stdout
