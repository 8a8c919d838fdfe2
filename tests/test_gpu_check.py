"""The acceptance test for one GPU (`torus-train check --acceptance`, torus_train/check/acceptance.py) and its
thin caller scripts/bench/gpu_check.sh, on a machine without a GPU: flags, usage errors, the schema-3 document
(every check null, its fields those docs/check.md documents), the parts' registry and the production spec
shrunk to one GPU (it validates). The checks themselves need a CUDA GPU; the rehearsal (slow) runs every part on
the CPU at toy size."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.check.acceptance import (
    ACCEPTANCE,
    CHECKS,
    LIMIT_MARGIN,
    REHEARSAL_SLOWER,
    UNIT_SECONDS,
    clear_part,
    part_env,
)
from torus_train.check.shrunk import SPEC, Shrunk
from torus_train.registry import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "gpu_check.sh"
CHECK_MD = ROOT / "docs" / "check.md"
ORDER = ["check", "syncs", "speed", "production", "digest", "graphs"]


def run(*args: str, env: dict | None = None, timeout: int = 120, drop: str = "") -> subprocess.CompletedProcess:
    """The thin caller, CUDA hidden (a CPU machine, whatever this one has); ``drop``: a variable taken out."""
    environ = {k: v for k, v in os.environ.items() if k != drop}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def documented() -> dict[str, set[str]]:
    """check -> fields, from docs/check.md's lines "check.field   meaning"."""
    text = (ROOT / "docs" / "check.md").read_text()
    fields: dict[str, set[str]] = {}
    for m in re.finditer(r"^(\w+)\.(\w+) {2,}", text, flags=re.M):
        fields.setdefault(m.group(1), set()).add(m.group(2))
    return fields


def test_help_and_usage_errors(tmp_path):
    r = run("--help")
    assert r.returncode == 0 and "--acceptance" in r.stdout and "--rehearse" in r.stdout
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    for bad in (
        ["--bogus"],
        ["--out"],
        ["--json"],
        ["--parts", ""],
        ["--parts", "syncs,bogus"],
        ["--out", str(mine)],
        ["--out", str(mine / "notes.txt")],
    ):
        r = run(*bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", (bad, r.stderr)
    assert "'bogus' is not an acceptance part; choose from check, syncs" in run("--parts", "syncs,bogus").stderr
    assert "did not write" in run("--out", str(mine)).stderr and os.listdir(mine) == ["notes.txt"]


def test_rehearse_and_out_go_with_acceptance(capsys):
    from torus_train.cli import main

    for flags in (["--rehearse"], ["--out", "x"]):
        with pytest.raises(SystemExit) as e:
            main(["check", *flags])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "goes with --acceptance" in err, err


def test_without_a_gpu_every_check_is_null_and_documented(tmp_path):
    out = tmp_path / "out"
    r = run("--out", str(out), "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU" in r.stderr and "status no-gpu" in r.stdout
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc == json.loads((out / "summary.json").read_text())
    assert (doc["status"], doc["gpu"], doc["gpu_check"], doc["parts"]) == ("no-gpu", None, 3, [])
    assert doc["written_by"] == "torus-train check" and {"torch", "cuda", "dali", "date", "wall_seconds"} <= set(doc)
    assert list(doc["checks"]) == list(CHECKS) and set(CHECKS) == set(documented())
    for name, check in doc["checks"].items():
        assert check["ok"] is None and check["pass_if"] and "seconds" in check
        assert set(check) - {"ok", "pass_if", "seconds"} == documented()[name], name
    rows = r.stdout.splitlines()  # the table: a row per check, then the status
    assert [row.split()[0] for row in rows[1:-1]] == list(CHECKS)
    again = run("--out", str(out))  # the check's own folder is taken again
    assert again.returncode == 0, again.stderr


def test_a_second_run_into_the_same_folder_starts_each_part_from_nothing(tmp_path):
    """A part's result and its own folder of runs (whose runs would be refused as results already there, and
    their old figures read) go before it runs again; the rest of the folder stays."""
    out = tmp_path / "out"
    for path in ("parts/digest.json", "digest/run1/summary.json", "parts/syncs.json", "syncs/x", "summary.json"):
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text("{}")
    assert clear_part("digest", out) == (out / "parts" / "digest.json", out / "parts" / "digest.log")
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["parts/syncs.json", "summary.json", "syncs/x"]


def test_every_check_has_one_part_and_the_limits_fit():
    assert list(ACCEPTANCE.names()) == ORDER
    filled = [c for p in ACCEPTANCE for c in p.checks]
    assert sorted(filled) == sorted(CHECKS)
    for part in ACCEPTANCE:
        assert callable(load(part.ref)), part.ref
    assert REHEARSAL_SLOWER == 5


def test_each_limit_is_sized_from_what_its_part_does_and_documented():
    """A part's limit is LIMIT_MARGIN x the expected seconds of its counted work (starts, builds, autotuning
    rounds, captures, steps), rounded up to 10 s; syncs and graphs have room over the 40 s and 180 s first set
    without a count; docs/check.md's table shows each part's limit and its counts as the registry has them."""
    for name, part in ACCEPTANCE.items():
        w = part.work
        expected = sum(getattr(w, item) * unit for item, unit in UNIT_SECONDS.items())  # by name
        assert w.seconds == pytest.approx(expected + w.other_s), name
        assert part.limit % 10 == 0 and 0 <= part.limit - LIMIT_MARGIN * w.seconds < 10, name
    limits = {n: p.limit for n, p in ACCEPTANCE.items()}
    assert limits["syncs"] >= 2 * 40 and limits["graphs"] >= 2 * 180
    graphs = ACCEPTANCE.get("graphs").work  # per batch and round 4 models and 3 captures, then agree's 4 and 6
    assert (graphs.builds, graphs.captures) == (3 * 2 * 4 + 4, 3 * 2 * 3 + 3 * 2)
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+), (\d+), (\d+), (\d+), (\d+), (\d+) \|", CHECK_MD.read_text(), re.M)
    documented = {r[0]: tuple(map(int, r[1:])) for r in rows}
    assert documented == {
        n: (p.limit, p.work.starts, p.work.builds, p.work.autotunes, p.work.captures, p.work.steps, p.work.other_s)
        for n, p in ACCEPTANCE.items()
    }


def test_the_parts_that_may_turn_determinism_on_start_with_cublas_workspace(monkeypatch, tmp_path):
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG at a process's first gemm: every part whose code turns determinism on
    gets it in the environment its process starts with, whatever the caller's (a user's value stands); the
    others measure the default configuration without it. A rehearsal's part refuses determinism without it
    (check/__main__.py: CUDA counted as started), so the rehearsal fails a part missing here."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "unset by the test")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    s = Shrunk(tmp_path, rehearsal=True)
    given = {n: part_env(p, s).get("CUBLAS_WORKSPACE_CONFIG") for n, p in ACCEPTANCE.items()}
    assert given == {
        "check": ":4096:8",  # the check part's deterministic part, after its graphs part's gemms
        "syncs": None,
        "speed": None,
        "production": None,  # `torus-train run` without --deterministic; a rank sets it itself when it is
        "digest": ":4096:8",  # the loop at 256 autotuned, then deterministic, in one process
        "graphs": ":4096:8",  # agree's deterministic runs after the timed ones
    }
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert part_env(ACCEPTANCE.get("digest"), s)["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_the_production_spec_shrunk_to_one_gpu_is_valid(tmp_path):
    from torus_train.job.spec import load_spec, parse_override

    shrunk = Shrunk(tmp_path)
    spec = shrunk.loop_spec(tmp_path, 256, 30)
    assert (spec.model.arch, spec.model.precision, spec.model.channels_last) == ("resnet50", "fp16", True)
    assert (spec.optimizer.name, spec.comm.algo, spec.comm.compression) == ("lars", "torus", "fp16")
    assert (spec.data.image_size, spec.grid.grid, spec.schedule.steps) == (224, "1x1", 30)
    bf16 = shrunk.loop_spec(tmp_path, 256, 30, "bf16")  # the speed part's bf16 loop validates too
    assert (bf16.model.precision, bf16.comm.compression) == ("bf16", "bf16")
    deterministic = shrunk.loop_spec(tmp_path, 256, 30, deterministic=True)
    assert not spec.job.deterministic and deterministic.job.deterministic
    sets = shrunk.cli_sets(
        [
            "model.num_classes=8",
            "schedule.stages=[{until_epoch=1,global_batch=32},{until_epoch=2,global_batch=256}]",
            "schedule.epochs=2",
        ]
    )
    cli = load_spec(str(SPEC), [parse_override(v) for k, v in zip(sets[::2], sets[1::2], strict=True)])
    assert cli.data.loader == "dali" and cli.eval.every_epochs == 5 and cli.grid.gpus == 1
    assert [s.global_batch for s in cli.schedule.stages] == [32, 256]
    toy = Shrunk(tmp_path, rehearsal=True)
    assert (toy.small, toy.large, toy.backend, toy.loop_spec(tmp_path, 8, 3).data.image_size) == (4, 8, "gloo", 64)


def check_graphs(graphs: dict) -> None:
    """The graphs check of a rehearsal: batch 2, 4 and 8, every column filled, nothing captured on the CPU."""
    assert sorted(graphs["batches"], key=int) == ["2", "4", "8"]
    columns = ("ours_graphed_img_s", "ours_eager_img_s", "bare_eager_img_s", "bare_graphed_img_s")
    for batch, row in graphs["batches"].items():
        assert None not in row.values() and min(row[k] for k in columns) > 0, batch
        assert abs(row["ratio"] - row["ours_graphed_img_s"] / row["bare_graphed_img_s"]) < 0.01, batch
        assert row["capture_seconds"] == 0.0  # no capture on the CPU
    assert graphs["eager_ratio_batch_32"] > 0
    # on the CPU both sides run the same step eagerly: equal to the bit, and the NaN step skipped and counted
    agree = graphs["agree"]
    assert (agree["eager_vs_graphed_max_rel"], agree["graphed_runs_equal"]) == (0.0, True), agree
    assert agree["nonfinite_step_skipped"] and agree["all_finite"] and agree["ok"], agree


def check_loop_parts(checks: dict) -> None:
    """syncs, speed and digest of a rehearsal."""
    assert checks["host_syncs"]["ok"] and checks["host_syncs"]["syncs_per_step"] == 0
    assert checks["host_syncs"]["steps"] > 0 and checks["host_syncs"]["backend"] == "gloo"
    digest = checks["digest"]
    assert digest["ok"] and len(digest["first"]) == 64
    assert digest["deterministic_cost"] == pytest.approx(digest["deterministic_img_s"] / digest["default_img_s"])
    speed = checks["speed_vs_bare"]
    assert speed["batch"] == 8 and speed["torus_train_img_s"] > 0 and speed["bare_img_s"] > 0
    assert abs(speed["ratio"] - speed["torus_train_img_s"] / speed["bare_img_s"]) < 1e-9
    prec = checks["bf16_vs_fp16"]  # the pass line: the loop in bf16 against the bare loop in bf16
    assert prec["fp16_img_s"] == speed["torus_train_img_s"]
    assert prec["ratio"] == pytest.approx(prec["bf16_img_s"] / prec["bare_bf16_img_s"])
    assert prec["bf16_over_fp16"] == pytest.approx(prec["bf16_img_s"] / prec["fp16_img_s"])


@pytest.mark.slow
@pytest.mark.timeout(1560)  # the parts' limits (x5 in a rehearsal) bound it; a loaded 2-core CPU is slow
def test_the_rehearsal_runs_every_part_on_the_cpu(tmp_path):
    """--rehearse: every part end to end on the CPU (gloo, DALI's CPU decoder, 64 px), every documented field
    filled; the pass lines that hold on any device hold here."""
    out = tmp_path / "out"
    # the caller's environment without cuBLAS's workspace: each part that turns determinism on must get it
    r = run(
        "--rehearse",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "s.json"),
        timeout=1500,
        drop="CUBLAS_WORKSPACE_CONFIG",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["status"] == "rehearsal" and doc["gpu"] is None and doc["parts"] == ORDER
    checks = doc["checks"]
    for name, check in checks.items():
        assert "error" not in check and None not in check.values(), (name, check)
        assert documented()[name] <= set(check), name
    machine = checks["machine"]["parts"]  # `torus-train check` on the CPU: the GPU parts null, the others ok
    assert machine["decoder_cpu"]["ok"] and machine["deterministic"]["ok"] and machine["environment"]["ok"]
    assert all(machine[n]["ok"] is None for n in ("gpus", "nccl", "graphs", "decoder_gpu")) and checks["machine"]["ok"]
    assert "throughput" not in machine and (out / "machine.json").is_file()
    prod = checks["production"]
    assert prod["ok"] and (prod["backend"], prod["loader"], prod["evaluations"]) == ("gloo", "dali (cpu)", 2)
    assert prod["dali_checked"] is True and prod["note"] == "DALI" and prod["images_per_s"] > 0
    assert prod["replicas_agree"] is True and prod["steps"] == 48 + 24  # 192 images at batch 4, then at batch 8
    wait = checks["data_wait"]
    assert (wait["steps_batch_32"], wait["steps_batch_256"]) == (48 - 3, 24 - 3)  # each stage's first 3 left out
    assert 0 <= wait["share_batch_32"] <= 1 and 0 <= wait["share_batch_256"] <= 1
    check_loop_parts(checks)
    check_graphs(checks["graphs"])


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_one_part_without_dali_passes_on_torchvision_and_says_dali_was_not_checked(tmp_path):
    """--parts production where nvidia.dali does not import (a package of that name that raises): the run takes
    torchvision (with its GPU decoder on a GPU; the CPU one here), its figures are filled, the check passes and
    its note says that DALI was not checked; the other parts' checks stay null."""
    fake = tmp_path / "nodali" / "nvidia"
    (fake / "dali").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os, site\n"  # the real nvidia.* packages stay importable
        "__path__.extend(os.path.join(d, 'nvidia') for d in site.getsitepackages())\n"
    )
    (fake / "dali" / "__init__.py").write_text("raise ImportError('nvidia.dali hidden by the test')\n")
    out = tmp_path / "out"
    r = run("--rehearse", "--parts", "production", "--out", str(out), env={"PYTHONPATH": str(fake.parent)}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "summary.json").read_text())
    assert (doc["status"], doc["parts"]) == ("rehearsal", ["production"])
    prod = doc["checks"]["production"]
    assert prod["ok"] is True and "error" not in prod and prod["dali_checked"] is False
    assert "DALI was not checked" in prod["note"]
    assert (prod["loader"], prod["evaluations"], prod["replicas_agree"]) == ("torchvision (cpu)", 2, True)
    assert doc["checks"]["data_wait"]["steps_batch_256"] == 21
    for name in ("machine", "host_syncs", "speed_vs_bare", "bf16_vs_fp16", "peak_memory", "digest"):
        assert doc["checks"][name]["ok"] is None and doc["checks"][name]["seconds"] is None, name


@pytest.mark.parametrize(
    ("natural", "poisoned", "unchanged", "skipped_ok"),
    [
        (0, 1, True, True),  # the NaN step alone skipped
        (1, 2, True, True),  # fp16's scaler skipped a step of its own at 2^16 in both runs: no fault
        (1, 1, True, False),  # the NaN step was not counted
        (0, 2, True, False),  # one more skip than the NaN step explains
        (0, 1, False, False),  # counted, but the parameters moved
    ],
)
def test_the_nan_step_is_one_skip_more_than_the_unpoisoned_run(
    monkeypatch, tmp_path, natural, poisoned, unchanged, skipped_ok
):
    """graphs.agree's nonfinite_step_skipped compares the poisoned run's skipped steps with the same graphed run's
    unpoisoned count plus one (the runs themselves are the GPU's: stood in here by their results)."""
    import torch

    from torus_train.check import accept_graphs

    params = torch.ones(8)

    def trained(boot, s, batch, steps, graphs, poison_at=None):
        if poison_at is None:
            return {"params": params.clone(), "skipped": natural if graphs else 0}
        return {"params": params.clone(), "skipped": poisoned, "unchanged": unchanged}

    monkeypatch.setattr(accept_graphs, "trained", trained)
    got = accept_graphs.agreement(None, Shrunk(tmp_path, rehearsal=True), 4)
    assert got["nonfinite_step_skipped"] is skipped_ok and got["ok"] is skipped_ok
    assert got["skipped"] == {"unpoisoned": natural, "poisoned": poisoned}
    assert got["graphed_runs_equal"] and got["eager_vs_graphed_max_rel"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_part_that_turns_determinism_on_started_without_cublas_workspace_fails(tmp_path):
    """The digest part's process started as a part that may not turn determinism on would be (no
    CUBLAS_WORKSPACE_CONFIG): in a rehearsal, where CUDA counts as started, its deterministic loop is refused in
    one line and the part fails, as it would on a GPU (where cuBLAS would have read the variable already)."""
    (tmp_path / "parts").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env |= {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "torus_train.check", "digest", str(tmp_path), "--rehearse"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=840, env=env)
    assert r.returncode == 1 and not (tmp_path / "parts" / "digest.json").exists()
    assert "UserError: job.deterministic: CUDA started in this process without CUBLAS_WORKSPACE_CONFIG" in r.stderr
