#!/usr/bin/env python
"""A linear classifier on raw pixels of the demo set, for comparison with the convnet of `torus-train run`.

Each image is taken the way validation sees it (resize the shorter side, centre crop, --size px), flattened
to 3*size*size standardised pixel values; a softmax regression is fitted with full-batch L-BFGS and L2
regularisation, one run per --l2 value, and scored on the validation split.

    python scripts/experiments/linear_baseline.py                      # the cached demo set (created if missing)
    python scripts/experiments/linear_baseline.py --data DIR --size 32 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from PIL import Image

from torus_train.data.base import val_resize
from torus_train.data.checks import scan
from torus_train.data.demo import ensure_demo_dataset


def load(root: str, split: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    s = scan(root, split)
    r = val_resize(size)
    xs = np.empty((len(s), 3 * size * size), np.float32)
    for i, p in enumerate(s.files):
        with Image.open(p) as im:
            im = im.convert("RGB")
            w, h = im.size
            k = r / min(w, h)
            im = im.resize((max(r, round(w * k)), max(r, round(h * k))), Image.BILINEAR)
            w, h = im.size
            left, top = (w - size) // 2, (h - size) // 2
            xs[i] = np.asarray(im.crop((left, top, left + size, top + size)), np.float32).reshape(-1) / 255
    return xs, np.asarray(s.labels, np.int64)


def fit(x: torch.Tensor, y: torch.Tensor, classes: int, l2: float, iters: int) -> torch.nn.Linear:
    torch.manual_seed(0)
    lin = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.LBFGS(lin.parameters(), lr=1, max_iter=iters, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(x), y) + l2 * lin.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return lin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="ImageNet-layout folder (default: the cached demo set)")
    ap.add_argument("--size", type=int, default=32, help="pixels per side, as the convnet sees them")
    ap.add_argument("--l2", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    root = args.data or str(ensure_demo_dataset())
    t0 = time.time()
    xtr, ytr = load(root, "train", args.size)
    xva, yva = load(root, "val", args.size)
    mean, std = xtr.mean(0), xtr.std(0) + 1e-6
    xtr_t, xva_t = torch.from_numpy((xtr - mean) / std), torch.from_numpy((xva - mean) / std)
    ytr_t, yva_t = torch.from_numpy(ytr), torch.from_numpy(yva)
    classes = int(ytr.max()) + 1
    print(
        f"{root}: {len(ytr)} train, {len(yva)} val images, {classes} classes, {xtr.shape[1]} pixel features "
        f"(loaded in {time.time() - t0:.1f} s)"
    )
    print(f"chance: {100 / classes:.1f}%")
    print("| L2 | train top-1 | val top-1 |\n|---|---|---|")
    rows = []
    for l2 in args.l2:
        lin = fit(xtr_t, ytr_t, classes, l2, args.iters)
        with torch.no_grad():
            tr = (lin(xtr_t).argmax(1) == ytr_t).float().mean().item()
            va = (lin(xva_t).argmax(1) == yva_t).float().mean().item()
        rows.append({"l2": l2, "train_top1": round(tr, 4), "val_top1": round(va, 4)})
        print(f"| {l2:g} | {100 * tr:.1f}% | {100 * va:.1f}% |", flush=True)
    best = max(rows, key=lambda r: r["val_top1"])
    print(f"best linear classifier on raw pixels: {100 * best['val_top1']:.1f}% val top-1 (L2 {best['l2']:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"data": root, "size": args.size, "rows": rows, "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
