#!/usr/bin/env python3
"""Print the predicted-vs-reported scaling-efficiency table of docs/plan.md (markdown) from the cost model.

    python scripts/efficiency_table.py

Every figure comes from torus_train.plan.networks' presets (datasheets; see their `sources`); nothing here is
fitted to the reported efficiencies. Efficiency is shown with no overlap, the stated default overlap (half of
the backward pass hides communication) and full overlap, since the overlap is the model's least known input.
"""
from __future__ import annotations

from torus_train.job.topology import Grid
from torus_train.plan.cost import step_cost
from torus_train.plan.networks import PRESETS
from torus_train.plan.search import make_plan

# (work, reported efficiency, preset, GPUs, images per GPU, gradient dtype, algorithm, grid or None = model's best)
CASES = [
    ("Sony v1 (Mikami et al. 2018)", "91.62%", "abci-v100", 1088, 32, "fp16", "torus", (32, 34)),
    ("Sony v1 (Mikami et al. 2018)", "91.62%", "abci-v100", 1088, 32, "fp16", "torus", None),
    ("Sony v2", "84.75%", "abci-v100", 3456, 16, "fp16", "torus", (48, 72)),
    ("Sony v2", "84.75%", "abci-v100", 3456, 16, "fp16", "torus", None),
    ("Goyal et al. 2017", "~90%", "goyal-p100-50gbe", 256, 32, "fp32", "hierarchical", (8, 32)),
    ("Goyal et al. 2017", "~90%", "goyal-p100-50gbe", 256, 32, "fp32", "torus", (8, 32)),
    ("Jia et al. 2018", "87.9%", "jia-p40-100gbe", 2048, 32, "fp16", "hierarchical", (8, 256)),
    ("Jia et al. 2018", "87.9%", "jia-p40-100gbe", 2048, 32, "fp16", "torus", (8, 256)),
]


def main() -> None:
    print("| work | reported | network preset | GPUs | img/GPU | grads | algorithm | grid | all-reduce ms "
          "| compute ms | predicted eff. (overlap 0 / 0.5 / 1) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for work, reported, preset, gpus, batch, dtype, algo, grid in CASES:
        net = PRESETS[preset]
        g = Grid(*grid, net.gpus_per_node) if grid else None
        p = make_plan(gpus, net, "resnet50", batch, g, dtype)
        a = p.algorithms[algo]
        effs = [step_cost(p.compute_seconds, a.allreduce_seconds, o).scaling_efficiency for o in (0.0, 0.5, 1.0)]
        label = p.grid if grid else f"{p.grid} (model's best)"
        print(f"| {work} | {reported} | {preset} | {gpus} | {batch} | {dtype} | {algo} | {label} | "
              f"{a.allreduce_seconds * 1e3:.2f} | {p.compute_seconds * 1e3:.1f} | "
              f"{' / '.join(f'{e * 100:.1f}%' for e in effs)} |")


if __name__ == "__main__":
    main()
