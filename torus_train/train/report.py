"""What a run tells: rank 0's progress line, metrics.jsonl records, the summary (and its replica check)."""

from __future__ import annotations

import json
import logging
import math
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.train.board import EVAL_TAGS, INTERVAL_TAGS, Board
from torus_train.train.checkpoint import write_atomic
from torus_train.train.state import RunState
from torus_train.train.step import check_nonfinite
from torus_train.train.timing import FIELDS, PERCENTILES
from torus_train.train.writer import APPENDER

log = logging.getLogger("torus_train.train")


def write_jsonl(path: Path, record: dict) -> None:
    """Append one line from the writer thread (train/writer.py): the training thread never waits on the file."""
    APPENDER.append(path, json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the lines after `step` (written after the checkpoint a resume starts from: they will be written
    again) and any torn last line; rewritten atomically. Returns how many lines went."""

    APPENDER.flush()  # lines handed to the writer thread are in the file before it is read
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            keep = isinstance(rec, dict) and not (isinstance(rec.get("step"), int) and rec["step"] > step)
        except ValueError:
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        write_atomic(path, "".join(line + "\n" for line in kept).encode())
    return dropped


def record_resume(rs: RunState, resumed: bool) -> None:
    """After a resume: metrics.jsonl cut back to the checkpoint's step, a resume event, a progress line. Without
    a checkpoint yet (a restart before the first one) the run starts again, and every step line goes."""
    if not rs.rank0:
        return
    kept = rs.pos.global_step if resumed else -1
    dropped = truncate_metrics(rs.metrics, kept)
    write_jsonl(
        rs.metrics, {"event": "resume", "step": rs.pos.global_step, "epoch": rs.pos.epoch, "dropped_lines": dropped}
    )
    if rs.progress.board:
        rs.progress.board.resume(kept)
    where = (
        f"resumed at epoch {rs.pos.epoch}, step {rs.pos.global_step}" if resumed else "no checkpoint yet: started again"
    )
    whose = "after it" if resumed else "of the earlier attempt"
    rs.progress.say(where + (f" ({dropped} metrics lines {whose} dropped)" if dropped else ""))


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Rank 0's progress: one refreshing line on a terminal, a line per interval otherwise. The ETA comes from
    train/eta.py (the work left in each stage at that stage's rate), set up by ``plan``."""

    def __init__(self, epochs: int, out: Path | None = None):
        self.epochs = epochs
        self.board = Board(out) if out is not None else None  # TensorBoard scalars, when it is installed
        self.total = 0
        self.tty = sys.stdout.isatty()
        self.eta = None
        self.prior: tuple[float, int] | None = None  # (seconds, global batch) of the timed step before training
        self._last_end = None  # time.time() at the end of the last interval
        self._last_epoch = None

    def plan(self, eta) -> None:
        """The run's train/eta.Eta (replaced at every stage switch, keeping what was measured)."""
        if self.eta is not None:
            # a plan over another loader may end in another stage (schedule.steps caps it); the stages both
            # plans hold keep what was measured
            for new, old in zip(eta.stages, self.eta.stages, strict=False):
                new.seconds, new.steps = old.seconds, old.steps
                new.first_seconds, new.first_steps = old.first_seconds, old.first_steps
            eta.gap_seconds, eta.boundaries, eta.prior = self.eta.gap_seconds, self.eta.boundaries, self.eta.prior
        self.eta = eta

    def eta_text(self, global_step: int) -> str:
        left = self.eta.seconds_left(global_step) if self.eta is not None else None
        return "?" if left is None else _fmt_time(left)

    def observe(self, rec: dict, steps: int, start: float, end: float) -> None:
        """A logging interval of ``steps`` steps from ``start`` to ``end`` (time.time())."""
        if self.eta is None:
            return
        gap = start - self._last_end if self._last_end is not None else 0.0
        self.eta.observe(
            rec["step"],
            steps,
            end - start,
            gap,
            crossed_boundary=rec["epoch"] != self._last_epoch and self._last_epoch is not None,
        )
        self._last_end, self._last_epoch = end, rec["epoch"]

    def update(self, rec: dict) -> None:
        line = (
            f"epoch {rec['epoch'] + 1}/{self.epochs} step {rec['step']}/{self.total} | "
            f"{rec['images_per_second']:,.0f} img/s | loss {rec['loss']:.4f} | lr {rec['lr']:.4g} | "
            f"batch {rec['global_batch']} | ETA {self.eta_text(rec['step'])}"
        )
        if rec.get("noise_scale") is not None:
            line += f" | noise scale {rec['noise_scale']:,.0f}"
        if self.tty:
            print("\r" + line.ljust(110), end="", flush=True)
        else:
            print(line, flush=True)

    def say(self, text: str) -> None:
        print(("\n" if self.tty else "") + text, flush=True)


def new_interval() -> dict:
    return {"t": time.time(), "data": 0.0, "steps": 0, "loss": 0.0, "images": 0}


def record_stage(rs: RunState, epoch: int, stage) -> None:
    """A batch-size switch: logged on every rank, a metrics event and a progress line on rank 0."""
    log.info(
        "stage %d from epoch %d: global batch %d, per rank %d (%d x %d)",
        stage.index,
        epoch,
        stage.global_batch,
        stage.per_rank_batch,
        stage.micro_batch,
        stage.accumulation,
    )
    if not rs.rank0:
        return
    if rs.noise is not None:  # the averaged noise scale as the stage begins (summary.json)
        rs.noise_marks.append({"epoch": epoch, "stage": stage.index, "step": rs.pos.global_step, **rs.noise.read()})
    write_jsonl(
        rs.metrics,
        {
            "event": "stage",
            "epoch": epoch,
            "stage": stage.index,
            "global_batch": stage.global_batch,
            "per_rank_batch": stage.per_rank_batch,
            "accumulation": stage.accumulation,
            "step": rs.pos.global_step,
        },
    )
    split = f" ({stage.accumulation} x {stage.micro_batch})" if stage.accumulation > 1 else ""
    rs.progress.say(
        f"stage {stage.index} from epoch {epoch}: global batch {stage.global_batch} = "
        f"{rs.boot.info.world_size} ranks x {stage.per_rank_batch}{split}"
    )


def log_interval(rs: RunState, interval: dict, epoch: int, stage, lr: float) -> None:
    """Average the interval's loss over the ranks and agree on a stop request; rank 0 writes a metrics line
    and updates the progress."""
    end = time.time()
    seconds = max(end - interval["t"], 1e-9)
    n = max(interval["steps"], 1)
    # the interval's loss was summed on the device (no host read per step); one all-reduce, one read here
    loss = torch.as_tensor(interval["loss"], dtype=torch.float64, device=rs.boot.device).reshape(1) / n
    stop = torch.tensor([1.0 if rs.stop.signal else 0.0], dtype=torch.float64, device=rs.boot.device)
    t = torch.cat([loss, stop])
    dist.all_reduce(t)
    loss_sum, stops = t.tolist()
    rs.times.flush()  # CUDA step events, read while the host waits here anyway
    rs.stop_agreed = stops > 0
    rec = {
        "step": rs.pos.global_step,
        "epoch": epoch,
        "global_batch": stage.global_batch,
        "per_rank_batch": stage.per_rank_batch,
        "lr": lr,
        "loss": loss_sum / rs.boot.info.world_size,
        "images_per_second": interval["images"] / seconds,
        "data_time": interval["data"] / n,
        "step_time": seconds / n,
        "wall_seconds": round(rs.wall(), 3),
    }
    if rs.rank0 and rs.noise is not None:
        rec.update(rs.noise.read())  # read here, once per interval: the step never reads it
    if not math.isfinite(rec["loss"]):
        log.warning("step %d: loss is %s", rs.pos.global_step, rec["loss"])
    log.info(
        "step %d epoch %d loss %.4f lr %.4g %.1f img/s", rec["step"], epoch, rec["loss"], lr, rec["images_per_second"]
    )
    if rs.rank0:
        write_jsonl(rs.metrics, rec)
    check_nonfinite(rs)  # the skipped steps, counted on the device, read here rather than on every step
    if rs.rank0:
        if rs.progress.board:
            rs.progress.board.write({**rec, "skipped_steps": rs.skipped_steps}, INTERVAL_TAGS)
        rs.progress.observe(rec, interval["steps"], interval["t"], end)
        rs.progress.update(rec)


def record_eval(rs: RunState, result: dict, epoch: int) -> None:
    rs.last_eval = result
    rs.pos.best_top1 = max(rs.pos.best_top1 or 0.0, result["top1"])
    target = rs.spec.eval.target_top1
    wall = round(rs.wall(), 3)
    if target and rs.pos.target_epoch is None and result["top1"] >= target:
        rs.pos.target_epoch, rs.pos.target_seconds = epoch + 1, wall
    log.info("eval after epoch %d: top-1 %.4f top-5 %.4f", epoch, result["top1"], result["top5"])
    if not rs.rank0:
        return
    rec = {"event": "eval", "epoch": epoch, "step": rs.pos.global_step, **result, "wall_seconds": wall}
    write_jsonl(rs.metrics, rec)
    if rs.progress.board:
        rs.progress.board.write(rec, EVAL_TAGS)
    hit = ""
    if target and rs.pos.target_epoch == epoch + 1:
        hit = f" | reached target {target:.2%} at {rs.pos.target_seconds:.1f} s"
    rs.progress.say(
        f"eval after epoch {epoch + 1}: top-1 {result['top1']:.2%} top-5 {result['top5']:.2%} "
        f"({result['samples']} images){hit}"
    )


HOST_BYTES = 64
STRAGGLER_RATIO = 1.3  # own work p50 against the median rank's, from which the summary text names a rank
LISTED_RANKS = 256  # summary["ranks"] lists every rank up to this world size; stragglers are always listed


def gather_ranks(rs: RunState) -> list[dict]:
    """Every rank's step-time percentiles (train/timing.py), host and skipped corrupt files: one all_gather of
    a few numbers per rank, once, at the end. Every rank calls it; all get the list."""
    host = socket.gethostname().encode()[:HOST_BYTES]
    c = rs.corrupt
    mine = [*rs.times.percentiles(), len(rs.times.compute), len(c.files) if c else 0, c.samples if c else 0]
    mine += list(host) + [0] * (HOST_BYTES - len(host))
    v = torch.tensor(mine, dtype=torch.float64, device=rs.boot.device)
    every = [torch.empty_like(v) for _ in range(rs.boot.info.world_size)]
    dist.all_gather(every, v)
    rows = []
    for r, t in enumerate(every):
        x = t.tolist()
        k = len(FIELDS) * len(PERCENTILES)
        row = {
            "rank": r,
            "host": bytes(int(b) for b in x[k + 3 :] if b).decode(errors="replace"),
            "steps": int(x[k]),
            "corrupt_files": int(x[k + 1]),
            "corrupt_reads": int(x[k + 2]),
        }
        for i, (f, q) in enumerate((f, q) for f in FIELDS for q in PERCENTILES):
            row[f"{f}_{'max' if q == 100 else f'p{q}'}"] = round(x[i], 6)
        rows.append(row)
    return rows


def stragglers(rows: list[dict]) -> dict:
    """The slowest ranks by their own work per step (data + compute, p50) against the median rank."""
    median = statistics.median_low([r["work_p50"] for r in rows])
    slow = sorted(rows, key=lambda r: -r["work_p50"])[:5]
    return {
        "median_work_p50": median,
        "median_compute_p50": statistics.median_low([r["compute_p50"] for r in rows]),
        "median_data_p50": statistics.median_low([r["data_p50"] for r in rows]),
        "slowest": [
            {
                "rank": r["rank"],
                "host": r["host"],
                "work_p50": r["work_p50"],
                "compute_p50": r["compute_p50"],
                "data_p50": r["data_p50"],
                "vs_median": round(r["work_p50"] / median, 3) if median > 0 else None,
            }
            for r in slow
        ],
    }


def rank_report(rs: RunState) -> dict:
    """summary.json's "stragglers", "ranks" (up to LISTED_RANKS) and "corrupt_skipped" (every rank calls)."""
    rows = gather_ranks(rs)
    return {
        "stragglers": stragglers(rows),
        "ranks": rows if len(rows) <= LISTED_RANKS else None,
        "corrupt_skipped": {
            "policy": rs.spec.data.on_corrupt,
            "files": sum(r["corrupt_files"] for r in rows),
            "reads": sum(r["corrupt_reads"] for r in rows),
        },
    }


def summary(rs: RunState, wall: float, digest: str, agree: bool, ranks: dict | None = None) -> dict:
    spec, boot, pos, ev = rs.spec, rs.boot, rs.pos, rs.last_eval
    return {
        "world_size": boot.info.world_size,
        "grid": str(boot.grid),
        "gpus_per_node": boot.grid.gpus_per_node,
        "backend": boot.backend,
        "device": boot.device.type,
        "comm_algo": spec.comm.algo,
        "compression": spec.comm.compression,
        "model": spec.model.arch,
        "image_size": spec.data.image_size,
        "loader": getattr(rs.loader, "kind", None),
        **data_classes(rs.loader),
        "decoder": getattr(rs.loader, "decoder", None),
        "steps": pos.global_step,
        "epochs_done": pos.epoch,
        "images": pos.images,
        "wall_seconds": round(wall, 3),
        "images_per_second": round(pos.images / wall, 2) if wall else None,
        "skipped_steps": rs.skipped_steps,
        "deterministic": spec.job.deterministic,
        "cuda_graph_captures": list(rs.graphs.capture_seconds) if rs.graphs is not None else None,
        "choices": choices(rs),
        "val_top1": ev["top1"] if ev else None,
        "val_top5": ev["top5"] if ev else None,
        "best_top1": pos.best_top1,
        "target_top1": spec.eval.target_top1 or None,
        "time_to_target_epoch": pos.target_epoch,
        "time_to_target_seconds": pos.target_seconds,
        "schedule_control": spec.schedule.control,
        "stage_starts": list(pos.stage_starts),
        "noise_scale": noise_summary(rs),
        "param_digest": digest,
        "param_digests_agree": agree,
        **(ranks or {}),
    }


def noise_summary(rs: RunState) -> dict | None:
    """The averaged noise scale at each stage change (as the stage began) and at the end; None when off."""
    if rs.noise is None:
        return None
    return {"stage_changes": list(rs.noise_marks), "end": rs.noise.read()}


def data_classes(loader) -> dict:
    """summary.json's "classes" (label i is classes[i]: the WNIDs of ImageNet) and "class_names" (their words,
    where the packed set holds them), so that the report can name what was trained; {} for synthetic data."""
    classes = list(getattr(loader, "classes", None) or ())
    if not classes:
        return {}
    names = list(getattr(loader, "class_names", None) or ())
    return {"classes": classes, "class_names": names if len(names) == len(classes) else None}


def choices(rs: RunState) -> dict:
    """What each `auto` setting resolved to and why ({"cuda_graphs": {"choice", "why"}, ...}); the StepGraph's
    own at the end (a later stage may have fallen back)."""
    return {**rs.choices, **({"cuda_graphs": dict(rs.graphs.choice)} if rs.graphs is not None else {})}


def summary_text(s: dict) -> str:
    ranks = f"{s['world_size']} rank" + ("s" if s["world_size"] != 1 else "")
    parts = [
        f"done: {s['steps']} steps on {ranks} (grid {s['grid']}, {s['comm_algo']}) in "
        f"{s['wall_seconds']:.1f} s, {s['images_per_second'] or 0:,.1f} img/s"
    ]
    if s["val_top1"] is not None:
        parts.append(f"val top-1 {s['val_top1']:.2%}")
    if s["time_to_target_seconds"] is not None:
        parts.append(f"target reached at epoch {s['time_to_target_epoch']}, {s['time_to_target_seconds']:.1f} s")
    parts.append(f"replicas agree: {s['param_digests_agree']} ({s['param_digest'][:12]})")
    return "; ".join(parts) + "".join("\n" + line for line in rank_lines(s))


def rank_lines(s: dict) -> list[str]:
    """A line per straggler (own work p50 >= STRAGGLER_RATIO x the median rank's) and one for skipped files."""
    lines = []
    st: dict = s.get("stragglers") or {}
    for r in st["slowest"] if st else ():
        if r["vs_median"] is not None and r["vs_median"] >= STRAGGLER_RATIO:
            lines.append(
                f"straggler: rank {r['rank']} on {r['host']}, own work p50 {r['work_p50']:.3f} s "
                f"(compute {r['compute_p50']:.3f}, data {r['data_p50']:.3f}) against "
                f"{st['median_work_p50']:.3f} s median ({r['vs_median']:.1f}x)"
            )
    skipped = s.get("corrupt_skipped")
    if skipped and skipped["files"]:
        lines.append(
            f"corrupt images skipped: {skipped['files']} file(s), replaced in {skipped['reads']} reads "
            "(data.on_corrupt = skip; each named in its rank's log)"
        )
    return lines
