"""`plan --plot` (all-reduce time over GPU counts per algorithm) and `plan --png` (one step's bucket timeline).

matplotlib is optional (`pip install 'torus-train[plot]'`) and imported only when a picture is drawn.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from torus_train.errors import UserError
from torus_train.outfiles import Writer, save_figure
from torus_train.plan.networks import Network
from torus_train.plan.search import Plan, sweep

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn (the [plot] extra)
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

WRITER = Writer("plan")
"""The main plan's --json, --plot and --png: replaced only when an earlier `plan` wrote them."""
PLOT_COUNTS = (64, 128, 256, 512, 1024, 1088, 2048, 2176, 3456, 4096)
"""GPU counts on the plot's x axis: powers of two plus the paper's 1,088, 2,176 and 3,456."""


def require_matplotlib(flag: str = "--plot") -> None:
    """UserError naming the flag when matplotlib is not installed (checked before any work)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise UserError(f"{flag} needs matplotlib: pip install 'torus-train[plot]'") from None


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(net: Network, nbytes: int, path: str, what: str, placement: str, gpus: int) -> None:
    """PNG of the predicted all-reduce time of `nbytes` against GPU count (PLOT_COUNTS) per algorithm, the torus
    on its fastest grid; a dotted line at `gpus`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algo, points in sweep(net, nbytes, PLOT_COUNTS, placement).items():
        ax.plot([n for n, _ in points], [s * 1e3 for _, s in points], marker="o", label=algo)
    ax.axvline(gpus, color="grey", linestyle=":", label=f"--gpus {gpus}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [n for n in PLOT_COUNTS if n & (n - 1) == 0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs (torus on its fastest grid; hierarchical with one leader per node)")
    ax.set_ylabel("predicted all-reduce time (ms)")
    ax.set_title(f"{net.name}: {what}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    _save(plt, fig, path, "--plot")


def plot_timeline(p: Plan, path: str) -> None:
    """One step from the end of the forward pass: the backward pass split at the buckets' ready times, and each
    algorithm's exchanges (one bar per bucket, queued) on its own row."""
    plt = _pyplot()
    algos = list(p.algorithms)
    first = p.algorithms[algos[0]].timeline
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * (len(algos) + 1)))
    prev = 0.0
    for b in first["buckets"]:
        ax.barh(
            0,
            (b["ready_seconds"] - prev) * 1e3,
            left=prev * 1e3,
            color=colors(b["index"] % 10),
            edgecolor="black",
            height=0.6,
        )
        prev = b["ready_seconds"]
    for row, algo in enumerate(algos, start=1):
        _timeline_row(ax, row, p.algorithms[algo].timeline, colors)
    ax.axvline(first["backward_seconds"] * 1e3, color="grey", linestyle=":")
    ax.set_yticks(range(len(algos) + 1))
    ax.set_yticklabels(["backward (per bucket)"] + [f"{a} all-reduce" for a in algos])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the backward pass (dotted: its end)")
    ax.set_title(
        f"{p.network.name}, {p.gpus} GPUs, grid {p.grid}: {p.model} {p.gradient_dtype}, "
        f"{p.per_gpu_batch}/GPU, {len(first['buckets'])} buckets"
    )
    _save(plt, fig, path, "--png")


def _save(plt: ModuleType, fig: Figure, path: str, flag: str) -> None:
    fig.tight_layout()
    try:
        save_figure(fig, path, WRITER, flag, dpi=120)
    finally:
        plt.close(fig)


def _timeline_row(ax: Axes, row: int, t: dict, colors: Colormap) -> None:
    """One algorithm's queued exchanges (a bar per bucket) and its exposed time and efficiency."""
    for b in t["buckets"]:
        ax.barh(
            row,
            b["allreduce_seconds"] * 1e3,
            left=b["start_seconds"] * 1e3,
            color=colors(b["index"] % 10),
            edgecolor="black",
            height=0.6,
        )
    extra = f" + {t['overhead_seconds'] * 1e3:.2f} ms overhead" if t["overhead_seconds"] else ""
    ax.text(
        t["buckets"][-1]["end_seconds"] * 1e3,
        row,
        f"  exposed {t['exposed_seconds'] * 1e3:.2f} ms{extra}, eff. {t['scaling_efficiency'] * 100:.1f}%",
        va="center",
        fontsize=8,
    )
