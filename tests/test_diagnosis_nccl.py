"""NCCL's own words for a failed start or collective, as torch raises them or a rank's log holds them, become
one line naming the rank (ranks/diagnosis.py, errors.COMM_FAILURES), never a traceback."""

from __future__ import annotations

import pytest

from torus_train.errors import RunFailed, comm_failure
from torus_train.ranks.diagnosis import mark_comm_failure, rank_failure

DUPLICATE = """\
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, \
invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"""
SYSTEM = """\
NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with \
NCCL_DEBUG=INFO for details), NCCL version 2.19.3
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
socketStartConnect: Connect to 10.0.0.2<51893> failed : Software caused connection abort"""
CUDA = """\
NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO \
for details), NCCL version 2.20.5
ncclUnhandledCudaError: Call to CUDA function failed.
Last error:
Cuda failure 'out of memory'"""
WATCHDOG = (
    "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600075 "
    "milliseconds before timing out."
)
OTHER = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1000, invalid argument (run with "
    "NCCL_DEBUG=WARN for details), NCCL version 2.21.5"
)


@pytest.mark.parametrize(
    "text, meaning, quoted",
    [
        (DUPLICATE, "two ranks on one GPU: NCCL runs one rank per GPU", "Duplicate GPU detected : rank 1 and rank 0"),
        (SYSTEM, "NCCL system error", "unhandled system error"),
        (CUDA, "a CUDA call inside NCCL failed", "unhandled cuda error"),
        (WATCHDOG, "an NCCL collective ran past comm.timeout_s and NCCL's watchdog aborted it", "Watchdog caught"),
        (OTHER, "an NCCL call failed", "invalid argument"),
    ],
)
def test_nccl_texts_are_recognised(text, meaning, quoted):
    said = comm_failure(text)
    assert said is not None and said.startswith(meaning) and quoted in said
    assert "\n" not in said


def test_a_bench_rank_names_itself_in_one_line_and_other_errors_keep_their_traceback():
    failed = rank_failure(RuntimeError(DUPLICATE), 1)
    assert isinstance(failed, RunFailed) and failed.exit_code == 1
    assert str(failed).startswith("rank 1 failed: two ranks on one GPU") and "\n" not in str(failed)
    assert rank_failure(ZeroDivisionError("division by zero"), 1) is None
    assert comm_failure("RuntimeError: CUDA error: out of memory") is None  # not a collective's failure


def test_a_rank_aborted_by_ncclS_watchdog_is_read_from_its_log(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank00002.log").write_text("step 3\n" + WATCHDOG + "\nFatal Python error: Aborted\n")
    said = mark_comm_failure(tmp_path, 2)
    assert said.startswith("an NCCL collective ran past comm.timeout_s") and "Rank 1" in said


def test_a_bench_rank_that_nccl_fails_prints_one_line_and_exits_1(monkeypatch):
    from clihelp import invoke

    from torus_train.bench import sweep

    def refuse(*args, **kwargs):
        raise RuntimeError(DUPLICATE)  # what torch.distributed raises (DistBackendError is a RuntimeError)

    monkeypatch.setattr(sweep, "measure", refuse)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    code, _, err = invoke("bench", "allreduce", "--backend", "nccl", "-b", "1K", "-e", "1K")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("torus-train: error: rank 1 failed: two ranks on one GPU: NCCL runs one rank per GPU")
