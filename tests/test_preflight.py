"""The preflight (torus_train.ranks.preflight): what can be known before a rank starts is refused by `run` and by
`run --dry-run` alike, in one line (exit 2), before anything is written or trained; the dry run says what it
checked. Each case here used to pass the checks before launch and fail inside the ranks or at a later stage."""

from __future__ import annotations

import os

import pytest
from clihelp import assert_one_line_error, invoke
from datahelp import make_index_set

from torus_train.job.models import FIXED_INPUT, MIN_INPUT

STAGES = 'schedule.stages=[{until_epoch=1,global_batch=32,grid="2x1"},{until_epoch=2,global_batch=256,grid="%s"}]'
BASE = ["run", "--data", "synthetic", "--model", "resnet18", "--image-size", "32", "--epochs", "2"]


def test_a_later_stage_that_cannot_fit_is_refused_before_the_first_trains(tmp_path):
    out = tmp_path / "run"
    code, _, err = invoke(*BASE, "--out", str(out), "--set", STAGES % "16x16")
    assert_one_line_error(code, err, "grid stage 2 (epochs 1-2 on grid 16x16)")
    assert not out.exists()  # nothing prepared, no rank started


def test_a_later_stage_beyond_the_hostfiles_slots_is_refused(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    code, _, err = invoke(
        *BASE, "--out", str(tmp_path / "run"), "--launcher", "mpirun", "--hostfile", str(hosts), "--set", STAGES % "2x2"
    )
    assert_one_line_error(code, err, "grid stage 2 (epochs 1-2 on grid 2x2)")
    assert "slots" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--elastic", "--max-restarts", "1"], "--elastic needs --max-restarts 2 or more"),
        (["--elastic", "--max-restarts", "3", "--set", STAGES % "2x2"], "--elastic cannot be combined with stages"),
        (["--model", "vit_b_16"], "data.image_size: vit_b_16 takes only 224 px images, not 32"),
        (["--model", "inception_v3", "--image-size", "64"], "inception_v3 needs images of at least 75 px"),
        (
            ["--set", "model.num_classes=9223372036854775807"],
            "model.num_classes: 9223372036854775807 must be <= 1,000,000",
        ),
        (["--set", "job.seed=-1"], "job.seed: -1 must be >= 0"),
        (["--set", "schedule.steps=4294967296"], "schedule.steps: 4294967296 must be <= 2,147,483,647"),
    ],
)
@pytest.mark.parametrize("dry", [True, False])
def test_run_and_dry_run_refuse_alike(tmp_path, flags, message, dry):
    out = tmp_path / "run"
    code, _, err = invoke(*BASE, "--out", str(out), *flags, *(["--dry-run"] if dry else []))
    assert_one_line_error(code, err, message)
    assert not out.exists()


@pytest.fixture()
def data(tmp_path):
    return make_index_set(tmp_path / "d", n_train=6, n_val=3, classes=3)


def test_classes_against_the_model_and_between_splits(data, tmp_path):
    common = [
        "run",
        "--data",
        str(data),
        "--model",
        "resnet18",
        "--image-size",
        "32",
        "--dry-run",
        "--out",
        str(tmp_path / "run"),
    ]
    code, _, err = invoke(*common)  # the default spec's 10 classes
    assert_one_line_error(
        code, err, f"model.num_classes: 10 but {data}: train/ has 3 class folders; set --set model.num_classes=3"
    )
    code, out, err = invoke(*common, "--set", "model.num_classes=3")
    assert code == 0, err
    assert "# preflight passed:" in out and "data: 3 classes in train/ and val/" in out
    os.rename(data / "val" / sorted(os.listdir(data / "val"))[0], data / "val" / "zz_other")
    code, _, err = invoke(*common, "--set", "model.num_classes=3")
    assert_one_line_error(code, err, "val/ has other classes than train/ (not in train/: zz_other; missing in val/")


def test_the_dry_run_says_what_passed(tmp_path):
    code, out, err = invoke(*BASE, "--out", str(tmp_path / "run"), "--set", STAGES % "2x2", "--dry-run")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("# preflight passed:"))
    assert "epochs 0-1: grid 2x1, 2 ranks" in line and "epochs 1-2: grid 2x2, 4 ranks" in line
    assert "resnet18 takes 32 px images" in line


def _works(torch, model, size: int) -> bool:
    try:
        with torch.no_grad():
            model(torch.empty(1, 3, size, size, device="meta"))
        return True
    except Exception:
        return False


PROBES = (8, 16, 24, 32, 48, 64, 75)


@pytest.mark.parametrize("arch", sorted({*MIN_INPUT, *FIXED_INPUT}))
def test_the_input_size_table_matches_torchvision(arch):
    torch = pytest.importorskip("torch")
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.get_model(arch, weights=None, num_classes=10).eval()
    if arch in FIXED_INPUT:
        size = FIXED_INPUT[arch]
        assert _works(torch, model, size) and not _works(torch, model, size - 32)
        return
    low = MIN_INPUT[arch]
    assert _works(torch, model, low)
    assert not _works(torch, model, PROBES[PROBES.index(low) - 1])
