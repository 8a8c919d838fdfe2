"""What the gradient noise scale costs: the default job (`torus-train run`, no spec) with the estimate on and
off, side by side in one run of this script, alternating (on, off, then off, on, ...) so that both see the same
machine load; steps per second and the on/off ratio (target >= 0.98: the estimate is on by default).

    python scripts/bench/bench_noise.py --rounds 3 --json F
    python scripts/bench/bench_noise.py --rounds 1 --run-args "--steps 40"    # shorter
    python scripts/bench/bench_noise.py --compare-traces ON OFF   # two `plan rehearse --keep` folders

--compare-traces reads the collective traces of two rehearsals (`torus-train plan rehearse --keep DIR`, with
the estimate on and with `--set noise.enabled=false`) and prints, per trace file, whether both issue the same
collectives in the same order (op, group, root, dtype, captured or replayed, phase) and where their element
counts differ (the stats slot: one more element in the last bucket, fewer where padding absorbs it).

Each run trains in a fresh folder with evaluation and checkpoints off (they cost the same either way and
would blur the step rate). steps/s is the run's steps over its training seconds (summary.json's wall_seconds,
from the first data touch to the end); step s is the median of metrics.jsonl's step_time (seconds per step over
each logging interval, data wait included). The ratio is on/off of the medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--set", "eval.every_epochs=0", "--set", "checkpoint.every_epochs=0", "--set", "checkpoint.at_end=false"]


def one_run(on: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["run", "--out", f"{tmp}/run", *QUIET, "--set", f"noise.enabled={'true' if on else 'false'}", *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "torus_train", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            sys.exit(f"bench_noise: the run with the estimate {'on' if on else 'off'} failed:\n{done.stderr[-2000:]}")
        summary = json.loads(Path(tmp, "run", "summary.json").read_text())
        lines = [json.loads(x) for x in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "step_time" in r]
    noise = (summary.get("noise_scale") or {}).get("end") or {}
    return {
        "noise": on,
        "steps": summary["steps"],
        "train_s": summary["wall_seconds"],
        "steps_per_s": round(summary["steps"] / summary["wall_seconds"], 4),
        "step_s_median": round(statistics.median(r["step_time"] for r in steps), 5),
        "noise_scale_end": noise.get("noise_scale"),
        "log_lines_with_noise_scale": sum("noise_scale" in r for r in steps),
    }


COLLECTIVE = ("op", "group", "root", "dtype", "captured", "replay", "phase")


def compare_traces(on: Path, off: Path) -> int:
    """Print, per trace file of both folders, the collectives compared; exit status 1 when any differ."""
    bad = 0
    names = sorted(p.name for p in on.glob("trace-*.json"))
    if not names or names != sorted(p.name for p in off.glob("trace-*.json")):
        sys.exit(f"bench_noise: {on} and {off} do not hold the same trace files")
    print("| trace | collectives on / off | same sequence | element counts that differ (on - off) |\n|---|---|---|---|")
    for name in names:
        a, b = (
            [e for e in json.loads((d / name).read_text())["events"] if e["kind"] == "collective"] for d in (on, off)
        )
        same = [tuple(e[k] for k in COLLECTIVE) for e in a] == [tuple(e[k] for k in COLLECTIVE) for e in b]
        diff = sorted({e["numel"] - f["numel"] for e, f in zip(a, b, strict=False) if e["numel"] != f["numel"]})
        bad += not same
        print(f"| {name} | {len(a)} / {len(b)} | {'yes' if same else 'NO'} | {diff or 'none'} |")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating on/off pairs")
    ap.add_argument("--run-args", default="", help="more `torus-train run` arguments, quoted (e.g. '--steps 40')")
    ap.add_argument("--json", help="write the runs and the ratios here")
    ap.add_argument("--compare-traces", nargs=2, type=Path, metavar=("ON", "OFF"), help="two rehearsal folders")
    a = ap.parse_args(argv)
    if a.compare_traces:
        return compare_traces(*a.compare_traces)
    extra = shlex.split(a.run_args)
    runs = []
    for r in range(a.rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            runs.append({"round": r, **one_run(on, extra)})
            x = runs[-1]
            print(
                f"round {r} estimate {'on ' if on else 'off'}: {x['steps']} steps in {x['train_s']:.1f} s, "
                f"{x['steps_per_s']:.3f} steps/s, median step {x['step_s_median']:.4f} s",
                flush=True,
            )
    med = {
        on: {k: statistics.median(x[k] for x in runs if x["noise"] is on) for k in ("steps_per_s", "step_s_median")}
        for on in (True, False)
    }
    ratio = med[True]["steps_per_s"] / med[False]["steps_per_s"]
    step_ratio = med[False]["step_s_median"] / med[True]["step_s_median"]
    print("\n| estimate | steps/s (median) | median step s |\n|---|---|---|")
    for on in (True, False):
        print(f"| {'on' if on else 'off'} | {med[on]['steps_per_s']:.3f} | {med[on]['step_s_median']:.4f} |")
    print(f"\non/off steps per second: {ratio:.3f} (target >= 0.98); off/on median step time: {step_ratio:.3f}")
    if a.json:
        doc = {"runs": runs, "median": {"on": med[True], "off": med[False]}, "ratio_steps_per_s": round(ratio, 4)}
        Path(a.json).write_text(json.dumps({**doc, "ratio_step_time": round(step_ratio, 4)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
