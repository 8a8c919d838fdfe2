"""`torus-train report`: a finished, a running and a failed run, several runs, and bad input (exit 2, or a
plot of what is there with a line saying what was left out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from torus_train.cli import cli, main


def write_run(out: Path, epochs: int = 3, finished: bool = True, steps_per_epoch: int = 4) -> Path:
    """A run folder as train/report.py writes it: stage events, an interval line every 2 steps, evals."""
    out.mkdir(parents=True)
    lines, step, wall = [], 0, 0.0
    for e in range(epochs):
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
        for _ in range(steps_per_epoch // 2):
            step, wall = step + 2, wall + 1.0
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
                    "wall_seconds": wall,
                }
            )
        lines.append(
            {
                "event": "eval",
                "epoch": e,
                "step": step,
                "top1": 0.3 * (e + 1),
                "top5": 0.9,
                "val_loss": 1.0 / (e + 1),
                "samples": 100,
                "wall_seconds": wall + 0.2,
            }
        )
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if finished:
        ranks = [
            {"rank": r, "host": "h", "work_p50": 0.1 + r / 100, "compute_p50": 0.09, "data_p50": 0.01 + r / 100}
            for r in range(2)
        ]
        (out / "summary.json").write_text(
            json.dumps(
                {
                    "steps": step,
                    "wall_seconds": wall,
                    "world_size": 2,
                    "grid": "2x1",
                    "target_top1": 0.8,
                    "ranks": ranks,
                }
            )
        )
    return out


def test_finished_run_png_and_json(tmp_path):
    run = write_run(tmp_path / "a")
    r = CliRunner().invoke(cli, ["report", str(run), "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    assert "finished" in r.output and "target 80%: passed after epoch 3" in r.output
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["written_by"] == "torus-train report" and doc["skipped_lines"] == 0
    figures = doc["runs"][0]
    assert len(figures["intervals"]) == 6 and [e["top1"] for e in figures["evals"]] == pytest.approx([0.3, 0.6, 0.9])
    assert [s["global_batch"] for s in figures["stages"]] == [128, 256] and len(figures["ranks"]) == 2


def test_running_run_with_a_torn_line_and_a_failed_run_compared(tmp_path):
    running = write_run(tmp_path / "running", finished=False)
    with open(running / "metrics.jsonl", "a") as f:
        f.write('{"step": 14, "epoch": 3, "glo')  # the writer was interrupted mid-line
    failed = write_run(tmp_path / "failed", epochs=1, finished=False)
    (failed / "logs").mkdir()
    (failed / "logs" / "rank00001.failed").write_text("nonfinite")
    png = tmp_path / "both.png"
    r = CliRunner().invoke(
        cli, ["report", str(running), str(failed), "--png", str(png), "--json", str(tmp_path / "b.json")]
    )
    assert r.exit_code == 0, r.output
    assert f"{failed}: failed" in r.output and f"{running}: no summary.json" in r.output
    assert "metrics.jsonl line 12: torn last line" in r.output
    assert "per-rank work left out" in r.output and png.stat().st_size > 10_000
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [len(f["evals"]) for f in doc["runs"]] == [3, 1]
    assert [f["skipped_lines"] for f in doc["runs"]] == [1, 0] and doc["skipped_lines"] == 1  # the torn line


def test_bad_values_are_left_out_naming_file_line_and_field(tmp_path):
    run = write_run(tmp_path / "a")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"loss": 1.0', '"loss": NaN')
    lines[2] = lines[2].replace('"step": 4', '"step": "4"')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    summary["ranks"][1]["data_p50"] = "slow"
    (run / "summary.json").write_text(json.dumps(summary))
    r = CliRunner().invoke(cli, ["report", str(run), "--no-png", "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    assert "metrics.jsonl line 2: loss: nan must be a finite number" in r.output
    assert "metrics.jsonl line 3: step: '4' must be an integer" in r.output
    assert "summary.json ranks[1]: data_p50: 'slow' must be a number" in r.output
    assert "2 line(s) of metrics.jsonl skipped" in r.output
    assert json.loads((tmp_path / "a.json").read_text())["skipped_lines"] == 2
    assert not (run / "report.png").exists()


@pytest.mark.parametrize(
    "case,expected",
    [
        ("missing", "no such folder"),
        ("not_a_run", "not a run's output folder (no metrics.jsonl or summary.json)"),
        ("empty", "nothing to show yet"),
        ("garbage", "nothing to show yet (skipped metrics.jsonl line 1: not JSON"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, expected):
    out = tmp_path / case
    if case != "missing":
        out.mkdir()
    if case == "empty":
        (out / "metrics.jsonl").write_text("")
    if case == "garbage":
        (out / "metrics.jsonl").write_text("this is not json\n")
    with pytest.raises(SystemExit) as e:
        main(["report", str(out), "--no-png"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("torus-train: error: report: ")
    assert expected in err


def test_help():
    r = CliRunner().invoke(cli, ["report", "--help"])
    assert r.exit_code == 0 and "--json" in r.output and "--png" in r.output


def test_tensorboard_is_named_for_the_scalars_the_png_leaves_out(tmp_path):
    """The PNG draws the curves by epoch and the ranks; every scalar against step and wall time (speed, LR,
    batch) is TensorBoard's, and report says where when a run has written it."""
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    r = CliRunner().invoke(cli, ["report", str(a), "--no-png", "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0 and "every scalar" not in r.output, r.output
    (a / "tensorboard").mkdir()
    r = CliRunner().invoke(cli, ["report", str(a), "--no-png", "--json", str(tmp_path / "a.json")])
    assert r.output.splitlines()[-1] == f"every scalar: tensorboard --logdir {a}"
    (b / "tensorboard").mkdir()
    r = CliRunner().invoke(cli, ["report", str(a), str(b), "--png", str(tmp_path / "ab.png")])
    assert r.exit_code == 0 and r.output.splitlines()[-1] == f"every scalar: tensorboard --logdir_spec a:{a},b:{b}"
    assert (tmp_path / "ab.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
