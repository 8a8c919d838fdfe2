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


def test_a_device_decoder_that_fails_fails_the_probe_though_the_cpu_route_would_answer(monkeypatch):
    """The loader's decode answers a device decode that raises (nvJPEG's RuntimeError) with a CPU decode of the
    same image, on the device: a probe that took that answer would pass with the device decoder broken. The
    probe decodes the device route on the device only and fails, naming the first kind it refused."""
    from torus_train.data import batch_decode
    from torus_train.data.samples import samples

    def broken(encoded, mode, device):
        raise RuntimeError("nvjpegDecodeBatched failed: NVJPEG_STATUS_EXECUTION_FAILED\ndetail")

    monkeypatch.setattr(batch_decode, "decode_jpeg", broken)
    items = list(samples().values())
    images, failed = decode_batch(probe.encoded(items), CPU)  # the loader's call: every image from the CPU route
    assert failed == {} and all(im is not None and im.device == CPU for im in images)
    v = probe.probe_device_decoder(CPU)
    assert v.ok is False
    assert v.why == (
        "baseline: not decoded (RuntimeError: nvjpegDecodeBatched failed: NVJPEG_STATUS_EXECUTION_FAILED) (jpeg batch)"
    )
    r = probe.probe_decoder_repeats(CPU)
    assert r.ok is False and r.why.startswith("baseline: not decoded (RuntimeError: nvjpegDecodeBatched")


def test_four_component_jpegs_take_the_cpu_route_before_the_batched_call(monkeypatch):
    """A CMYK JPEG (PIL's Adobe-inverted one) never reaches the device decoder, which need not follow the Adobe
    inversion PIL does (torchvision's own CUDA tests skip CMYK): it is decoded on the CPU route and moved to the
    device, so the probe's verdict does not hang on it; the device decoder gets the other JPEGs in one call."""
    from torus_train.data import batch_decode
    from torus_train.data.batch_decode import jpeg_components
    from torus_train.data.samples import jpeg_samples

    real, calls = batch_decode.decode_jpeg, []

    def seen(encoded, mode, device):
        calls.append([jpeg_components(e) for e in (encoded if isinstance(encoded, list) else [encoded])])
        return real(encoded, mode=mode, device=device)

    monkeypatch.setattr(batch_decode, "decode_jpeg", seen)
    items = list(jpeg_samples().values())
    assert [s.kind for s in items if jpeg_components(probe.encoded([s])[0]) == 4] == ["cmyk"]
    images, failed = decode_batch(probe.encoded(items), CPU, fallback=False)
    assert failed == {} and None not in images
    assert calls == [[3, 3, 1, 3, 3]]  # one batched call, the CMYK image not in it
    cmyk = next(k for k, s in enumerate(items) if s.kind == "cmyk")
    assert torch.equal(images[cmyk], probe.reference(items[cmyk]))
    v = probe.probe_device_decoder(CPU)
    assert v.ok is True and "cmyk" in v.detail["cpu_route"] and "baseline" not in v.detail["cpu_route"]
    assert set(v.detail["cpu_route"]) == {"cmyk", "png_named_jpeg", "png_rgba", "bmp", "tiff", "webp"}


def test_a_jpeg_header_is_read_for_its_components():
    from torus_train.data.batch_decode import jpeg_components, on_device

    def t(raw: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    app0 = b"\xff\xe0\x00\x04ab"  # a segment of 4 bytes (its length counts itself)
    sof = b"\xff\xc2\x00\x11\x08\x00\x10\x00\x10\x04"  # progressive frame, 16x16, 4 components
    assert jpeg_components(t(b"\xff\xd8" + app0 + b"\xff" + sof)) == 4  # a fill byte before the marker
    assert jpeg_components(t(b"\xff\xd8" + app0 + b"\xff\xda\x00\x02")) is None  # a scan before any frame
    assert jpeg_components(t(b"\xff\xd8" + sof[:6])) is None  # cut short
    assert on_device(t(b"\xff\xd8\x00\x00")) and not on_device(t(b"\x89PNG\r\n"))
