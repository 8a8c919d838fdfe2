"""Alpha-beta-gamma cost of one gradient all-reduce and of one training step on a described cluster (pure).

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
  each flow gets ``nics_per_node * nic_bandwidth / F``, so a lone flow uses every NIC of its node. That is
  what NCCL does: it runs one channel (ring) per NIC and, where the GPUs share NVLink, splits an operation
  over the channels and balances them onto the NICs (NCCL's maintainer, NVIDIA/nccl issue 601: "creates 4
  rings, each using a different NIC"; two 8-NIC A100 nodes reach about 600 Gbit/s in one all-reduce, issue
  495). So the torus's vertical phase (K flows per node, each carrying 1/X of the data) shares the NICs
  K ways, and the hierarchical leader's one flow carries all of the data through them: per node the leader
  sends X/K times the torus's bytes (Mikami et al. 2018).

A training step with a stated overlap (``step_cost``, what ``plan --overlap`` overrides with): compute =
per-rank batch / single-GPU throughput; the backward pass is a stated fraction of it (2/3: backward costs
about twice the forward); a stated fraction ``overlap`` of the backward pass hides one fused all-reduce; step =
compute + max(0, allreduce - overlap * backward); scaling efficiency = compute / step (throughput(N) / (N *
single-GPU throughput), the definition used in the paper's table). By default ``plan`` derives the overlap
from the run's buckets instead (torus_train.plan.timeline). Not modelled: stragglers, data loading, BatchNorm
statistics, optimizer time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from torus_train.errors import UserError
from torus_train.job.algorithms import ALGORITHMS as ALGORITHM_TABLE
from torus_train.job.algorithms import modelled
from torus_train.job.topology import Grid, parse_grid
from torus_train.plan.nccl import NcclEstimate, NcclModel
from torus_train.plan.networks import NcclHardware, Network
from torus_train.registry import load

ALGORITHMS = modelled()
"""Algorithms the alpha-beta-gamma phases model (the entries of torus_train.job.algorithms with `phases`), in the
order tables print them. flat and tree are TEXTBOOK algorithms (one unpipelined ring; a binomial tree of whole
buffers), not what NCCL runs: NCCL_ALGORITHMS are."""

NCCL_ALGORITHMS = ("nccl-ring", "nccl-tree", "nccl-nvls", "nccl-collnet", "nccl")
"""NCCL's algorithms from its own tuning model (torus_train.plan.nccl), each with its fastest protocol per size;
"nccl" is the (algorithm, protocol) NCCL's default tuning chooses per size (no CollNet: it needs
NCCL_COLLNET_ENABLE=1)."""

ALGORITHM_LABELS = {
    **{name: ALGORITHM_TABLE.get(name).phases_label for name in ALGORITHMS},
    "nccl-ring": "NCCL Ring, its best protocol",
    "nccl-tree": "NCCL double binary tree, its best protocol",
    "nccl-nvls": "NCCL NVLS (NVLSTree across nodes)",
    "nccl-collnet": "NCCL CollNet Direct (SHARP; opt-in)",
    "nccl": "what NCCL's tuning chooses per size",
}
"""What each algorithm name stands for, printed beside the table."""


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


def _flow_bandwidth(net: Network, flows: int) -> float:
    """Bytes per second of each of `flows` flows leaving one node at once: they share all its NICs (a lone flow
    is split over every NIC, as NCCL's channels are)."""
    return net.nics_per_node * net.inter.bandwidth_gbytes_per_s * 1e9 / flows


def _links(
    net: Network, src: np.ndarray, dst: np.ndarray, node: np.ndarray
) -> tuple[list[tuple[float, float]], np.ndarray]:
    """The kinds of link a step in which every src[i] sends to dst[i] at once uses, as (alpha seconds, beta
    seconds per byte), and which edges leave their node. The step lasts as long as its slowest edge: intra
    edges pay the intra-node link, inter edges the NICs of the busiest node shared by its outgoing flows."""
    inter = node[src] != node[dst]
    links = []
    if (~inter).any():
        links.append((net.intra.alpha, net.intra.beta))
    if inter.any():
        flows = int(np.bincount(node[src[inter]]).max())
        links.append((net.inter.alpha, 1.0 / _flow_bandwidth(net, flows)))
    return links, inter


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
    """flat | tree | hierarchical | torus | nccl-ring | nccl-tree | nccl-nvls | nccl-collnet | nccl."""
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
    nccl_choice: str | None = None
    """NCCL algorithms: the (algorithm/protocol) its tuning model picked at this size; None for ours."""

    @property
    def busbw_gbytes_per_s(self) -> float:
        """nccl-tests bus bandwidth: nbytes / seconds * 2(N-1)/N."""
        n = parse_grid(self.grid).size
        return 0.0 if self.seconds == 0 else self.nbytes / self.seconds * (2 * (n - 1) / n) / 1e9


class _Phases:
    """The phases of one all-reduce as its algorithm adds them, per byte all-reduced (the algorithms are called
    with n = 1): each step's links, bytes and bytes reduced, and the bytes each rank sends across nodes. The
    cost at any size follows from them: allreduce_cost evaluates one size, allreduce_seconds_fn many."""

    def __init__(self, grid: Grid, node: np.ndarray):
        self.grid = grid
        self.node = node
        self.terms: list[tuple[str, int, float, list[tuple[float, float]], float]] = []
        """(phase name, repeats, bytes each sender sends per step, its links, bytes reduced), per byte."""
        self.inter_bytes = np.zeros(grid.size)

    def ring(
        self, name: str, rings: np.ndarray, nbytes: float, net: Network, steps: int, reduce_bytes: float = 0.0
    ) -> None:
        """`steps` ring steps on each ring (rows of `rings`, ranks in ring order), chunk = nbytes / ring length."""
        p = rings.shape[1]
        if p <= 1 or steps == 0:
            return
        src = rings.reshape(-1)
        links, inter = _links(net, src, np.roll(rings, -1, axis=1).reshape(-1), self.node)
        self.inter_bytes[src[inter]] += steps * nbytes / p
        self.terms.append((name, steps, nbytes / p, links, reduce_bytes))

    def tree(self, name: str, groups: np.ndarray, nbytes: float, net: Network, reduce: bool) -> None:
        """Binomial reduce (to the group's first rank) or broadcast (from it) of nbytes within each group."""
        p = groups.shape[1]
        if p <= 1:
            return
        dists = [1 << i for i in range(math.ceil(math.log2(p)))]
        for d in dists if reduce else dists[::-1]:
            idx = np.arange(p)
            sender = idx[(idx % (2 * d)) == d]  # reduce: sender -> sender - d
            far, near = groups[:, sender].reshape(-1), groups[:, sender - d].reshape(-1)
            src, dst = (far, near) if reduce else (near, far)
            links, inter = _links(net, src, dst, self.node)
            self.inter_bytes[src[inter]] += nbytes
            self.terms.append((name, 1, nbytes, links, nbytes if reduce else 0.0))

    def seconds(self, nbytes: float, gamma: float) -> float:
        """The all-reduce of nbytes: every step as long as its slowest link, plus the reduction."""
        return sum(_term_seconds(t, float(nbytes), gamma) for t in self.terms)

    def result(self, algo: str, nbytes: int, gamma: float) -> AllreduceCost:
        """The all-reduce of nbytes these phases make: each phase's steps and seconds, the busiest rank's bytes."""
        phases: dict[str, Phase] = {}
        for term in self.terms:
            name, k, f = term[:3]
            ph = phases.setdefault(name, Phase(name, 0, f * nbytes, 0.0))
            ph.steps += k
            ph.seconds += _term_seconds(term, nbytes, gamma)
        return AllreduceCost(
            algo,
            str(self.grid),
            nbytes,
            sum(p.steps for p in phases.values()),
            float(self.inter_bytes.max()) * nbytes,
            sum(p.seconds for p in phases.values()),
            list(phases.values()),
        )


def _term_seconds(term: tuple[str, int, float, list[tuple[float, float]], float], n: float, gamma: float) -> float:
    """One term of _Phases at n bytes: its repeats of the step (as long as its slowest link), and the reduction."""
    _, k, f, links, r = term
    return k * max(a + f * n * b for a, b in links) + r * n * gamma


# Each algorithm as phases on ranks[row, col] (Y rows of X ranks) for n bytes; the formulas are in allreduce_cost.
def flat_phases(ph: _Phases, ranks: np.ndarray, n: float, net: Network) -> None:
    p = ranks.size
    ring = ranks.reshape(1, -1)
    ph.ring("ring reduce-scatter", ring, n, net, p - 1, reduce_bytes=(p - 1) / p * n)
    ph.ring("ring all-gather", ring, n, net, p - 1)


def tree_phases(ph: _Phases, ranks: np.ndarray, n: float, net: Network) -> None:
    everyone = ranks.reshape(1, -1)
    ph.tree("tree reduce", everyone, n, net, reduce=True)
    ph.tree("tree broadcast", everyone, n, net, reduce=False)


def hierarchical_phases(ph: _Phases, ranks: np.ndarray, n: float, net: Network) -> None:
    y = ranks.shape[0]
    ph.tree("row reduce to leader", ranks, n, net, reduce=True)
    leaders = ranks[:, :1].T  # one ring: column 0
    ph.ring("leader ring reduce-scatter", leaders, n, net, y - 1, reduce_bytes=(y - 1) / y * n)
    ph.ring("leader ring all-gather", leaders, n, net, y - 1)
    ph.tree("row broadcast", ranks, n, net, reduce=False)


def torus_phases(ph: _Phases, ranks: np.ndarray, n: float, net: Network) -> None:
    y, x = ranks.shape
    ph.ring("row reduce-scatter", ranks, n, net, x - 1, reduce_bytes=(x - 1) / x * n)
    cols = ranks.T  # each column is a vertical ring
    ph.ring("column reduce-scatter", cols, n / x, net, y - 1, reduce_bytes=(y - 1) / y * n / x)
    ph.ring("column all-gather", cols, n / x, net, y - 1)
    ph.ring("row all-gather", ranks, n, net, x - 1)


def _phases_of(algo: str) -> Callable[[_Phases, np.ndarray, float, Network], None]:
    """The function that adds `algo`'s phases (its entry's `phases` in torus_train.job.algorithms)."""
    phases = ALGORITHM_TABLE.get(algo).phases
    if phases is None:
        raise UserError(f"algo: the cost model has no phases for {algo}; modelled: {', '.join(modelled())}")
    return load(phases)


def algorithms_for(net: Network, ranks: int | None = None) -> tuple[str, ...]:
    """Every algorithm the planner prints for this network: ours, and NCCL's where its hardware has them
    (NVLS: Hopper with NVSwitch; CollNet: SHARP switches with NVSwitch nodes, and more than one node)."""
    hw = net.nccl or NcclHardware()
    absent = set()
    if not (hw.generation == "hopper" and hw.nvswitch):
        absent.add("nccl-nvls")
    if not (hw.sharp and hw.nvswitch) or (ranks is not None and ranks <= net.gpus_per_node):
        absent.add("nccl-collnet")
    return ALGORITHMS + tuple(a for a in NCCL_ALGORITHMS if a not in absent)


def check_algorithm(algo: str, net: Network | None = None) -> None:
    """Raise UserError naming the algorithm when it is unknown, or absent from this network's hardware."""
    known = ALGORITHMS + NCCL_ALGORITHMS
    if algo not in known:
        raise UserError(f"algo: unknown all-reduce algorithm {algo!r}; known: {', '.join(known)}")
    if net is not None and algo not in algorithms_for(net):
        raise UserError(
            f"algo: {algo} needs hardware network {net.name} does not have "
            f"(nccl-nvls: Hopper + NVSwitch; nccl-collnet: SHARP + NVSwitch)"
        )


def _nccl_estimate(algo: str, model: NcclModel, nbytes: float) -> NcclEstimate | None:
    """NCCL's estimate for a planner name: nccl-<algo> with its best protocol, or nccl's own choice."""
    if algo == "nccl":
        return model.choose(nbytes)
    return model.best(algo.removeprefix("nccl-"), nbytes)


def _nccl_cost(algo: str, grid: Grid, net: Network, nbytes: int) -> AllreduceCost:
    """One NCCL all-reduce as its tuning model predicts it (one communicator of all ranks; the grid only names
    the world size)."""
    model = NcclModel(net, grid.size)
    e = _nccl_estimate(algo, model, nbytes)
    if e is None or nbytes == 0:
        return AllreduceCost(algo, str(grid), int(nbytes), 0, 0.0, 0.0, [])
    chosen = f"{e.algo}/{e.protocol}"
    phase = Phase(
        f"NCCL {chosen}: latency {e.latency_us:.1f} us + bytes / {e.algbw_gbps:.1f} GB/s",
        e.steps,
        float(nbytes),
        e.seconds,
    )
    return AllreduceCost(
        algo, str(grid), int(nbytes), e.steps, model.bytes_across_nodes(e.algo, nbytes), e.seconds, [phase], chosen
    )


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
    check_algorithm(algo, net)
    if algo in NCCL_ALGORITHMS:
        node_map(grid, net.gpus_per_node, placement)  # checks the placement
        return _nccl_cost(algo, grid, net, nbytes)
    return _phases(algo, grid, net, placement).result(algo, int(nbytes), net.gamma)


def _phases(algo: str, grid: Grid, net: Network, placement: str) -> _Phases:
    """`algo`'s phases on `grid` per byte all-reduced (its phase function called on ranks[row, col] with n = 1)."""
    phases = _Phases(grid, node_map(grid, net.gpus_per_node, placement))
    _phases_of(algo)(phases, np.arange(grid.size).reshape(grid.y, grid.x), 1.0, net)
    return phases


def allreduce_seconds_fn(algo: str, grid: Grid, net: Network, placement: str = "rows") -> Callable[[float], float]:
    """seconds(nbytes) of `algo` on `grid`, equal to allreduce_cost(...).seconds, with the links of every step
    worked out once: the bucket timeline asks for hundreds of sizes on one grid."""
    if grid.gpus_per_node != net.gpus_per_node:
        grid = Grid(grid.x, grid.y, net.gpus_per_node)
    check_algorithm(algo, net)
    if algo in NCCL_ALGORITHMS:
        model = NcclModel(net, grid.size)

        def nccl_seconds(nbytes: float) -> float:
            e = _nccl_estimate(algo, model, nbytes)
            return 0.0 if e is None or nbytes == 0 else e.seconds

        return nccl_seconds
    phases, gamma = _phases(algo, grid, net, placement), net.gamma
    return lambda nbytes: phases.seconds(nbytes, gamma)


# ------------------------------------------------------------------------------------------------
# Training step and scaling efficiency
# ------------------------------------------------------------------------------------------------
BACKWARD_FRACTION = 2.0 / 3.0
"""Share of a training step's compute spent in the backward pass (backward costs about twice the forward)."""
STEP_OVERHEAD = 0.0755
"""FITTED, the one fitted constant of the model: every step on N GPUs also pays this fraction of the single-GPU
compute with nothing hiding it (what the timeline leaves out: stragglers and jitter across nodes, the wait for
the slowest rank, data loading, BatchNorm and optimizer work around the exchange). Least squares in efficiency
points over the four published runs of docs/plan.md (scripts/experiments/efficiency_table.py, which also shows it fitted on
three and the fourth predicted); `plan --step-overhead` replaces it, 0 removes it."""
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


def step_cost(
    compute_seconds: float,
    allreduce_seconds: float,
    overlap: float = DEFAULT_OVERLAP,
    backward_fraction: float = BACKWARD_FRACTION,
) -> StepCost:
    """Step time with a stated overlap of communication and the backward pass."""
    if not 0.0 <= overlap <= 1.0:
        raise UserError(f"--overlap: {overlap!r} must be between 0 and 1")
    hidden = overlap * backward_fraction * compute_seconds
    exposed = max(0.0, allreduce_seconds - hidden)
    step = compute_seconds + exposed
    return StepCost(compute_seconds, allreduce_seconds, exposed, step, compute_seconds / step if step else 1.0)
