"""train/decoder.py: how data.decoder resolves for one rank (outside a process group: its own verdict), with
the probe's verdicts forced where a CUDA rank is needed. The run-level behaviour (every rank, one line, the
summary, equal parameters) is tests/dist/test_decoder_choice.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torus_train.data.batch_decode import decode_batch
from torus_train.errors import UserError
from torus_train.train import decoder as dec
from torus_train.train.faults import parse
from torus_train.verdict import Verdict


def spec(decoder="auto", source="demo", loader="torchvision", deterministic=False):
    return SimpleNamespace(
        data=SimpleNamespace(decoder=decoder, source=source, loader=loader),
        job=SimpleNamespace(deterministic=deterministic),
    )


def boot(device="cpu", rank=0):
    return SimpleNamespace(device=torch.device(device), info=SimpleNamespace(rank=rank))


@pytest.fixture
def verdicts(monkeypatch):
    """Set the probes' verdicts for a "CUDA" rank: {"agree": Verdict, "repeat": Verdict}; calls are counted."""
    got = {"agree": Verdict.passed("11 kinds agree"), "repeat": Verdict.passed("bit-identical"), "calls": []}

    def fake(name):
        def probe(device, decode=None):
            got["calls"].append(name)
            return got[name]

        return probe

    monkeypatch.setattr(dec, "probe_device_decoder", fake("agree"))
    monkeypatch.setattr(dec, "probe_decoder_repeats", fake("repeat"))
    return got


def choose(*args, **kw):
    said = []
    choice = dec.choose_decoder(*args, say=said.append, **kw)
    return choice, said


def test_forced_and_cpu_choices_need_no_probe(verdicts):
    assert choose(spec("auto"), boot("cpu"))[0] == dec.DecoderChoice("cpu", "cpu", "auto: the ranks run on the cpu")
    assert choose(spec("cpu"), boot("cuda"))[0] == dec.DecoderChoice("cpu", "cpu", "data.decoder = cpu")
    assert choose(spec("gpu"), boot("cuda"))[0] == dec.DecoderChoice("gpu", "gpu", "data.decoder = gpu")
    with pytest.raises(UserError, match=r"data\.decoder = gpu needs ranks on CUDA GPUs"):
        choose(spec("gpu"), boot("cpu"))
    assert choose(spec(source="synthetic"), boot("cuda"))[0].choice == "none"
    assert choose(spec(loader="dali"), boot("cuda"))[0].choice == "dali"
    assert verdicts["calls"] == []


def test_auto_on_cuda_uses_the_gpu_decoder_when_it_agrees(verdicts):
    choice, said = choose(spec(), boot("cuda"))
    assert choice == dec.DecoderChoice("gpu", "gpu", "auto: 11 kinds agree") and said == []
    assert verdicts["calls"] == ["agree"]  # not deterministic: no repeat asked


def test_auto_on_cuda_falls_back_in_one_line_when_it_does_not(verdicts):
    verdicts["agree"] = Verdict.failed("cmyk: differs from PIL by 41.2 levels on average")
    choice, said = choose(spec(), boot("cuda"))
    assert (choice.decoder, choice.choice) == ("cpu", "cpu")
    assert (
        choice.summary()["why"]
        == "auto: the GPU decoder failed its start-up check here (cmyk: differs from PIL by 41.2 levels on average)"
    )
    assert said == [
        "data.decoder: the GPU decoder failed its start-up check here (cmyk: differs from PIL by 41.2 levels on "
        "average); decoding on the CPU (data.decoder = cpu)"
    ]
    assert dec.choose_decoder(spec(), boot("cuda", rank=1), say=None).choice == "cpu"  # other ranks: silent


def test_a_deterministic_run_needs_the_repeat_too(verdicts):
    assert choose(spec(deterministic=True), boot("cuda"))[0].choice == "gpu"
    assert verdicts["calls"] == ["agree", "repeat"]
    verdicts["repeat"] = Verdict.failed("two decodes on cuda differ in 3 of 24 images (cmyk)")
    choice, said = choose(spec(deterministic=True), boot("cuda"))
    assert choice.choice == "cpu" and "deterministic run: two decodes on cuda differ" in choice.why
    assert len(said) == 1
    assert choose(spec(deterministic=False), boot("cuda"))[0].choice == "gpu"  # the repeat binds only those


def test_an_injected_fault_makes_a_cpu_rank_probe_with_the_real_decoders():
    """The faults the run tests use: the real probe on the CPU, the fault's decoder on the rank it names."""
    choice, said = choose(spec(), boot("cpu"), fault=parse("wrongimage:0"))
    assert choice.choice == "cpu" and "differs from PIL" in choice.why and len(said) == 1
    choice, said = choose(spec(), boot("cpu"), fault=parse("decoderaises:all"))
    assert "the device decoder raised RuntimeError: injected decoder failure" in choice.why and len(said) == 1
    choice, said = choose(spec(), boot("cpu", rank=0), fault=parse("wrongimage:1"))  # aimed elsewhere: passes
    assert choice.choice == "cpu" and choice.why.startswith("auto: the ranks run on the cpu (") and said == []


def test_the_probe_combines_agreement_and_repeat_on_the_cpu_branch():
    assert dec.probe(torch.device("cpu"), deterministic=True).ok is True
    calls = []

    def drifting(encoded, device):
        images, failed = decode_batch(encoded, device)
        calls.append(1)
        if len(calls) == 3:  # the second decode of the repeat probe
            images[0] = 255 - images[0]
        return images, failed

    v = dec.probe(torch.device("cpu"), deterministic=True, decode=drifting)
    assert v.ok is False and v.why.startswith("deterministic run: two decodes on cpu differ in 1 of")
