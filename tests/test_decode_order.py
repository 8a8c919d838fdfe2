"""The device decode's ordering (data/batch_decode.device_jpeg) and the gate that keeps the loader threads' device
work out of a CUDA graph capture (data/device_work.py), on the CPU: a recorded fake stream stands for the
prefetch stream, a fake decode for nvJPEG."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.utils.deterministic as det

from torus_train.data import batch_decode
from torus_train.data.device_work import DEVICE_WORK, DeviceWorkGate

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


class RecordedStream:
    """The prefetch stream: kernels queued on it (the previous batch's crop reading a freed block) run only when
    it is synchronised. Every call is logged."""

    def __init__(self, queued: list[str]):
        self.queued, self.log = list(queued), []

    def synchronize(self) -> None:
        self.log.append(("synchronize", list(self.queued)))
        self.queued.clear()


def recording_decode(stream: RecordedStream, images: int = 1):
    """nvJPEG's stand-in: logs what was still queued on the prefetch stream when it wrote its outputs."""

    def decode(encoded, mode, device):
        stream.log.append(("decode", list(stream.queued), det.fill_uninitialized_memory))
        return [torch.zeros(3, 2, 2, dtype=torch.uint8)] * images

    return decode


def test_the_device_decode_runs_after_the_prefetch_streams_earlier_work():
    stream = RecordedStream(["augment batch 1 (reads the block the decode may be given)"])
    batch_decode.device_jpeg([torch.zeros(4, dtype=torch.uint8)], CUDA, stream, recording_decode(stream))
    assert [entry[0] for entry in stream.log] == ["synchronize", "decode"]
    assert stream.log[1][1] == []  # nothing of the prefetch stream was pending when the decoder wrote


def test_the_cpu_decode_is_the_plain_call():
    stream = RecordedStream(["anything"])
    batch_decode.device_jpeg([torch.zeros(4, dtype=torch.uint8)], torch.device("cpu"), stream, recording_decode(stream))
    assert [entry[0] for entry in stream.log] == ["decode"]


def test_the_loaders_decode_calls_are_ordered_batched_and_one_by_one(monkeypatch):
    """decode_batch on a CUDA device: the batched call and the image-by-image fallback each wait first."""
    stream = RecordedStream(["augment batch 1"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    calls = []

    def decode(encoded, mode, device):
        calls.append(len(stream.queued))
        stream.queued.append("augment of this batch")  # queued after the decode, as the loader does
        if isinstance(encoded, list):
            raise RuntimeError("a PNG in the batch")
        return torch.zeros(3, 2, 2, dtype=torch.uint8)

    monkeypatch.setattr(batch_decode, "decode_jpeg", decode)
    jpeg_like = torch.tensor([0xFF, 0xD8, 0, 0], dtype=torch.uint8)  # its first bytes a JPEG's: the device route
    images, failed = batch_decode.decode_batch([jpeg_like] * 2, CUDA)
    assert failed == {} and len(images) == 2
    assert calls == [0, 0, 0]  # the batched call and both single ones found the prefetch stream drained
    assert [entry[0] for entry in stream.log] == ["synchronize"] * 3


def test_deterministic_runs_do_not_prefill_what_nvjpeg_writes():
    stream = RecordedStream([])
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert det.fill_uninitialized_memory is True
        batch_decode.device_jpeg([torch.zeros(4, dtype=torch.uint8)], CUDA, stream, recording_decode(stream))
        assert stream.log[-1][2] is False  # no fill kernel queued on the prefetch stream during the decode
        assert det.fill_uninitialized_memory is True  # and back on afterwards
    finally:
        torch.use_deterministic_algorithms(before)
    batch_decode.device_jpeg([torch.zeros(4, dtype=torch.uint8)], CUDA, stream, recording_decode(stream))
    assert stream.log[-1][2] is True  # not deterministic: left as torch has it


def _in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_a_hold_waits_for_work_under_way_and_keeps_new_work_out():
    gate, events = DeviceWorkGate(), []
    inside, release = threading.Event(), threading.Event()

    def worker():
        with gate.work():
            inside.set()
            release.wait(10)
            events.append("work done")

    def holder():
        with gate.held():
            events.append("held")
            time.sleep(0.2)
            events.append("released")

    w = _in_thread(worker)
    assert inside.wait(10)
    h = _in_thread(holder)
    time.sleep(0.2)
    assert events == []  # the hold waits for the worker's batch
    release.set()
    h.join(10)
    w.join(10)
    assert events == ["work done", "held", "released"]

    entered = threading.Event()

    def late_worker():
        with gate.work():
            entered.set()

    with gate.held():
        late = _in_thread(late_worker)
        time.sleep(0.2)
        assert not entered.is_set() and gate.busy == 0 and gate.waits == 1  # new work waits out the hold
    late.join(10)
    assert entered.is_set() and gate.busy == 0


def test_the_pin_threads_batch_takes_the_gate():
    from torus_train.data.torchvision_loader import _collate_gated, _GatedBatch

    batch = _collate_gated([(torch.zeros(2), 1, "note"), (torch.ones(2), 0, "")])
    assert isinstance(batch, _GatedBatch) and len(batch) == 3  # (images, labels, notes) as before
    plain = _GatedBatch(([1], ["a"]))
    got = []
    with DEVICE_WORK.held():
        t = _in_thread(lambda: got.append(plain.pin_memory()))
        time.sleep(0.2)
        assert got == []  # the pin thread's page-locking waits out the capture
    t.join(10)
    assert got == [plain] and isinstance(got[0], _GatedBatch)


@pytest.fixture
def device_path_loader(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from datahelp import make_index_set

    from torus_train.data import make_loader
    from torus_train.job.sources import DECODERS, Decoder

    DECODERS.add("test-order", Decoder("test-order", "the GPU decoder's path on any device", lambda device: "gpu"))
    root = make_index_set(tmp_path / "d", n_train=8, n_val=4, size=24)
    args = dict(rank=0, world_size=1, batch_size=4, image_size=16, num_classes=None, seed=0)
    ld = make_loader("torchvision", root, "train", channels_last=False, device="cpu", num_threads=0, **args)
    ld.close()
    ld = make_loader(
        "torchvision", root, "train", channels_last=False, device="cpu", num_threads=0, decoder="test-order", **args
    )
    yield ld
    ld.close()
    DECODERS.remove("test-order")


def test_the_decode_prefetcher_waits_out_a_capture(device_path_loader):
    got = []
    with DEVICE_WORK.held():
        t = _in_thread(lambda: got.extend(x.shape[0] for x, _ in device_path_loader))
        time.sleep(0.5)
        assert got == [] and DEVICE_WORK.busy == 0  # no batch decoded while the capture holds the gate
    t.join(30)
    assert got == [4, 4]
