"""Alpha-beta-gamma cost model of gradient all-reduce on a described GPU cluster (pure; numpy, no torch).

What it predicts, per algorithm (``flat`` ring, binomial ``tree``, ``hierarchical``, 2D ``torus``), for one
all-reduce of n bytes over a Grid laid out on nodes of K GPUs:

* sequential communication steps (a ring step or a tree round is one step: every rank waits for it),
* bytes each rank sends over inter-node links (the largest over ranks),
* seconds: each step costs ``max(alpha + chunk / bandwidth)`` over the kinds of link its edges use, plus
  ``gamma`` seconds per byte summed (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009).

How links are shared (the one modelling choice that decides the torus against the others):
* an edge between two ranks of one node uses the intra-node link (``intra``: bandwidth per GPU per direction
  to its ring neighbour, and latency);
* an edge that leaves a node is a flow on the node's NICs: with F flows leaving the same node in the same step,
  each flow gets ``min(nic_bandwidth, nics_per_node * nic_bandwidth / F)``; one flow cannot use more than one
  NIC. So the torus's vertical phase (K flows per node, each carrying 1/X of the data) and the hierarchical
  leader's (one flow carrying all of it) differ exactly as Mikami et al. 2018 argue.

A training step (``step_cost``): compute = per-rank batch / single-GPU throughput; the backward pass is a
stated fraction of it (2/3: backward costs about twice the forward); a stated fraction ``overlap`` of the
backward pass hides communication; step = compute + max(0, allreduce - overlap * backward); scaling efficiency
= compute / step (throughput(N) / (N * single-GPU throughput), the definition used in the paper's table).
Not modelled: stragglers, data loading, BatchNorm statistics, optimizer time, bucketing into several calls.
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from torus_train.errors import UserError
from torus_train.job.topology import Grid, GridError, check_grid_size, factor_pairs, parse_grid

ALGORITHMS = ("flat", "tree", "hierarchical", "torus")
"""Algorithms the model knows, in the order tables print them."""


class NetworkError(UserError):
    """A network description (preset name or TOML file) that cannot be used; the message names the field."""


# ------------------------------------------------------------------------------------------------
# Network description
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """One kind of link: its bandwidth per direction and its per-message latency."""

    bandwidth_gbytes_per_s: float
    """Bandwidth per direction in GB/s (1e9 bytes per second): per GPU for intra-node links, per NIC across nodes."""
    latency_us: float
    """Per-message latency (alpha) in microseconds, as seen by the communication library."""

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / (self.bandwidth_gbytes_per_s * 1e9)

    @property
    def alpha(self) -> float:
        """Seconds per message."""
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Network:
    """A cluster as the cost model sees it: nodes of GPUs, links inside and between nodes, the GPU's speed."""

    name: str
    """Preset name or file name; printed with every prediction."""
    gpus_per_node: int
    """GPUs (ranks) per node; consecutive ranks share a node, so a row of X >= K ranks fills whole nodes."""
    intra: Link
    """Link between two GPUs of one node (per GPU, per direction, to its ring neighbour)."""
    inter: Link
    """One NIC of a node (per direction), with the latency of a message between nodes."""
    nics_per_node: int
    """NICs per node; flows leaving a node share them, one flow uses at most one."""
    gpu: str = "unknown GPU"
    """The GPU model, for the printout."""
    reduce_gbytes_per_s: float = 300.0
    """Rate at which a GPU sums received data into its buffer, GB/s; gamma = 1 / this (memory-bound: about a
    third of the memory bandwidth, since a sum reads two operands and writes one)."""
    images_per_second: dict = field(default_factory=dict)
    """Single-GPU training throughput per model name (images/s), where a figure is known."""
    description: str = ""
    """One line saying what this network is."""
    sources: tuple = ()
    """Where each figure comes from (datasheets, papers, measurements)."""

    @property
    def gamma(self) -> float:
        """Seconds per byte reduced."""
        return 1.0 / (self.reduce_gbytes_per_s * 1e9)

    def check(self, where: str = "network") -> "Network":
        """Raise NetworkError naming the field when a figure is not usable; return self."""
        def positive(path: str, value, integer: bool = False) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if integer:
                ok = ok and float(value).is_integer()
            if not ok or value <= 0:
                kind = "a positive integer" if integer else "a positive number"
                raise NetworkError(f"{where}.{path}: {value!r} must be {kind}")

        positive("gpus_per_node", self.gpus_per_node, integer=True)
        positive("nics_per_node", self.nics_per_node, integer=True)
        positive("intra.bandwidth_gbytes_per_s", self.intra.bandwidth_gbytes_per_s)
        positive("inter.bandwidth_gbytes_per_s", self.inter.bandwidth_gbytes_per_s)
        positive("reduce_gbytes_per_s", self.reduce_gbytes_per_s)
        for path, value in (("intra.latency_us", self.intra.latency_us), ("inter.latency_us", self.inter.latency_us)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise NetworkError(f"{where}.{path}: {value!r} must be a number >= 0")
        for model, ips in self.images_per_second.items():
            positive(f"images_per_second.{model}", ips)
        return self

    def describe(self) -> list[str]:
        """Printable lines with every parameter the prediction uses."""
        k = self.gpus_per_node
        return [
            f"network {self.name}: {self.description}".rstrip(": "),
            f"  {k} x {self.gpu} per node; intra-node {self.intra.bandwidth_gbytes_per_s:g} GB/s per GPU per "
            f"direction, {self.intra.latency_us:g} us",
            f"  {self.nics_per_node} NIC(s) per node at {self.inter.bandwidth_gbytes_per_s:g} GB/s per direction "
            f"({self.nics_per_node * self.inter.bandwidth_gbytes_per_s / k:g} GB/s per GPU), "
            f"{self.inter.latency_us:g} us",
            f"  reduction {self.reduce_gbytes_per_s:g} GB/s per GPU (gamma)",
        ]


# Presets. Every figure is from a datasheet or a paper, stated in `sources`; none is fitted to a result.
PRESETS: dict[str, Network] = {
    "abci-v100": Network(
        name="abci-v100",
        description="ABCI compute node (Sony's runs): 4 V100 SXM2 on NVLink 2, 2 x InfiniBand EDR",
        gpus_per_node=4,
        intra=Link(50.0, 2.0),
        inter=Link(12.5, 2.0),
        nics_per_node=2,
        gpu="V100 SXM2 16GB",
        reduce_gbytes_per_s=300.0,
        images_per_second={"resnet50": 1376.0},
        sources=(
            "NVLink 2: 25 GB/s per link per direction (NVIDIA V100 datasheet); ABCI's 4 GPUs are fully connected "
            "with 2 links per pair = 50 GB/s per direction to a ring neighbour",
            "InfiniBand EDR: 100 Gb/s = 12.5 GB/s per direction per HCA, 2 HCAs per ABCI node (ABCI system overview)",
            "latency: NVLink and IB about 1-2 us at MPI/NCCL level; 2 us taken for both",
            "V100 HBM2 900 GB/s; a sum reads 2 and writes 1 -> 300 GB/s reduction rate",
            "ResNet-50 v1.5 mixed precision, 1 V100: about 1,376 img/s (NVIDIA DeepLearningExamples)",
        ),
    ),
    "dgx-h100": Network(
        name="dgx-h100",
        description="DGX H100: 8 H100 SXM on NVLink 4 / NVSwitch, 8 x ConnectX-7 NDR400",
        gpus_per_node=8,
        intra=Link(450.0, 2.0),
        inter=Link(50.0, 2.0),
        nics_per_node=8,
        gpu="H100 SXM 80GB",
        reduce_gbytes_per_s=1100.0,
        images_per_second={"resnet50": 3000.0},
        sources=(
            "NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction per GPU through NVSwitch (NVIDIA H100 datasheet)",
            "NDR400 InfiniBand: 400 Gb/s = 50 GB/s per direction per NIC, 8 per DGX H100 (NVIDIA DGX H100 datasheet)",
            "latency: 2 us intra and inter (NVLink/IB at NCCL level, 1-2 us)",
            "H100 HBM3 3.35 TB/s; a sum reads 2 and writes 1 -> about 1,100 GB/s",
            "ResNet-50 1 H100: 3,000 img/s is an ESTIMATE (A100 80GB about 2,180 img/s per NVIDIA "
            "DeepLearningExamples, times about 1.4); not a measurement",
        ),
    ),
    "goyal-p100-50gbe": Network(
        name="goyal-p100-50gbe",
        description="Goyal et al. 2017 (Facebook Big Basin): 8 P100 SXM2 on NVLink 1, 1 x 50 Gbit Ethernet",
        gpus_per_node=8,
        intra=Link(20.0, 2.0),
        inter=Link(6.25, 20.0),
        nics_per_node=1,
        gpu="P100 SXM2 16GB",
        reduce_gbytes_per_s=240.0,
        images_per_second={"resnet50": 219.0},
        sources=(
            "8 P100 per Big Basin server with one 50 Gbit Ethernet NIC (Goyal et al. 2017, section 5)",
            "NVLink 1: 20 GB/s per link per direction (NVIDIA P100 datasheet); a ring hop uses one link",
            "50 GbE: 6.25 GB/s per direction; TCP latency about 10-30 us, 20 us taken",
            "P100 HBM2 732 GB/s -> about 240 GB/s reduction rate",
            "ResNet-50 fp32, 1 P100: about 219 img/s (TensorFlow benchmarks, DGX-1 P100, 2017; recalled, not re-checked)",
        ),
    ),
    "jia-p40-100gbe": Network(
        name="jia-p40-100gbe",
        description="Jia et al. 2018 (Tencent): 8 P40 per node on PCIe 3.0, 1 x 100 Gbit Ethernet",
        gpus_per_node=8,
        intra=Link(12.0, 5.0),
        inter=Link(12.5, 15.0),
        nics_per_node=1,
        gpu="Tesla P40 24GB",
        reduce_gbytes_per_s=115.0,
        images_per_second={"resnet50": 200.0},
        sources=(
            "8 P40 per node is an ASSUMPTION (2048 GPUs = 256 nodes); 100 Gbit Ethernet as the paper reports",
            "PCIe 3.0 x16: 15.75 GB/s theoretical, about 12 GB/s achieved per direction; 5 us through the host bridge",
            "100 GbE: 12.5 GB/s per direction; latency about 10-30 us, 15 us taken",
            "P40 GDDR5 346 GB/s -> about 115 GB/s reduction rate",
            "ResNet-50, 1 P40: 200 img/s is an ESTIMATE (fp32 peak 11.8 TFLOPS close to P100's 10.6, half the "
            "memory bandwidth; P40 has no fast fp16 math)",
        ),
    ),
}


@dataclass(frozen=True)
class Model:
    """A network to train, as the cost model needs it: how many gradient values a step exchanges."""

    name: str
    """Model name as given to --model."""
    parameters: int
    """Trainable parameters (= gradient values exchanged per step)."""
    parameter_tensors: int
    """Parameter tensors (gradients are fused into one buffer; kept for the printout)."""

    def gradient_bytes(self, dtype: str) -> int:
        """Bytes of one gradient exchange in this dtype."""
        return self.parameters * DTYPE_BYTES[dtype]


DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
"""Bytes per gradient value by exchange dtype."""

MODELS: dict[str, Model] = {
    # torchvision parameter counts
    "resnet50": Model("resnet50", 25_557_032, 161),
    "resnet18": Model("resnet18", 11_689_512, 62),
    "resnet101": Model("resnet101", 44_549_160, 314),
}


def load_network(name_or_path: str) -> Network:
    """A preset by name, or a network described in a TOML file (see docs/plan.md for the keys)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not (name_or_path.endswith(".toml") or path.exists()):
        raise NetworkError(f"--network: unknown network {name_or_path!r}; presets: {', '.join(PRESETS)}, "
                           f"or a path to a .toml file")
    if not path.is_file():
        raise NetworkError(f"--network: file {name_or_path} does not exist")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise NetworkError("reading a network TOML file needs Python 3.11 or `pip install tomli`") from None
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise NetworkError(f"{path}: not valid TOML: {e}") from None
    return network_from_dict(data, where=f"{path}", default_name=path.stem)


def network_from_dict(data: dict, where: str = "network", default_name: str = "custom") -> Network:
    """Build and check a Network from a TOML-like dict; unknown keys and missing ones are named."""
    top = {"name", "description", "gpu", "gpus_per_node", "nics_per_node", "reduce_gbytes_per_s",
           "images_per_second", "sources", "intra", "inter"}
    unknown = sorted(set(data) - top)
    if unknown:
        raise NetworkError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(top))}")
    links = {}
    for section in ("intra", "inter"):
        sec = data.get(section)
        if not isinstance(sec, dict):
            raise NetworkError(f"{where}.{section}: missing table [{section}] with bandwidth_gbytes_per_s and latency_us")
        bad = sorted(set(sec) - {"bandwidth_gbytes_per_s", "latency_us"})
        if bad:
            raise NetworkError(f"{where}.{section}.{bad[0]}: unknown key; use bandwidth_gbytes_per_s and latency_us")
        for key in ("bandwidth_gbytes_per_s", "latency_us"):
            if key not in sec:
                raise NetworkError(f"{where}.{section}.{key}: missing")
        links[section] = Link(sec["bandwidth_gbytes_per_s"], sec["latency_us"])
    for key in ("gpus_per_node", "nics_per_node"):
        if key not in data:
            raise NetworkError(f"{where}.{key}: missing")
    ips = data.get("images_per_second", {})
    if not isinstance(ips, dict):
        raise NetworkError(f"{where}.images_per_second: {ips!r} must be a table of model = images per second")
    net = Network(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        gpu=str(data.get("gpu", "unknown GPU")),
        gpus_per_node=data["gpus_per_node"],
        nics_per_node=data["nics_per_node"],
        intra=links["intra"],
        inter=links["inter"],
        reduce_gbytes_per_s=data.get("reduce_gbytes_per_s", 300.0),
        images_per_second=dict(ips),
        sources=tuple(str(s) for s in data.get("sources", ())),
    )
    net.check(where)
    return replace(net, gpus_per_node=int(net.gpus_per_node), nics_per_node=int(net.nics_per_node))


# ------------------------------------------------------------------------------------------------
# Link use of a communication step
# ------------------------------------------------------------------------------------------------
def node_map(grid: Grid, k: int, placement: str = "rows") -> np.ndarray:
    """Node of every rank. "rows": consecutive ranks fill a node, so a node's K ranks sit in one row (the
    paper's placement, torus_train.job.topology). "columns": a node holds K consecutive ranks of one column, so
    the vertical rings run inside nodes and the horizontal ones cross the network."""
    ranks = np.arange(grid.size)
    if placement == "rows":
        return ranks // k
    if placement == "columns":
        row, col = ranks // grid.x, ranks % grid.x
        return (col * grid.y + row) // k
    raise UserError(f"--placement: {placement!r}; use rows or columns")


def _edge_time(grid: Grid, net: Network, src: np.ndarray, dst: np.ndarray, chunk_bytes: float,
               node: np.ndarray) -> tuple[float, np.ndarray]:
    """Seconds for one step in which every src[i] sends chunk_bytes to dst[i] at once.

    Returns (seconds, inter) where inter[i] says whether edge i leaves its node. The step lasts as long as its
    slowest edge: intra edges cost alpha_intra + chunk/bw_intra, inter edges alpha_inter + chunk/bw_flow with
    the NICs of the busiest node shared by its outgoing flows.
    """
    inter = node[src] != node[dst]
    t = 0.0
    if src.size == 0:
        return 0.0, inter
    if (~inter).any():
        t = max(t, net.intra.alpha + chunk_bytes * net.intra.beta)
    if inter.any():
        flows = int(np.bincount(node[src[inter]]).max())
        nic = net.inter.bandwidth_gbytes_per_s * 1e9
        bw = min(nic, net.nics_per_node * nic / flows)
        t = max(t, net.inter.alpha + chunk_bytes / bw)
    return t, inter


@dataclass
class Phase:
    """One phase of an algorithm: a number of identical sequential steps on one set of edges."""

    name: str
    """What the phase does, e.g. 'row reduce-scatter'."""
    steps: int
    """Sequential steps in the phase."""
    chunk_bytes: float
    """Bytes each sending rank sends per step."""
    seconds: float
    """Time of the phase, reduction included."""


@dataclass
class AllreduceCost:
    """Predicted cost of one all-reduce of `nbytes` with one algorithm on one grid."""

    algo: str
    """flat | tree | hierarchical | torus."""
    grid: str
    """The grid, XxY."""
    nbytes: int
    """Bytes all-reduced (one fused gradient buffer)."""
    steps: int
    """Sequential communication steps."""
    bytes_across_nodes: float
    """Bytes the busiest rank sends over inter-node links."""
    seconds: float
    """Predicted all-reduce time."""
    phases: list = field(default_factory=list)
    """The phases, for the printout."""

    @property
    def busbw_gbytes_per_s(self) -> float:
        """nccl-tests bus bandwidth: nbytes / seconds * 2(N-1)/N."""
        n = parse_grid(self.grid).size
        return 0.0 if self.seconds == 0 else self.nbytes / self.seconds * (2 * (n - 1) / n) / 1e9


class _Acc:
    """Accumulates phases and per-rank inter-node bytes."""

    def __init__(self, grid: Grid, node: np.ndarray):
        self.grid = grid
        self.node = node
        self.phases: list[Phase] = []
        self.inter_bytes = np.zeros(grid.size)

    def ring(self, name: str, rings: np.ndarray, nbytes: float, net: Network, steps: int,
             reduce_bytes: float = 0.0) -> None:
        """`steps` ring steps on each ring (rows of `rings`, ranks in ring order), chunk = nbytes / ring length."""
        p = rings.shape[1]
        if p <= 1 or steps == 0:
            return
        src = rings.reshape(-1)
        dst = np.roll(rings, -1, axis=1).reshape(-1)
        chunk = nbytes / p
        t, inter = _edge_time(self.grid, net, src, dst, chunk, self.node)
        self.inter_bytes[src[inter]] += steps * chunk
        self.phases.append(Phase(name, steps, chunk, steps * t + reduce_bytes * net.gamma))

    def tree(self, name: str, groups: np.ndarray, nbytes: float, net: Network, reduce: bool) -> None:
        """Binomial reduce (to the group's first rank) or broadcast (from it) of nbytes within each group."""
        p = groups.shape[1]
        if p <= 1:
            return
        rounds = math.ceil(math.log2(p))
        total = 0.0
        dists = [1 << i for i in range(rounds)]
        for d in (dists if reduce else dists[::-1]):
            idx = np.arange(p)
            sender = idx[(idx % (2 * d)) == d]            # reduce: sender -> sender - d
            far, near = groups[:, sender].reshape(-1), groups[:, sender - d].reshape(-1)
            src, dst = (far, near) if reduce else (near, far)
            t, inter = _edge_time(self.grid, net, src, dst, nbytes, self.node)
            self.inter_bytes[src[inter]] += nbytes
            total += t + (nbytes * net.gamma if reduce else 0.0)
        self.phases.append(Phase(name, rounds, nbytes, total))

    def result(self, algo: str, nbytes: int) -> AllreduceCost:
        steps = sum(p.steps for p in self.phases)
        return AllreduceCost(algo, str(self.grid), nbytes, steps, float(self.inter_bytes.max()),
                             sum(p.seconds for p in self.phases), self.phases)


def allreduce_cost(algo: str, grid: Grid, net: Network, nbytes: int, placement: str = "rows") -> AllreduceCost:
    """Predicted all-reduce of nbytes over `grid` (laid out on net.gpus_per_node GPUs per node) with `algo`.

    flat:         one ring over all N ranks in rank order: reduce-scatter + all-gather, 2(N-1) steps of n/N.
    tree:         binomial reduce to rank 0 + binomial broadcast, 2 ceil(lg N) rounds of n bytes.
    hierarchical: binomial reduce in each row to its first rank, ring all-reduce of n among those Y leaders
                  (one column), binomial broadcast in each row: 2 ceil(lg X) + 2(Y-1) steps.
    torus:        1) ring reduce-scatter in each row (X-1 steps of n/X), 2) ring all-reduce of each rank's
                  n/X chunk along its column (2(Y-1) steps of n/(XY)), 3) ring all-gather in each row:
                  2(X-1) + 2(Y-1) steps (Mikami et al. 2018, section 3.2).
    """
    if grid.gpus_per_node != net.gpus_per_node:
        grid = Grid(grid.x, grid.y, net.gpus_per_node)
    n, x, y = float(nbytes), grid.x, grid.y
    ranks = np.arange(grid.size).reshape(y, x)          # ranks[row, col]
    acc = _Acc(grid, node_map(grid, net.gpus_per_node, placement))
    if algo == "flat":
        p = grid.size
        ring = ranks.reshape(1, -1)
        acc.ring("ring reduce-scatter", ring, n, net, p - 1, reduce_bytes=(p - 1) / p * n)
        acc.ring("ring all-gather", ring, n, net, p - 1)
    elif algo == "tree":
        everyone = ranks.reshape(1, -1)
        acc.tree("tree reduce", everyone, n, net, reduce=True)
        acc.tree("tree broadcast", everyone, n, net, reduce=False)
    elif algo == "hierarchical":
        acc.tree("row reduce to leader", ranks, n, net, reduce=True)
        leaders = ranks[:, :1].T                          # one ring: column 0
        acc.ring("leader ring reduce-scatter", leaders, n, net, y - 1, reduce_bytes=(y - 1) / y * n)
        acc.ring("leader ring all-gather", leaders, n, net, y - 1)
        acc.tree("row broadcast", ranks, n, net, reduce=False)
    elif algo == "torus":
        acc.ring("row reduce-scatter", ranks, n, net, x - 1, reduce_bytes=(x - 1) / x * n)
        cols = ranks.T                                    # each column is a vertical ring
        acc.ring("column reduce-scatter", cols, n / x, net, y - 1, reduce_bytes=(y - 1) / y * n / x)
        acc.ring("column all-gather", cols, n / x, net, y - 1)
        acc.ring("row all-gather", ranks, n, net, x - 1)
    else:
        raise UserError(f"algo: unknown all-reduce algorithm {algo!r}; known: {', '.join(ALGORITHMS)}")
    return acc.result(algo, int(nbytes))


# ------------------------------------------------------------------------------------------------
# Training step and scaling efficiency
# ------------------------------------------------------------------------------------------------
BACKWARD_FRACTION = 2.0 / 3.0
"""Share of a training step's compute spent in the backward pass (backward costs about twice the forward)."""
DEFAULT_OVERLAP = 0.5
"""Stated default: half of the backward pass can hide communication (DDP-style buckets start all-reducing
while earlier layers still compute, but the last buckets wait for the end of backward)."""


@dataclass
class StepCost:
    """One training step at N GPUs with one all-reduce algorithm."""

    compute_seconds: float
    """Forward + backward on one GPU: per-rank batch / single-GPU throughput."""
    allreduce_seconds: float
    """Predicted all-reduce of the gradients."""
    exposed_seconds: float
    """Communication not hidden behind the backward pass."""
    step_seconds: float
    """compute + exposed."""
    scaling_efficiency: float
    """compute / step, a fraction: throughput(N) / (N x single-GPU throughput)."""


def step_cost(compute_seconds: float, allreduce_seconds: float, overlap: float = DEFAULT_OVERLAP,
              backward_fraction: float = BACKWARD_FRACTION) -> StepCost:
    """Step time with a stated overlap of communication and the backward pass."""
    if not 0.0 <= overlap <= 1.0:
        raise UserError(f"--overlap: {overlap!r} must be between 0 and 1")
    hidden = overlap * backward_fraction * compute_seconds
    exposed = max(0.0, allreduce_seconds - hidden)
    step = compute_seconds + exposed
    return StepCost(compute_seconds, allreduce_seconds, exposed, step, compute_seconds / step if step else 1.0)


# ------------------------------------------------------------------------------------------------
# Grid choice by predicted time
# ------------------------------------------------------------------------------------------------
def rank_grids(n: int, net: Network, nbytes: int, placement: str = "rows") -> list[tuple[Grid, AllreduceCost]]:
    """Every factor pair X x Y = n with its predicted torus all-reduce, fastest first (ties: fewer steps)."""
    out = []
    for x, y in factor_pairs(n):
        g = Grid(x, y, net.gpus_per_node)
        out.append((g, allreduce_cost("torus", g, net, nbytes, placement)))
    out.sort(key=lambda gc: (round(gc[1].seconds, 12), gc[1].steps, -gc[0].x))
    return out


def best_grid(n: int, net: Network, nbytes: int, placement: str = "rows") -> tuple[Grid, str]:
    """The grid with the fastest predicted torus all-reduce for n ranks, and why (against the runner-up and
    against the grid with the fewest steps)."""
    if not isinstance(n, int) or n < 1:
        raise GridError(f"--gpus must be a positive integer, got {n!r}")
    ranked = rank_grids(n, net, nbytes, placement)
    g, c = ranked[0]
    k = net.gpus_per_node
    ring, side, what = (g.x, "rows", "horizontal") if placement == "rows" else (g.y, "columns", "vertical")
    where = ("the whole job fits on one node" if n <= k
             else f"{side} inside one node: {what} rings on the intra-node links" if ring <= k and k % ring == 0
             else f"{side} span {math.ceil(ring / k)} nodes" if ring % k == 0
             else f"{side} and nodes do not line up")
    why = f"fastest predicted torus of the {len(ranked)} factor pairs, {c.seconds * 1e3:.3f} ms, {c.steps} steps, {where}"
    if len(ranked) > 1:
        g2, c2 = ranked[1]
        why += f"; next best {g2} {c2.seconds * 1e3:.3f} ms"
    fewest = min(ranked, key=lambda gc: (gc[1].steps, -gc[0].x))
    if fewest[0] != g:
        why += (f"; the fewest-steps grid {fewest[0]} ({fewest[1].steps} steps) is predicted "
                f"{fewest[1].seconds * 1e3:.3f} ms: bandwidth, not step count, decides at this size")
    return g, why


# ------------------------------------------------------------------------------------------------
# A whole plan
# ------------------------------------------------------------------------------------------------
@dataclass
class AlgoPlan:
    """One algorithm's line of a plan."""

    algo: str
    """flat | tree | hierarchical | torus."""
    steps: int
    """Sequential communication steps."""
    bytes_across_nodes: float
    """Bytes the busiest rank sends across nodes per all-reduce."""
    allreduce_seconds: float
    """Predicted all-reduce time."""
    step_seconds: float
    """Predicted training step time."""
    scaling_efficiency: float
    """Predicted scaling efficiency, a fraction."""
    busbw_gbytes_per_s: float
    """Predicted nccl-tests bus bandwidth of the all-reduce."""


@dataclass
class Plan:
    """Predictions for one (GPUs, grid, network, model, batch) point."""

    gpus: int
    """World size."""
    grid: str
    """The grid used for the torus and hierarchical algorithms."""
    grid_why: str
    """Why this grid (chosen or given)."""
    network: Network
    """The network described."""
    model: str
    """Model name."""
    gradient_dtype: str
    """Dtype gradients are exchanged in."""
    gradient_bytes: int
    """Bytes per all-reduce."""
    per_gpu_batch: int
    """Images per GPU per step."""
    images_per_second: float
    """Single-GPU training throughput used."""
    overlap: float
    """Fraction of the backward pass that hides communication."""
    placement: str
    """How ranks fill nodes: rows (a node's ranks in one row) or columns."""
    compute_seconds: float
    """Per-step compute on one GPU."""
    algorithms: dict
    """algo -> AlgoPlan."""

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("network", "algorithms")}
        net = asdict(self.network)
        net["sources"] = list(self.network.sources)
        d["network"] = net
        d["backward_fraction"] = BACKWARD_FRACTION
        d["algorithms"] = {a: asdict(p) for a, p in self.algorithms.items()}
        return d


def make_plan(gpus: int, net: Network, model: str = "resnet50", per_gpu_batch: int = 32,
              grid: Grid | None = None, gradient_dtype: str = "fp16", images_per_second: float | None = None,
              overlap: float = DEFAULT_OVERLAP, placement: str = "rows") -> Plan:
    """Predict every algorithm at `gpus` GPUs; with no grid, choose the fastest torus grid."""
    if not isinstance(gpus, int) or gpus < 1:
        raise UserError(f"--gpus: {gpus!r} must be a positive integer")
    if per_gpu_batch < 1:
        raise UserError(f"--per-gpu-batch: {per_gpu_batch!r} must be a positive integer")
    if model not in MODELS:
        raise UserError(f"--model: unknown model {model!r}; known: {', '.join(MODELS)}")
    if gradient_dtype not in DTYPE_BYTES:
        raise UserError(f"--grad-dtype: {gradient_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    nbytes = MODELS[model].gradient_bytes(gradient_dtype)
    if grid is None:
        grid, why = best_grid(gpus, net, nbytes, placement)
    else:
        check_grid_size(grid, gpus)
        grid = Grid(grid.x, grid.y, net.gpus_per_node)
        why = f"given by --grid ({grid.torus_steps} torus steps)"
    if images_per_second is None:
        if model not in net.images_per_second:
            raise UserError(f"--images-per-second: network {net.name} has no throughput figure for {model}; "
                            f"give one (known for: {', '.join(net.images_per_second) or 'none'})")
        images_per_second = float(net.images_per_second[model])
    if not images_per_second > 0:
        raise UserError(f"--images-per-second: {images_per_second!r} must be > 0")
    compute = per_gpu_batch / images_per_second
    algos = {}
    for algo in ALGORITHMS:
        c = allreduce_cost(algo, grid, net, nbytes, placement)
        s = step_cost(compute, c.seconds, overlap)
        algos[algo] = AlgoPlan(algo, c.steps, c.bytes_across_nodes, c.seconds, s.step_seconds,
                               s.scaling_efficiency, c.busbw_gbytes_per_s)
    return Plan(gpus, str(grid), why, net, model, gradient_dtype, nbytes, per_gpu_batch, images_per_second,
                overlap, placement, compute, algos)


def sweep(net: Network, nbytes: int, gpu_counts: Iterable[int],
          placement: str = "rows") -> dict[str, list[tuple[int, float]]]:
    """Predicted all-reduce seconds per algorithm for each GPU count: torus on its fastest grid, hierarchical
    with one leader per node (rows of K = GPUs per node, its definition; any grid when K does not divide the
    count), flat and tree (which do not depend on the grid) as they are."""
    out: dict[str, list[tuple[int, float]]] = {a: [] for a in ALGORITHMS}
    k = net.gpus_per_node
    for n in gpu_counts:
        grids = [Grid(x, y, k) for x, y in factor_pairs(n)]
        per_node = [g for g in grids if g.x == k] or grids
        for a in ALGORITHMS:
            pool = {"torus": grids, "hierarchical": per_node}.get(a, grids[:1])
            out[a].append((n, min(allreduce_cost(a, g, net, nbytes, placement).seconds for g in pool)))
    return out


# ------------------------------------------------------------------------------------------------
# Calibration from `torus-train bench allreduce --json`
# ------------------------------------------------------------------------------------------------
# The model of one CPU host, fitted on one grid's bench rows and used to predict another grid:
#
#   time = o * (steps * alpha + coeff * n * (beta_cache + miss * beta_extra))
#   o    = max(1, (ranks + background) / cores)       ranks time-share the cores
#   miss = 1 - min(1, llc / (ranks * n))              share of the working set the last-level cache cannot hold
#
# steps and coeff (bytes each rank sends per byte all-reduced) come from the general model with every rank on
# one host. All ranks of an all-reduce work at once, so the CPU time per step and per byte of all of them is
# shared by the cores: o. The ranks' buffers (ranks * n bytes) share one last-level cache; while they fit, a
# byte costs beta_cache (copy and sum in cache), the share that does not fit costs beta_extra more (DRAM).
# llc is the machine's cache size, read from the OS, not fitted. The fit minimises the relative error.
def local_coefficients(algo: str, grid: Grid) -> tuple[int, float]:
    """(steps, bytes coefficient) of `algo` on one machine: time = steps*alpha + coefficient*n*beta.

    On one host every edge is alike, so the general model collapses to these two numbers; the reduction
    (gamma) is folded into beta because a CPU sums while it copies and one grid cannot tell them apart.
    """
    net = Network("unit", grid.size, Link(1.0, 1.0), Link(1.0, 1.0), 1, reduce_gbytes_per_s=1e30)
    # Evaluate the general model at two sizes on a unit network: steps*alpha and bytes*beta fall out exactly.
    c0 = allreduce_cost(algo, Grid(grid.x, grid.y, grid.size), net, 0)
    c1 = allreduce_cost(algo, Grid(grid.x, grid.y, grid.size), net, 10**9)   # 1e9 bytes at 1 GB/s
    return c0.steps, (c1.seconds - c0.seconds)


def oversubscription(ranks: int, cores: int, background: float = 0.0) -> float:
    """Stated model of a CPU host: max(1, (ranks + background) / cores)."""
    return max(1.0, (ranks + background) / cores)


def cache_miss_fraction(ranks: int, nbytes: float, llc_bytes: float) -> float:
    """Share of the ranks' buffers (ranks * nbytes) that a last-level cache of llc_bytes cannot hold."""
    footprint = ranks * nbytes
    return 0.0 if footprint <= llc_bytes else 1.0 - llc_bytes / footprint


def parse_cache_size(text: str) -> int:
    """'49152K', '48M', '32768' (as /sys and lscpu write them, powers of 1024) -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t.rstrip("KMG")) * mult)
    except ValueError:
        raise UserError(f"cache size {text!r}: not a size such as 49152K or 48M") from None


def machine_llc_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of this machine's last-level data or unified cache, or None where the OS does not say."""
    best: tuple[int, int] | None = None
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError, UserError):
            continue
        if kind != "Instruction" and size > 0 and (best is None or level > best[0]):
            best = (level, size)
    if best is None and hasattr(os, "sysconf"):
        try:
            l3 = os.sysconf("SC_LEVEL3_CACHE_SIZE")
        except (ValueError, OSError):
            l3 = 0
        return l3 if l3 > 0 else None
    return None if best is None else best[1]


def fit_terms(algo: str, grid: Grid, nbytes: float, cores: int, background: float, llc_bytes: float) -> np.ndarray:
    """Seconds per unit of (alpha, beta_cache, beta_extra) for one all-reduce: the row of the fit's design
    matrix, so time = terms @ (alpha, beta_cache, beta_extra)."""
    steps, coeff = local_coefficients(algo, grid)
    o = oversubscription(grid.size, cores, background)
    per_byte = o * coeff * nbytes
    return np.array([o * steps, per_byte, per_byte * cache_miss_fraction(grid.size, nbytes, llc_bytes)])


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| over x >= 0, for a few columns: the best least-squares solution over every support
    set whose solution is non-negative (the optimum lies on one of them)."""
    cols = a.shape[1]
    best, best_res = np.zeros(cols), float(np.sum(b ** 2))
    for mask in range(1, 1 << cols):
        keep = [j for j in range(cols) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (x < 0).any():
            continue
        res = float(np.sum((a[:, keep] @ x - b) ** 2))
        if res < best_res - 1e-15 * max(1.0, best_res):
            best, best_res = np.zeros(cols), res
            best[keep] = x
    return best


@dataclass
class Calibration:
    """alpha and the per-byte costs fitted for one algorithm on this machine, from bench rows on one grid."""

    algo: str
    """The algorithm whose rows were fitted."""
    grid: str
    """The grid the rows came from."""
    backend: str
    """Backend of the rows (gloo, mpi, nccl)."""
    alpha_us: float
    """Fitted per-step latency, microseconds (at one rank per core)."""
    cache_gbytes_per_s: float
    """Fitted per-rank bandwidth 1/beta_cache, GB/s (one rank per core), while the ranks' buffers fit the cache."""
    memory_gbytes_per_s: float
    """Fitted per-rank bandwidth 1/(beta_cache + beta_extra), GB/s, for the bytes that do not fit the cache;
    equal to the cache figure when no row's buffers exceeded the cache (nothing to fit it on)."""
    llc_bytes: int
    """Last-level cache size used for the miss fraction (the machine's, or --llc-mib)."""
    cores: int
    """CPU cores of the machine; ranks beyond one per core slow both terms by ranks/cores (stated model)."""
    background: float
    """Other runnable processes sharing the cores while the bench ran (0 = the ranks had the machine)."""
    rows_used: list
    """(size_bytes, time_us) of the rows used."""
    rows_skipped: int
    """Rows left out (other algo/grid/backend, or wrong != 0)."""
    rows_beyond_cache: int
    """Rows used whose buffers (ranks x size) exceeded the cache: the ones that fix the memory figure."""
    rms_relative_error: float
    """Root-mean-square of (fit - measured) / measured over the rows used (the quantity minimised)."""

    @property
    def coefficients(self) -> np.ndarray:
        """(alpha, beta_cache, beta_extra) in seconds and seconds per byte."""
        beta_c = 1.0 / (self.cache_gbytes_per_s * 1e9)
        return np.array([self.alpha_us * 1e-6, beta_c, 1.0 / (self.memory_gbytes_per_s * 1e9) - beta_c])

    def oversubscription(self, ranks: int, background: float | None = None) -> float:
        """max(1, (ranks + background) / cores): ranks time-share the cores with each other and with other
        runnable processes, so per-step and per-byte work stretch alike. background defaults to the fit's."""
        return oversubscription(ranks, self.cores, self.background if background is None else background)

    def predict_seconds(self, grid: Grid, nbytes: int, algo: str | None = None,
                        background: float | None = None) -> float:
        """Predicted time of one all-reduce of nbytes on `grid` on this host (with `background` other runnable
        processes; default: as during the fit)."""
        bg = self.background if background is None else background
        return float(fit_terms(algo or self.algo, grid, nbytes, self.cores, bg, self.llc_bytes) @ self.coefficients)

    def predict_busbw(self, grid: Grid, nbytes: int, algo: str | None = None,
                      background: float | None = None) -> float:
        """Predicted nccl-tests busbw in GB/s."""
        return busbw_gbytes_per_s(grid.size, nbytes, self.predict_seconds(grid, nbytes, algo, background))

    def describe(self) -> list[str]:
        """Printable lines: the model, the fitted figures with units, and the fit's error."""
        memory = (f"1/(beta_cache + beta_extra) = {self.memory_gbytes_per_s:.4f} GB/s per rank beyond the cache "
                  f"({self.rows_beyond_cache} rows beyond it)" if self.rows_beyond_cache else
                  "no row's buffers exceeded the cache: the memory figure is taken equal to the cache figure")
        model = (f"model: time = o * (steps * alpha + coeff * n * (beta_cache + miss * beta_extra)), "
                 f"o = max(1, (ranks + {self.background:g} background) / {self.cores} cores), "
                 f"miss = 1 - min(1, {self.llc_bytes / 2**20:g} MiB cache / (ranks * n))")
        fit = (f"fit on {self.algo} {self.grid} ({self.backend}), minimising the relative error: "
               f"alpha = {self.alpha_us:.2f} us per step, 1/beta_cache = {self.cache_gbytes_per_s:.4f} GB/s per "
               f"rank in cache, {memory}")
        return [model, fit,
                f"fit error on the calibration rows: rms {self.rms_relative_error * 100:.1f}% of the measured time"]


def busbw_gbytes_per_s(ranks: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth: nbytes / seconds * 2(N-1)/N, in GB/s."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def read_bench(path: str) -> list[dict]:
    """Rows of a `bench allreduce --json` file, checked for the fields the fit needs."""
    import json
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--calibrate: file {path} does not exist")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"--calibrate: {path} is not JSON: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        data = data["rows"]
    if not isinstance(data, list) or not data:
        raise UserError(f"--calibrate: {path} must hold a non-empty JSON list of bench rows")
    for i, row in enumerate(data):
        for key in ("algo", "grid", "size_bytes", "time_us"):
            if not isinstance(row, dict) or key not in row:
                raise UserError(f"--calibrate: {path}: row[{i}].{key}: missing")
        if not (isinstance(row["time_us"], (int, float)) and row["time_us"] > 0):
            raise UserError(f"--calibrate: {path}: row[{i}].time_us: {row['time_us']!r} must be > 0")
        if not (isinstance(row["size_bytes"], int) and row["size_bytes"] >= 0):
            raise UserError(f"--calibrate: {path}: row[{i}].size_bytes: {row['size_bytes']!r} must be an integer >= 0")
        parse_grid(row["grid"])
    return data


def read_benches(paths: str) -> list[dict]:
    """Rows of one or more bench files (comma-separated); several -> the median time per (algo, grid, size).

    On a shared machine one run's noise can be as large as the band a prediction is held to: record the grids
    in alternating runs and merge them."""
    groups: dict = {}
    for path in (p for p in paths.split(",") if p):
        for r in read_bench(path):
            groups.setdefault((r["algo"], r["grid"], r["size_bytes"]), []).append(r)
    out = []
    for rows in groups.values():
        good = [r for r in rows if int(r.get("wrong", 0)) == 0]
        use = good or rows
        merged = dict(use[0])
        merged["time_us"] = statistics.median(r["time_us"] for r in use)
        merged["wrong"] = 0 if good else merged.get("wrong", 1)
        merged["runs"] = len(use)
        out.append(merged)
    return out


def _llc(llc_bytes: int | None) -> int:
    if llc_bytes is None:
        llc_bytes = machine_llc_bytes()
        if llc_bytes is None:
            raise UserError("--llc-mib: the OS does not say this machine's last-level cache size; give it")
    if not llc_bytes > 0:
        raise UserError(f"--llc-mib: {llc_bytes / 2**20:g} must be > 0")
    return int(llc_bytes)


def calibrate(rows: Sequence[dict], algo: str | None = None, grid: str | None = None,
              cores: int | None = None, background: float = 0.0, llc_bytes: int | None = None) -> Calibration:
    """Fit alpha, beta_cache and beta_extra (all >= 0) of the model above to the rows of one algorithm on one
    grid (the first present unless named) with wrong == 0, minimising the relative error of the time.

    Relative, not absolute: the rows span 1 KiB to 64 MiB, three decades of time, and a fit on seconds
    would follow the largest rows alone and leave alpha undetermined. llc_bytes: default this machine's.
    """
    cores = cores or os.cpu_count() or 1
    if background < 0:
        raise UserError(f"--background: {background} must be >= 0")
    llc = _llc(llc_bytes)
    algos = [r["algo"] for r in rows]
    algo = algo or ("torus" if "torus" in algos else algos[0])
    grids = [r["grid"] for r in rows if r["algo"] == algo]
    if not grids:
        raise UserError(f"--calibrate: no rows for algo {algo!r} (present: {', '.join(sorted(set(algos)))})")
    grid = grid or grids[0]
    used = [r for r in rows if r["algo"] == algo and r["grid"] == grid and int(r.get("wrong", 0)) == 0]
    backends = sorted({str(r.get("backend", "?")) for r in used})
    if len({r["size_bytes"] for r in used}) < 2:
        raise UserError(f"--calibrate: need rows at two or more sizes for {algo} on {grid} with wrong == 0, "
                        f"found {len(used)}")
    g = parse_grid(grid)
    g = Grid(g.x, g.y, g.size)
    t = np.array([r["time_us"] * 1e-6 for r in used])
    n = np.array([float(r["size_bytes"]) for r in used])
    a = np.stack([fit_terms(algo, g, s, cores, background, llc) for s in n])
    alpha, beta_c, extra = nonnegative_lstsq(a / t[:, None], np.ones_like(t))
    if beta_c <= 0:
        raise UserError(f"--calibrate: times of {algo} on {grid} do not grow with size "
                        f"({', '.join(f'{int(s)} B: {x * 1e6:.0f} us' for s, x in zip(n, t))}); "
                        f"cannot fit a bandwidth: rerun the bench with more iterations (-n) on a quieter machine")
    beyond = int((a[:, 2] > 0).sum())
    fit = a @ np.array([alpha, beta_c, extra])
    rms = float(np.sqrt(np.mean(((fit - t) / t) ** 2)))
    return Calibration(algo, grid, ",".join(backends), float(alpha * 1e6), float(1.0 / beta_c / 1e9),
                       float(1.0 / (beta_c + extra) / 1e9), llc, cores, background,
                       [(int(r["size_bytes"]), float(r["time_us"])) for r in used], len(rows) - len(used), beyond,
                       rms)


@dataclass
class Comparison:
    """One bench row held against the calibrated prediction."""

    algo: str
    """Algorithm of the row."""
    grid: str
    """Grid of the row."""
    size_bytes: int
    """Bytes all-reduced."""
    measured_busbw: float
    """busbw from the row's time, GB/s."""
    predicted_busbw: float
    """busbw the calibration predicts, GB/s."""

    @property
    def ratio(self) -> float:
        """predicted / measured busbw (= measured / predicted time)."""
        return self.predicted_busbw / self.measured_busbw


def compare(cal: Calibration, rows: Sequence[dict], min_bytes: int = 0,
            background: float | None = None) -> list[Comparison]:
    """The rows of cal's algorithm with wrong == 0 and size >= min_bytes, measured against predicted busbw,
    sorted by grid and size. background: of the compared bench (default: the fit's)."""
    out = []
    for r in rows:
        if r["algo"] != cal.algo or r["size_bytes"] < max(min_bytes, 1) or int(r.get("wrong", 0)) != 0:
            continue
        g = parse_grid(r["grid"])
        g = Grid(g.x, g.y, g.size)
        measured = busbw_gbytes_per_s(g.size, r["size_bytes"], r["time_us"] * 1e-6)
        out.append(Comparison(cal.algo, str(g), int(r["size_bytes"]), measured,
                              cal.predict_busbw(g, r["size_bytes"], background=background)))
    return sorted(out, key=lambda c: (c.grid, c.size_bytes))
