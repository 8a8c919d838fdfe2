"""A run's results read back for `torus-train report`: metrics.jsonl and summary.json, checked, as figures
(for --json) and as one PNG (pure: no torch; matplotlib only inside ``plot``).

Works on a finished run, on one still in progress (no summary.json yet, a torn last line) and on one that
failed. Every value used is checked (type and finiteness); a line or field that fails is left out and said in
``Run.skipped`` naming the file, the line and the field, so the plot shows what is there.
"""
from __future__ import annotations

import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from torus_train.errors import UserError

INTERVAL_FIELDS = {"step": int, "epoch": int, "global_batch": int, "lr": float, "loss": float,
                   "images_per_second": float, "data_time": float, "step_time": float, "wall_seconds": float}
"""A logging interval's line in metrics.jsonl and the type of each field (train/report.py log_interval)."""
EVAL_FIELDS = {"step": int, "epoch": int, "top1": float, "top5": float, "wall_seconds": float}
STAGE_FIELDS = {"step": int, "epoch": int, "stage": int, "global_batch": int, "per_rank_batch": int}
RANK_FIELDS = {"rank": int, "work_p50": float, "compute_p50": float, "data_p50": float}
"""summary.json's per-rank rows (train/report.py gather_ranks): the rank's own work per step and its parts."""
EVENTS = {None: INTERVAL_FIELDS, "eval": EVAL_FIELDS, "stage": STAGE_FIELDS}
"""metrics.jsonl's "event" field (None: a logging interval) -> the fields read from its lines."""
EVENT_LISTS = {None: "intervals", "eval": "evals", "stage": "stages"}
SUMMARY_FIELDS = {"steps": int, "wall_seconds": float, "world_size": int}
SHOWN_SKIPS = 5  # problems named one by one; the rest are counted


@dataclass
class Run:
    """What one output folder holds, checked."""

    out: Path
    intervals: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    summary: dict | None = None
    ranks: list[dict] = field(default_factory=list)
    target: float | None = None
    skipped: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.out.name

    @property
    def status(self) -> str:
        if self.summary is not None:
            return "finished"
        return "failed" if _failed(self.out) else "no summary.json: in progress, or stopped"

    def figures(self) -> dict:
        """The figures the PNG shows, for --json."""
        return {"out": str(self.out), "status": self.status, "target_top1": self.target,
                "intervals": self.intervals, "evals": self.evals, "stages": self.stages, "ranks": self.ranks,
                "summary": self.summary, "skipped": self.skipped}


def _failed(out: Path) -> bool:
    """A rank left its failure marker (logs/rankNNNNN.failed, ranks/diagnosis.py)."""
    return any((out / "logs").glob("rank*.failed"))


def _check(rec: dict, fields: dict, where: str) -> str:
    """'' when every field is there with its type and finite, else the first problem."""
    for name, kind in fields.items():
        v = rec.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            return f"{where}: field {name!r} is {v!r}, not {'an integer' if kind is int else 'a number'}"
        if not math.isfinite(v):
            return f"{where}: field {name!r} is {v!r}, not finite"
    return ""


def read_metrics(run: Run) -> None:
    path = run.out / "metrics.jsonl"
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        run.skipped.append(f"{path}: {e.strerror or e}")
        return
    lines = text.split("\n")
    problems = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {i}"
        try:
            rec = json.loads(line)
        except ValueError:
            torn = i == len(lines) and not text.endswith("\n")
            problems.append(f"{where}: {'torn last line (run still writing or stopped)' if torn else 'not JSON'}")
            continue
        if not isinstance(rec, dict):
            problems.append(f"{where}: not a JSON object")
            continue
        kind = rec.get("event")
        if kind not in EVENTS:
            continue  # other events (resume, ...) are not plotted
        fields, into = EVENTS[kind], getattr(run, EVENT_LISTS[kind])
        bad = _check(rec, fields, where)
        if bad:
            problems.append(bad)
            continue
        if kind == "eval" and not (0 <= rec["top1"] <= 1 and 0 <= rec["top5"] <= 1):
            problems.append(f"{where}: field 'top1'/'top5' outside [0, 1]")
            continue
        kept = {k: rec[k] for k in fields}
        if kind == "eval" and _finite(rec.get("val_loss")):
            kept["val_loss"] = rec["val_loss"]
        into.append(kept)
    run.skipped += [f"skipped {p}" for p in problems[:SHOWN_SKIPS]]
    if len(problems) > SHOWN_SKIPS:
        run.skipped.append(f"skipped {len(problems) - SHOWN_SKIPS} more line(s) of {path.name}")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_summary(run: Run) -> None:
    path = run.out / "summary.json"
    if not path.exists():
        return
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        run.skipped.append(f"skipped {path.name}: not readable JSON ({e}); per-rank figures left out")
        return
    if not isinstance(s, dict):
        run.skipped.append(f"skipped {path.name}: not a JSON object; per-rank figures left out")
        return
    bad = _check(s, SUMMARY_FIELDS, path.name)
    if bad:
        run.skipped.append(f"skipped {bad}; summary left out")
        return
    run.summary = s
    if _finite(s.get("target_top1")):
        run.target = s["target_top1"]
    rows = s.get("ranks")
    if rows is None:
        rows = (s.get("stragglers") or {}).get("slowest") if isinstance(s.get("stragglers"), dict) else None
    if not isinstance(rows, list):
        run.skipped.append(f"{path.name}: no per-rank rows ('ranks'); per-rank work left out")
        return
    for i, r in enumerate(rows):
        bad = _check(r, RANK_FIELDS, f"{path.name} ranks[{i}]") if isinstance(r, dict) else \
            f"{path.name} ranks[{i}]: not an object"
        if bad:
            run.skipped.append(f"skipped {bad}")
            continue
        run.ranks.append({k: r[k] for k in RANK_FIELDS})


def read_target(run: Run) -> None:
    """The accuracy target from job.json when summary.json has none (a run in progress)."""
    if run.target is not None:
        return
    try:
        t = json.loads((run.out / "job.json").read_text())["spec"]["eval"]["target_top1"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if _finite(t) and 0 < t <= 1:
        run.target = t


def read_run(out: str | Path) -> Run:
    """One output folder; UserError (exit 2) when it is not a run or holds nothing to show."""
    p = Path(out)
    if not p.is_dir():
        raise UserError(f"report: {out}: no such folder (give a run's output folder, e.g. runs/default)")
    if not (p / "metrics.jsonl").exists() and not (p / "summary.json").exists():
        raise UserError(f"report: {out}: not a run's output folder (no metrics.jsonl or summary.json)")
    run = Run(p)
    if (p / "metrics.jsonl").exists():
        read_metrics(run)
    else:
        run.skipped.append("no metrics.jsonl: curves left out")
    read_summary(run)
    read_target(run)
    if not run.intervals and not run.evals and run.summary is None:
        why = "; ".join(run.skipped) or "metrics.jsonl is empty"
        raise UserError(f"report: {out}: nothing to show yet ({why})")
    return run


# --------------------------------------------------------------------------------------------------------
# derived series
# --------------------------------------------------------------------------------------------------------
def epoch_position(run: Run) -> dict[int, float]:
    """step -> fractional epoch, from the last step logged in each epoch (the loop logs every epoch's last
    step); the epoch in progress is assumed as long in images as the first complete one."""
    last: dict[int, int] = {}
    for r in run.intervals + run.evals:
        last[r["epoch"]] = max(last.get(r["epoch"], 0), r["step"])
    batch = {r["epoch"]: r["global_batch"] for r in run.intervals}
    epochs = sorted(last)
    complete = {e for e in epochs if e != epochs[-1] or run.summary is not None}
    images = None
    for e in epochs:
        if e in complete and e in batch:
            images = (last[e] - last.get(e - 1, 0)) * batch[e]
            break
    pos = {}
    for r in run.intervals + run.evals:
        e = r["epoch"]
        start = last.get(e - 1, 0) if e - 1 in last else _start_guess(last, e)
        if e in complete:
            n = last[e] - start
        else:
            n = -(-images // batch[e]) if images and e in batch else max(last[e] - start, 1)
        pos[r["step"]] = e + (r["step"] - start) / max(n, 1)
    return pos


def _start_guess(last: dict[int, int], e: int) -> int:
    earlier = [s for k, s in last.items() if k < e]
    return max(earlier) if earlier else 0


def stage_rows(run: Run) -> list[dict]:
    """Stage switches with the LR at their start (the first interval after), from metrics.jsonl."""
    rows = []
    for st in run.stages:
        after = [r for r in run.intervals if r["step"] > st["step"]]
        rows.append({**st, "lr_first": after[0]["lr"] if after else None})
    return rows


# --------------------------------------------------------------------------------------------------------
# the PNG
# --------------------------------------------------------------------------------------------------------
def plot(runs: list[Run], path: str | Path) -> list[str]:
    """Write the PNG of ``runs``; returns lines saying what could not be drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5))
    notes: list[str] = []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lr_ax, wait_ax = axes[1][0].twinx(), axes[1][1].twinx()  # one right-hand axis each, shared by the runs
    for i, run in enumerate(runs):
        c = colours[i % len(colours)]
        label = run.name if len(runs) > 1 else None
        pos = epoch_position(run)
        if run.intervals or run.evals:
            _loss(axes[0][0], run, pos, c, label, "epoch")
            _loss(axes[0][2], run, pos, c, label, "wall")
        _top1(axes[0][1], run, pos, c, label, "epoch")
        _top1(axes[0][3], run, pos, c, label, "wall")
        if run.intervals:
            _batch_lr(axes[1][0], lr_ax, run, pos, c)
            _speed(axes[1][1], wait_ax, run, pos, c, label)
        else:
            notes.append(f"{run.name}: no training intervals in metrics.jsonl: loss, batch and speed left out")
        if not run.evals:
            notes.append(f"{run.name}: no evaluation in metrics.jsonl: top-1 panels left out")
    _ranks(axes[1][2], runs, colours, notes)
    _text(axes[1][3], runs, notes)
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    title = runs[0].name if len(runs) == 1 else " vs ".join(r.name for r in runs)
    fig.suptitle(f"torus-train report: {title}", fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return notes


def _x(records: list[dict], pos: dict, axis: str) -> list[float]:
    return [pos[r["step"]] if axis == "epoch" else r["wall_seconds"] for r in records]


def _xlabel(axis: str) -> str:
    return "epoch" if axis == "epoch" else "wall time (s, from the first step)"


def _loss(ax, run: Run, pos: dict, c, label, axis: str) -> None:
    ax.plot(_x(run.intervals, pos, axis), [r["loss"] for r in run.intervals], color=c,
            label=(f"{label}: " if label else "") + "train loss")
    ev = [r for r in run.evals if "val_loss" in r]
    if ev:
        ax.plot(_x(ev, pos, axis), [r["val_loss"] for r in ev], "o--", color=c, ms=4,
                label=(f"{label}: " if label else "") + "val loss")
    ax.set_xlabel(_xlabel(axis))
    ax.set_ylabel("loss")
    ax.set_title(f"loss against {'epoch' if axis == 'epoch' else 'wall time'}")
    ax.grid(alpha=0.3)


def _top1(ax, run: Run, pos: dict, c, label, axis: str) -> None:
    if run.evals:
        ax.plot(_x(run.evals, pos, axis), [100 * r["top1"] for r in run.evals], "o-", color=c,
                label=(f"{label}: " if label else "") + "top-1")
        ax.plot(_x(run.evals, pos, axis), [100 * r["top5"] for r in run.evals], ":", color=c, alpha=0.6,
                label=(f"{label}: " if label else "") + "top-5")
    drawn = ax.__dict__.setdefault("_torus_targets", set())  # one line per target, however many runs share it
    if run.target and run.target not in drawn:
        drawn.add(run.target)
        ax.axhline(100 * run.target, color="grey", lw=0.8, ls="--")
        ax.text(ax.get_xlim()[0], 100 * run.target, f" target {100 * run.target:g}%", va="bottom", fontsize=8,
                color="grey")
    ax.set_xlabel(_xlabel(axis))
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"top-1 against {'epoch' if axis == 'epoch' else 'wall time'}")
    ax.grid(alpha=0.3)


def _batch_lr(ax, lr, run: Run, pos: dict, c) -> None:
    """The global batch as steps from each stage's first step (stage events), the LR of every interval."""
    points = sorted([(pos.get(st["step"], 0.0) if st["step"] else 0.0, st["global_batch"]) for st in run.stages]
                    + [(pos[r["step"]], r["global_batch"]) for r in run.intervals])
    if points:
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=c, lw=2)
    for st in run.stages:
        x = pos.get(st["step"], 0.0) if st["step"] else 0.0
        ax.axvline(x, color=c, lw=0.6, alpha=0.5)
        ax.annotate(f"stage {st['stage']}: {st['global_batch']}", (x, st["global_batch"]), fontsize=8,
                    xytext=(3, 4), textcoords="offset points", color=c)
    ax.set_ylabel("global batch (solid)")
    ax.set_xlabel("epoch")
    ax.set_title("batch-size stages and learning rate")
    lr.plot([pos[r["step"]] for r in run.intervals], [r["lr"] for r in run.intervals], "--", color=c, alpha=0.8)
    lr.set_ylabel("learning rate (dashed)")
    ax.grid(alpha=0.3)


def _speed(ax, wait, run: Run, pos: dict, c, label) -> None:
    xs = [pos[r["step"]] for r in run.intervals]
    ax.plot(xs, [r["images_per_second"] for r in run.intervals], color=c,
            label=(f"{label}: " if label else "") + "images/s")
    ax.set_xlabel("epoch")
    ax.set_ylabel("images/s over all ranks (solid)")
    ax.set_title("throughput and rank 0's data wait")
    wait.plot(xs, [1000 * r["data_time"] for r in run.intervals], ":", color=c, alpha=0.8)
    wait.set_ylabel("rank 0 data wait per step, ms (dotted)")
    ax.grid(alpha=0.3)


def _ranks(ax, runs: list[Run], colours, notes: list[str]) -> None:
    """Each rank's own work per step (compute + data wait, p50), from summary.json: the stragglers."""
    shown = [(i, r) for i, r in enumerate(runs) if r.ranks]
    width = 0.8 / max(len(shown), 1)
    for k, (i, run) in enumerate(shown):
        xs = [r["rank"] + k * width for r in run.ranks]
        comp = [1000 * r["compute_p50"] for r in run.ranks]
        data = [1000 * r["data_p50"] for r in run.ranks]
        c = colours[i % len(colours)]
        ax.bar(xs, comp, width, color=c, label=f"{run.name}: compute" if len(runs) > 1 else "compute")
        ax.bar(xs, data, width, bottom=comp, color=c, alpha=0.4, hatch="//",
               label=f"{run.name}: data wait" if len(runs) > 1 else "data wait")
    for run in runs:
        if not run.ranks:
            notes.append(f"{run.name}: per-rank work left out ({run.status})" if run.summary is None
                         else f"{run.name}: per-rank work left out (no usable rows in summary.json)")
    if not shown:
        ax.text(0.5, 0.5, "no per-rank figures: they are in summary.json,\nwritten when a run ends",
                ha="center", va="center", transform=ax.transAxes, color="grey")
    ranks = sorted({r["rank"] for run in runs for r in run.ranks})
    if 0 < len(ranks) <= 16:
        ax.set_xticks([r + 0.4 - width / 2 for r in ranks], [str(r) for r in ranks])
    ax.set_xlabel("rank")
    ax.set_ylabel("own work per step, p50 (ms)")
    ax.set_title("per-rank work: compute + data wait (stragglers)")
    ax.grid(alpha=0.3, axis="y")


def _text(ax, runs: list[Run], notes: list[str]) -> None:
    ax.axis("off")
    lines = []
    for run in runs:
        lines.append(f"{run.name}: {run.status}")
        lines += ["  " + t for t in summary_lines(run)]
    lines += [""] + notes + [f"{r.name}: {s}" for r in runs for s in r.skipped]
    ax.text(0, 1, "\n".join(_wrap(line) for line in lines[:40]), va="top", family="monospace", fontsize=8)


def _wrap(line: str, width: int = 60) -> str:
    return "\n".join(textwrap.wrap(line, width, subsequent_indent="    ")) or line


def summary_lines(run: Run) -> list[str]:
    """A few lines about a run: steps, time, speed, accuracy, target."""
    lines = []
    s = run.summary
    if s is not None:
        lines.append(f"{s['steps']} steps on {s['world_size']} ranks (grid {s.get('grid', '?')}), "
                     f"{s['wall_seconds']:.1f} s")
    elif run.intervals:
        last = run.intervals[-1]
        lines.append(f"up to step {last['step']} (epoch {last['epoch'] + 1}), {last['wall_seconds']:.1f} s")
    if run.intervals:
        rates = [r["images_per_second"] for r in run.intervals]
        lines.append(f"images/s: median {sorted(rates)[len(rates) // 2]:,.0f} over {len(rates)} intervals")
    if run.evals:
        best = max(run.evals, key=lambda r: r["top1"])
        lines.append(f"top-1 last {100 * run.evals[-1]['top1']:.2f}% (epoch {run.evals[-1]['epoch'] + 1}), "
                     f"best {100 * best['top1']:.2f}%")
        if run.target:
            hit = next((r for r in run.evals if r["top1"] >= run.target), None)
            missed = "not reached" + (" yet" if run.status.startswith("no summary") else "")
            lines.append(f"target {100 * run.target:g}%: " + (f"passed after epoch {hit['epoch'] + 1}, "
                                                              f"{hit['wall_seconds']:.1f} s" if hit else missed))
    return lines


def report(outs: list[str], png: str | None, json_path: str | None) -> tuple[list[Run], list[str]]:
    """Read every run, write the PNG and/or the JSON; returns the runs and the notes on what was left out."""
    runs = [read_run(o) for o in outs]
    notes: list[str] = []
    if png:
        notes = plot(runs, png)
    if json_path:
        Path(json_path).write_text(json.dumps([r.figures() for r in runs], indent=1) + "\n")
    return runs, notes
