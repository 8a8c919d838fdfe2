"""All-reduce sweep in nccl-tests' conventions (all_reduce_perf): sizes, columns, busbw, #wrong.

This module is the pure part (sizes, bandwidths, rows, the tables; no torch); the measurement inside a rank is
torus_train.bench.sweep.

Conventions (nccl-tests doc/PERFORMANCE.md): algbw = bytes / time (GB = 1e9 B); busbw = algbw * 2(n-1)/n,
comparable to a link's bandwidth whatever the rank count. Time is the mean over -n iterations after -w warm-up
iterations, taken on every rank and reduced with MAX (the slowest rank is the collective's time). The -n
iterations of the algorithms at one size run in alternating rounds, so they are compared under the same load.
#wrong counts elements farther than a tolerance from a float64 sum computed from a formula, never from the
algorithm's own output.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from torus_train import outfiles
from torus_train.errors import UserError
from torus_train.job.algorithms import BASELINE, runnable
from torus_train.job.launchers.local import MAX_LOCAL_RANKS as LOCAL_RANKS_CAP
from torus_train.job.topology import Grid, check_grid_size, choose_grid
from torus_train.outfiles import Writer
from torus_train.usernumbers import float_of

DTYPES = {
    "float": "float32",
    "float32": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
SHORT_TYPE = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}
# relative precision of each type (unit roundoff), for the #wrong tolerance
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}

ROUNDS = 4  # timed iterations of a point are split into this many rounds, alternating the algorithms

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str) -> int:
    """'64K', '1M', '2G', '4096' (nccl-tests suffixes are powers of 1024) -> bytes."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"{flag} {text!r} is not a size; use bytes with an optional K, M or G suffix, e.g. 1K or 64M")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    value = float_of(m.group(1), flag) * mult
    if not value >= 1:
        raise UserError(f"{flag} {text!r} must be at least 1 byte")
    if value > MAX_BYTES:
        raise UserError(
            f"{flag} {_short(text)} is more than {MAX_BYTES >> 30} GiB, the most one rank's buffers are "
            f"sized for; give a smaller size, e.g. 64M"
        )
    return int(value)


MAX_BYTES = 64 << 30
"""The largest message: each rank holds a few buffers of it (nccl-tests' largest default sweeps stop at 8 GiB)."""


def _short(text: str) -> str:
    return repr(text) if len(text) <= 24 else f"'{text[:12]}...' ({len(text)} characters)"


@dataclass
class BenchConfig:
    """What one `bench allreduce` run measures."""

    min_bytes: int = 1 << 10
    """-b: smallest message in bytes."""
    max_bytes: int = 64 << 20
    """-e: largest message in bytes."""
    factor: int = 2
    """-f: multiply the size by this between steps."""
    iters: int = 20
    """-n: timed iterations per size and algorithm."""
    warmup: int = 5
    """-w: untimed iterations before timing."""
    check: bool = True
    """-c: count wrong elements against a float64 reference."""
    dtype: str = "float32"
    """-d: float32, float16 or bfloat16."""
    algos: list = field(default_factory=lambda: list(runnable()))
    """--algo: the algorithms, measured interleaved at every size (default: every one a rank can run)."""
    max_seconds_per_point: float = 10.0
    """Cap on the timed iterations of one (size, algorithm) so a sweep of big sizes stays bounded."""

    def __post_init__(self) -> None:
        if self.min_bytes > self.max_bytes:
            raise UserError(f"-b {self.min_bytes} is larger than -e {self.max_bytes}; the sweep runs from -b up to -e")
        if self.factor < 2:
            raise UserError(f"-f {self.factor} must be at least 2")
        if self.iters < 1 or self.warmup < 0:
            raise UserError("-n must be at least 1 and -w at least 0")
        if self.dtype not in ITEMSIZE:
            raise UserError(f"-d {self.dtype!r} is not supported; use float, half or bfloat16")
        known = runnable()
        bad = [a for a in self.algos if a not in known]
        if bad or not self.algos:
            raise UserError(f"--algo {','.join(bad) or '(empty)'} is unknown; choose from {','.join(known)}")

    def sizes(self) -> list[int]:
        """Message sizes in bytes, rounded down to whole elements (at least one)."""
        item = ITEMSIZE[self.dtype]
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(max(item, s // item * item))
            s *= self.factor
        return out


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n."""
    return 2.0 * (n - 1) / n if n > 1 else 1.0


@dataclass
class Row:
    """One measured point; the JSON keys of `--json`."""

    algo: str
    backend: str
    grid: str
    size_bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int


def make_row(
    algo: str, backend: str, grid: str, world: int, size_bytes: int, dtype: str, seconds: float, wrong: int
) -> Row:
    algbw = size_bytes / seconds / 1e9 if seconds > 0 else 0.0
    return Row(
        algo,
        backend,
        grid,
        size_bytes,
        size_bytes // ITEMSIZE[dtype],
        dtype,
        seconds * 1e6,
        algbw,
        algbw * busbw_factor(world),
        wrong,
    )


# --- where the ranks run --------------------------------------------------------------------------
DEFAULT_CPU_RANKS = 4
"""Ranks (2x2) on a machine with fewer than 2 GPUs, or when the ranks are CPU processes."""
MAX_LOCAL_RANKS = LOCAL_RANKS_CAP
"""Local ranks bench spawns on this machine at most, as `run` (job/launchers/local.py; a larger world is started
with mpirun or srun)."""


@dataclass(frozen=True)
class BenchRanks:
    """Where one `bench allreduce` runs: how many ranks, their grid and their backend, each with why."""

    world: int
    grid: Grid
    grid_why: str
    backend: str
    backend_why: str
    """Said in the header ('' when --backend named it)."""


def bench_ranks(
    nprocs: int | None,
    grid: Grid | None,
    backend: str | None,
    gpus: int,
    launched_world: int | None = None,
    gpus_why: str = "",
) -> BenchRanks:
    """The ranks of a sweep (pure; refuses what cannot run with one line). NCCL runs one rank per GPU, so two
    ranks never share a device: with no --backend, G >= 2 GPUs here give G ranks on NCCL (grid chosen for G)
    and fewer give 4 CPU ranks on gloo; an explicit --backend nccl with more ranks than GPUs is refused.
    launched_world: the world of ranks a launcher started by hand (mpirun/srun), whose placement is theirs.
    gpus_why: why CUDA shows fewer GPUs than asked (job/gpus.py), for the refusals' line."""
    launched = launched_world is not None
    if launched_world is not None:
        world = launched_world
    elif nprocs:
        world = nprocs
    elif grid:
        world = grid.size
    elif backend in (None, "nccl") and (gpus >= 2 or (backend == "nccl" and gpus)):
        world = gpus
    else:
        world = DEFAULT_CPU_RANKS
    if world < 1:
        raise UserError(f"--nprocs {nprocs} must be at least 1")
    if not launched and world > MAX_LOCAL_RANKS:
        raise UserError(
            f"{world} local ranks: at most {MAX_LOCAL_RANKS} are spawned here; start more with mpirun or srun"
        )
    if grid is not None:
        check_grid_size(grid, world, "the rank count" if launched else "--nprocs")
        why = "given by --grid"
    else:
        grid, why = choose_grid(world)
        why = "chosen: " + why
    backend, backend_why = _backend(backend, world, gpus, launched, gpus_why)
    return BenchRanks(world, grid, why, backend, backend_why)


def _backend(backend: str | None, world: int, gpus: int, launched: bool, gpus_why: str = "") -> tuple[str, str]:
    """(backend, why) for bench_ranks."""
    if backend == "nccl" and not launched:
        if not gpus:
            why = f" ({gpus_why})" if gpus_why else ""
            raise UserError(f"--backend nccl needs CUDA GPUs; CUDA shows none here{why} (use gloo or mpi)")
        if world > gpus:
            raise UserError(
                f"--backend nccl: {world} ranks but {gpus} GPU(s) here, and NCCL runs one rank per GPU; "
                f"run CPU ranks with --backend gloo, at most {gpus} rank(s) on NCCL (--nprocs), or on "
                "more GPUs (mpirun, srun)"
            )
    if backend is not None:
        return backend, ""
    if launched:
        return ("nccl", "GPUs here") if gpus else ("gloo", "no GPU here")
    if gpus >= 2 and world <= gpus:
        return "nccl", f"one rank per GPU ({gpus} GPUs here)"
    if not gpus:
        return "gloo", "CPU ranks: no GPU here"
    if gpus == 1:
        return "gloo", "CPU ranks: one GPU here, and NCCL runs one rank per GPU (an all-reduce needs 2 or more)"
    return "gloo", (
        f"CPU ranks: {world} ranks but {gpus} GPUs here, and NCCL runs one rank per GPU "
        f"(--nprocs {gpus} to measure NCCL)"
    )


# --- output -------------------------------------------------------------------------------------
def header(backend: str, grid: str, world: int, notes: list[str]) -> str:
    lines = [f"# torus-train bench allreduce: backend {backend}, grid {grid} ({world} ranks)"]
    lines += [f"#   {n}" for n in notes]
    return "\n".join(lines)


def table(rows: list[Row], algo: str) -> str:
    """One algorithm's table in all_reduce_perf's layout (in-place columns only), with its footer."""
    mine = [r for r in rows if r.algo == algo]
    out = [
        f"# algo: {algo}",
        "#                                                      in-place",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
    ]
    for r in mine:
        out.append(
            f"{r.size_bytes:12d}  {r.count:12d}  {SHORT_TYPE[r.dtype]:>8s}     sum      -1  "
            f"{_fmt_time(r.time_us):>7s}  {r.algbw_gbps:6.2f}  {r.busbw_gbps:6.2f}  {r.wrong:6d}"
        )
    bad = sum(r.wrong for r in mine)
    avg = sum(r.busbw_gbps for r in mine) / len(mine) if mine else 0.0
    out.append(f"# Out of bounds values : {bad} {'OK' if bad == 0 else 'FAILED'}")
    out.append(f"# Avg bus bandwidth    : {avg:.4f}")
    return "\n".join(out)


def ratio_table(rows: list[Row], base: str = BASELINE) -> str:
    """busbw of each other algorithm divided by the baseline's, per size (measured in the same run)."""
    others = [a for a in dict.fromkeys(r.algo for r in rows) if a != base]
    by = {(r.algo, r.size_bytes): r for r in rows}
    sizes = sorted({r.size_bytes for r in rows})
    if base not in {r.algo for r in rows} or not others:
        return ""
    out = [
        "# busbw ratio to " + base + " (same run, interleaved)",
        "#       size  " + "  ".join(f"{a:>12s}" for a in others),
    ]
    for s in sizes:
        b = by[(base, s)].busbw_gbps
        cells = [f"{by[(a, s)].busbw_gbps / b:12.2f}" if b > 0 else f"{'-':>12s}" for a in others]
        out.append(f"{s:12d}  " + "  ".join(cells))
    return "\n".join(out)


def _fmt_time(us: float) -> str:
    return f"{us:.1f}" if us < 1e6 else f"{us:.0f}"


ROW_KEYS = frozenset(("algo", "grid", "size_bytes", "time_us", "busbw_gbps", "wrong"))
"""Keys every row of `--json` has (a Row's, and those of earlier versions): how an earlier output is known."""


def is_bench_rows(doc: object) -> bool:
    """True for a `bench allreduce --json` output: a non-empty list of rows. It stays a plain list (plan
    calibrate and the scripts read it as one), so it carries no marker field and is known by its shape."""
    return isinstance(doc, list) and bool(doc) and all(isinstance(r, dict) and r.keys() >= ROW_KEYS for r in doc)


WRITER = Writer("bench allreduce", recognise=is_bench_rows)
"""--json and --plot replace only an earlier output of `bench allreduce` (torus_train/outfiles.py)."""


def write_json(rows: list[Row], path: str) -> None:
    outfiles.write_json(path, [asdict(r) for r in rows], WRITER)


def plot(rows: list[Row], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algo in dict.fromkeys(r.algo for r in rows):
        pts = [(r.size_bytes, r.busbw_gbps) for r in rows if r.algo == algo]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        outfiles.save_figure(fig, path, WRITER, "--plot", dpi=110)
    finally:
        plt.close(fig)
