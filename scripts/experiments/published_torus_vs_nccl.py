#!/usr/bin/env python3
"""The planner's torus/NCCL ratio against the published ones (docs/plan.md, "Published torus-vs-NCCL figures").

    python scripts/experiments/published_torus_vs_nccl.py                  # the table
    python scripts/experiments/published_torus_vs_nccl.py --json OUT       # also the rows

For each published comparison of a 2D torus with NCCL on one cluster: the planner's all-reduce time for the
torus and for the NCCL algorithm the work compared with (`nccl-ring` for a flat NCCL ring), on the work's grid
and network, at the message sizes in SIZES_MB (the works do not always say the size: the ratio is shown
across sizes), beside the published ratio. Variants change what the work does not state (the link inside a
node). Sony v1 (NCCL 2.3.5, ring only) published no torus-against-NCCL time in the sources here.

Writes [{"work", "variant", "grid", "network", "nccl_algo", "bytes", "torus_ms", "nccl_ms",
"predicted_ratio", "published_ratio"}].
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from torus_train.job.topology import Grid  # noqa: E402
from torus_train.plan.cost import allreduce_cost  # noqa: E402
from torus_train.plan.networks import Link, load_network  # noqa: E402

SIZES_MB = (4, 64, 256, 680, 1360)
"""Message sizes (1e6 bytes) the ratio is shown at: up to BERT-Large's 340M parameters in fp16 (680 MB) and
fp32 (1,360 MB)."""


@dataclass(frozen=True)
class Published:
    work: str
    grid: Grid
    network: str
    nccl_algo: str
    torus_ms: float
    nccl_ms: float
    source: str


WORKS = (
    Published(
        "horovod-3608",
        Grid(6, 32, 6),
        "scripts/networks/horovod-3608.toml",
        "nccl-ring",
        978.0,
        2498.0,
        "github.com/horovod/horovod/pull/3608: BERT-Large all-reduce, 32 nodes x 6 V100, one 10 GbE NIC; "
        "NCCLRingAllreduce 2498 ms, NCCLTorusAllreduce 978 ms",
    ),
)

VARIANTS = {
    "nvlink": lambda net: net,
    "pcie3": lambda net: replace(net, intra=Link(12.0, 5.0), nccl=replace(net.nccl, intra="pci")),
}
"""What the work leaves open, as changes to its network file: the link inside a node."""


def rows() -> list[dict]:
    out = []
    for w in WORKS:
        base = load_network(str(ROOT / w.network))
        for variant, change in VARIANTS.items():
            net = change(base)
            for mb in SIZES_MB:
                n = int(mb * 1e6)
                t = allreduce_cost("torus", w.grid, net, n).seconds
                c = allreduce_cost(w.nccl_algo, w.grid, net, n).seconds
                out.append(
                    {
                        "work": w.work,
                        "variant": variant,
                        "grid": str(w.grid),
                        "network": net.name,
                        "nccl_algo": w.nccl_algo,
                        "bytes": n,
                        "torus_ms": t * 1e3,
                        "nccl_ms": c * 1e3,
                        "predicted_ratio": t / c,
                        "published_ratio": w.torus_ms / w.nccl_ms,
                    }
                )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    out = rows()
    for w in WORKS:
        print(f"# {w.work}: {w.source}; published torus/NCCL {w.torus_ms / w.nccl_ms:.2f}")
    print(
        f"{'work':>14} {'variant':>8} {'grid':>6} {'MB':>6} {'torus ms':>9} {'NCCL ms':>9} {'predicted':>9} "
        f"{'published':>9}"
    )
    for r in out:
        print(
            f"{r['work']:>14} {r['variant']:>8} {r['grid']:>6} {r['bytes'] / 1e6:>6g} {r['torus_ms']:>9.1f} "
            f"{r['nccl_ms']:>9.1f} {r['predicted_ratio']:>9.2f} {r['published_ratio']:>9.2f}"
        )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
