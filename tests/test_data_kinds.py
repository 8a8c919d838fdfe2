"""Every kind of file a real data set holds and PIL reads trains: a folder of one file of each kind
(data/samples.py) passes `data check` and `data check --decode`, packs, loads on every loader from the folder
and from its packed set with no file skipped, and trains to the end; truly corrupt files are counted by kind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from clihelp import assert_one_line_error, invoke
from datahelp import make_index_set

from torus_train.data import make_loader
from torus_train.data.base import CorruptLog
from torus_train.data.index import DataError
from torus_train.data.samples import cpu_only_samples, samples
from torus_train.job.sources import DECODERS, Decoder

sys.path.insert(0, str(Path(__file__).parent / "dist"))
from runhelp import run_cli

ALL = {**samples(), **cpu_only_samples()}
CLASSES = ("a", "b")
ON_DEVICE = "test-kinds-on-device"
LOADERS = ["dali", "torchvision", "torchvision-device"]


def kinds_folder(root: Path) -> Path:
    """train/ and val/, each class holding one file of every kind (a PNG named .JPEG keeps its name)."""
    for split in ("train", "val"):
        for c in CLASSES:
            (root / split / c).mkdir(parents=True)
            for kind, s in ALL.items():
                (root / split / c / f"{kind}{s.suffix}").write_bytes(s.data)
    return root


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    root = kinds_folder(tmp_path_factory.mktemp("kinds") / "d")
    packed = root.parent / "packed"
    code, _, err = invoke("data", "pack", "--data", str(root), "--out", str(packed), "--shard-mb", "0.01")
    assert code == 0, err
    return {"folder": root, "packed": packed}


@pytest.fixture(scope="module", autouse=True)
def device_decoder_anywhere():
    """The GPU decoder's code path (workers read, the rank decodes) placed on the CPU."""
    DECODERS.add(ON_DEVICE, Decoder(ON_DEVICE, "the GPU decoder's path on any device", lambda device: "gpu"))
    yield
    DECODERS.remove(ON_DEVICE)


def load_all(kind: str, root: Path, split: str) -> tuple[int, CorruptLog, object]:
    """(real samples delivered in one epoch, the CorruptLog, the loader) under the default on_corrupt (fail)."""
    args = dict(rank=0, world_size=1, batch_size=4, image_size=24, num_classes=None, seed=0, channels_last=False)
    args.update(device="cpu", num_threads=1, verify=False, corrupt=CorruptLog())
    if kind == "torchvision-device":
        kind, args["decoder"] = "torchvision", ON_DEVICE
    ld = make_loader(kind, root, split, **args)
    n = 0
    try:
        for x, y in ld:
            assert torch.isfinite(x).all() and x.shape[1:] == (3, 24, 24)
            n += int((y >= 0).sum()) if split == "val" else x.shape[0]
    finally:
        ld.close()
    return n, args["corrupt"], ld


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("where", ["folder", "packed"])
def test_check_passes_every_kind(kinds, where, decode):
    args = ["data", "check", "--data", str(kinds[where]), "--workers", "2"] + (["--decode"] if decode else [])
    code, out, err = invoke(*args)
    assert code == 0, err
    files = 2 * len(CLASSES) * len(ALL)
    assert f"summary: every one of {files:,} files trains" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["folder", "packed"])
@pytest.mark.parametrize("kind", LOADERS)
def test_every_kind_loads_with_none_skipped(kinds, kind, where):
    """Validation visits each file once: every one is delivered, none replaced; training pads to whole batches."""
    per_split = len(CLASSES) * len(ALL)
    n, log, _ = load_all(kind, kinds[where], "val")
    assert n == per_split and log.samples == 0 and not log.files
    n, log, ld = load_all(kind, kinds[where], "train")
    assert n == len(ld) * 4 >= per_split and log.samples == 0 and not log.files


def test_dali_takes_what_its_decoder_reads_and_the_cpu_decodes_the_rest(kinds):
    """The reader thread hands DALI the file as read when its format is one DALI decodes, else PIL's pixels as
    an uncompressed BMP (the TIFFs, the GIF named .JPEG): the same pixels PIL reads."""
    import io

    import numpy as np
    from PIL import Image

    from torus_train.data.base import LoaderConfig
    from torus_train.data.checks import sniff
    from torus_train.data.dali import DALI_FORMATS, Feed
    from torus_train.data.index import ensure_index, load_index

    root = kinds["folder"]
    split = load_index(ensure_index(root), root).split("val")
    feed = Feed(split, LoaderConfig("val", 0, 1, 4, 24, 0, False, 1), CorruptLog())
    on_cpu = set()
    for i, name in enumerate(split.files):
        data, _ = feed.sample(i)
        kind = Path(name).stem
        if sniff(ALL[kind].data) in DALI_FORMATS:
            assert data.tobytes() == ALL[kind].data, kind
            continue
        on_cpu.add(kind)
        assert sniff(data) == "bmp", kind
        pixels = np.asarray(Image.open(io.BytesIO(data.tobytes())))
        assert (pixels == np.asarray(Image.open(io.BytesIO(ALL[kind].data)).convert("RGB"))).all(), kind
    assert on_cpu == {"tiff", "tiff_bilevel", "gif_named_jpeg"}


def test_a_format_dali_refuses_at_run_time_is_decoded_on_the_cpu(kinds, monkeypatch):
    """A file the sniffing hands to DALI but its decoder refuses (here: GIF and TIFF declared DALI's) stops the
    pipeline once; PIL reads every sample in flight, so the refused ones go the CPU route and the step is
    redone: every sample delivered, none skipped, under on_corrupt = fail."""
    import torus_train.data.dali as dali

    monkeypatch.setattr(dali, "DALI_FORMATS", frozenset({"jpeg", "png", "bmp", "webp", "gif", "tiff"}))
    n, log, ld = load_all("dali", kinds["folder"], "val")
    assert n == len(CLASSES) * len(ALL) and log.samples == 0
    refused = {Path(ld.split.files[i]).stem for i in ld._feed.on_cpu}
    assert refused == set(cpu_only_samples()), refused


RUN = ["--launcher", "local", "--gpus", "1", "--grid", "1x1", "--model", "resnet18_w32", "--image-size", "24",
       "--set", "model.num_classes=2", "--set", "eval.every_epochs=1", "--set", "schedule.epochs=1",
       "--set", "schedule.stages=[{until_epoch=1,global_batch=8}]", "--set", "checkpoint.every_epochs=0",
       "--set", "data.num_threads=1"]  # fmt: skip


@pytest.mark.timeout(200)
@pytest.mark.parametrize("where", ["folder", "packed"])
@pytest.mark.parametrize("loader", ["dali", "torchvision"])
def test_every_kind_trains_to_the_end(kinds, loader, where, tmp_path):
    """A one-rank run over the folder of every kind (and its packed set), the default data.on_corrupt (fail):
    every step taken, validation over every file, nothing skipped."""
    out = tmp_path / "run"
    r = run_cli(*RUN, "--data", str(kinds[where]), "--out", str(out), "--set", f"data.loader={loader}", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    per_split = len(CLASSES) * len(ALL)
    assert s["steps"] == -(-per_split // 8) and s["images"] == s["steps"] * 8
    assert s["corrupt_skipped"] == {"policy": "fail", "files": 0, "reads": 0}
    assert f"({per_split} images)" in r.stdout  # the evaluation read every validation file


def test_check_counts_truly_corrupt_files_by_kind(tmp_path):
    root = kinds_folder(tmp_path / "d")
    jpeg = samples()["baseline"].data
    bad = root / "train" / "a"
    (bad / "cut1.JPEG").write_bytes(jpeg[:-10])
    (bad / "cut2.JPEG").write_bytes(jpeg[: len(jpeg) // 2])
    (bad / "cut.png").write_bytes(samples()["png_rgba"].data[:60])
    (bad / "empty.JPEG").write_bytes(b"")
    (root / "val" / "b" / "page.JPEG").write_bytes(b"<html><body>404 Not Found</body></html>")
    code, out, err = invoke("data", "check", "--data", str(root), "--workers", "2")
    files = 2 * len(CLASSES) * len(ALL) + 5
    verdict = f"5 of {files} files will not train (truncated 3, empty 1, not an image 1)"
    assert code == 2 and f"summary: {verdict}" in out
    assert err.splitlines()[-1].startswith(f"torus-train: error: {verdict}; fix or remove them")
    lines = out.splitlines()
    at = {ln.split("  ")[1]: k for k, ln in enumerate(lines) if ln.startswith("  ") and not ln.startswith("      ")}
    named = {
        kind: [ln.strip().split(": ")[0] for ln in lines[k + 1 :] if ln.startswith("      ")] for kind, k in at.items()
    }
    assert named["truncated"][:3] == [str(bad / n) for n in ("cut.png", "cut1.JPEG", "cut2.JPEG")]
    assert named["empty"][0] == str(bad / "empty.JPEG")
    assert named["not an image"][0] == str(root / "val" / "b" / "page.JPEG")
    code, out, _ = invoke("data", "check", "--data", str(root), "--decode", "--workers", "1")
    assert code == 2 and f"summary: {verdict}; decoded whole by PIL" in out


def test_check_refuses_a_worker_count_out_of_range(tmp_path):
    for n in ("0", "1025"):
        code, out, err = invoke("data", "check", "--data", str(tmp_path), "--workers", n)
        assert_one_line_error(code, err, f"--workers: {n} must be between 1 and 1,024")
        assert out == ""


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_broken_file_on_dali_s_cpu_route_is_corrupt(tmp_path, policy):
    """A GIF cut short passes the cheap check (GIF has none) and takes DALI's CPU route, where PIL fails on it:
    the default policy names it, skip replaces it by the next readable file."""
    root = make_index_set(tmp_path / "d", n_train=12, n_val=6)
    victim = sorted((root / "train" / "c1").iterdir())[0]
    victim.write_bytes(cpu_only_samples()["gif_named_jpeg"].data[:200])
    args = dict(rank=0, world_size=1, batch_size=4, image_size=24, num_classes=None, seed=0, channels_last=False)
    log = CorruptLog()
    ld = make_loader(
        "dali", root, "train", device="cpu", num_threads=1, verify=False, on_corrupt=policy, corrupt=log, **args
    )
    try:
        if policy == "fail":
            with pytest.raises(DataError, match=f"^{victim}: does not decode"):
                for _ in ld:
                    pass
        else:
            assert [x.shape[0] for x, _ in ld] == [4] * 3 and list(log.files) == [str(victim)]
    finally:
        ld.close()
