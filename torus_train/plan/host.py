"""The step time of a `torus-train run` on one CPU host, from this machine's calibration and a measured profile
(pure: torch only inside ``measure_step_profile``).

What it predicts, for R ranks of one thread each on C cores with B other runnable threads (background):

* o = max(1, (R + B) / C): the ranks time-share the cores, so each rank's forward, backward and optimizer step
  take o times what one rank alone takes (``StepProfile``, measured here with one thread in CPU time, which
  time-sharing with other processes does not stretch: on this 2-core machine shared with other jobs the wall
  time of one step varied 2.5x between consecutive steps while its CPU time stayed within 10%);
* the gradients in DDP's buckets (torus_train.plan.timeline: reverse parameter order, 1 MiB first, then the
  run's comm.bucket_mb), each bucket's exchange from the calibration of the torus on this machine
  (torus_train.plan.calibrate, which already holds the same o);
* two bounds on the step, the larger wins:
  - the timeline (the critical path): forward, then the backward shared over modules by the measured profile,
    each bucket exchanged from its ready time, queued; the optimizer step after the last exchange;
  - the cores' work: every rank's forward, backward, optimizer step and exchanges need the cores, so the step
    cannot be shorter than o x (forward + backward + optimizer) + the exchanges. When the ranks fill every core
    (R + B >= C) this bound is the larger: an exchange thread that runs during the backward pass takes its
    core from the backward pass, and nothing hides.
  Stated simplification: an exchange on loopback gloo or shared memory is CPU work (copies, sums, syscalls)
  throughout, its latency included.
* the training loop's own work per step beyond forward, backward and optimizer (DDP and its hook, the
  finiteness check, the loop's bookkeeping) when measured: ``StepProfile.loop_seconds``, the CPU per step of a
  one-rank run of the same job on one core (a 1x1 grid exchanges nothing), less the profile's step; it comes after the
  optimizer step, stretched by o like the rest. Data loading is not modelled (synthetic data is one batch
  made once).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torus_train.errors import UserError
from torus_train.job.algorithms import DEFAULT
from torus_train.plan.timeline import Layer, layers_with_profile, timeline
from torus_train.userfiles import Field, check, check_regular, read_json, read_json_lines

if TYPE_CHECKING:
    import torch  # annotations only: torch is imported where a step is measured

    from torus_train.job.topology import Grid
    from torus_train.plan.calibrate import Calibration


@dataclass
class StepProfile:
    """One rank's step on this machine, measured alone (``measure_step_profile``)."""

    model: str
    """torchvision model name."""
    image_size: int
    """Image side in pixels."""
    batch: int
    """Images per step."""
    num_classes: int
    """Classifier outputs (decides fc's size)."""
    threads: int
    """torch threads used (a run's CPU ranks use 1 each here)."""
    forward_seconds: float
    """Forward pass and loss, median."""
    backward_seconds: float
    """Backward pass, median."""
    optimizer_seconds: float
    """Optimizer step (SGD with momentum and weight decay), median."""
    modules: dict = field(default_factory=dict)
    """Backward seconds per module with parameters (timeline.measure_backward_profile's convention)."""
    cores: int = 1
    """CPU cores of the machine when measured."""
    background: float = 0.0
    """Other runnable threads while it was measured (its own oversubscription: max(1, (1 + background) / cores))."""
    colocated: int = 1
    """Copies of the same step that ran at once on the machine while it was measured (1 = alone): the ranks of a
    run share the memory bandwidth and the cache, which stretches even their CPU time."""
    loop_seconds: float | None = None
    """CPU seconds per step of a one-rank `torus-train run` of the same job (the training loop as it runs:
    DDP, its hook, the finiteness check, the loop's bookkeeping), when measured; the prediction then adds
    loop_seconds - (forward + backward + optimizer), at least 0, as the loop's own work, after the optimizer."""
    clock: str = "cpu"
    """"cpu": the seconds are the thread's CPU time (time-sharing does not count); "wall": wall-clock seconds,
    divided by the measurement's own oversubscription to get a rank alone."""

    @property
    def own_oversubscription(self) -> float:
        """How much the measurement itself was slowed by time-sharing: 1 for CPU time, else
        max(1, (threads + background) / cores)."""
        return 1.0 if self.clock == "cpu" else max(1.0, (self.threads + self.background) / self.cores)

    def alone(self) -> tuple[float, float, float]:
        """(forward, backward, optimizer) seconds of one rank with a core to itself."""
        o = self.own_oversubscription
        return self.forward_seconds / o, self.backward_seconds / o, self.optimizer_seconds / o

    def loop_overhead(self) -> float:
        """The training loop's work per step beyond forward, backward and optimizer (0 when not measured)."""
        if self.loop_seconds is None:
            return 0.0
        return max(0.0, self.loop_seconds - sum(self.alone()))


MAX_PROFILE_SECONDS = 1e6
"""A profile's times (a step's parts, a module's backward): at most 1e6 s, so that sums and shares stay finite."""
PROFILE_FIELDS = (
    Field("model", "str"),
    Field("image_size", "int", 1, 1 << 20),
    Field("batch", "int", 1, 1 << 30),
    Field("num_classes", "int", 1, 1 << 31),
    Field("threads", "int", 1, 1 << 16),
    Field("forward_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("backward_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("optimizer_seconds", "number", 0, MAX_PROFILE_SECONDS),
    Field("modules", "dict"),
    Field("cores", "int", 1, 1 << 20, optional=True),
    Field("background", "number", 0, 1 << 20, optional=True),
    Field("colocated", "int", 1, 1 << 20, optional=True),
    Field("loop_seconds", "number", 0, MAX_PROFILE_SECONDS, optional=True),
    Field("clock", "str", optional=True, choices=("cpu", "wall")),
)
"""A step profile's JSON (``profile_to_json``): every field the prediction reads."""


def read_step_profile(path: str, flag: str = "--layer-profile") -> StepProfile:
    """A StepProfile from its JSON file; one line naming the flag, the file and the field when it cannot be used."""
    where = f"{flag}: {path}"
    d = read_json(path, where)
    if isinstance(d, dict) and "forward_seconds" not in d:
        raise UserError(
            f"{where}: not a step profile (no 'forward_seconds'); measure one with "
            f"`python -m torus_train.plan.host MODEL OUT.json --image-size N --batch B`"
        )
    values = {k: v for k, v in check(d, PROFILE_FIELDS, where).items() if v is not None}
    values["modules"] = check_module_seconds(values["modules"], f"{where}: modules")
    if not values["forward_seconds"] + values["backward_seconds"] > 0:
        raise UserError(f"{where}: forward_seconds + backward_seconds must be > 0")
    return StepProfile(**values)


def check_module_seconds(d: object, where: str) -> dict:
    """{module name: backward seconds}: finite, in [0, MAX_PROFILE_SECONDS], not all zero."""
    if not isinstance(d, dict) or not d:
        raise UserError(f"{where}: must hold {{module name: seconds >= 0}}, not an empty or other value")
    for name, v in d.items():
        check({"seconds": v}, (Field("seconds", "number", 0, MAX_PROFILE_SECONDS),), f"{where}: {name!r}")
    if not sum(d.values()) > 0:
        raise UserError(f"{where}: every module's seconds are 0; measure the profile again")
    return {k: float(v) for k, v in d.items()}


@dataclass
class HostPrediction:
    """Predicted step of a run on this host, with both bounds and what decided."""

    grid: str
    """XxY of the run."""
    ranks: int
    """R."""
    cores: int
    """C."""
    background: float
    """B during the run."""
    oversubscription: float
    """o = max(1, (R + B) / C)."""
    per_rank_batch: int
    """Images per rank per step."""
    forward_seconds: float
    """o x the profile's forward, scaled to the run's batch."""
    backward_seconds: float
    """o x the profile's backward, scaled to the run's batch."""
    optimizer_seconds: float
    """o x the profile's optimizer step, and o x the loop's own work when measured (StepProfile.loop_seconds)."""
    bucket_bytes: list
    """Bytes exchanged per bucket, in DDP's order."""
    bucket_seconds: list
    """Calibrated exchange time per bucket."""
    communication_seconds: float
    """Sum of the exchanges."""
    timeline_step_seconds: float
    """The critical path: forward + backward + exposed exchanges + optimizer."""
    cores_step_seconds: float
    """The cores' work: o x (forward + backward + optimizer) + the exchanges."""
    step_seconds: float
    """The larger of the two: the prediction."""
    bound: str
    """Which bound decided: "timeline" or "cores"."""
    timeline: dict = field(default_factory=dict)
    """The bucket timeline (torus_train.plan.timeline.Timeline.to_json)."""


def predict_host_step(
    cal: Calibration,
    profile: StepProfile,
    grid: Grid,
    per_rank_batch: int,
    bucket_cap_bytes: int,
    exchange_bytes: int,
    layers: Sequence[Layer],
    background: float,
) -> HostPrediction:
    """The step of R = grid.size ranks on this host (cal.cores cores, `background` other runnable threads).

    cal: a torus_train.plan.calibrate.Calibration of the torus; layers: the model's parameter tensors
    (timeline.model_layers) for DDP's buckets; exchange_bytes: bytes per gradient value on the wire (4 for fp32)."""
    r, c = grid.size, cal.cores
    o = max(1.0, (r + background) / c)
    scale = per_rank_batch / profile.batch  # stated: compute linear in the batch around the profile's
    fwd, bwd, opt = (x * o * s for x, s in zip(profile.alone(), (scale, scale, 1.0), strict=True))
    opt += o * profile.loop_overhead()
    shared = layers_with_profile(layers, profile.modules)
    t = timeline(
        shared,
        fwd + bwd + opt,
        bwd / (fwd + bwd + opt),
        lambda n: cal.predict_seconds(grid, n, background=background),
        exchange_bytes,
        DEFAULT,
        bucket_cap_bytes,
    )
    comm = t.communication_seconds
    critical = t.step_seconds
    cores = fwd + bwd + opt + comm
    step, bound = (critical, "timeline") if critical >= cores else (cores, "cores")
    return HostPrediction(
        str(grid),
        r,
        c,
        background,
        o,
        per_rank_batch,
        fwd,
        bwd,
        opt,
        [b.nbytes for b in t.buckets],
        [b.allreduce_seconds for b in t.buckets],
        comm,
        critical,
        cores,
        step,
        bound,
        t.to_json(),
    )


# ------------------------------------------------------------------------------------------------
# A finished run's measured steps
# ------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """What a finished run's folder says: its spec and grid, and the measured step time per stage."""

    out: str
    """The run's folder."""
    spec: dict
    """job.json's spec."""
    grid: str
    """XxY."""
    device: str
    """summary.json's device (cpu, cuda)."""
    steps: int
    """Optimizer steps done."""
    stages: list
    """[{per_rank_batch, records, records_used, step_seconds (median of the used records' step_time)}]."""


WARMUP_RECORDS = 1
"""metrics.jsonl records skipped at the start of each stage: the first steps build DDP's buckets and warm caches."""


JOB_FIELDS = (
    Field("spec.model.arch", "str"),
    Field("spec.model.num_classes", "int", 1, 1 << 31),
    Field("spec.data.image_size", "int", 8, 1 << 16),
    Field("spec.comm.algo", "str"),
    Field("spec.comm.compression", "str"),
    Field("spec.comm.bucket_mb", "number", 0, 1 << 20, low_open=True),
    Field("grid.x", "int", 1, 1 << 20),
    Field("grid.y", "int", 1, 1 << 20),
)
"""What `plan compare-run` reads from OUT/job.json."""
SUMMARY_FIELDS = (Field("device", "str"), Field("steps", "int", 0))
"""What `plan compare-run` reads from OUT/summary.json."""
STEP_FIELDS = (Field("per_rank_batch", "int", 1, 1 << 30), Field("step_time", "number", 0, low_open=True))
"""What `plan compare-run` reads from each step record of OUT/metrics.jsonl."""


def read_run(out: str, flag: str = "plan compare-run") -> RunRecord:
    """OUT/job.json, OUT/summary.json and OUT/metrics.jsonl of a finished run, each field checked; one line
    naming the file and the field when one cannot be used."""
    d = Path(out)
    for name in ("job.json", "summary.json", "metrics.jsonl"):
        if not (d / name).exists():
            raise UserError(f"{flag}: {d / name} is missing: give the --out folder of a finished `torus-train run`")
        check_regular(d / name, flag)  # a FIFO or device is named, never opened
    where = {name: f"{flag}: {d / name}" for name in ("job.json", "summary.json", "metrics.jsonl")}
    job_json = read_json(d / "job.json", where["job.json"])
    job = check(job_json, JOB_FIELDS, where["job.json"])
    summary = check(read_json(d / "summary.json", where["summary.json"]), SUMMARY_FIELDS, where["summary.json"])
    by_batch: dict[int, list] = {}
    for n, m in enumerate(read_json_lines(d / "metrics.jsonl", where["metrics.jsonl"]), 1):
        if isinstance(m, dict) and "event" not in m and "step_time" in m:
            rec = check(m, STEP_FIELDS, f"{where['metrics.jsonl']}: record {n}")
            by_batch.setdefault(rec["per_rank_batch"], []).append(rec["step_time"])
    stages = []
    for batch, times in by_batch.items():
        used = times[WARMUP_RECORDS:] or times
        stages.append(
            {
                "per_rank_batch": batch,
                "records": len(times),
                "records_used": len(used),
                "step_seconds": statistics.median(used),
            }
        )
    if not stages:
        raise UserError(
            f"{flag}: {d / 'metrics.jsonl'} has no step records (a run of a few steps with "
            f"job.log_every above them logs none: rerun with --set job.log_every=N)"
        )
    return RunRecord(
        str(d), job_json["spec"], f"{job['grid.x']}x{job['grid.y']}", summary["device"], summary["steps"], stages
    )


def measure_step_profile(
    model: str,
    image_size: int = 64,
    batch: int = 16,
    num_classes: int = 10,
    threads: int = 1,
    repeats: int = 5,
    warmup: int = 2,
) -> StepProfile:
    """One rank's step measured here with `threads` torch threads: forward + loss, backward, SGD step
    (momentum 0.9, weight decay 5e-5) as medians over `repeats` steps after `warmup`, and the backward per
    module (timeline.measure_backward_profile's hooks, on the same steps). With one thread the clock is the
    thread's CPU time (the backward pass runs on the calling thread on CPU), so other jobs on the machine do
    not stretch it; with more, wall time."""
    import torch
    import torchvision

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    clock = time.thread_time if threads == 1 else time.perf_counter
    m = getattr(torchvision.models, model)(num_classes=num_classes)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    names, stamps = _stamp_backward(m, clock)
    x = torch.randn(batch, 3, image_size, image_size)
    y = torch.randint(0, num_classes, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    steps = [_timed_step(m, opt, lambda: loss_fn(m(x), y), stamps, clock) for _ in range(warmup + repeats)][warmup:]
    fw, bw, op = [s[0] for s in steps], [s[1] for s in steps], [s[2] for s in steps]
    modules = {n: statistics.median(s[3].get(n, 0.0) for s in steps) for n in names}
    return StepProfile(
        model,
        image_size,
        batch,
        num_classes,
        threads,
        statistics.median(fw),
        statistics.median(bw),
        statistics.median(op),
        modules,
        cores=len(os.sched_getaffinity(0)),
        background=0.0,
        clock="cpu" if threads == 1 else "wall",
    )


def _stamp_backward(m: torch.nn.Module, clock: Callable[[], float]) -> tuple[list[str], dict[str, float]]:
    """(the names of m's modules that own parameters, a dict each of them stamps with clock() when its last
    gradient is accumulated in the backward pass)."""
    names = [n for n, mod in m.named_modules() if any(True for _ in mod.parameters(recurse=False))]
    mods = dict(m.named_modules())
    stamps: dict[str, float] = {}
    for n in names:
        for p in mods[n].parameters(recurse=False):
            p.register_post_accumulate_grad_hook(lambda _p, n=n: stamps.__setitem__(n, clock()))
    return names, stamps


def _timed_step(
    m: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_of: Callable[[], torch.Tensor],
    stamps: dict[str, float],
    clock: Callable[[], float],
) -> tuple[float, float, float, dict[str, float]]:
    """One training step: (forward + loss, backward, optimizer step, each module's share of the backward: the
    time since the previous stamp)."""
    opt.zero_grad(set_to_none=True)
    stamps.clear()
    t0 = clock()
    loss = loss_of()
    t1 = clock()
    loss.backward()
    t2 = clock()
    opt.step()
    t3 = clock()
    prev, per_module = t1, {}
    for n, t in sorted(stamps.items(), key=lambda kv: kv[1]):
        per_module[n], prev = t - prev, t
    return t1 - t0, t2 - t1, t3 - t2, per_module


def profile_to_json(p: StepProfile) -> dict:
    """The profile as JSON; its `modules` is also what `plan --layer-profile` reads."""
    return asdict(p)


def busy_loop(model: str, image_size: int, batch: int, num_classes: int) -> None:
    """Run one rank's step forever, one thread (a co-located copy for measure_step_profile's --colocated)."""
    import torch
    import torchvision

    torch.set_num_threads(1)
    m = getattr(torchvision.models, model)(num_classes=num_classes)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    x, y = torch.randn(batch, 3, image_size, image_size), torch.randint(0, num_classes, (batch,))
    first = True
    while True:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if first:
            print("ready", flush=True)  # measure_colocated waits for this line from every copy
            first = False


def measure_colocated(
    model: str, image_size: int, batch: int, num_classes: int, colocated: int, repeats: int
) -> StepProfile:
    """measure_step_profile while colocated - 1 copies of the same step run in other processes (started here,
    stopped by their own process ids when the measurement ends)."""
    others = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torus_train.plan.host",
                "--busy",
                model,
                "-",
                "--image-size",
                str(image_size),
                "--batch",
                str(batch),
                "--num-classes",
                str(num_classes),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(colocated - 1)
    ]
    try:
        for proc in others:  # every copy has done one step: all are in their loop
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":  # stdout is a PIPE
                raise UserError("--colocated: a copy of the step did not start")
        prof = measure_step_profile(model, image_size, batch, num_classes, 1, repeats)
    finally:
        for proc in others:
            proc.terminate()
        for proc in others:
            proc.wait(timeout=30)
    prof.colocated = colocated
    return prof


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(
        description="Measure one rank's step (forward, backward per module, optimizer) "
        "on CPU, for `torus-train plan compare-run --layer-profile`."
    )
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--colocated",
        type=int,
        default=1,
        help="measure while this many copies of the step run at once (the ranks of a run; 1 = alone)",
    )
    ap.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--background",
        type=float,
        default=0.0,
        help="other runnable threads during the measurement (only used for a wall-clock profile)",
    )
    a = ap.parse_args()
    if a.busy:
        busy_loop(a.model, a.image_size, a.batch, a.num_classes)
    if a.colocated > 1 and a.threads != 1:
        ap.error("--colocated needs --threads 1")
    prof = (
        measure_colocated(a.model, a.image_size, a.batch, a.num_classes, a.colocated, a.repeats)
        if a.colocated > 1
        else measure_step_profile(a.model, a.image_size, a.batch, a.num_classes, a.threads, a.repeats)
    )
    prof.background = a.background
    Path(a.out).write_text(json.dumps(profile_to_json(prof), indent=1) + "\n")
    print(
        f"# {a.model} at {a.image_size} px, batch {a.batch}, {a.threads} thread(s), {prof.clock} time, "
        f"{prof.colocated} copies at once: forward {prof.forward_seconds * 1e3:.1f} ms, backward "
        f"{prof.backward_seconds * 1e3:.1f} ms, optimizer {prof.optimizer_seconds * 1e3:.1f} ms; wrote {a.out}"
    )
