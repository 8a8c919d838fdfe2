"""A full output file system (a tmpfs of the test's own, filled to the last byte): the rank's line and its
.failed marker survive it, torch's error file cannot replace the failure, and the kind says "no space" (never
restarted). Real files on a real full file system; the whole job is in tests/dist/test_full_disk_run.py."""

from __future__ import annotations

import errno
import json
import os

import pytest
from fulldisk import fill, small_fs

from torus_train.errors import RunFailed
from torus_train.ranks.diagnosis import failed_path, failure_kind, failure_message, out_of_space, reserve_path
from torus_train.ranks.worker import classify, errors_after_the_line, report_failure, reserve_marker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def full_out(tmp_path):
    with small_fs(tmp_path / "fs", "1m") as fs:
        out = fs / "O"
        (out / "logs").mkdir(parents=True)
        reserve_marker(out, 0)  # as every rank does when it starts
        yield out


def test_the_line_and_the_marker_survive_a_full_disk(full_out):
    out = full_out
    fill(out / "filler")
    with pytest.raises(OSError) as e:
        (out / "logs" / "probe").write_text("x")
    assert e.value.errno == errno.ENOSPC
    said = "checkpoint folder /x: no space left; the previous checkpoint at step 8 is kept"
    read, write = os.pipe()  # the launcher's stderr (mpirun and srun pass it on)
    report_failure(out, 0, 1, "no space", said, write)
    os.close(write)
    assert os.read(read, 4096).decode() == f"torus-train: rank 0 failed: {said}\n"
    assert json.loads(failed_path(out, 0).read_text())["kind"] == "no space"
    assert (failure_kind(out, 0), failure_message(out, 0)) == ("no space", said)
    assert out_of_space(out, 4) == (0, said) and not reserve_path(out, 0).exists()


def test_without_its_room_a_marker_is_whole_or_absent_never_empty(full_out):
    out = full_out
    reserve_path(out, 1).unlink(missing_ok=True)
    fill(out / "filler")
    report_failure(out, 1, 1, "no space", "x", 2)
    assert not failed_path(out, 1).exists() and os.listdir(out / "logs") == ["rank00000.failed.room"]


def test_torchs_error_file_on_a_full_disk_does_not_replace_the_failure(full_out, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import record

    out = full_out
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(out / "logs" / "rank00000.error.json"))
    fill(out / "filler")

    def fails():
        raise RunFailed("checkpoint folder O/checkpoints: no space left; the previous checkpoint at step 8 is kept")

    errors = errors_after_the_line()
    with pytest.raises(RunFailed) as e:  # torch's own handler raised OSError [Errno 28] here instead
        record(fails, error_handler=errors)()
    assert classify(e.value, out) == (1, "no space", str(e.value))
    errors.write()
    assert not (out / "logs" / "rank00000.error.json").exists()


def test_an_enospc_anywhere_in_the_chain_names_the_output_folder(tmp_path):
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("tensorboard writer failed") from inner
    except RuntimeError as e:
        code, kind, line = classify(e, tmp_path)
    assert (code, kind) == (1, "no space") and line == f"{tmp_path}: no space left on its file system"
    assert classify(OSError(errno.EACCES, "Permission denied"), tmp_path)[1] == "crash"
