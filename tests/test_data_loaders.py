"""DALI and torchvision loaders on real JPEG files: same shard order, shapes, padding, errors, and how close
DALI's validation output is to torchvision's validation transform. "torchvision-device" is the torchvision
loader with its GPU decoder's code path (workers read, the rank decodes a batch at once and augments it) run on
the CPU: a test-only data.decoder entry places it on any device."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from datahelp import decode_indices, make_index_set, wreck_jpeg

from torus_train.data import make_loader
from torus_train.data.checks import DataError, scan
from torus_train.data.demo import generate
from torus_train.data.sharding import shard
from torus_train.errors import UserError
from torus_train.job.sources import DECODERS, Decoder

KINDS = ["dali", "torchvision", "torchvision-device"]
ON_DEVICE = "test-on-device"


@pytest.fixture(scope="module", autouse=True)
def device_decoder_anywhere():
    """A data.decoder entry that runs the GPU decoder's path on the rank's device, whatever it is (CPU here)."""
    DECODERS.add(ON_DEVICE, Decoder(ON_DEVICE, "the GPU decoder's path on any device", lambda device: "gpu"))
    yield
    DECODERS.remove(ON_DEVICE)


OPEN: list = []


@pytest.fixture(autouse=True)
def close_loaders():
    """Every loader a test made is closed after it: one left to the garbage collector costs 5 s (the
    DataLoader's status-check interval while its persistent workers stop)."""
    yield
    while OPEN:
        OPEN.pop().close()


def loader(kind, root, split, **kw):
    args = dict(
        rank=0,
        world_size=1,
        batch_size=8,
        image_size=24,
        num_classes=None,
        seed=0,
        channels_last=False,
        device="cpu",
        num_threads=1,
    )
    if kind == "torchvision-device":
        kind, args["decoder"] = "torchvision", ON_DEVICE
    args.update(kw)
    OPEN.append(make_loader(kind, root, split, **args))
    return OPEN[-1]


@pytest.fixture(scope="module")
def index_set(tmp_path_factory):
    return make_index_set(tmp_path_factory.mktemp("idx"), n_train=90, n_val=30)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("split", ["train", "val"])
def test_reads_its_shard_in_order(kind, split, index_set):
    """Rank 2 of 4 reads exactly checks.shard's indices, in that order, with their labels."""
    ld = loader(kind, index_set, split, rank=2, world_size=4, batch_size=4)
    ld.set_epoch(1)
    sh = shard(ld.num_samples, 2, 4, 4, epoch=1, seed=0, shuffle=split == "train")
    got, labels = [], []
    for x, y in ld:
        assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
        got += decode_indices(x)
        labels += y.tolist()
    assert len(got) == len(ld) * 4 == len(sh.indices)
    assert got == list(sh.indices)
    split_files = scan(index_set, split)
    want = [split_files.labels[i] for i in sh.indices]
    if split == "val" and sh.pad:
        want[-sh.pad :] = [-1] * sh.pad
    assert labels == want
    ld.close()


@pytest.mark.parametrize("kind", KINDS)
def test_channels_last_and_val_padding_labels(kind, index_set):
    ld = loader(kind, index_set, "val", rank=3, world_size=4, batch_size=4, channels_last=True)
    # 30 val images, 4 ranks x 4 -> 32 slots; rank 3 holds the 2 padded ones
    assert ld.pad == 2 and len(ld) == 2
    ys = []
    for x, y in ld:
        assert x.is_contiguous(memory_format=torch.channels_last)
        ys += y.tolist()
    assert ys.count(-1) == 2 and ys[-2:] == [-1, -1]


@pytest.fixture(scope="module")
def demo_small(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    generate(root, seed=1, train_per_class=6, val_per_class=4, workers=1)
    return root


def test_dali_val_matches_torchvision_val(demo_small):
    """Same files, same order: mean absolute difference of the normalised tensors stays small."""
    a = loader("dali", demo_small, "val", batch_size=20, image_size=32)  # 64 px files: resize 36, crop 32
    b = loader("torchvision", demo_small, "val", batch_size=20, image_size=32)
    diffs = []
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(ya, yb)
        diffs.append((xa - xb).abs().mean().item())
    mad = float(np.mean(diffs))
    print(f"DALI vs torchvision validation transform: mean |diff| = {mad:.4f} (normalised units)")
    assert mad < 0.01  # measured 0.0025 (about 0.14 of a 0..255 level): resampling kernels differ


@pytest.mark.parametrize("kind", KINDS)
def test_train_augments_and_reshuffles(kind, demo_small):
    ld = loader(kind, demo_small, "train", batch_size=20, image_size=32)
    ld.set_epoch(0)
    x0, y0 = next(iter(ld))
    ld.set_epoch(1)
    x1, y1 = next(iter(ld))
    assert not torch.equal(y0, y1) or not torch.equal(x0, x1)
    assert abs(x0.mean().item()) < 1.5 and 0.3 < x0.std().item() < 2.0


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_jpeg_inside_names_the_file(kind, tmp_path):
    root = make_index_set(tmp_path / "d", n_train=12, n_val=6)
    victim = sorted((root / "train" / "c1").iterdir())[0]
    wreck_jpeg(victim)  # the content check passes; only a decoder finds it
    ld = loader(kind, root, "train", batch_size=4)
    with pytest.raises(DataError) as e:
        for _ in ld:
            pass
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{victim}: ")


def test_class_count_mismatch_and_bad_args(index_set):
    with pytest.raises(DataError, match="3 class folders, but the model has 1000 classes"):
        loader("torchvision", index_set, "train", num_classes=1000)
    with pytest.raises(UserError, match=re.escape("data.loader: 'pil'")):
        loader("pil", index_set, "train")
    with pytest.raises(UserError, match="a data folder is needed"):
        loader("dali", None, "train")


def test_synthetic():
    ld = make_loader(
        "synthetic",
        None,
        "train",
        rank=1,
        world_size=4,
        batch_size=8,
        image_size=16,
        num_classes=10,
        seed=0,
        channels_last=True,
        device="cpu",
        synthetic_samples=100,
    )
    batches = list(ld)
    assert len(batches) == len(ld) == 4  # ceil(100 / 32)
    x, y = batches[0]
    assert x.shape == (8, 3, 16, 16) and x.is_contiguous(memory_format=torch.channels_last)
    assert y.max() < 10


def test_auto_says_once(index_set, capsys):
    import torus_train.data as data

    data._said_auto = False
    a = loader("auto", index_set, "train")
    b = loader("auto", index_set, "train")
    err = capsys.readouterr().err
    assert err.count("input pipeline:") == 1 and a.kind == b.kind == "dali"


def read_epoch(ld, epoch, limit=None):
    ld.set_epoch(epoch)
    got = []
    for step, (x, _) in enumerate(ld):
        got += decode_indices(x)
        if limit is not None and step + 1 == limit:
            break
    return got


def test_dali_pipeline_is_built_once_across_epochs_and_rebuilt_after_an_early_stop(index_set):
    ld = loader("dali", index_set, "train", rank=1, world_size=4, batch_size=4)
    expect = [shard(90, 1, 4, 4, epoch=e, seed=0).indices.tolist() for e in (0, 1)]
    assert read_epoch(ld, 0) == expect[0]
    pipe = ld._pipe
    assert read_epoch(ld, 1) == expect[1] and ld._pipe is pipe  # the next epoch came from the same pipeline
    assert read_epoch(ld, 1, limit=2) == expect[1][:8]  # a pass that stops early (resume, steps)...
    assert read_epoch(ld, 1) == expect[1] and ld._pipe is not pipe  # ...makes the next pass start afresh


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_gone_since_indexing_is_named(kind, tmp_path):
    root = make_index_set(tmp_path / "d", n_train=12, n_val=6)
    ld = loader(kind, root, "train", batch_size=4, verify=False)
    victim = ld.split.files[int(ld.shard.indices[5])]
    import os

    os.unlink(victim)
    with pytest.raises(DataError, match=victim.split("/")[-1]):
        for _ in ld:
            pass


@pytest.mark.parametrize("kind", [*KINDS, "synthetic"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_images_equal_the_float32_ones_rounded(kind, dtype, index_set):
    """A GPU model computing in fp16/bf16 gets its images in that dtype from the loader (DALI emits float16
    and casts bf16 on the device); the values are the float32 ones rounded once, and channels_last holds."""
    root = None if kind == "synthetic" else index_set
    full = loader(kind, root, "val", channels_last=True, num_classes=3)
    half = loader(kind, root, "val", channels_last=True, num_classes=3, dtype=dtype)
    n = 0
    try:
        for (xf, yf), (xh, yh) in zip(full, half, strict=True):
            assert xh.dtype == getattr(torch, dtype) and xh.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(yf, yh)
            # rounding of values below 8 in magnitude: half an ulp at 4..8 is 2**-9 (fp16) and 2**-6 (bf16)
            tol = 2.0**-9 if dtype == "float16" else 2.0**-6
            assert (xh.float() - xf).abs().max().item() <= tol
            n += 1
    finally:
        # DALI's threads must be gone before the next test forks DataLoader workers: a fork beside running
        # threads can leave a worker stuck on a lock one of them held
        full.close(), half.close()
    assert n > 0


def test_unknown_image_dtype_is_refused(index_set):
    with pytest.raises(UserError, match="dtype"):
        loader("dali", index_set, "val", dtype="int8")


def encoded_files(root, split, n):
    files = sorted(p for p in (root / split).rglob("*") if p.is_file())[:n]
    return files, [torch.from_numpy(np.fromfile(f, dtype=np.uint8)) for f in files]


def test_batch_decode_and_augment_on_the_cpu(demo_small):
    """The GPU decoder's functions with device="cpu": one batched decode, then per-image crop boxes resized to
    the fixed size, flipped and normalised; the same generator seed gives the same batch, another seed
    another; validation's output is torchvision's CPU transform up to the resampling kernels."""
    from PIL import Image

    from torus_train.data.base import MEAN, STD
    from torus_train.data.batch_decode import augment, decode_batch
    from torus_train.data.torchvision_loader import transform

    files, encoded = encoded_files(demo_small, "val", 12)
    images, failed = decode_batch(encoded, torch.device("cpu"))
    assert failed == {} and len(images) == 12
    assert all(im.dtype == torch.uint8 and im.shape[0] == 3 and im.device.type == "cpu" for im in images)

    def train(seed, **kw):
        return augment(images, "train", 32, torch.Generator().manual_seed(seed), **kw)

    x = train(0)
    assert x.shape == (12, 3, 32, 32) and x.dtype == torch.float32
    low = min((0 - m) / s for m, s in zip(MEAN, STD, strict=True))
    high = max((1 - m) / s for m, s in zip(MEAN, STD, strict=True))
    assert low - 1e-5 <= x.min().item() and x.max().item() <= high + 1e-5
    assert torch.equal(x, train(0)) and not torch.equal(x, train(1))
    half = train(0, dtype=torch.float16, channels_last=True)
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=torch.channels_last)
    assert (half.float() - x).abs().max().item() <= 2.0**-9
    val = augment(images, "val", 32, torch.Generator())
    want = torch.stack([transform("val", 32)(Image.open(f).convert("RGB")) for f in files])
    assert val.shape == want.shape and (val - want).abs().mean().item() < 0.05


def test_a_file_that_reads_but_does_not_decode_is_replaced_on_the_device_path(tmp_path):
    """on_corrupt = skip with the decode in the rank: the batch keeps its size, the bad file is named once in
    the CorruptLog with its replacement (the next readable file)."""
    root = make_index_set(tmp_path / "d", n_train=12, n_val=6)
    victim = sorted((root / "train" / "c1").iterdir())[0]
    wreck_jpeg(victim)  # the workers' content check passes, the decoder fails
    ld = loader("torchvision-device", root, "train", batch_size=4, on_corrupt="skip")
    steps = [x.shape[0] for x, _ in ld]
    assert steps == [4] * len(ld) and list(ld.corrupt.files) == [str(victim)]
    ld.close()


def test_the_decoder_entry_places_it_by_device(index_set):
    """data.decoder: auto follows the device, gpu on a CPU rank is one line naming the field."""
    assert DECODERS.get("auto").place("cuda") == "gpu" and DECODERS.get("auto").place("cpu") == "cpu"
    assert DECODERS.get("cpu").place("cuda") == "cpu" and DECODERS.get("gpu").place("cuda") == "gpu"
    with pytest.raises(UserError, match=re.escape("data.decoder = gpu needs ranks on CUDA")):
        DECODERS.get("gpu").place("cpu")
    ld = make_loader(
        "torchvision",
        index_set,
        "val",
        rank=0,
        world_size=1,
        batch_size=4,
        image_size=24,
        num_classes=None,
        seed=0,
        channels_last=False,
        device="cpu",
        num_threads=0,
    )
    assert (ld.kind, ld.decoder) == ("torchvision", "cpu")  # what summary.json's loader and decoder say


def test_device_path_stops_its_prefetch_thread_after_an_early_stop(index_set):
    """A pass that stops early (resume, --steps) leaves no decode thread behind, and the next pass reads the
    whole shard from its start."""
    import threading

    ld = loader("torchvision-device", index_set, "train", rank=1, world_size=4, batch_size=4)
    expect = shard(90, 1, 4, 4, epoch=1, seed=0).indices.tolist()
    assert read_epoch(ld, 1, limit=2) == expect[:8]
    assert read_epoch(ld, 1) == expect
    ld.close()
    assert not [t for t in threading.enumerate() if t.name == "torus-decode"]
