"""The table of docs/recipe.md "Stages that follow the noise scale": runs of the default job under each
schedule.control variant, one row per run: when each stage started, steps and seconds to the target, final
top-1, total steps and training seconds.

    python scripts/experiments/recipe_seeds.py --out /tmp/cmp/fixed --seeds 0,1,2
    python scripts/experiments/recipe_seeds.py --out /tmp/cmp/noise --seeds 0,1,2 --set schedule.control=noise
    python scripts/experiments/control_table.py fixed=/tmp/cmp/fixed noise=/tmp/cmp/noise [--json rows.json]

Each FOLDER holds recipe_seeds.py's seedS-tT run folders. Steps and seconds to the target are those of the first
evaluation at or above it (summary.json's target_top1): evaluations come once an epoch, so they are read at
epoch ends (training seconds: summary.json's wall_seconds, from the first step).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def row(name: str, out: Path) -> dict:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    s = json.loads((out / "summary.json").read_text())
    target = s.get("target_top1") or 0.9
    evals = [r for r in recs if r.get("event") == "eval"]
    hit = next((r for r in evals if r["top1"] >= target), None)
    starts = [r["epoch"] for r in recs if r.get("event") == "stage"]
    why = {r["stage"]: r["why"] for r in recs if r.get("event") == "stage_decision"}
    return {
        "variant": name,
        "run": out.name,
        "stage_starts": starts,
        "decided_by": [why.get(i, "table") for i in range(1, len(starts))],
        "steps_to_target": hit["step"] if hit else None,
        "seconds_to_target": hit["wall_seconds"] if hit else None,
        "target_epoch": hit["epoch"] + 1 if hit else None,
        "final_top1": evals[-1]["top1"] if evals else None,
        "steps": s["steps"],
        "train_s": s["wall_seconds"],
        "digest": s.get("param_digest", "")[:12],
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| control | run | stages start at epochs | decided by | steps to 90% (epoch) | s to 90% | final top-1 | "
        "steps | training s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        to = f"{r['steps_to_target']} ({r['target_epoch']})" if r["steps_to_target"] else "not reached"
        secs = f"{r['seconds_to_target']:.1f}" if r["seconds_to_target"] else "-"
        lines.append(
            f"| {r['variant']} | {r['run']} | {', '.join(map(str, r['stage_starts']))} | "
            f"{', '.join(r['decided_by']) or '-'} | {to} | {secs} | {100 * r['final_top1']:.1f}% | {r['steps']} | "
            f"{r['train_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=FOLDER")
    ap.add_argument("--json", default="", help="write the rows here too")
    a = ap.parse_args()
    rows = []
    for v in a.variants:
        name, folder = v.split("=", 1)
        for out in sorted(Path(folder).iterdir()):
            if (out / "summary.json").exists():
                rows.append(row(name, out))
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
