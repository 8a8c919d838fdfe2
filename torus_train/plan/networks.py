"""Cluster descriptions for the cost model: links, networks, the presets with their sources, TOML files (pure).

A Network is what the cost model needs to know of a cluster: GPUs per node, the intra-node link per GPU, the
NICs of a node, the GPU's reduction rate and single-GPU training throughput, and what NCCL's tuning model reads
of the hardware (``NcclHardware``: the GPU generation, NVSwitch, SHARP; plan/nccl.py models NCCL over it). The
presets describe the clusters of the works the paper compares with; every figure is from a datasheet or a
paper, named in ``sources``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torus_train.errors import UserError, shown_path
from torus_train.userfiles import read_text
from torus_train.usernumbers import NumberError, float_value, int_value


class NetworkError(UserError):
    """A network description (preset name or TOML file) that cannot be used; the message names the field."""


GENERATIONS = ("pascal", "volta", "ampere", "hopper")
LINK_KEYS = ("bandwidth_gbytes_per_s", "latency_us")
# Upper bounds of a network's figures, far above any machine's, so that the cost model's products stay finite
MAX_NODE_GPUS = 1024
MAX_NICS = 256
MAX_GBYTES_PER_S = 1e6
"""A link or a reduction at 1 PB/s."""
MAX_LATENCY_US = 1e9
"""A latency of some 17 minutes."""
MAX_IMAGES_PER_S = 1e9
"""GPU generations: they select NCCL's per-architecture constants (pascal shares Volta's, without LL128)."""


@dataclass(frozen=True)
class NcclHardware:
    """What NCCL's model needs beyond links and NICs: the GPU generation and the switches."""

    generation: str = "volta"
    """pascal | volta | ampere | hopper: selects NCCL's per-architecture constants and LL128."""
    nvswitch: bool = False
    """GPUs of a node meet in an NVSwitch (NVLS needs it, with hopper)."""
    sharp: bool = False
    """The network switches reduce in-network (SHARP): CollNet is possible (off in NCCL by default)."""
    intra: str = "nvlink"
    """nvlink | pci: the intra-node link's kind (LL128 needs NVLink)."""

    def check(self, where: str = "nccl") -> NcclHardware:
        """Raise UserError naming the field when a value is unknown; return self."""
        if self.generation not in GENERATIONS:
            raise UserError(f"{where} generation: {self.generation!r}; use one of {', '.join(GENERATIONS)}")
        if self.intra not in ("nvlink", "pci"):
            raise UserError(f"{where} intra: {self.intra!r}; use nvlink or pci")
        for name in ("nvswitch", "sharp"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{where} {name}: {getattr(self, name)!r} must be true or false")
        return self

    @property
    def gen_index(self) -> int:
        """Index into NCCL's per-architecture tables: Volta (and older), Ampere, Hopper."""
        return {"pascal": 0, "volta": 0, "ampere": 1, "hopper": 2}[self.generation]


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
    """NICs per node; flows leaving a node share them all (a lone flow is split over every NIC)."""
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
    nccl: NcclHardware | None = None
    """What NCCL's tuning model needs beyond the links (GPU generation, NVSwitch, SHARP); None: Volta on NVLink,
    no NVSwitch, no SHARP."""

    @property
    def gamma(self) -> float:
        """Seconds per byte reduced."""
        return 1.0 / (self.reduce_gbytes_per_s * 1e9)

    def check(self, where: str = "network") -> Network:
        """Raise NetworkError naming the field when a figure is not usable; return self."""

        try:  # what the TOML held, through the number door, with upper bounds (cost.py multiplies them)
            for path, value, kind, low, high in self._figures():
                source = f"{where} {path}"
                if kind is int:
                    int_value(value, source, int(low), int(high))
                else:
                    float_value(value, source, low, high, low_open=low == 0 and "latency" not in path)
        except NumberError as e:
            raise NetworkError(str(e)) from None
        if self.nccl is not None:
            self.nccl.check(f"{where} [nccl]")
        return self

    def _figures(self) -> list[tuple[str, Any, type, float, float]]:
        """(field as a message names it, value, int or float, low, high) of every figure check() bounds."""
        links = [(f"[{s}] {k}", getattr(getattr(self, s), k), k) for s in ("intra", "inter") for k in LINK_KEYS]
        return [
            ("gpus_per_node", self.gpus_per_node, int, 1, MAX_NODE_GPUS),
            ("nics_per_node", self.nics_per_node, int, 1, MAX_NICS),
            *[(p, v, float, 0, MAX_LATENCY_US if k == "latency_us" else MAX_GBYTES_PER_S) for p, v, k in links],
            ("reduce_gbytes_per_s", self.reduce_gbytes_per_s, float, 0, MAX_GBYTES_PER_S),
            *[(f"[images_per_second] {m}", v, float, 0, MAX_IMAGES_PER_S) for m, v in self.images_per_second.items()],
        ]

    def describe(self) -> list[str]:
        """Printable lines with every parameter the prediction uses."""
        k, hw = self.gpus_per_node, self.nccl or NcclHardware()
        return [
            f"network {self.name}: {self.description}".rstrip(": "),
            f"  {k} x {self.gpu} per node; intra-node {self.intra.bandwidth_gbytes_per_s:g} GB/s per GPU per "
            f"direction, {self.intra.latency_us:g} us",
            f"  {self.nics_per_node} NIC(s) per node at {self.inter.bandwidth_gbytes_per_s:g} GB/s per direction "
            f"({self.nics_per_node * self.inter.bandwidth_gbytes_per_s / k:g} GB/s per GPU), "
            f"{self.inter.latency_us:g} us",
            f"  reduction {self.reduce_gbytes_per_s:g} GB/s per GPU (gamma)",
            f"  for NCCL's model: {hw.generation} GPUs on {hw.intra}, "
            f"{'an NVSwitch' if hw.nvswitch else 'no NVSwitch'}, {'SHARP switches' if hw.sharp else 'no SHARP'}",
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
        nccl=NcclHardware("volta", nvswitch=False, sharp=False),
        sources=(
            "NVLink 2: 25 GB/s per link per direction (NVIDIA V100 datasheet); ABCI's 4 GPUs are fully connected "
            "with 2 links per pair = 50 GB/s per direction to a ring neighbour",
            "InfiniBand EDR: 100 Gb/s = 12.5 GB/s per direction per HCA, 2 HCAs per ABCI node (ABCI system overview)",
            "latency: NVLink and IB about 1-2 us at MPI/NCCL level; 2 us taken for both",
            "V100 HBM2 900 GB/s; a sum reads 2 and writes 1 -> 300 GB/s reduction rate",
            "NCCL: Volta without NVSwitch (ABCI's 4 GPUs are directly linked): no NVLS, no CollNet Direct",
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
        nccl=NcclHardware("hopper", nvswitch=True, sharp=True),
        sources=(
            "NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction per GPU through NVSwitch (NVIDIA H100 datasheet)",
            "NDR400 InfiniBand: 400 Gb/s = 50 GB/s per direction per NIC, 8 per DGX H100 (NVIDIA DGX H100 datasheet)",
            "latency: 2 us intra and inter (NVLink/IB at NCCL level, 1-2 us)",
            "H100 HBM3 3.35 TB/s; a sum reads 2 and writes 1 -> about 1,100 GB/s",
            "NCCL: Hopper with 4 NVSwitch chips (NVLS); Quantum-2 NDR switches reduce in-network (SHARP v3, "
            "CollNet; NCCL uses it only with NCCL_COLLNET_ENABLE=1) (NVIDIA DGX SuperPOD H100 reference architecture)",
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
        nccl=NcclHardware("pascal", nvswitch=False, sharp=False),
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
        nccl=NcclHardware("pascal", nvswitch=False, sharp=False, intra="pci"),
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


def load_network(name_or_path: str) -> Network:
    """A preset by name, or a network described in a TOML file (see docs/plan.md for the keys)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    try:
        exists, link = path.exists(), path.is_symlink()
    except OSError as e:  # a name too long for the file system, ...
        raise NetworkError(f"--network {shown_path(name_or_path)}: {e.strerror or e}") from None
    if not (name_or_path.endswith(".toml") or exists):
        raise NetworkError(
            f"--network: unknown network {shown_path(name_or_path)!r}; presets: {', '.join(PRESETS)}, or a path "
            "to a .toml file"
        )
    if not exists and not link:
        raise NetworkError(f"--network: file {shown_path(name_or_path)} does not exist")
    return network_from_dict(_read_toml(path), where=f"{path}", default_name=path.stem)


MAX_NETWORK_BYTES = 1 << 20
"""A network description is a few hundred bytes; more is not one."""


def _read_toml(path: Path) -> dict:
    """The TOML file as a dict; tomllib is in the standard library from Python 3.11, tomli before it."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin (3.11+; vermin does not see the fallback)
    else:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise NetworkError("reading a network TOML file needs Python 3.11 or `pip install tomli`") from None
    try:
        return tomllib.loads(read_text(path, "--network", MAX_NETWORK_BYTES))  # through the door: never a FIFO
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise NetworkError(f"{path}: not valid TOML: {e}") from None


_TOP_KEYS = {
    "name",
    "description",
    "gpu",
    "gpus_per_node",
    "nics_per_node",
    "reduce_gbytes_per_s",
    "images_per_second",
    "sources",
    "intra",
    "inter",
    "nccl",
}
"""Keys a network TOML file may hold at the top level."""


def network_from_dict(data: dict, where: str = "network", default_name: str = "custom") -> Network:
    """Build and check a Network from a TOML-like dict; unknown keys and missing ones are named."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise NetworkError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(_TOP_KEYS))}")
    intra, inter = (_link_from_dict(data.get(section), where, section) for section in ("intra", "inter"))
    for key in ("gpus_per_node", "nics_per_node"):
        if key not in data:
            raise NetworkError(f"{where} {key}: missing")
    ips = data.get("images_per_second", {})
    if not isinstance(ips, dict):
        raise NetworkError(f"{where} images_per_second: {str(ips)[:40]!r} must be a table of model = images per second")
    net = Network(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        gpu=str(data.get("gpu", "unknown GPU")),
        gpus_per_node=data["gpus_per_node"],
        nics_per_node=data["nics_per_node"],
        intra=intra,
        inter=inter,
        reduce_gbytes_per_s=data.get("reduce_gbytes_per_s", 300.0),
        images_per_second=dict(ips),
        sources=_sources(data.get("sources", []), where),
        nccl=_nccl_from_dict(data.get("nccl"), where),
    )
    net.check(where)
    return replace(net, gpus_per_node=int(net.gpus_per_node), nics_per_node=int(net.nics_per_node))


def _sources(value: object, where: str) -> tuple[str, ...]:
    """``sources``: a list of strings (where each figure comes from)."""
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise NetworkError(f"{where} sources: {str(value)[:40]!r} must be a list of strings, e.g. [\"datasheet\"]")
    return tuple(value)


def _nccl_from_dict(sec: object, where: str) -> NcclHardware | None:
    """Optional table [nccl] (generation, nvswitch, sharp, intra) as NcclHardware; checked by Network.check."""
    if sec is None:
        return None
    known = {"generation", "nvswitch", "sharp", "intra"}
    if not isinstance(sec, dict) or set(sec) - known:
        bad = sorted(set(sec) - known)[0] if isinstance(sec, dict) else "nccl"
        raise NetworkError(f"{where} [nccl] {bad}: unknown key; use {', '.join(sorted(known))}")
    return NcclHardware(**sec)


def _link_from_dict(sec: object, where: str, section: str) -> Link:
    """Table [section] ("intra" or "inter") as a Link; its figures are checked with the rest by Network.check."""
    if not isinstance(sec, dict):
        raise NetworkError(f"{where} [{section}]: missing table with bandwidth_gbytes_per_s and latency_us")
    bad = sorted(set(sec) - {"bandwidth_gbytes_per_s", "latency_us"})
    if bad:
        raise NetworkError(f"{where} [{section}] {bad[0]}: unknown key; use bandwidth_gbytes_per_s and latency_us")
    for key in ("bandwidth_gbytes_per_s", "latency_us"):
        if key not in sec:
            raise NetworkError(f"{where} [{section}] {key}: missing")
    return Link(sec["bandwidth_gbytes_per_s"], sec["latency_us"])
