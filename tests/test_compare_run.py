"""scripts/experiments/compare_run.py: a finished CPU run's measured step against the CPU-host model's prediction
(cpu_host.py), from a calibration and a step profile (step_profile.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "scripts" / "experiments"
sys.path.insert(0, str(EXPERIMENTS))  # compare_run.py and cpu_host.py, as the scripts beside them import them

import compare_run  # noqa: E402
from cpu_host import StepProfile, host_calibrate, predict_host_step  # noqa: E402

from torus_train.plan.calibrate import host_grid, read_benches  # noqa: E402
from torus_train.plan.timeline import bucket_plan, model_layers  # noqa: E402

BENCH = ROOT / "docs" / "bench" / "allreduce_gloo_2x2.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """python scripts/experiments/NAME ARGS, from the checkout's root."""
    return subprocess.run(
        [sys.executable, str(EXPERIMENTS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=ENV,
    )


def _profile(tmp_path: Path, background: float = 0.0) -> Path:
    """A step profile of resnet18 at 64 px: 10 ms forward, 20 ms backward shared evenly, 5 ms optimizer."""
    mods = sorted({layer.name.rsplit(".", 1)[0] for layer in model_layers("resnet18", 64, 10)})
    p = StepProfile("resnet18", 64, 16, 10, 1, 0.010, 0.020, 0.005, {m: 0.020 / len(mods) for m in mods}, 2, background)
    f = tmp_path / "prof.json"
    f.write_text(json.dumps(p.__dict__))
    return f


def _run_folder(tmp_path: Path, device: str = "cpu", times=(9.0, 0.5, 0.5, 0.7)) -> Path:
    """The three files `torus-train run` leaves, for a 2x2 CPU torus run at 16 images per rank."""
    out = tmp_path / "run"
    out.mkdir()
    spec = {
        "model": {"arch": "resnet18", "num_classes": 10},
        "data": {"image_size": 64},
        "comm": {"algo": "torus", "compression": "none", "bucket_mb": 25.0},
    }
    (out / "job.json").write_text(json.dumps({"spec": spec, "grid": {"x": 2, "y": 2, "gpus_per_node": 4}}))
    (out / "summary.json").write_text(json.dumps({"device": device, "steps": 5 * len(times), "grid": "2x2"}))
    lines = [{"event": "stage", "epoch": 0, "per_rank_batch": 16}]
    lines += [{"step": 5 * (i + 1), "per_rank_batch": 16, "step_time": t} for i, t in enumerate(times)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return out


def test_compare_run_on_a_fixture_folder_predicts_by_hand(tmp_path, capsys):
    out, prof, js = _run_folder(tmp_path), _profile(tmp_path), tmp_path / "cmp.json"
    args = [str(out), "--calibrate", str(BENCH), "--layer-profile", str(prof), "--cores", "2", "--json", str(js)]
    assert compare_run.main(args) == 0
    output = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert set(d) >= {"run", "grid", "ranks", "calibration", "profile", "run_background", "stages"}
    (st,) = d["stages"]
    # measured: the median step_time after the first (warm-up) record: median(0.5, 0.5, 0.7)
    assert st["measured_step_seconds"] == 0.5 and st["records_used"] == 3
    # predicted by hand: 4 ranks on 2 cores, o = 2; every core busy, so nothing hides: the step is
    # o x (10 + 20 + 5 ms) + each bucket's calibrated exchange (fp32 bytes of DDP's buckets of resnet18)
    cal = host_calibrate(read_benches(str(BENCH)), algo="torus", cores=2)
    buckets = [sum(layer.numel for layer in b) * 4 for b in bucket_plan(model_layers("resnet18", 64, 10))]
    comm = sum(cal.predict_seconds(host_grid("2x2"), n) for n in buckets)
    assert st["prediction"]["bucket_bytes"] == buckets
    assert st["predicted_step_seconds"] == pytest.approx(2 * 0.035 + comm)
    assert st["prediction"]["bound"] == "cores" and st["ratio"] == pytest.approx(st["predicted_step_seconds"] / 0.5)
    assert f"{st['ratio']:.2f}" in output and "pred/meas" in output


def test_the_timeline_bound_decides_when_cores_are_free():
    """2 ranks on 8 cores: o = 1, exchanges hide behind the backward pass, and the critical path is longer than
    the cores' work only when an exchange outlasts the backward left after it."""
    cal = host_calibrate(read_benches(str(BENCH)), algo="torus", cores=8)
    prof = StepProfile(
        "resnet18",
        64,
        16,
        10,
        1,
        0.010,
        0.020,
        0.005,
        dict.fromkeys({layer.name.rsplit(".", 1)[0] for layer in model_layers("resnet18", 64, 10)}, 0.02 / 21),
        8,
        0.0,
    )
    h = predict_host_step(cal, prof, host_grid("2x1"), 16, 25 * 2**20, 4, model_layers("resnet18", 64, 10), 0.0)
    assert h.oversubscription == 1.0
    assert h.cores_step_seconds == pytest.approx(0.035 + h.communication_seconds)
    assert h.step_seconds == max(h.timeline_step_seconds, h.cores_step_seconds)
    assert h.timeline_step_seconds == pytest.approx(0.035 + h.timeline["exposed_seconds"])


@pytest.mark.parametrize(
    "what, needle",
    [
        ("missing", "summary.json is missing"),
        ("gpu", "ran on cuda; only runs on CPU ranks"),
        ("no-bench", "compare_run.py needs this machine's calibration"),
        ("other-model", "is resnet50 at 64 px; the run is resnet18"),
    ],
)
def test_compare_run_bad_input_is_one_line_exit_2(tmp_path, what, needle):
    out = _run_folder(tmp_path, device="cuda" if what == "gpu" else "cpu")
    prof = _profile(tmp_path)
    if what == "missing":
        (out / "summary.json").unlink()
    if what == "other-model":
        d = json.loads(prof.read_text())
        prof.write_text(json.dumps(d | {"model": "resnet50"}))
    args = [str(out), "--layer-profile", str(prof)]
    if what != "no-bench":
        args += ["--calibrate", str(BENCH)]
    r = script("compare_run.py", *args)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("compare_run.py: error: ")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--background", "1e308"], "--background: 1e+308 must be <="),
        (["--run-background", "1e308"], "--run-background: 1e+308 must be <="),
        (["--llc-mib", "1e308"], "--llc-mib: 1e+308 must be <="),
        (["--cores", "0"], "--cores: 0 must be in [1, 1048576]"),
    ],
)
def test_compare_run_numbers_out_of_range_are_one_line(tmp_path, capsys, args, message):
    assert compare_run.main([str(_run_folder(tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert err == f"compare_run.py: error: {err.split(': error: ', 1)[1]}" and message in err and err.count("\n") == 1


@pytest.mark.timeout(100)
def test_a_fifo_in_the_run_folder_is_refused_by_name(tmp_path):
    out = _run_folder(tmp_path)
    (out / "metrics.jsonl").unlink()
    os.mkfifo(out / "metrics.jsonl")
    r = script("compare_run.py", str(out), "--calibrate", str(BENCH), "--layer-profile", str(_profile(tmp_path)))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr  # a read of the FIFO would block forever
    assert f"{out / 'metrics.jsonl'} is a FIFO, not a regular file" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_run_on_a_real_run(tmp_path):
    """A real 4-rank torus run (a few steps), a real bench and a real profile, back to back, compared."""
    env_py = [sys.executable, "-m", "torus_train"]
    bench, prof, out = tmp_path / "b.json", tmp_path / "p.json", tmp_path / "run"
    for cmd in (
        [
            *env_py,
            "bench",
            "allreduce",
            "--grid",
            "2x2",
            "--algo",
            "torus",
            "-b",
            "1M",
            "-e",
            "16M",
            "-n",
            "3",
            "-w",
            "1",
            "--json",
            str(bench),
        ],
        [sys.executable, str(EXPERIMENTS / "step_profile.py"), "resnet18", str(prof), "--repeats", "3"],
        [
            *env_py,
            "run",
            "--gpus",
            "4",
            "--grid",
            "2x2",
            "--data",
            "synthetic",
            "--model",
            "resnet18",
            "--image-size",
            "64",
            "--steps",
            "8",
            "--out",
            str(out),
            "--set",
            "job.log_every=2",
            "--set",
            "checkpoint.every_epochs=0",
            "--set",
            "checkpoint.at_end=false",
            "--set",
            "eval.every_epochs=0",
            "--set",
            "schedule.stages=[{until_epoch=1,per_rank_batch=16}]",
        ],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stdout + r.stderr
    js = tmp_path / "cmp.json"
    r = script("compare_run.py", str(out), "--calibrate", str(bench), "--layer-profile", str(prof), "--json", str(js))
    assert r.returncode == 0, r.stderr
    (st,) = json.loads(js.read_text())["stages"]
    rec = compare_run.read_run(str(out))
    assert st["measured_step_seconds"] == rec.stages[0]["step_seconds"] > 0 and st["records_used"] == 3
    assert st["predicted_step_seconds"] > 0 and len(st["prediction"]["bucket_bytes"]) == 3
    print(
        f"\nreal 2x2 run: measured {st['measured_step_seconds'] * 1e3:.0f} ms, predicted "
        f"{st['predicted_step_seconds'] * 1e3:.0f} ms, pred/meas {st['ratio']:.2f}"
    )


def test_the_loops_own_work_is_added_when_measured(tmp_path):
    """loop_seconds (CPU per step of a one-rank run of the job) beyond forward + backward + optimizer comes after
    the optimizer step, stretched by o like the rest: 4 ranks on 2 cores, 50 ms against the profile's 35 ms."""
    cal = host_calibrate(read_benches(str(BENCH)), algo="torus", cores=2)
    layers = model_layers("resnet18", 64, 10)
    mods = dict.fromkeys({layer.name.rsplit(".", 1)[0] for layer in layers}, 0.02 / 21)
    base = StepProfile("resnet18", 64, 16, 10, 1, 0.010, 0.020, 0.005, mods, 2, 0.0)
    with_loop = StepProfile("resnet18", 64, 16, 10, 1, 0.010, 0.020, 0.005, mods, 2, 0.0, loop_seconds=0.050)
    a, b = (predict_host_step(cal, p, host_grid("2x2"), 16, 25 * 2**20, 4, layers, 0.0) for p in (base, with_loop))
    assert with_loop.loop_overhead() == pytest.approx(0.015)
    assert b.step_seconds - a.step_seconds == pytest.approx(2 * 0.015)


@pytest.mark.timeout(240)
def test_step_profile_measures_a_toy_step_that_compare_run_reads(tmp_path):
    """scripts/experiments/step_profile.py at toy size: one thread, CPU time, every module with parameters; its
    `modules` is a profile `plan --layer-profile` reads."""
    from click.testing import CliRunner

    from torus_train.commands.plan import plan

    prof = tmp_path / "p.json"
    r = script("step_profile.py", "resnet18", str(prof), "--image-size", "32", "--batch", "2", "--repeats", "1")
    assert r.returncode == 0 and f"wrote {prof}" in r.stdout, r.stderr
    p = compare_run.read_step_profile(str(prof))
    assert (p.model, p.image_size, p.batch, p.clock, p.colocated) == ("resnet18", 32, 2, "cpu", 1)
    assert p.forward_seconds > 0 and p.backward_seconds > 0 and {"conv1", "fc"} <= set(p.modules)
    assert {layer.name.rsplit(".", 1)[0] for layer in model_layers("resnet18")} == set(p.modules)
    args = ["--grid", "2x2", "--model", "resnet18", "--network", "dgx-h100", "--images-per-second", "500"]
    r = CliRunner().invoke(plan, [*args, "--layer-profile", str(prof)])
    assert r.exit_code == 0 and "measured --layer-profile" in r.output, r.output
    bad = script("step_profile.py", "resnet18", str(prof), "--colocated", "2", "--threads", "2")
    assert bad.returncode == 2 and "--colocated needs --threads 1" in bad.stderr
