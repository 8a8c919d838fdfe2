"""A run's results read back for `torus-train report`: metrics.jsonl and summary.json, checked, as figures
(for --json) and as one PNG (pure: no torch; matplotlib only inside ``plot``).

Works on a finished run, on one still in progress (no summary.json yet, a torn last line) and on one that
failed. Every value used is checked (type and finiteness); a line or field that fails is left out and said in
``Run.skipped`` naming the file, the line and the field, so the plot shows what is there.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from torus_train.errors import UserError
from torus_train.outfiles import Writer, save_figure, write_json
from torus_train.train.noise_report import has_noise, noise_panel
from torus_train.userfiles import Field, check, check_regular, finite, read_bytes, read_json

WRITER = Writer("report")
"""report's --json and PNG: replaced only when an earlier report wrote them (torus_train/outfiles.py)."""
MAX_COUNT = 2**63 - 1
"""Steps, epochs, batches: what a run writes fits a signed 64-bit integer."""
MAX_FIGURE = 1e30
"""Times, rates, losses and LRs: a magnitude beyond this is no figure a run writes (and would not plot)."""


def _count(name: str, low: int = 0) -> Field:
    return Field(name, "int", low, MAX_COUNT)


def _figure(name: str, low: float | None = 0.0, high: float = MAX_FIGURE, optional: bool = False) -> Field:
    return Field(name, "number", -MAX_FIGURE if low is None else low, high, optional=optional)


INTERVAL_FIELDS = (
    _count("step"),
    _count("epoch"),
    _count("global_batch", 1),
    _figure("lr"),
    _figure("loss", None),
    _figure("images_per_second"),
    _figure("data_time"),
    _figure("step_time"),
    _figure("wall_seconds"),
    _figure("noise_scale", None, optional=True),
)
"""A logging interval's line in metrics.jsonl and each field's type and range (train/report.py log_interval)."""
EVAL_FIELDS = (
    _count("step"),
    _count("epoch"),
    _figure("top1", high=1.0),
    _figure("top5", high=1.0),
    _figure("wall_seconds"),
    _figure("val_loss", None, optional=True),
)
STAGE_FIELDS = (
    _count("step"),
    _count("epoch"),
    _count("stage"),
    _count("global_batch", 1),
    _count("per_rank_batch", 1),
)
DECISION_FIELDS = (
    _count("step"),
    _count("epoch"),
    _count("stage"),
    _figure("threshold"),
    Field("why", "str"),
    _figure("noise_scale", None, optional=True),
)
"""A stage start the schedule's control decided (train/follow.py)."""
RANK_FIELDS = (_count("rank"), _figure("work_p50"), _figure("compute_p50"), _figure("data_p50"))
"""summary.json's per-rank rows (train/report.py gather_ranks): the rank's own work per step and its parts."""
EVENTS = {None: INTERVAL_FIELDS, "eval": EVAL_FIELDS, "stage": STAGE_FIELDS, "stage_decision": DECISION_FIELDS}
"""metrics.jsonl's "event" field (None: a logging interval) -> the fields read from its lines."""
EVENT_LISTS = {None: "intervals", "eval": "evals", "stage": "stages", "stage_decision": "decisions"}
SUMMARY_FIELDS = (
    _count("steps"),
    _figure("wall_seconds"),
    _count("world_size", 1),
    Field("grid", "str", optional=True),
    Field("target_top1", "number", 0, 1, low_open=True, optional=True),
    Field("classes", "list", optional=True),
    Field("class_names", "list", optional=True),
)
"""What report reads from summary.json (nothing else of it is kept or written back)."""
SHOWN_SKIPS = 5  # problems named one by one; the rest are counted


@dataclass
class Run:
    """What one output folder holds, checked."""

    out: Path
    intervals: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    summary: dict | None = None
    ranks: list[dict] = field(default_factory=list)
    target: float | None = None
    skipped: list[str] = field(default_factory=list)
    skipped_lines: int = 0
    """Lines of metrics.jsonl left out as unusable (not JSON, wrong types, out of range), all counted."""

    @property
    def name(self) -> str:
        return self.out.name

    @property
    def status(self) -> str:
        if self.summary is not None:
            return "finished"
        return "failed" if _failed(self.out) else "no summary.json: in progress, or stopped"

    def figures(self) -> dict:
        """Everything read and checked, for --json (the PNG draws the curves by epoch and the ranks)."""
        return {
            "out": str(self.out),
            "status": self.status,
            "target_top1": self.target,
            "intervals": self.intervals,
            "evals": self.evals,
            "stages": self.stages,
            "stage_decisions": self.decisions,
            "ranks": self.ranks,
            "summary": self.summary,
            "skipped_lines": self.skipped_lines,
            "skipped": self.skipped,
        }


def _failed(out: Path) -> bool:
    """A rank left its failure marker (logs/rankNNNNN.failed, ranks/diagnosis.py)."""
    return any((out / "logs").glob("rank*.failed"))


def _checked(rec: object, fields: tuple[Field, ...], where: str) -> tuple[dict | None, str]:
    """(the record's fields, converted, without the missing optional ones; '') or (None, the first problem)."""
    try:
        kept = check(rec, fields, where)
    except UserError as e:
        return None, str(e)
    return {k: v for k, v in kept.items() if v is not None}, ""


def read_metrics(run: Run) -> None:
    """Every usable line of metrics.jsonl into the run; each other line is skipped, counted and (the first
    SHOWN_SKIPS) named. A FIFO or device is refused before it is opened."""
    path = run.out / "metrics.jsonl"
    lines = read_bytes(path, "report").split(b"\n")
    problems = []
    for i, raw in enumerate(lines, 1):
        if raw.strip():
            problem = _take_line(run, raw, f"{path.name} line {i}", torn=i == len(lines))
            if problem:
                problems.append(problem)
    run.skipped_lines = len(problems)
    run.skipped += [f"skipped {p}" for p in problems[:SHOWN_SKIPS]]
    if len(problems) > SHOWN_SKIPS:
        run.skipped.append(f"skipped {len(problems) - SHOWN_SKIPS} more line(s) of {path.name}")


def _take_line(run: Run, raw: bytes, where: str, torn: bool) -> str:
    """Add one line of metrics.jsonl to the run; '' when used (or another event, not plotted), else why not.
    torn: the last line, with no newline after it (a run still writing, or stopped mid-line)."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"{where}: byte {e.start} is not UTF-8 text"
    except (ValueError, RecursionError):
        return f"{where}: {'torn last line (run still writing or stopped)' if torn else 'not JSON'}"
    if not isinstance(rec, dict):
        return f"{where}: not a JSON object"
    kind = rec.get("event")
    if kind is not None and not isinstance(kind, str):
        return f"{where}: field 'event' is {type(kind).__name__}, not a string"
    if kind not in EVENTS:
        return ""  # other events (resume, ...) are not plotted
    kept, problem = _checked(rec, EVENTS[kind], where)
    if kept is not None:
        getattr(run, EVENT_LISTS[kind]).append(kept)
    return problem


def read_summary(run: Run) -> None:
    """summary.json's checked fields and per-rank rows; a file that cannot be used is said in run.skipped (a FIFO
    or device is refused before it is opened)."""
    path = run.out / "summary.json"
    if not path.exists():
        return
    check_regular(path, "report")
    try:
        s = read_json(path, "report")
    except UserError as e:
        run.skipped.append(f"skipped {path.name}: {str(e).removeprefix('report: ')}; per-rank figures left out")
        return
    summary, bad = _checked(s, SUMMARY_FIELDS, path.name)
    run.summary = summary
    if bad or summary is None:
        run.skipped.append(f"skipped {bad}; summary left out")
        return
    run.target = summary.get("target_top1")
    _check_classes(run, summary, path.name)
    rows = s.get("ranks")
    if rows is None:
        rows = (s.get("stragglers") or {}).get("slowest") if isinstance(s.get("stragglers"), dict) else None
    if not isinstance(rows, list):
        run.skipped.append(f"{path.name}: no per-rank rows ('ranks'); per-rank work left out")
        return
    for i, r in enumerate(rows):
        kept, bad = _checked(r, RANK_FIELDS, f"{path.name} ranks[{i}]")
        if kept is None:
            run.skipped.append(f"skipped {bad}")
        else:
            run.ranks.append(kept)


def _check_classes(run: Run, s: dict, where: str) -> None:
    """The trained classes and their words in summary ``s`` (train/report.py data_classes): strings, the names
    one per class; anything else is left out and said."""
    classes, names = s.get("classes"), s.get("class_names")
    if classes is not None and not all(isinstance(c, str) for c in classes):
        run.skipped.append(f"{where}: classes: not a list of strings; the class names left out")
        s.pop("classes"), s.pop("class_names", None)
    elif names is not None and (
        classes is None or len(names) != len(classes) or not all(isinstance(n, str) for n in names)
    ):
        run.skipped.append(f"{where}: class_names: not one string per class; left out")
        s.pop("class_names")


def class_line(summary: dict, shown: int = 3) -> str | None:
    """'classes: 1,000 (n01440764 tench, Tinca tinca; n01443537 goldfish, ...; ...)' or None without classes."""
    classes = summary.get("classes")
    if not classes:
        return None
    names = summary.get("class_names") or [""] * len(classes)
    first = "; ".join(f"{c} {n}".strip() for c, n in zip(classes[:shown], names, strict=False))
    return f"classes: {len(classes):,} ({first}{'; ...' if len(classes) > shown else ''})"


def read_target(run: Run) -> None:
    """The accuracy target from job.json when summary.json has none (a run in progress); job.json is optional
    here, so one that cannot be read (or is no regular file) is passed over."""
    if run.target is not None:
        return
    try:
        t = read_json(run.out / "job.json", "report")["spec"]["eval"]["target_top1"]
    except (UserError, KeyError, TypeError):
        return
    if finite(t) and 0 < t <= 1:
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


# --------------------------------------------------------------------------------------------------------
# the PNG: what TensorBoard does not show (OUT/tensorboard/ has every scalar against step and wall time)
# --------------------------------------------------------------------------------------------------------
def plot(runs: list[Run], path: str | Path) -> list[str]:
    """Write the PNG of ``runs``: loss and top-1 against epoch with the batch-size stages and the target, each
    rank's own work per step (summary.json), and where measured the noise scale against the global batch.
    Returns lines saying what could not be drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noisy = any(has_noise(run) for run in runs)  # a panel for the noise scale where a run measured it
    fig, axes = plt.subplots(1, 4 if noisy else 3, figsize=(24 if noisy else 18, 5.2))
    loss_ax, top1_ax, ranks_ax = axes[:3]
    notes: list[str] = []
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        c = colours[i % len(colours)]
        label = f"{run.name}: " if len(runs) > 1 else ""
        pos = epoch_position(run)
        _loss(loss_ax, run, pos, c, label)
        _top1(top1_ax, run, pos, c, label)
        for ax in (loss_ax, top1_ax):
            _stages(ax, run, pos, c)
        if noisy:
            noise_panel(axes[3], run, pos, c, label)
        if not run.intervals:
            notes.append(f"{run.name}: no training intervals in metrics.jsonl: the training loss left out")
        if not run.evals:
            notes.append(f"{run.name}: no evaluation in metrics.jsonl: top-1 left out")
    _targets(top1_ax, runs)
    _ranks(ranks_ax, runs, colours, notes)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    # the run's summary as the title: the picture says what it shows on its own
    summaries = [f"{run.name} ({run.status}): {'; '.join(summary_lines(run))}" for run in runs]
    fig.suptitle("\n".join(textwrap.fill(text, 160, subsequent_indent="    ") for text in summaries), fontsize=10)
    fig.tight_layout()
    try:
        save_figure(fig, path, WRITER, "--png", dpi=90)
    finally:
        plt.close(fig)
    return notes


def _epochs(records: list[dict], pos: dict) -> list[float]:
    return [pos[r["step"]] for r in records]


def _loss(ax, run: Run, pos: dict, c, label: str) -> None:
    if run.intervals:
        ax.plot(_epochs(run.intervals, pos), [r["loss"] for r in run.intervals], color=c, label=label + "train")
    ev = [r for r in run.evals if "val_loss" in r]
    if ev:
        ax.plot(_epochs(ev, pos), [r["val_loss"] for r in ev], "o--", color=c, ms=4, label=label + "validation")
    ax.set(xlabel="epoch", ylabel="loss", title="loss, with the batch-size stages")
    ax.grid(alpha=0.3)


def _top1(ax, run: Run, pos: dict, c, label: str) -> None:
    if run.evals:
        xs = _epochs(run.evals, pos)
        ax.plot(xs, [100 * r["top1"] for r in run.evals], "o-", color=c, label=label + "top-1")
        ax.plot(xs, [100 * r["top5"] for r in run.evals], ":", color=c, alpha=0.6, label=label + "top-5")
    ax.set(xlabel="epoch", ylabel="validation accuracy (%)", title="top-1 and top-5, with the target")
    ax.grid(alpha=0.3)


def _stages(ax, run: Run, pos: dict, c) -> None:
    """A line at each batch-size switch, labelled with the stage's global batch (metrics.jsonl's stage events)."""
    for st in run.stages:
        x = pos.get(st["step"], 0.0) if st["step"] else 0.0
        ax.axvline(x, color=c, lw=0.6, alpha=0.5)
        ax.annotate(
            f"batch {st['global_batch']}",
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 4),
            textcoords="offset points",
            fontsize=8,
            color=c,
        )


def _targets(ax, runs: list[Run]) -> None:
    """One dashed line per accuracy target, however many runs share it."""
    for target in sorted({r.target for r in runs if r.target}):
        ax.axhline(100 * target, color="grey", lw=0.8, ls="--")
        ax.annotate(
            f" target {100 * target:g}%",
            (0, 100 * target),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
            color="grey",
        )


def _ranks(ax, runs: list[Run], colours, notes: list[str]) -> None:
    """Each rank's own work per step (compute + data wait, p50), from summary.json: the stragglers."""
    shown = [(i, r) for i, r in enumerate(runs) if r.ranks]
    width = 0.8 / max(len(shown), 1)
    for k, (i, run) in enumerate(shown):
        xs = [r["rank"] + k * width for r in run.ranks]
        comp = [1000 * r["compute_p50"] for r in run.ranks]
        data = [1000 * r["data_p50"] for r in run.ranks]
        c, label = colours[i % len(colours)], f"{run.name}: " if len(runs) > 1 else ""
        ax.bar(xs, comp, width, color=c, label=label + "compute")
        ax.bar(xs, data, width, bottom=comp, color=c, alpha=0.4, hatch="//", label=label + "data wait")
    for run in runs:
        if not run.ranks:
            why = run.status if run.summary is None else "no usable rows in summary.json"
            notes.append(f"{run.name}: per-rank work left out ({why})")
    if not shown:
        ax.text(
            0.5,
            0.5,
            "no per-rank figures: they are in summary.json,\nwritten when a run ends",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )
    ranks = sorted({r["rank"] for run in runs for r in run.ranks})
    if 0 < len(ranks) <= 16:
        ax.set_xticks([r + 0.4 - width / 2 for r in ranks], [str(r) for r in ranks])
    ax.set(xlabel="rank", ylabel="own work per step, p50 (ms)", title="per-rank work: compute + data wait")
    ax.grid(alpha=0.3, axis="y")


def summary_lines(run: Run) -> list[str]:
    """A few lines about a run: steps, time, speed, accuracy, target."""
    lines = []
    s = run.summary
    if s is not None:
        ranks = f"{s['world_size']} rank" + ("s" if s["world_size"] != 1 else "")
        lines.append(f"{s['steps']} steps on {ranks} (grid {s.get('grid', '?')}), {s['wall_seconds']:.1f} s")
        classes = class_line(s)
        if classes:
            lines.append(classes)
    elif run.intervals:
        last = run.intervals[-1]
        lines.append(f"up to step {last['step']} (epoch {last['epoch'] + 1}), {last['wall_seconds']:.1f} s")
    if run.intervals:
        rates = [r["images_per_second"] for r in run.intervals]
        lines.append(f"images/s: median {sorted(rates)[len(rates) // 2]:,.0f} over {len(rates)} intervals")
    if run.evals:
        best = max(run.evals, key=lambda r: r["top1"])
        lines.append(
            f"top-1 last {100 * run.evals[-1]['top1']:.2f}% (epoch {run.evals[-1]['epoch'] + 1}), "
            f"best {100 * best['top1']:.2f}%"
        )
        if run.target:
            hit = next((r for r in run.evals if r["top1"] >= run.target), None)
            missed = "not reached" + (" yet" if run.status.startswith("no summary") else "")
            lines.append(
                f"target {100 * run.target:g}%: "
                + (f"passed after epoch {hit['epoch'] + 1}, {hit['wall_seconds']:.1f} s" if hit else missed)
            )
    return lines


def report(outs: list[str], png: str | None, json_path: str | None) -> tuple[list[Run], list[str]]:
    """Read every run, write the PNG and/or the JSON; returns the runs and the notes on what was left out.
    The output paths are checked by the command before (torus_train/outfiles.py)."""
    runs = [read_run(o) for o in outs]
    notes: list[str] = []
    if png:
        notes = plot(runs, png)
    if json_path:
        write_json(
            json_path,
            {"runs": [r.figures() for r in runs], "skipped_lines": sum(r.skipped_lines for r in runs)},
            WRITER,
        )
    return runs, notes
