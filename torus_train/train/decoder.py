"""data.decoder resolved once per run, before training, with one verdict for every rank.

    choice = choose_decoder(spec, boot, say)     every rank, at the same point (two all-reduces when it probes: comm/consensus.py)
    choice.decoder                               the data.decoder entry the loaders are built with
    choice.summary()                             summary.json's choices.decoder: {"choice", "why"}

``auto`` (a probed entry of job/sources.py's DECODERS) on CUDA ranks uses the device decoder (nvJPEG) only when data/decode_probe.py shows it decoding the
embedded images of every kind as PIL does (and, for a deterministic run, giving the same bits twice) on every
rank; otherwise every rank decodes on the CPU and rank 0 says so in one line. ``cpu`` and ``gpu`` are obeyed
without a probe (gpu on CPU ranks is refused before launch: job/sources.py). The decoder only matters to the
torchvision pipeline: DALI decodes by itself, synthetic data is not decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torus_train.comm.consensus import consensus
from torus_train.data.decode_probe import DecodeFn, probe_decoder_repeats, probe_device_decoder
from torus_train.data.pipelines import resolve_kind
from torus_train.job.rank import Bootstrap
from torus_train.job.sources import DECODERS, source_of
from torus_train.job.spec import JobSpec
from torus_train.train.faults import Fault
from torus_train.verdict import Verdict


@dataclass(frozen=True)
class DecoderChoice:
    decoder: str
    """The data.decoder entry the loaders are built with: the spec's, or cpu / gpu as the probe decided."""
    choice: str
    """What decodes, for the summary: cpu, gpu, or dali (DALI decodes) / none (synthetic: nothing is decoded)."""
    why: str
    """One line: the setting, or the probe's verdict."""

    def summary(self) -> dict[str, str]:
        return {"choice": self.choice, "why": self.why}


def choose_decoder(
    spec: JobSpec, boot: Bootstrap, say: Callable[[str], None] | None = None, fault: Fault | None = None
) -> DecoderChoice:
    """This run's decoder (see the module docstring). ``say``: rank 0's one-line messages (None elsewhere);
    ``fault``: the tests' injected fault (train/faults.py): a decoder-probe fault makes every rank probe, CPU
    ranks included, with the fault's decode function on the ranks it names."""
    setting = spec.data.decoder
    if not source_of(spec.data.source).reads_files:
        return DecoderChoice(setting, "none", f"data.source = {spec.data.source}: nothing is decoded")
    if resolve_kind(spec.data.loader, boot.info.rank) != "torchvision":
        return DecoderChoice(setting, "dali", "the DALI pipeline decodes (data.decoder applies to torchvision's)")
    entry, injected = DECODERS.get(setting), fault.kind.probe if fault is not None else None
    placed = entry.place(boot.device.type)  # a UserError where the device cannot take it
    if not entry.probed or (placed != "gpu" and injected is None):
        why = f"{setting}: the ranks run on the {boot.device.type}" if entry.probed else f"data.decoder = {setting}"
        return DecoderChoice(placed, placed, why)
    decode = injected if fault is not None and fault.targets(boot.info.rank) else None
    verdict = probe(boot.device, spec.job.deterministic, decode)
    found = consensus(None if verdict.ok is True else verdict.why, boot.device)
    if found.ok and placed == "gpu":
        return DecoderChoice("gpu", "gpu", f"{setting}: {verdict.why}")
    if found.ok:  # an injected probe on CPU ranks passed: the CPU ranks still decode on the CPU
        return DecoderChoice("cpu", "cpu", f"{setting}: the ranks run on the {boot.device.type} ({verdict.why})")
    failed = f"the GPU decoder failed its start-up check {found.where()} ({found.reason()})"
    if say is not None:
        say(f"data.decoder: {failed}; decoding on the CPU (data.decoder = cpu)")
    return DecoderChoice("cpu", "cpu", f"{setting}: {failed}")


def probe(device: torch.device, deterministic: bool, decode: DecodeFn | None = None) -> Verdict:
    """The device decoder's verdict on this rank: agreement with PIL, then (deterministic runs) a repeat."""
    verdict = probe_device_decoder(device, decode)
    if verdict.ok and deterministic:
        repeat = probe_decoder_repeats(device, decode)
        if not repeat.ok:
            return Verdict.failed(f"deterministic run: {repeat.why}", **repeat.detail)
        return Verdict.passed(f"{verdict.why}; {repeat.why}", **verdict.detail)
    return verdict
