"""Forward FLOPs per image (job/models.py) against torch's own counter, the house model, and the training work
that `run --dry-run` prints (job/work.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torus_train.job.models import HOUSE_ARCHS, forward_flops
from torus_train.job.spec import load_spec
from torus_train.job.work import images_processed, work_text


@pytest.mark.parametrize("arch,size", [("resnet18", 32), ("resnet18_w32", 32), ("resnext50_32x4d", 40)])
def test_forward_flops_match_torchs_counter(arch, size):
    import torch
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    from torus_train.train.models import build_house_model

    model = (
        build_house_model(HOUSE_ARCHS[arch], 10)
        if arch in HOUSE_ARCHS
        else torchvision.models.get_model(arch, num_classes=10)
    ).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, 3, size, size))
    assert forward_flops(arch, size, 10) == counter.get_total_flops()


def test_house_model_is_resnet18_at_half_width():
    import torch
    import torchvision

    from torus_train.train.models import build_house_model

    half = build_house_model(HOUSE_ARCHS["resnet18_w32"], 10)
    full = torchvision.models.resnet18(num_classes=10)
    layers = lambda m: [type(x).__name__ for x in m.modules()][1:]  # noqa: E731  (the same layers in order)
    assert layers(half) == layers(full)
    n_half, n_full = (sum(p.numel() for p in m.parameters()) for m in (half, full))
    assert 0.24 < n_half / n_full < 0.26
    assert half(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert forward_flops("resnet18_w32", 32, 10) / forward_flops("resnet18", 32, 10) < 0.27


def test_unknown_layouts_have_no_flops_and_the_spec_takes_the_house_name():
    assert forward_flops("vit_b_16", 224, 1000) is None
    assert load_spec(None, [("model.arch", "resnet18_w32")]).model.arch == "resnet18_w32"


def test_images_processed_counts_padded_steps_of_every_stage():
    spec = load_spec(None, [("schedule.epochs", 7)])
    schedule = spec.schedule.at(2)
    # 10,000 images: 79 steps of 128, 40 of 256, 20 of 512 per epoch; stages 2, 3 and 2 epochs
    assert images_processed(schedule, 10_000) == 2 * 79 * 128 + 3 * 40 * 256 + 2 * 20 * 512
    capped = load_spec(None, [("schedule.steps", 100)]).schedule.at(2)
    assert images_processed(capped, 10_000) == 79 * 128 + 21 * 128  # epoch 0, then 21 steps of epoch 1


def test_work_text_of_the_default_job_and_of_a_folder_without_index(tmp_path):
    spec = load_spec(None, [])
    text = work_text(spec, spec.schedule.at(2))
    assert "images processed (10,000 per epoch from the demo set" in text and "19.7 MFLOP per image" in text
    folder = load_spec(None, [("data.source", str(tmp_path)), ("model.arch", "vit_b_16")])
    text = work_text(folder, folder.schedule.at(2))
    assert "no index of" in text and "not known for vit_b_16" in text
    gone = load_spec(None, [("data.source", str(tmp_path / "shards"))])  # not here: a folder or a packed set
    text = work_text(gone, gone.schedule.at(2))
    assert f"images not known ({tmp_path / 'shards'} is not on this machine)" in text and "data index" not in text


def test_models_and_work_do_not_import_torch():
    code = "import sys, torus_train.job.models, torus_train.job.work; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
