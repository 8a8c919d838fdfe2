"""GPUs as CUDA counts them (job/gpus.py), and what `run` and `bench allreduce` refuse because of them: one line,
exit 2, before any rank starts. The driver is faked by a fake NVML (this machine has none); CUDA_VISIBLE_DEVICES
is set per test."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from torus_train.cli import cli, main
from torus_train.job import gpus
from torus_train.job.launchers.local import MAX_LOCAL_RANKS

UUIDS = ["GPU-3f2a0000-aaaa", "GPU-77b10000-bbbb"]
"""A driver's two GPUs as NVML names them."""


@pytest.mark.parametrize(
    "value, driver, count, why",
    [
        ("0", 2, 1, ""),
        ("1,0", 2, 2, ""),
        (" 0 , 1 ", 2, 2, ""),  # spaces around entries are ignored
        ("0,0", 2, 0, "names 0 twice, and CUDA then shows no GPU"),
        ("0,1,0", 2, 0, "names 0 twice"),
        ("abc", 2, 0, "stops at 'abc'"),
        ("0,abc,1", 2, 1, "stops at 'abc'"),
        ("0,-1,1", 2, 1, "stops at '-1'"),
        ("1gpu2,0x", 4, 2, ""),  # strtoul: the number an entry starts with
        ("0-3", 4, 1, ""),  # no ranges: "0-3" reads as 0
        ("0,5", 2, 1, "names GPU 5, and the driver lists 2 (0-1)"),
        ("5", 2, 0, "names GPU 5"),
        ("GPU-3f2a,GPU-77b1", UUIDS, 2, ""),  # UUIDs, abbreviated ones included, matched against the driver's
        ("GPU-3f2a,GPU-3f2a", UUIDS, 0, "names GPU-3f2a twice"),
        ("GPU-3f2a,GPU-3f", UUIDS, 0, "names GPU-3f2a0000-aaaa twice"),  # two prefixes of one GPU, as torch
        ("GPU-3f2a,1", UUIDS, 1, "stops at '1'"),
        ("GPU-3f2a,GPU-c,GPU-77b1", UUIDS, 1, "stops at GPU-c, which no GPU here has"),
        ("GPU-,GPU-77b1", UUIDS, 0, "stops at GPU-, which 2 GPUs here match"),  # ambiguous, as torch
        ("GPU-a,GPU-b,GPU-c", 2, 3, ""),  # the UUIDs not asked (a count only): counted as named
        ("MIG-a,MIG-b,MIG-c", UUIDS[:1], 3, ""),  # MIG instances: up to 7 on one GPU, counted as named
        ("", 2, 0, "hides every GPU"),
        ("-1", 2, 0, "hides every GPU"),
        ("0,1", None, 0, "no NVIDIA driver here"),  # no driver: CUDA shows nothing, whatever the variable says
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, driver, count, why):
    got = gpus.gpu_count({"CUDA_VISIBLE_DEVICES": value}, driver)
    assert got.count == count and why in got.why and bool(got.why) == bool(why), got
    if isinstance(driver, list) and not value.startswith(("GPU-", "MIG-")):
        assert gpus.gpu_count({"CUDA_VISIBLE_DEVICES": value}, len(driver)) == got  # indices need the count only


def test_without_the_variable_every_driver_gpu_counts():
    assert gpus.gpu_count({}, 8) == gpus.GpuCount(8) and gpus.gpu_count({}, None).count == 0


class FakeNvml:
    """NVML's calls that job/gpus.py makes, over ``uuids`` (None: the library does not load, as without a driver)."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuids: list[str] | None):
        self.uuids, self.started = uuids, 0

    def nvmlInit(self) -> None:
        if self.uuids is None:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.started += 1

    def nvmlShutdown(self) -> None:
        self.started -= 1

    def nvmlDeviceGetCount(self) -> int:
        assert self.started and self.uuids is not None
        return len(self.uuids)

    def nvmlSystemGetDriverVersion(self) -> str:
        assert self.started
        return "580.95.05"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        assert self.uuids is not None
        return self.uuids[handle]


def test_the_driver_is_asked_through_nvml_and_left_shut(monkeypatch):
    nvml = FakeNvml(["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2"])
    monkeypatch.setattr(gpus, "nvml", lambda: nvml)
    assert gpus.driver_gpus() == 3 and gpus.driver_uuids() == nvml.uuids and nvml.started == 0
    assert gpus.driver_version() == "580.95.05" and nvml.started == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-cccc")
    assert gpus.local_gpus() == gpus.GpuCount(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-dddd")
    assert gpus.local_gpus() == gpus.GpuCount(
        1, "CUDA_VISIBLE_DEVICES=GPU-bbbb,GPU-dddd stops at GPU-dddd, which no GPU here has"
    )
    monkeypatch.setattr(gpus, "nvml", lambda: FakeNvml(None))
    assert gpus.driver_gpus() is None and gpus.driver_uuids() is None and gpus.driver_version() is None
    assert gpus.local_gpus() == gpus.GpuCount(0, gpus.NO_DRIVER)


@pytest.fixture
def driver(monkeypatch):
    """fake_driver(n): a fake NVML that lists n GPUs (none is real); no CUDA_VISIBLE_DEVICES."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def fake_driver(n: int) -> None:
        monkeypatch.setattr(gpus, "nvml", lambda: FakeNvml([f"GPU-{i:04d}" for i in range(n)]))
        assert gpus.driver_gpus() == n

    return fake_driver


@pytest.fixture
def no_rank_starts(monkeypatch):
    """Any rank start fails the test: `run`'s legs and `bench allreduce`'s spawn."""
    from torus_train.commands import bench
    from torus_train.ranks import orchestrate

    def started(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(orchestrate, "run_legs", started)
    monkeypatch.setattr(bench, "_spawn_local", started)


def refused(capsys, *argv: str) -> str:
    """The one line `torus-train ARGV` exits 2 with."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in out.err, out.err
    assert lines[0].startswith("torus-train: error: ")
    return lines[0]


RUN = ["run", "--data", "synthetic", "--steps", "1"]


@pytest.mark.parametrize(
    "visible, reason",
    [
        ("0,0", "CUDA_VISIBLE_DEVICES=0,0 names 0 twice, and CUDA then shows no GPU"),
        ("0,1,0", "CUDA_VISIBLE_DEVICES=0,1,0 names 0 twice, and CUDA then shows no GPU"),
        ("abc", "CUDA_VISIBLE_DEVICES=abc stops at 'abc'"),
    ],
)
def test_nccl_on_gpus_cuda_does_not_show_is_refused(
    visible, reason, driver, no_rank_starts, capsys, monkeypatch, tmp_path
):
    driver(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    line = refused(capsys, *RUN, "--backend", "nccl", "--gpus", "2", "--out", str(tmp_path / "run"))
    assert line == (
        f"torus-train: error: comm.backend = nccl needs one GPU per rank and CUDA shows none here ({reason}); "
        "pass --backend gloo for CPU ranks"
    )
    assert not (tmp_path / "run").exists()


def test_an_index_past_the_drivers_gpus_leaves_fewer_gpus_than_ranks(
    driver, no_rank_starts, capsys, monkeypatch, tmp_path
):
    driver(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,5")
    line = refused(capsys, *RUN, "--backend", "nccl", "--gpus", "2", "--out", str(tmp_path / "run"))
    assert line.startswith(
        "torus-train: error: CUDA shows 1 GPU(s) here (CUDA_VISIBLE_DEVICES=0,5 names GPU 5, and the driver lists 2 "
        "(0-1)): 2 ranks do not fit on this machine (1 GPU(s), one rank each)"
    )
    assert not (tmp_path / "run").exists()


def test_nccl_without_a_driver_is_refused_by_run_and_bench(no_rank_starts, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(gpus, "nvml", lambda: FakeNvml(None))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # entries, but nothing behind them
    line = refused(capsys, *RUN, "--backend", "nccl", "--gpus", "2", "--out", str(tmp_path / "run"))
    assert "comm.backend = nccl needs one GPU per rank and CUDA shows none here (no NVIDIA driver here: " in line
    line = refused(capsys, "bench", "allreduce", "--backend", "nccl")
    assert line == (
        "torus-train: error: --backend nccl needs CUDA GPUs; CUDA shows none here (no NVIDIA driver here: NVML "
        "(libnvidia-ml.so.1, installed with the driver) does not start) (use gloo or mpi)"
    )
    assert not (tmp_path / "run").exists()


def test_more_local_ranks_than_the_cap_are_refused_by_run_and_bench(driver, no_rank_starts, capsys, tmp_path):
    """One cap for both commands: the default job on a machine whose driver lists 1,025 GPUs, and bench's
    rank per GPU there."""
    driver(MAX_LOCAL_RANKS + 1)
    line = refused(capsys, "run", "--data", "synthetic", "--out", str(tmp_path / "run"))
    assert line.startswith(f"torus-train: error: {MAX_LOCAL_RANKS + 1} ranks: at most {MAX_LOCAL_RANKS} start on one")
    line = refused(capsys, "bench", "allreduce")
    assert line == (
        f"torus-train: error: {MAX_LOCAL_RANKS + 1} local ranks: at most {MAX_LOCAL_RANKS} are spawned here; start "
        "more with mpirun or srun"
    )
    line = refused(capsys, "bench", "allreduce", "--nprocs", str(MAX_LOCAL_RANKS + 1))
    assert f"at most {MAX_LOCAL_RANKS}" in line
    assert not (tmp_path / "run").exists()


def test_the_gpu_decoder_on_cpu_ranks_is_refused_before_launch(no_rank_starts, capsys, monkeypatch, tmp_path):
    """Issue 38's item 4: data.decoder = gpu where the ranks run on the CPU (no GPU here, or gloo asked)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from datahelp import make_index_set

    monkeypatch.setattr(gpus, "local_gpu_count", lambda environ=None: 0)
    data = make_index_set(tmp_path / "d", n_train=6, n_val=3, size=24)
    base = ["run", "--data", str(data), "--set", "data.decoder=gpu", "--out", str(tmp_path / "run")]
    line = refused(capsys, *base)
    assert line == (
        "torus-train: error: data.decoder = gpu needs ranks on CUDA GPUs, and these ranks run on the CPU (CUDA "
        "shows no GPU here); use data.decoder = auto or cpu"
    )
    monkeypatch.setattr(gpus, "local_gpu_count", lambda environ=None: 4)
    assert "(comm.backend = gloo)" in refused(capsys, *base, "--backend", "gloo")
    assert not (tmp_path / "run").exists()
    # synthetic data is not decoded: nothing to obey or refuse
    r = CliRunner().invoke(cli, [*RUN, "--backend", "gloo", "--set", "data.decoder=gpu", "--dry-run"])
    assert r.exit_code == 0 and "cannot start here" not in r.output, r.output


def test_a_python_without_the_nvml_binding_runs_and_counts_no_gpu_saying_why():
    """pynvml is imported where the driver is asked: with the module absent (sys.modules['pynvml'] = None, as
    `import pynvml` then raises ImportError) the CLI still imports and answers, and the count is a machine's
    without a driver, its why naming the missing binding."""
    code = (
        "import sys\nsys.modules['pynvml'] = None\n"
        "import torus_train.cli\nfrom torus_train.job import gpus\n"
        "got = gpus.local_gpus({})\nprint(got.count)\nprint(got.why)\n"
        "print(gpus.driver_gpus(), gpus.driver_uuids(), gpus.driver_version())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    count, why, driver = r.stdout.splitlines()
    assert (count, why, driver) == ("0", gpus.NO_NVML, "None None None")
    assert "nvidia-ml-py" in gpus.NO_NVML
