"""The acceptance part `production`: `torus-train run` of the shrunk production spec (shrunk.py) on photo-like
JPEGs, two epochs (the small batch, then the large one), evaluation after each; DALI, or where nvidia.dali does
not import, torchvision with its GPU decoder (data.decoder = auto), said in the check's note. Pure: the run is a
process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from torus_train.check.environment import dali_version
from torus_train.check.shrunk import PHOTO_LIKE_SET, SPEC, Shrunk, stages

LEFT_OUT, MEASURED = 3, 20
"""The first steps of a stage (a new loader, cuDNN autotuning) are not the loader's; then at least this many."""
CLASSES = 8


def photos(s: Shrunk) -> Path:
    """8 classes, the train set a whole number of large-batch steps, more than LEFT_OUT + MEASURED of them
    (6,144 images: 192 steps at batch 32, 24 at 256; a rehearsal's 192: 48 at batch 4, 24 at batch 8). A few
    images per class are made, the others are links to them: the loader's speed is measured, not the images'.
    Kept for the next run into this folder (its size in its name)."""
    per_class = s.large * (LEFT_OUT + MEASURED + 1) // CLASSES
    unique, val_per_class = (4, 2) if s.rehearsal else (16, 8)
    folder = s.out / f"photos-{per_class}-{unique}"
    if (folder / "train").is_dir():
        return folder
    argv = [sys.executable, str(PHOTO_LIKE_SET), "--out", str(folder), "--classes", str(CLASSES)]
    subprocess.run([*argv, "--per-class", str(unique), "--val-per-class", str(val_per_class)], check=True)
    for cls in (folder / "train").iterdir():
        for i in range(unique, per_class):
            os.link(cls / f"img{i % unique:04d}.JPEG", cls / f"img{i:04d}.JPEG")
    return folder


def production(s: Shrunk) -> dict[str, Any]:
    """production and data_wait (docs/check.md): the run's backend, loader, evaluations, replicas; the data
    wait's share of each stage's step time."""
    dali = dali_version() is not None  # without it: torchvision decoding on the GPU, and DALI not checked
    run = s.out / "production"
    sets = ["model.num_classes=8", "eval.every_epochs=1", "checkpoint.every_epochs=1", "job.log_every=1"]
    sets += ["eval.target_top1=0", stages(s.small, s.large), *([] if dali else ["data.loader=torchvision"])]
    argv = [sys.executable, "-m", "torus_train", "run", "--spec", str(SPEC), "--data", str(photos(s))]
    r = subprocess.run([*argv, "--out", str(run), "--epochs", "2", *s.cli_sets(sets)], capture_output=True, text=True)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    metrics = run / "metrics.jsonl"
    recs = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    want = f"dali ({s.dali_decoder})" if dali else f"torchvision ({s.torchvision_decoder})"
    loader = summary["loader"] + (f" ({summary['decoder']})" if summary["decoder"] else "") if summary else None
    not_dali = f"nvidia.dali does not import here: DALI was not checked; torchvision with its {s.torchvision_decoder}"
    prod = {
        "backend": summary.get("backend"),
        "loader": loader,
        "dali_checked": dali and loader == want,
        "note": "DALI" if dali else f"{not_dali} decoder was",
        "steps": summary.get("steps"),
        "evaluations": sum(1 for x in recs if x.get("event") == "eval"),
        "images_per_s": summary.get("images_per_second"),
        "replicas_agree": summary.get("param_digests_agree"),
    }
    prod["ok"] = r.returncode == 0 and prod["backend"] == s.backend and loader == want
    prod["ok"] = prod["ok"] and prod["evaluations"] == 2 and prod["replicas_agree"] is True
    if r.returncode:
        prod["error"] = (r.stderr or r.stdout)[-800:]
    steps = [x for x in recs if "step_time" in x]
    (small, n_small), (large, n_large) = wait(steps, s.small), wait(steps, s.large)
    waits = {"share_batch_32": small, "share_batch_256": large, "steps_batch_32": n_small, "steps_batch_256": n_large}
    waits["ok"] = all(v is not None and v <= 0.10 for v in (small, large)) and min(n_small, n_large) >= MEASURED
    return {"production": prod, "data_wait": waits}


def wait(steps: list[dict], batch: int) -> tuple[float | None, int]:
    """(data wait / step time, steps) over the stage at ``batch`` after its first LEFT_OUT steps; a metrics
    line holds the per-step means of the steps since the line before it."""
    done, rows, last = 0, [], None
    for x in steps:
        n = x["step"] - (x["step"] - 1 if last is None else last)
        last = x["step"]
        if x["per_rank_batch"] != batch:
            continue
        if done >= LEFT_OUT:
            rows.append((x["data_time"] * n, x["step_time"] * n, n))
        done += n
    share = sum(d for d, _, _ in rows) / sum(t for _, t, _ in rows) if rows else None
    return share, sum(n for _, _, n in rows)
