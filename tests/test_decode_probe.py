"""The device decoder's probe (data/decode_probe.py) and the Verdict it returns (verdict.py): the CPU branch of the
loader's own decode passes, a decoder that returns another image, raises, drops an image or does not repeat fails,
and a CUDA device this machine lacks is "cannot run here"."""

from __future__ import annotations

import json

import pytest
import torch

from torus_train.data import decode_probe as probe
from torus_train.data.batch_decode import decode_batch
from torus_train.verdict import Verdict

CPU = torch.device("cpu")


def test_verdict_to_json_round_trips():
    v = Verdict.failed("cmyk: differs", cmyk={"mean": 41.0})
    assert json.loads(json.dumps(v.to_json())) == {
        "ok": False,
        "why": "cmyk: differs",
        "detail": {"cmyk": {"mean": 41.0}},
    }
    assert Verdict.from_json(v.to_json()) == v
    assert [Verdict(x, "").word for x in (True, False, None)] == ["ok", "FAILED", "n/a"]


def test_the_loaders_decode_agrees_with_pil_on_every_kind():
    v = probe.probe_device_decoder(CPU)
    assert v.ok is True, v.why
    kinds = set(v.detail["mixed batch"])
    assert {"baseline", "progressive", "grayscale", "cmyk", "png_named_jpeg", "bmp", "tiff", "webp"} <= kinds
    assert all(d["mean"] == 0.0 for d in v.detail["mixed batch"].values())  # the same libjpeg-turbo / PIL underneath


def _altered(kind: str, change):
    """decode_batch, with the image of ``kind`` changed by ``change``."""
    from torus_train.data.samples import samples

    target = samples()[kind].data

    def decode(encoded, device):
        images, failed = decode_batch(encoded, device)
        for k, data in enumerate(encoded):
            if bytes(data.numpy()) == target:
                images[k] = change(images[k])
        return images, failed

    return decode


def test_a_decoder_that_returns_another_image_fails():
    swapped = _altered("progressive", lambda im: im.flip(0))  # BGR for RGB
    v = probe.probe_device_decoder(CPU, decode=swapped)
    assert v.ok is False and v.why.startswith("progressive: differs from PIL by")


def test_a_small_corrupted_patch_fails_though_the_mean_would_pass():
    def patch(im):
        im = im.clone()
        im[0, :2] ^= 0x40  # two rows of one channel off by 64 levels: 1.7% of the values, the mean moves ~1.1
        return im

    v = probe.probe_device_decoder(CPU, decode=_altered("baseline", patch))
    diff = v.detail["jpeg batch"]["baseline"]
    assert v.ok is False and v.why.startswith("baseline: differs")
    assert diff["mean"] < probe.MEAN_LEVELS and diff["far"] > probe.FAR_SHARE


def test_differences_within_the_tolerance_pass():
    def off_by_one(im):
        return (im.to(torch.int16) + 1).clamp(0, 255).to(torch.uint8)

    v = probe.probe_device_decoder(CPU, decode=_altered("grayscale", off_by_one))
    assert v.ok is True, v.why
    assert 0 < v.detail["jpeg batch"]["grayscale"]["mean"] <= probe.MEAN_LEVELS


def test_a_decoder_that_raises_fails_with_its_message():
    def raising(encoded, device):
        raise RuntimeError("nvjpegDecodeJpeg failed: 7\nsecond line")

    v = probe.probe_device_decoder(CPU, decode=raising)
    assert v.ok is False
    assert v.why == "the device decoder raised RuntimeError: nvjpegDecodeJpeg failed: 7 (jpeg batch)"
    assert probe.probe_decoder_repeats(CPU, decode=raising).ok is False


def test_a_decoder_that_drops_an_image_or_answers_elsewhere_fails():
    def dropping(encoded, device):
        images, failed = decode_batch(encoded, device)
        images[-1], failed[len(images) - 1] = None, "RuntimeError: unsupported"
        return images, failed

    v = probe.probe_device_decoder(CPU, decode=dropping)
    assert v.ok is False and "not decoded (RuntimeError: unsupported)" in v.why
    v = probe.probe_device_decoder(CPU, decode=lambda enc, dev: (decode_batch(enc, dev)[0][:-1], {}))
    assert v.ok is False and "returned" in v.why


def test_repeats_catch_a_decoder_whose_bits_change():
    calls = []

    def drifting(encoded, device):
        images, failed = decode_batch(encoded, device)
        calls.append(1)
        if len(calls) == 2:
            images[3] = images[3].clone()
            images[3][0, 0, 0] ^= 1
        return images, failed

    v = probe.probe_decoder_repeats(CPU, decode=drifting)
    assert v.ok is False and "differ in 1 of" in v.why
    assert probe.probe_decoder_repeats(CPU).ok is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_device_without_cuda_cannot_run_here():
    for check in (probe.probe_device_decoder, probe.probe_decoder_repeats):
        v = check(torch.device("cuda"))
        assert v.ok is None and "no CUDA device" in v.why
