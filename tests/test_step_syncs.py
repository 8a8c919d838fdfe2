"""No host read in a training step: the CPU counter (tests/synccount.py) sees reads, the real loop makes none
outside its intervals (scripts/dev/check_step_syncs.py, on a smaller model), the graph probe's step is counted
apart; on CUDA torch's sync debug mode counts (torus_train/check/syncs.py): its warnings are turned into reads
on the threads that are the step's, here with torch's mode switch replaced, and for real where a GPU is."""

from __future__ import annotations

import _thread
import importlib.util
import json
import threading
import warnings
from pathlib import Path

import pytest
import torch
from graphfake import install
from synccount import SyncCounter

from torus_train.check import syncs
from torus_train.check.shrunk import CPU_SYNC_COUNTER
from torus_train.check.smallrun import PRECISIONS, world_of_one
from torus_train.ranks.distributed import shutdown
from torus_train.train import graphs

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dev" / "check_step_syncs.py"
SMALL = dict(image_size=32, batch=2, arch="shufflenet_v2_x0_5")  # 0.35M parameters, BatchNorm and biases


def script():
    spec = importlib.util.spec_from_file_location("check_step_syncs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_counter_sees_each_kind_of_host_read():
    t, z = torch.tensor([1.0, 0.0]), torch.tensor(2.0)
    reads = [
        lambda: z.item(),
        lambda: bool(z),
        lambda: t.tolist(),
        lambda: t.numpy(),
        lambda: t.nonzero(),
        lambda: torch.equal(t, t),
        lambda: f"{z:.1f}",
        lambda: t[t > 0],
    ]
    for read in reads:
        with SyncCounter() as c:
            read()
        assert c.count == 1, (read, c.where)
    with SyncCounter() as c:  # device-side work only
        torch.where(z > 1, t, t * 2).sum().add_(1)
        torch.isfinite(t).all().float()
    assert c.count == 0, c.where


@pytest.mark.timeout(240)
def test_no_host_read_in_a_step_of_any_precision(monkeypatch):
    found = script().count_all(7, "lars", **SMALL)
    assert set(found) == set(PRECISIONS)
    for precision, r in found.items():
        assert r["interval_steps"] == [5, 7]  # the logging steps, left out
        assert r["steps"] == 4 and r["syncs"] == 0, (precision, r["where"])


@pytest.mark.timeout(120)
def test_a_read_in_a_step_is_counted_and_placed(monkeypatch):
    from torus_train.train import loop

    # a host read planted in the step's own code: set_lr runs once per step
    monkeypatch.setattr(loop, "set_lr", lambda opt, lr: opt.param_groups[0]["params"][0].sum().item())
    found = script().count_all(7, "sgd", ["fp32"], **SMALL)["fp32"]
    assert found["syncs"] == found["steps"] == 4
    [(where, n)] = found["where"].items()
    assert (
        n == 4
        and where.startswith("aten::_local_scalar_dense at ")
        and "test_step_syncs.py:" in where
        and where.endswith(" <lambda>")
    )


def test_script_writes_the_json_of_the_issue(monkeypatch, tmp_path):
    mod = script()
    counts = {p: {"steps": 5, "syncs": 0, "interval_steps": [5, 7], "where": {}} for p in PRECISIONS}
    monkeypatch.setattr(mod, "count_all", lambda steps, optimizer: counts)
    assert mod.main(["--json", str(tmp_path / "s.json"), "--steps", "7"]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == {
        "steps": 5,
        "syncs_per_step": {"fp32": 0.0, "bf16": 0.0, "fp16-scaler": 0.0},
    }
    counts["bf16"]["syncs"] = 10
    assert mod.main(["--json", str(tmp_path / "s.json"), "--steps", "7"]) == 1


@pytest.mark.timeout(180)
def test_the_graph_probes_step_is_counted_apart_and_replays_are_counted(monkeypatch, tmp_path):
    """The probe reads on purpose (max_rel_diff, the ranks' verdicts): its step goes with the logging steps;
    the steps replayed after it are counted (graphfake's replay runs the captured step again)."""
    fake = install(monkeypatch.setattr)
    boot = world_of_one("gloo")
    try:
        spec = script().small_spec(7, "sgd", str(tmp_path), **SMALL)
        graph = graphs.StepGraph(warmup=2)
        found = syncs.count_loop_syncs(spec, boot, tmp_path, "fp32", SyncCounter, graph=graph)
    finally:
        shutdown()
    assert graph.choice["choice"] == "graphed" and fake.log.count("replay") == 1 + 4  # the probe's, steps 4-7
    assert found["interval_steps"] == [3, 5, 7]  # the probe, then the logging steps
    assert found["steps"] == 3 and found["syncs"] == 0, found["where"]  # steps 2 (eager), 4 and 6 (replays)


def test_torchs_sync_warnings_are_reads_on_the_steps_threads(monkeypatch):
    """cuda_sync_warnings with torch's mode switch replaced (no CUDA here): each warning torch would raise is a
    read, placed at the code that caused it, on the entering thread and on a thread Python did not start (as the
    autograd engine's, which runs backward on CUDA), not on a thread the package started; other warnings pass."""
    switched: list = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", switched.append)

    def sync():  # what warn_or_error_on_sync raises after a synchronising CUDA operation
        warnings.warn(f"{syncs.SYNC_WARNING} (Triggered internally at CUDAFunctions.cpp:160.)", stacklevel=1)

    def from_a_thread_python_did_not_start():
        done = threading.Event()
        _thread.start_new_thread(lambda: (sync(), done.set()), ())
        assert done.wait(10)

    reads: list[str] = []
    before = warnings.showwarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        with syncs.cuda_sync_warnings(reads.append):
            for _ in range(2):  # each one, not once per place
                sync()
            from_a_thread_python_did_not_start()
            prefetch = threading.Thread(target=sync, name="torus-decode")
            prefetch.start()
            prefetch.join()
            warnings.warn("something else", stacklevel=1)
    assert switched == ["warn", 0] and warnings.showwarning is before
    assert len(reads) == 3 and reads[0] == reads[1], reads
    assert all(r.startswith("cuda sync at ") and "test_step_syncs.py:" in r for r in reads), reads
    assert reads[0].endswith(" sync") and reads[2].endswith(" sync")
    assert [str(w.message) for w in seen] == ["something else"]


def test_a_cpu_counts_with_the_tests_counter_loaded_from_the_checkout():
    """What a rehearsal's syncs part counts with: this folder's synccount.py, loaded by path."""
    counter, name = syncs.counter_for(torch.device("cpu"))
    assert Path(__file__).with_name("synccount.py") == CPU_SYNC_COUNTER and name == "tests/synccount.py (CPU)"
    reads: list[str] = []
    with counter(reads.append):
        torch.tensor(2.0).item()
        torch.tensor(2.0).add_(1)
    assert (
        len(reads) == 1 and reads[0].startswith("aten::_local_scalar_dense at ") and "test_step_syncs.py:" in reads[0]
    ), reads
    assert syncs.counter_for(torch.device("cuda")) == (syncs.cuda_sync_warnings, "torch.cuda.set_sync_debug_mode")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_torchs_mode_sees_a_read_in_the_step_and_one_in_backward():
    """For real: ``.item()`` on the training thread, and one in a gradient hook, which CUDA's backward runs on the
    autograd engine's device thread (tests/synccount.py's counter, one thread only, would miss it)."""
    x = torch.ones(4, device="cuda", requires_grad=True)

    def reads_in_backward(grad: torch.Tensor) -> None:
        grad.sum().item()

    x.register_hook(reads_in_backward)
    reads: list[str] = []
    with syncs.cuda_sync_warnings(reads.append):
        loss = (x * 2).sum()
        loss.item()
        loss.backward()
        torch.where(x > 0, x, -x).sum().add_(1)  # device-side work only
    assert len(reads) == 2, reads
