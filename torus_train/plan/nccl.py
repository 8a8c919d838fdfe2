"""NCCL's all-reduce as NCCL's own tuning model predicts it, and the algorithm it would choose (pure).

What a GPU user gets without the torus is NCCL, which picks, per call, the (algorithm, protocol) pair its tuning
model predicts fastest: time = latency + bytes / bandwidth, both from tables of constants and from the channels
its topology search found. This module is our own model of that reading of NCCL_SOURCE; the constants are NCCL's
(they are facts about NCCL, quoted in the tables below), the channel derivation is our simplification of its
search (``channels``).

Algorithms (NCCL's names in brackets):

* ``ring``    [Ring]: a pipelined ring over every rank, 2(N-1) steps of which 2(nodes-1) cross the network;
* ``tree``    [Tree]: a double binary tree over nodes with a chain inside each node (NCCL 2.4+): log-depth
  latency, bandwidth about half a ring's bus bandwidth per tree, two trees in parallel;
* ``nvls``    [NVLS on one node, NVLSTree across nodes]: the NVSwitch reduces in the switch (Hopper + NVSwitch);
  across nodes without SHARP NCCL uses NVLS inside the node and a tree between nodes;
* ``collnet`` [CollNetDirect]: the network switches reduce (SHARP); NCCL enables it only with
  NCCL_COLLNET_ENABLE=1, so its default choice (``choose``) leaves it out.

Protocols: LL (8-byte flag+data stores: lowest latency, a quarter to half of the bandwidth), LL128 (128-byte
lines with a flag: near full bandwidth, NVLink only), Simple (bulk copies with fences: full bandwidth, highest
latency).

The model, per (algorithm, protocol), for N ranks on `nodes` nodes of ppn = N / nodes GPUs:

* bus bandwidth = channels x bandwidth per channel (the network's for > 2 nodes, the intra-node figure for
  1-2 nodes, as NCCL), then capped/scaled per protocol (LL: half, at most the LL ceiling; LL128: 0.92, at most
  the per-channel LL128 ceiling; tree: 0.92 and a per-channel ceiling, LL /3.8, LL128 x120/128);
* algorithm bandwidth = bus bandwidth x N / (2(N-1)) for ring and NVLS, x 1/2 for tree and CollNet;
* latency (us) = base + per-hop latencies: ring 2(N-1) hops of which 2(nodes-1) are network hops; tree
  2((ppn-1) intra + log2(nodes) network); NVLS one intra + one network term (NVLSTree 2 log2(nodes) network);
  CollNet 2(min(1, ppn-1) intra + 0.4 (ppn-1)) + network;
* time = latency + bytes / algorithm bandwidth, with NCCL's two empirical fixes: the tree's bandwidth times a
  correction factor per power-of-two size (64 B .. 256 MiB), and the multi-node ring Simple latency times 1.9
  (pre-Ampere) or 1.4 once each rank's share per channel reaches 64 bytes (the ring's "plateau").

Inputs taken from the Network: GPUs per node, intra-node bandwidth per GPU, NICs and their bandwidth, the
network latency (its excess over InfiniBand's counts as NCCL's per-network latency, paid twice with Simple:
data and flush), and ``Network.nccl`` (GPU generation, NVSwitch, SHARP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torus_train.plan.networks import NcclHardware, Network

NCCL_SOURCE = (
    "NCCL 2.30.7 (NVIDIA/nccl commit 5067397, June 2026): src/graph/tuning.cc (ncclTopoTuneModel: base "
    "and per-link latencies, per-channel bandwidth ceilings, protocol factors; ncclTopoGetAlgoTime: tree "
    "correction, ring plateau) and src/graph/search.cc (channel speeds, channel duplication); our own "
    "model of it, torus_train/plan/nccl.py"
)
"""What the model reads, printed with every plan's sources."""

PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL's protocols, in its order."""

ALGOS = ("ring", "tree", "nvls", "collnet")
"""NCCL algorithms the model knows (planner names nccl-<algo>)."""

# --------------------------------------------------------------------------------------------------
# NCCL's constants (tuning.cc), arranged by us: {algo: (LL, LL128, Simple)} in microseconds or GB/s.
# --------------------------------------------------------------------------------------------------
BASE_LATENCY_US = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "collnet": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
"""Fixed cost of one call per algorithm and protocol."""

HOP_LATENCY_US = {
    "nvlink": {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet": (0.0, 0.0, 3.7),
        "nvls": (0.0, 0.0, 25.0),
        "nvls_tree": (0.0, 0.0, 25.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet": (0.0, 0.0, 3.7),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    "net": {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet": (0.0, 0.0, 31.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 20.9),
    },
}
"""Latency of one hop by the kind of link it crosses (NCCL's hwLatencies)."""

NET_OVERHEAD_US = 1.0
"""Per-step cost of posting a network operation on an Intel host (x3 with Simple); a ring step inside a node
of a multi-node ring costs at least this."""

# Per-channel ceilings, GB/s, by generation index (volta, ampere, hopper) and node bucket (1, 2, > 2 nodes).
LL_MAX_ONE_NODE_GBPS = {0: 39.0, 1: 87.7, 2: 141.0}
"""LL's total bandwidth ceiling on one node, by GPU generation."""
LL_MAX_MULTI_GBPS = (39.0, 39.0, 20.4)
"""LL's total bandwidth ceiling across nodes, by node bucket (Intel hosts)."""
RING_LL128_PER_CHANNEL = {0: (20.0, 20.0, 20.0), 1: (20.0, 20.0, 20.0), 2: (36.7, 36.7, 36.7)}
TREE_LL128_PER_CHANNEL = {0: (20.0, 20.0, 20.0), 1: (20.0, 20.0, 20.0), 2: (36.7, 36.7, 29.0)}
TREE_PER_CHANNEL = {0: (26.5, 18.5, 10.0), 1: (24.0, 23.6, 17.8), 2: (38.7, 41.4, 36.0)}
NVLS_TREE_PER_CHANNEL = {0: (26.5, 18.5, 10.0), 1: (24.0, 23.6, 17.8), 2: (0.0, 57.7, 45.5)}
NVLS_EFFICIENCY = {0: 0.0, 1: 0.0, 2: 0.85}
"""Share of the NVSwitch's multicast bandwidth NVLS reaches, by generation index."""

TREE_CORRECTION = {
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
    ),
}
"""Tree bandwidth factor for sizes 64 B x 2^i (i = 0..22); NCCL: trees fall short of the model at medium sizes."""

# Channel speeds the topology search tries (search.cc), GB/s per channel, fastest first.
INTRA_SPEEDS = {
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
}
INTER_SPEEDS = {
    "volta": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}
IB_LATENCY_US = 2.0
"""Network latency NCCL's constants already contain (InfiniBand); a preset's excess is NCCL's latencyInter."""


@dataclass(frozen=True)
class Channels:
    """A graph of NCCL's topology search, as we derive it: channels and the bandwidth of each."""

    count: int
    """Channels (parallel rings or trees), each on its own SMs and, across nodes, one NIC."""
    intra_gbps: float
    """Bandwidth per channel inside a node, GB/s."""
    inter_gbps: float
    """Bandwidth per channel across nodes, GB/s."""


def _speed(speeds: tuple, limit: float) -> float:
    """The fastest channel speed of NCCL's list that fits under `limit` GB/s (its slowest if none)."""
    return next((s for s in speeds if s <= limit + 1e-9), speeds[-1])


def channels(net: Network, hw: NcclHardware, nodes: int, pattern: str = "ring") -> Channels:
    """Channels of the ring/tree graph (pattern "ring") or the NVLS graph ("nvls"), our reading of search.cc.

    ring/tree, one node: channels of NCCL's fastest intra speed that fits the GPU's bandwidth, as many as fill
    it; several nodes: one channel per NIC at the fastest inter speed under the NIC's bandwidth. Then NCCL's
    duplication: a channel of >= 25 GB/s is split in two (not on Hopper when it is < 50 GB/s and there are more
    than 4). NVLS: one channel per GPU of the node, at the fastest intra speed under K/(K-1) of the GPU's
    NVLink bandwidth per channel (the switch serves K-1 peers), the network speed as for rings.
    Stated simplification: NCCL searches paths in the real PCI/NVLink graph; we divide the preset's figures.
    """
    arch = "hopper" if hw.generation == "hopper" else "volta"
    k, intra_bw = net.gpus_per_node, net.intra.bandwidth_gbytes_per_s
    nic_bw = net.inter.bandwidth_gbytes_per_s
    if pattern == "nvls":
        count = k
        intra = _speed(INTRA_SPEEDS[arch], intra_bw * k / max(k - 1, 1) / count)
        inter = _speed(INTER_SPEEDS[arch], net.nics_per_node * nic_bw / count) if nodes > 1 else intra
        return Channels(count, intra, inter)
    if nodes == 1:
        speed = _speed(INTRA_SPEEDS[arch], intra_bw)
        count = max(1, round(intra_bw / speed))
    else:
        speed = _speed(INTER_SPEEDS[arch], min(nic_bw, intra_bw))
        count = net.nics_per_node
    if speed >= 25.0 and not (hw.gen_index >= 2 and speed < 50.0 and count > 4):
        count, speed = count * 2, speed / 2
    return Channels(count, speed, speed)


@dataclass(frozen=True)
class NcclEstimate:
    """NCCL's predicted time for one (algorithm, protocol) at one size, with its two terms."""

    algo: str
    """ring | tree | nvls | collnet (nvls across nodes is NCCL's NVLSTree)."""
    protocol: str
    """LL | LL128 | Simple."""
    latency_us: float
    """The latency term, us (after the ring plateau factor)."""
    algbw_gbps: float
    """Algorithm bandwidth, GB/s (after the tree correction): bytes / this is the bandwidth term."""
    seconds: float
    """latency + bytes / algorithm bandwidth."""
    steps: int
    """Sequential hops of the algorithm (for the printout)."""


class NcclModel:
    """NCCL's tuning model for one communicator: N ranks on nodes of a Network. Built once per grid."""

    def __init__(self, net: Network, ranks: int) -> None:
        self.net = net
        self.hw: NcclHardware = getattr(net, "nccl", None) or NcclHardware()
        self.ranks = ranks
        self.nodes = max(1, math.ceil(ranks / net.gpus_per_node))
        self.ppn = ranks / self.nodes
        self.ring = channels(net, self.hw, self.nodes, "ring")
        self.nvls = channels(net, self.hw, self.nodes, "nvls")
        self._table = {(a, p): self._terms(a, p) for a in ALGOS for p in PROTOCOLS}

    # ---- what is available ------------------------------------------------------------------
    def has(self, algo: str) -> bool:
        """Whether this hardware can run `algo` at all (NVLS: Hopper + NVSwitch; CollNet: SHARP + NVSwitch)."""
        if algo == "nvls":
            return self.hw.generation == "hopper" and self.hw.nvswitch and self.ranks > 1
        if algo == "collnet":
            return self.hw.sharp and self.hw.nvswitch and self.nodes > 1
        return algo in ("ring", "tree")

    def enabled(self, algo: str, proto: str) -> bool:
        """Whether NCCL would run this pair: NVLS and CollNet only with Simple; LL128 needs NVLink and Volta+."""
        if not self.has(algo) or self.ranks <= 1:
            return False
        if algo in ("nvls", "collnet"):
            return proto == "Simple"
        if proto == "LL128":
            return self.hw.intra == "nvlink" and self.hw.generation != "pascal"
        return True

    # ---- NCCL's two tables: latency and bus bandwidth per (algo, proto) ----------------------
    def _node_bucket(self) -> int:
        return min(self.nodes, 3) - 1

    def _latency_inter_us(self) -> float:
        return max(0.0, self.net.inter.latency_us - IB_LATENCY_US)

    def _terms(self, algo: str, proto: str) -> tuple[float, float]:
        """(latency us, algorithm bandwidth GB/s) before the size-dependent fixes; (0, 0) if not enabled."""
        if not self.enabled(algo, proto):
            return 0.0, 0.0
        return self._latency(algo, proto), self._bus_bandwidth(algo, proto) * self._bus_to_alg(algo)

    def _bus_to_alg(self, algo: str) -> float:
        n = self.ranks
        return n / (2 * (n - 1)) if algo in ("ring", "nvls") else 0.5

    def _bus_bandwidth(self, algo: str, proto: str) -> float:
        g, b, ch = self.hw.gen_index, self._node_bucket(), self.ring
        if algo == "nvls":
            return self._nvls_bus_bandwidth()
        per_channel = ch.intra_gbps if (self.nodes <= 2 or algo == "collnet") else ch.inter_gbps
        bus = ch.count * per_channel
        ll_max = LL_MAX_ONE_NODE_GBPS[g] if self.nodes == 1 else LL_MAX_MULTI_GBPS[b]
        if algo == "ring":
            if proto == "LL":
                bus = min(ll_max, bus * 0.5)
            elif proto == "LL128":
                bus = min(bus * 0.92, ch.count * RING_LL128_PER_CHANNEL[g][b])
        elif algo == "tree":
            bus = min(bus * 0.92, ch.count * TREE_PER_CHANNEL[g][b])
            if proto == "LL":
                bus = min(bus / 3.8, ll_max)
            elif proto == "LL128":
                scale = 7.0 / 9.0 if self.nodes == 1 else 120.0 / 128.0
                bus = min(bus * scale, ch.count * TREE_LL128_PER_CHANNEL[g][b])
        elif algo == "collnet":
            gpus_per_head = self.ppn / ch.count  # CollNet Direct wants a NIC per GPU
            bus /= gpus_per_head - (gpus_per_head - 1) / 2
            bus *= 0.85 if g >= 2 else 1.0
        return bus

    def _nvls_bus_bandwidth(self) -> float:
        """NVLS on one node; NVLSTree (NVLS inside, a tree between nodes) across nodes without SHARP."""
        g, b, ch = self.hw.gen_index, self._node_bucket(), self.nvls
        intra = ch.intra_gbps * NVLS_EFFICIENCY[g] * (ch.count - 1) / ch.count * 2.0  # all-reduce pipelines two ops
        if self.nodes == 1:
            return ch.count * min(intra, ch.inter_gbps)
        inter = ch.inter_gbps * (2.0 if self.nodes <= 2 else 1.0)
        return ch.count * min(intra, inter, NVLS_TREE_PER_CHANNEL[g][b])

    def _hop_us(self, kind: str, algo: str, proto: str) -> float:
        return HOP_LATENCY_US[kind]["nvls_tree" if algo == "nvls" and self.nodes > 1 else algo][PROTOCOLS.index(proto)]

    def _latency(self, algo: str, proto: str) -> float:
        i = PROTOCOLS.index(proto)
        key = "nvls_tree" if algo == "nvls" and self.nodes > 1 else algo
        lat = BASE_LATENCY_US[key][i]
        intra = self._hop_us(self.hw.intra, algo, proto)
        inter_algo = "tree" if self.ppn == 1 else algo  # one GPU per node: every hop is a network hop
        inter = self._hop_us("net", inter_algo, proto) + self._latency_inter_us() * (2 if proto == "Simple" else 1)
        n, nodes, ppn = self.ranks, self.nodes, self.ppn
        if algo == "ring":
            if nodes > 1:
                intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
            inter_steps = 2 * (nodes - 1)
            return lat + (2 * (n - 1) - inter_steps) * intra + inter_steps * inter
        if algo == "tree":
            return lat + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
        if algo == "collnet":
            return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
        if nodes == 1:  # nvls
            return intra
        return lat + intra + 2 * _log2i(nodes) * inter  # NVLSTree

    # ---- the size-dependent time and the choice ------------------------------------------------
    def estimate(self, algo: str, proto: str, nbytes: float) -> NcclEstimate | None:
        """NCCL's time for this pair at nbytes, or None where NCCL would not run it."""
        lat, bw = self._table[(algo, proto)]
        if bw <= 0:
            return None
        log_size = _log2i(int(nbytes) >> 6) if nbytes >= 64 else -1
        if algo == "tree" and 0 <= log_size < 23:
            bw *= TREE_CORRECTION[proto][log_size]
        if algo == "ring" and proto == "Simple" and self.nodes > 1 and nbytes / (self.ring.count * self.ranks) >= 64:
            lat *= 1.9 if self.hw.gen_index == 0 else 1.4  # the ring's plateau
        us = lat + nbytes / (1000.0 * bw)
        return NcclEstimate(algo, proto, lat, bw, us * 1e-6, self.steps(algo))

    def best(self, algo: str, nbytes: float) -> NcclEstimate | None:
        """`algo` with NCCL's fastest protocol at this size (None where the hardware has no such algorithm)."""
        cands = [e for p in PROTOCOLS if (e := self.estimate(algo, p, nbytes)) is not None]
        return min(cands, key=lambda e: e.seconds) if cands else None

    def choose(self, nbytes: float) -> NcclEstimate | None:
        """NCCL's default choice: the fastest enabled (algorithm, protocol); CollNet is left out (it needs
        NCCL_COLLNET_ENABLE=1). None for a single rank (nothing to exchange)."""
        cands = [e for a in ALGOS if a != "collnet" for p in PROTOCOLS if (e := self.estimate(a, p, nbytes))]
        return min(cands, key=lambda e: e.seconds) if cands else None

    def steps(self, algo: str) -> int:
        """Sequential hops: ring 2(N-1); tree 2((ppn-1) + lg nodes); NVLS 1 (+ 2 lg nodes); CollNet 2(ppn-1)+1."""
        ppn, lg = round(self.ppn), _log2i(self.nodes)
        return {
            "ring": 2 * (self.ranks - 1),
            "tree": 2 * (ppn - 1 + lg),
            "nvls": 1 + 2 * lg,
            "collnet": 2 * (ppn - 1) + 1,
        }[algo]

    def bytes_across_nodes(self, algo: str, nbytes: float) -> float:
        """Bytes the busiest NIC-facing GPU sends across nodes: the node's outgoing bytes (ring 2(N-1)/N n, the
        two trees and NVLSTree about 2n, CollNet n) shared by the GPUs that face a NIC (min(ppn, channels))."""
        if self.nodes <= 1:
            return 0.0
        node = {"ring": 2 * (self.ranks - 1) / self.ranks * nbytes, "collnet": float(nbytes)}.get(algo, 2.0 * nbytes)
        return node / max(1, min(round(self.ppn), self.ring.count))


def _log2i(n: int) -> int:
    """floor(log2 n) for n >= 1, 0 for n < 1 (NCCL's log2i)."""
    return max(0, int(n).bit_length() - 1)
