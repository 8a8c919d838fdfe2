"""The examples of issue 33 for `report`, `plan` and `bench allreduce`: each one line and exit 2 (or a result
where the input is usable), nothing a run or the user wrote overwritten, no hang on a FIFO."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, invoke
from test_commands_report import write_run

GOOD_BENCH = [
    {
        "algo": "torus",
        "backend": "gloo",
        "grid": "2x1",
        "size_bytes": s,
        "count": s // 4,
        "dtype": "float32",
        "time_us": 50 + s / 1e3,
        "algbw_gbps": s / (50e3 + s),
        "busbw_gbps": s / (50e3 + s),
        "wrong": 0,
    }
    for s in (1024, 65536, 1 << 20, 4 << 20)
]
"""Rows as `bench allreduce --json` writes them (bench.allreduce.Row)."""


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def run(tmp_path) -> Path:
    return write_run(tmp_path / "r")


@pytest.mark.parametrize("target", ["metrics.jsonl", "summary.json"])
def test_report_json_never_overwrites_the_run_s_own_files(run, target):
    before = digest(run)
    code, _, err = invoke("report", str(run), "--no-png", "--json", str(run / target))
    assert_one_line_error(code, err, f"--json {run / target}: a file is there that `torus-train report` did not write")
    assert "left untouched" in err and digest(run) == before


def test_report_png_never_overwrites_a_file_it_did_not_write(run, tmp_path):
    (tmp_path / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\nthe user's picture")
    before = digest(tmp_path)
    code, _, err = invoke("report", str(run), "--png", str(tmp_path / "mine.png"))
    assert_one_line_error(code, err, "--png")
    assert digest(tmp_path) == before
    code, _, err = invoke("report", str(run), "--png", str(run / "summary.json"))
    assert_one_line_error(code, err, "'.json' is not a format matplotlib writes")


def test_report_replaces_its_own_earlier_json_and_png(run, tmp_path):
    out = tmp_path / "rep.json"
    for _ in range(2):
        code, _stdout, err = invoke("report", str(run), "--json", str(out))
        assert code == 0, err
    assert json.loads(out.read_text())["written_by"] == "torus-train report"
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = invoke("report", str(run), "--json", str(out), "--png", str(out))
    assert_one_line_error(code, err, "--png")  # '.json' is no picture format, checked first


@pytest.mark.parametrize("plot", ["r.xyz", "noext"])
def test_report_png_suffix_is_checked_before_any_work(run, tmp_path, plot):
    with contextlib.chdir(tmp_path):
        code, _, err = invoke("report", str(run), "--png", plot, "--json", "x.json")
    assert_one_line_error(code, err, f"--png {plot}:")
    assert not (tmp_path / plot).exists() and not (tmp_path / "x.json").exists()


BAD_LINES = {
    "step 10**400": '{"step": 1' + "0" * 400 + ', "epoch": 0, "global_batch": 2, "lr": 0.1, "loss": 1.0, '
    '"images_per_second": 1.0, "data_time": 0.0, "step_time": 1.0, "wall_seconds": 1.0}',
    "event a list": '{"event": [1], "step": 3}',
    "global_batch 0": '{"step": 3, "epoch": 0, "global_batch": 0, "lr": 0.1, "loss": 1.0, "images_per_second": 1.0, '
    '"data_time": 0.0, "step_time": 1.0, "wall_seconds": 1.0}',
    "loss 1e999": '{"step": 3, "epoch": 0, "global_batch": 2, "lr": 0.1, "loss": 1e999, "images_per_second": 1.0, '
    '"data_time": 0.0, "step_time": 1.0, "wall_seconds": 1.0}',
    "over-deep": "[" * 100_000 + "]" * 100_000,
    "not UTF-8": '{"step": "\xff"}',
    "top1 as string": '{"event": "eval", "step": 2, "epoch": 0, "top1": "0.5", "top5": 0.9, "wall_seconds": 1.0}',
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_metrics_line_is_skipped_and_counted_the_rest_reported(run, tmp_path, case):
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(BAD_LINES[case].encode("latin-1") + b"\n")
    before = digest(run)
    code, stdout, err = invoke("report", str(run), "--no-png", "--json", str(tmp_path / "a.json"))
    assert code == 0 and "Traceback" not in err, err
    assert "1 line(s) of metrics.jsonl skipped" in stdout and "left out: r: skipped metrics.jsonl line 12" in stdout
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["skipped_lines"] == 1 and len(doc["runs"][0]["intervals"]) == 6 and len(doc["runs"][0]["evals"]) == 3
    assert digest(run) == before


@pytest.mark.parametrize(
    "change,left_out",
    [
        ({"world_size": 0}, "world_size: 0 must be >= 1"),
        ({"steps": 10**400}, "steps: "),
        ({"wall_seconds": float("inf")}, "wall_seconds: inf must be a finite number"),
        ({"grid": [[["deep"]]]}, "grid: "),
        ({"ranks": [{"rank": "0"}]}, "ranks[0]: rank: '0' must be an integer"),
    ],
)
def test_a_bad_summary_is_left_out_and_said(run, tmp_path, change, left_out):
    summary = json.loads((run / "summary.json").read_text()) | change
    (run / "summary.json").write_text(json.dumps(summary, allow_nan=True))
    code, stdout, err = invoke("report", str(run), "--no-png", "--json", str(tmp_path / "a.json"))
    assert code == 0 and "Traceback" not in err, err
    assert left_out in stdout
    assert json.loads((tmp_path / "a.json").read_text())["runs"][0]["evals"]  # the curves are still there


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json"])
def test_report_on_a_fifo_returns_one_line(run, name):
    (run / name).unlink()
    os.mkfifo(run / name)
    out = subprocess.run(
        [sys.executable, "-m", "torus_train", "report", str(run), "--no-png"],
        capture_output=True,
        text=True,
        timeout=100,
    )  # a read of the FIFO would block here forever
    assert_one_line_error(out.returncode, out.stderr, f"report: {run / name} is a FIFO, not a regular file")


@pytest.fixture
def bench(tmp_path) -> Path:
    (tmp_path / "b.json").write_text(json.dumps(GOOD_BENCH))
    return tmp_path / "b.json"


def test_plan_calibrate_reads_rows_with_wrong_null(bench, tmp_path):
    rows = json.loads(bench.read_text())
    for r in rows:
        r["wrong"] = None
    bench.write_text(json.dumps(rows))
    code, stdout, err = invoke("plan", "calibrate", str(bench))
    assert code == 0, err
    assert "4 rows used" in stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "8", "--images-per-second", "1e308"], "--images-per-second: 1e+308 must be <="),
        (["--gpus", "8", "--images-per-second", "1e-308"], "--images-per-second: 1e-308 must be >="),
        (["--gpus", "8", "--step-overhead", "1e308"], "--step-overhead: 1e+308 must be <="),
        (["--gpus", "8", "--per-gpu-batch", "100000000000"], "--per-gpu-batch: 100000000000 must be"),
    ],
)
def test_plan_numbers_out_of_range_are_one_line(bench, run, args, message):
    args = [str(bench) if a == "B" else str(run) if a == "R" else a for a in args]
    code, stdout, err = invoke("plan", *args)
    assert_one_line_error(code, err, message)
    assert stdout == ""  # refused before any work


@pytest.mark.parametrize(
    "args,flag",
    [(["--gpus", "8", "--plot", "p.xyz"], "--plot p.xyz"), (["--gpus", "8", "--png", "p.xyz"], "--png p.xyz")],
)
def test_plan_plot_suffix_is_checked_before_any_work(tmp_path, args, flag):
    with contextlib.chdir(tmp_path):
        code, stdout, err = invoke("plan", *args)
    assert_one_line_error(code, err, f"{flag}: '.xyz' is not a format matplotlib writes")
    assert stdout == "" and list(tmp_path.iterdir()) == []


def test_plan_writers_replace_only_their_own_output(bench, tmp_path):
    with contextlib.chdir(tmp_path):
        for _ in range(2):  # the second run replaces the first's files
            code, _, err = invoke("plan", "--gpus", "8", "--json", "p.json", "--plot", "p.png")
            assert code == 0, err
        assert json.loads(Path("p.json").read_text())["written_by"] == "torus-train plan"
        before = digest(tmp_path)
        for args, flag in (
            (["plan", "calibrate", "b.json", "--json", "p.json"], "--json p.json"),
            (["plan", "calibrate", "b.json", "--json", "b.json"], "--json b.json"),
            (["plan", "--gpus", "8", "--json", "b.json"], "--json b.json"),
            (["report", "r", "--no-png", "--json", "p.json"], "--json p.json"),
            (["plan", "--gpus", "8", "--plot", "q.png", "--png", "q.png"], "--png"),
            (["plan", "--gpus", "8", "--json", "x.png", "--png", "x.png"], "--png"),
        ):
            code, stdout, err = invoke(*args)
            assert_one_line_error(code, err, flag)
            assert stdout == ""
        assert digest(tmp_path) == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--plot", "p.xyz"], "--plot p.xyz: '.xyz' is not a format matplotlib writes"),
        (["--json", "b.json", "--plot", "b.json"], "--plot b.json: '.json' is not a format"),
        (["--json", "notes.json"], "--json notes.json: a file is there that `torus-train bench allreduce` did not"),
        (["--json", "p.png", "--plot", "p.png"], "--json and --plot name the same file"),
    ],
)
def test_bench_allreduce_outputs_are_checked_before_any_rank_starts(bench, tmp_path, args, message):
    (tmp_path / "notes.json").write_text('{"mine": 1}')
    before = digest(tmp_path)
    with contextlib.chdir(tmp_path):
        code, _stdout, err = invoke("bench", "allreduce", "--nprocs", "2", *args)
    assert_one_line_error(code, err, message)
    assert digest(tmp_path) == before


def test_bench_rows_are_recognised_as_bench_output(bench):
    from dataclasses import fields

    from torus_train.bench.allreduce import WRITER, Row
    from torus_train.outfiles import check_json_output

    assert {f.name for f in fields(Row)} == set(GOOD_BENCH[0])
    check_json_output(bench, WRITER)  # an earlier bench file: may be replaced
    bench.write_text(json.dumps([{"algo": "torus"}]))
    with pytest.raises(Exception, match="did not write"):
        check_json_output(bench, WRITER)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "args,named",
    [
        (["plan", "calibrate", "F"], "BENCH.json: F: F is a FIFO"),
        (["plan", "calibrate", "B", "--compare", "F"], "--compare: F: F is a FIFO"),
        (["plan", "--gpus", "8", "--layer-profile", "F"], "--layer-profile: F: F is a FIFO"),
    ],
)
def test_plan_inputs_that_are_fifos_are_refused_by_name(bench, tmp_path, args, named):
    os.mkfifo(tmp_path / "F")
    args = [{"F": "F", "B": "b.json"}.get(a, a) for a in args]
    out = subprocess.run(
        [sys.executable, "-m", "torus_train", *args], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )  # a read of the FIFO would block here forever
    assert_one_line_error(out.returncode, out.stderr, named + ", not a regular file")
