"""`torus-train check` on this CPU machine: every part reports a verdict (the GPU parts null with a reason, the
CPU decoder and the deterministic repeat for real), the table on stdout and the JSON's shape, --help, usage
errors (exit 2), a failing part (exit 1), and a user's file at --json left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from torus_train.check.parts import PARTS, Part
from torus_train.cli import cli, main
from torus_train.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
GPU_PARTS = {"gpus", "nccl", "graphs", "decoder_gpu"}
REAL_ON_CPU = {"environment", "decoder_cpu", "deterministic"}


def torus_train(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "torus_train", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


@pytest.mark.timeout(300)
def test_every_part_reports_on_this_cpu_machine(tmp_path):
    out = tmp_path / "check.json"
    r = torus_train("check", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["written_by"] == "torus-train check" and doc["check"] == 1 and doc["ok"] is True
    assert {"date", "host", "torus_train", "wall_seconds"} <= set(doc)
    assert list(doc["parts"]) == list(PARTS.names())
    for name, part in doc["parts"].items():
        assert set(part) == {"ok", "why", "detail", "seconds"} and part["why"] and "\n" not in part["why"], name
    for name in GPU_PARTS:
        assert doc["parts"][name]["ok"] is None and "no CUDA device" in doc["parts"][name]["why"], name
    for name in REAL_ON_CPU:
        assert doc["parts"][name]["ok"] is True, (name, doc["parts"][name]["why"])
    t = doc["parts"]["throughput"]
    assert t["ok"] is None and t["why"].startswith("CPU figures") and set(t["detail"]["batches"]) == {"16", "32", "256"}
    for row in t["detail"]["batches"].values():
        assert row["ours_img_s"] > 0 and row["bare_img_s"] > 0 and row["ratio"] > 0
    d = doc["parts"]["deterministic"]["detail"]["digests"]
    assert len(d) == 2 and d[0] == d[1]
    # stdout: the table alone (the loop's own lines went to stderr), a row per part in order, and the totals
    rows = r.stdout.splitlines()
    assert rows[0].split() == ["part", "result", "sec", "why"]
    named = [line.split()[0] for line in rows[1:-1] if not line.startswith(" ")]
    assert named == list(PARTS.names())
    assert rows[-1].startswith(f"{len(PARTS.names())} parts in ") and "0 failed" in rows[-1]
    assert "check [" in r.stderr and "stage 0" not in r.stdout
    assert doc["wall_seconds"] < 300
    # the check's own earlier file is replaced on the next run
    again = torus_train("check", "--parts", "environment", "--json", str(out))
    assert again.returncode == 0 and list(json.loads(out.read_text())["parts"]) == ["environment"]


def test_help_lists_every_part():
    r = CliRunner().invoke(cli, ["check", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "--json FILE" in text and all(f"{name}:" in text for name in PARTS.names())


@pytest.mark.parametrize(
    "args, says",
    [
        (["--parts", "bogus"], "--parts: 'bogus' is not a part; choose from environment, gpus"),
        (["--parts", ","], "--parts: no part named"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_a_users_file_is_refused_before_any_part_runs(tmp_path, capsys):
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}\n')
    with pytest.raises(SystemExit) as e:
        main(["check", "--parts", "environment", "--json", str(mine)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "did not write" in err and "check [" not in err
    assert mine.read_text() == '{"mine": 1}\n'


@pytest.fixture
def toy_parts():
    def fails(ctx):
        return Verdict.failed("the toy part fails", figure=1)

    def raises(ctx):
        raise RuntimeError("boom\nsecond line")

    def cannot(ctx):
        return Verdict.cannot_run("not here")

    for name, fn in (("toy_fails", fails), ("toy_raises", raises), ("toy_null", cannot)):
        PARTS.add(name, Part(fn, "a toy"))  # type: ignore[arg-type]  # load() takes a function as well
    yield
    for name in ("toy_fails", "toy_raises", "toy_null"):
        PARTS.remove(name)


def test_a_failed_part_exits_1_and_the_others_still_run(toy_parts, tmp_path, capsys):
    out = tmp_path / "c.json"
    with pytest.raises(SystemExit) as e:
        main(["check", "--parts", "toy_raises,toy_fails,toy_null", "--json", str(out)])
    assert e.value.code == 1
    doc = json.loads(out.read_text())
    parts = doc["parts"]
    assert doc["ok"] is False and list(parts) == ["toy_fails", "toy_raises", "toy_null"]
    assert parts["toy_fails"].pop("seconds") >= 0
    assert parts["toy_fails"] == {"ok": False, "why": "the toy part fails", "detail": {"figure": 1}}
    assert parts["toy_raises"]["ok"] is False and parts["toy_raises"]["why"] == "RuntimeError: boom"
    assert parts["toy_null"]["ok"] is None
    table = capsys.readouterr().out
    assert "FAILED" in table and "2 failed, 1 cannot run here" in table


def test_null_is_not_a_failure(toy_parts, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "--parts", "toy_null"])
    assert e.value.code == 0 and "n/a" in capsys.readouterr().out


def test_the_command_does_not_import_torch():
    code = "import sys, torus_train.commands.check; print('torch' in sys.modules)"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert r.stdout.strip() == "False", r.stderr


def test_docs_list_every_part_in_order():
    text = (ROOT / "docs" / "check.md").read_text().split("## The acceptance test")[0]  # the parts' table
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == list(PARTS.names())  # the first row is the header


def test_gpus_fails_when_the_launcher_would_count_gpus_cuda_does_not_show(monkeypatch):
    from torus_train.check import environment
    from torus_train.job import gpus

    monkeypatch.setattr(gpus, "local_gpus", lambda environ=None: gpus.GpuCount(2))
    v = environment.gpus(None)
    assert v.ok is False and "job/gpus.py counts 2 GPU(s) but CUDA shows 0" in v.why
    monkeypatch.setattr(gpus, "local_gpus", lambda environ=None: gpus.GpuCount(0, "no NVIDIA driver"))
    v = environment.gpus(None)
    assert v.ok is None and v.why.startswith("no CUDA device (no NVIDIA driver)")
