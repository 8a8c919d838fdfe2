#!/usr/bin/env python3
"""Predicted against measured step time of real `torus-train run` jobs on this machine (docs/plan.md).

    python scripts/bench/plan_vs_run.py --grid 2x2 --grid 2x4 --json OUT.json [--repeats 2] [--steps 40]

For each repeat, and inside it for each grid in turn (so the grids alternate under similar load), back to back:
  1. calibrate: `torus-train bench allreduce --grid G --algo torus -b 1M -e 32M` (the sizes of ResNet-18's buckets);
  2. profile: one rank's step measured alone, 1 thread, CPU time (`scripts/experiments/step_profile.py resnet18 ...`),
     and the training loop's CPU per step in a one-rank run of the same job (1x1, 30 steps; --no-loop skips it);
  3. run: `torus-train run` on G with the torus hook, ResNet-18 at 64 px on synthetic data, --batch images per
     rank, --steps steps, metrics every 5 steps;
  4. compare: `scripts/experiments/compare_run.py RUN --calibrate BENCH --layer-profile PROF`, with the background
     load measured during each of 1 to 3.
The background is sampled every 0.5 s while each of 1 to 3 runs: the other runnable threads, as
scripts/dev/measure_background.py counts them, and the other runnable scheduling groups (sessions with a runnable
thread: the kernel's sched_autogroup shares the CPU between sessions; every rank of a local run is its own
session). The prediction is made three times: counting threads (the headline,
--background-unit), counting groups, and with no background (the model's o = max(1, (ranks + background) /
cores) for the bench and the run; the profile is CPU time, which time-sharing does not stretch).

Writes {"machine", "settings", "results": [{grid, repeat, measured_step_seconds, predicted_step_seconds, ratio,
bound, by_background_unit, backgrounds, files}], "summary": {grid: {...}}}
and prints one line per result. Exit 0 when it ran (whatever the ratios), 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
EXPERIMENTS = ROOT / "scripts" / "experiments"
sys.path[:0] = [str(ROOT), str(EXPERIMENTS)]  # this checkout's torus_train; the CPU-host model's scripts
from compare_run import read_run  # noqa: E402  (numpy only; the runs themselves are subprocesses)

TICK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, int, list[str], float]]:
    """pid -> (ppid, session, states of its threads, CPU seconds used), from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            states = []
            for tid in os.listdir(f"/proc/{d}/task"):
                with open(f"/proc/{d}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
        out[int(d)] = (int(fields[1]), int(fields[3]), states, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _tree(table: dict, root: int) -> set[int]:
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _, _, _) in table.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def background_sample(root: int) -> tuple[int, int, float]:
    """(runnable scheduling groups, runnable threads) outside the process tree of `root` and this script, and
    the CPU seconds used so far by the processes of that tree.

    With sched_autogroup_enabled = 1 (this machine's kernel) the scheduler shares the CPU between sessions
    (autogroups), and inside a session between its threads: a session with runnable threads takes one share
    however many it has. Kernel threads (session 0) are counted one by one."""
    table = _proc_table()
    mine = _tree(table, root) | {os.getpid()}
    groups, threads = set(), 0
    cpu = sum(table[pid][3] for pid in mine if pid in table and pid != os.getpid())
    for pid, (_, sess, states, _) in table.items():
        if pid in mine:
            continue
        r = sum(st == "R" for st in states)
        threads += r
        if r:
            groups.add(sess if sess else -pid)
    return len(groups), threads, cpu


def _last_step(metrics: Path | None) -> int | None:
    """The step of the last line of a run's metrics.jsonl, if any."""
    try:
        lines = metrics.read_text().splitlines() if metrics else []
        return int(json.loads(lines[-1]).get("step")) if lines else None
    except (OSError, ValueError, TypeError):
        return None


def autogroup_enabled() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def measured(cmd: list[str], log: Path, timeout: float, metrics: Path | None = None) -> dict:
    """Run cmd (its output in `log`), sampling the background every 0.5 s; returns {groups, threads, seconds}:
    the mean runnable scheduling groups and threads outside it; with `metrics` (a run's metrics.jsonl) also
    cpu_per_step: the CPU seconds its processes used per optimizer step, between the first sample after step 5
    and the last. Raises RuntimeError when it fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        samples = []
        try:
            while proc.poll() is None:
                if time.perf_counter() - t > timeout:
                    proc.terminate()
                    proc.wait(timeout=60)
                    raise RuntimeError(f"{' '.join(cmd[:6])} ... ran past {timeout:g} s; see {log}")
                g, th, cpu = background_sample(proc.pid)
                samples.append((g, th, cpu, _last_step(metrics), time.perf_counter()))
                time.sleep(0.5)
        except BaseException:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
            raise
        seconds = time.perf_counter() - t
        f.write(f"\n# {seconds:.1f} s, rc {proc.returncode}\n")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (rc {proc.returncode}); see {log}")
    n = max(len(samples), 1)
    out = {
        "groups": sum(x[0] for x in samples) / n,
        "threads": sum(x[1] for x in samples) / n,
        "samples": len(samples),
        "seconds": seconds,
    }
    # The CPU rate (cores busy) between the first record (warm-up) and the last (ranks exit then, and their CPU
    # leaves /proc), times the median step of the records: the metrics' step lags the samples by up to one
    # logging interval, so CPU over steps counted from them would be off by up to 2 intervals in 30 steps.
    last = max((x[3] for x in samples if x[3] is not None), default=None)
    stepped = [(x[2], x[4]) for x in samples if x[3] is not None and 5 <= x[3] < last]
    step = read_run(str(metrics.parent)).stages[0]["step_seconds"] if metrics else None
    if len(stepped) >= 2 and stepped[-1][1] > stepped[0][1] and step:
        out["cpu_rate"] = (stepped[-1][0] - stepped[0][0]) / (stepped[-1][1] - stepped[0][1])
        out["cpu_per_step"] = out["cpu_rate"] * step
    return out


def job_args(args, out: Path, steps: int) -> list[str]:
    """The job of every run: the model at the image size on synthetic data, args.batch per rank, torus hook."""
    return [
        "--data",
        "synthetic",
        "--model",
        args.model,
        "--image-size",
        str(args.image_size),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--set",
        "comm.algo=torus",
        "--set",
        "job.log_every=5",
        "--set",
        "checkpoint.every_epochs=0",
        "--set",
        "checkpoint.at_end=false",
        "--set",
        "eval.every_epochs=0",
        "--set",
        f"schedule.stages=[{{until_epoch=1,per_rank_batch={args.batch}}}]",
        "--set",
        "schedule.warmup_epochs=0",
    ]


def one(grid: str, rep: int, work: Path, args) -> dict:
    """Calibrate, profile, run and compare on one grid; returns the result row."""
    x, y = map(int, grid.split("x"))
    ranks = x * y
    d = work / f"{grid}_{rep}"
    d.mkdir(parents=True, exist_ok=True)
    bench, prof, run = d / "bench.json", d / "profile.json", d / "run"
    tt = [PY, "-m", "torus_train"]
    t0 = time.time()
    pick = "groups" if args.background_unit == "groups" else "threads"
    m_bench = measured(
        [
            *tt,
            "bench",
            "allreduce",
            "--grid",
            grid,
            "--algo",
            "torus",
            "-b",
            "1M",
            "-e",
            "32M",
            "-n",
            str(args.bench_iters),
            "-w",
            "2",
            "--json",
            str(bench),
        ],
        d / "bench.log",
        900,
    )
    m_prof = measured(
        [
            PY,
            str(EXPERIMENTS / "step_profile.py"),
            args.model,
            str(prof),
            "--image-size",
            str(args.image_size),
            "--batch",
            str(args.batch),
            "--repeats",
            "5",
        ],
        d / "profile.log",
        600,
    )
    bg_bench, bg_prof = m_bench[pick], m_prof[pick]
    p = json.loads(prof.read_text())
    p["background"] = bg_prof
    if args.loop:
        # pinned to one core, so the rank runs one compute thread, as the profile and the grid's ranks do
        m_loop = measured(
            ["taskset", "-c", "0", *tt, "run", "--gpus", "1", "--grid", "1x1", *job_args(args, d / "run_1x1", 30)],
            d / "run_1x1.log",
            900,
            d / "run_1x1" / "metrics.jsonl",
        )
        p["loop_seconds"] = m_loop.get("cpu_per_step")
    prof.write_text(json.dumps(p, indent=1) + "\n")
    m_run = measured(
        [*tt, "run", "--gpus", str(ranks), "--grid", grid, *job_args(args, run, args.steps)],
        d / "run.log",
        1200,
        run / "metrics.jsonl",
    )
    bg_run = m_run[pick]
    rows = {}
    variants = {
        "threads": (m_bench["threads"], m_run["threads"]),
        "groups": (m_bench["groups"], m_run["groups"]),
        "none": (0.0, 0.0),
    }
    for label, (bb, br) in variants.items():
        out = d / f"compare_{label}.json"
        r = subprocess.run(
            [
                PY,
                str(EXPERIMENTS / "compare_run.py"),
                str(run),
                "--calibrate",
                str(bench),
                "--layer-profile",
                str(prof),
                "--cores",
                str(args.cores),
                "--background",
                f"{bb}",
                "--run-background",
                f"{br}",
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        (d / f"compare_{label}.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"compare_run.py failed: {r.stderr.strip()}")
        rows[label] = json.loads(out.read_text())["stages"][0]
    w = rows[pick]
    pred = w["prediction"]
    return {
        "grid": grid,
        "ranks": ranks,
        "repeat": rep,
        "started": time.strftime("%H:%M:%S", time.gmtime(t0)),
        "measured_step_seconds": w["measured_step_seconds"],
        "metrics_records_used": w["records_used"],
        "predicted_step_seconds": w["predicted_step_seconds"],
        "ratio": w["ratio"],
        "bound": pred["bound"],
        "background_unit": pick,
        "timeline_step_seconds": pred["timeline_step_seconds"],
        "cores_step_seconds": pred["cores_step_seconds"],
        "exchanges_seconds": pred["bucket_seconds"],
        "oversubscription": pred["oversubscription"],
        # the model's CPU per rank per step (profile + the exchanges' work: the cores' bound over o) against
        # what the run's processes used: a check of the model that the background does not enter
        "predicted_cpu_per_rank_step_seconds": pred["cores_step_seconds"] / pred["oversubscription"],
        "measured_cpu_per_rank_step_seconds": (m_run["cpu_per_step"] / ranks if "cpu_per_step" in m_run else None),
        "by_background_unit": {
            k: {"predicted_step_seconds": v["predicted_step_seconds"], "ratio": v["ratio"]} for k, v in rows.items()
        },
        "backgrounds": {"bench": bg_bench, "profile": bg_prof, "run": bg_run, "unit": pick},
        "background_samples": {"bench": m_bench, "profile": m_prof, "run": m_run},
        "profile_ms": {k: p[k] * 1e3 for k in ("forward_seconds", "backward_seconds", "optimizer_seconds")},
        "profile_clock": p.get("clock", "wall"),
        "loop_seconds": p.get("loop_seconds"),
        "files": str(d),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", action="append", default=None, help="XxY (repeatable; default 2x2 and 2x4)")
    ap.add_argument("--json", dest="json_path", required=True, help="write the results here")
    ap.add_argument("--workdir", default=None, help="folder for benches, profiles, runs [default: next to --json]")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the grids, alternating")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=16, help="images per rank per step")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--bench-iters", type=int, default=5)
    ap.add_argument(
        "--no-loop",
        dest="loop",
        action="store_false",
        help="do not measure the training loop's CPU per step in a one-rank run of the same job",
    )
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument(
        "--background-unit",
        choices=["groups", "threads"],
        default="threads",
        help="what the headline prediction counts as background: runnable threads (as "
        "scripts/dev/measure_background.py and the calibration's model do) or runnable scheduling "
        "groups (sessions, which sched_autogroup shares the CPU between); both are in the JSON",
    )
    args = ap.parse_args()
    grids = args.grid or ["2x2", "2x4"]
    work = Path(args.workdir or Path(args.json_path).with_suffix("")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results, failed = [], None
    for rep in range(args.repeats):
        for g in grids:
            try:
                r = one(g, rep, work, args)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failed = f"{g} repeat {rep}: {e}"
                print(f"# FAILED {failed}", flush=True)
                break
            results.append(r)
            b, u = r["backgrounds"], r["by_background_unit"]
            print(
                f"{g} #{rep} ({r['started']} UTC): measured {r['measured_step_seconds'] * 1e3:.1f} ms, predicted "
                f"{r['predicted_step_seconds'] * 1e3:.1f} ms, pred/meas {r['ratio']:.2f} ({r['bound']} bound; "
                f"background {b['unit']}: bench {b['bench']:.2f} run {b['run']:.2f}); pred/meas counting "
                + ", ".join(f"{k} {v['ratio']:.2f}" for k, v in u.items())
                + (
                    f"; CPU per rank per step predicted {r['predicted_cpu_per_rank_step_seconds'] * 1e3:.0f} ms, "
                    f"used {r['measured_cpu_per_rank_step_seconds'] * 1e3:.0f} ms"
                    if r["measured_cpu_per_rank_step_seconds"]
                    else ""
                ),
                flush=True,
            )
        if failed:
            break
    summary = {}
    for g in grids:
        rs = [r for r in results if r["grid"] == g]
        if rs:
            summary[g] = {
                "runs": len(rs),
                "median_ratio": statistics.median(r["ratio"] for r in rs),
                "within_15_percent": sum(abs(r["ratio"] - 1) <= 0.15 for r in rs),
                "median_ratio_by_background_unit": {
                    k: statistics.median(r["by_background_unit"][k]["ratio"] for r in rs)
                    for k in rs[0]["by_background_unit"]
                },
            }
    load = os.getloadavg()
    out = {
        "machine": {"cores": args.cores, "loadavg_at_end": load, "autogroup": autogroup_enabled()},
        "settings": {k: v for k, v in vars(args).items() if k != "json_path"} | {"grid": grids},
        "results": results,
        "summary": summary,
        "failed": failed,
    }
    Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    for g, s in summary.items():
        alt = ", ".join(f"{k} {v:.2f}" for k, v in s["median_ratio_by_background_unit"].items())
        print(
            f"# summary {g}: {s['runs']} run(s), median pred/meas {s['median_ratio']:.2f}, "
            f"{s['within_15_percent']} within 15% (median counting the background as {alt})"
        )
    print(f"# wrote {args.json_path} (files under {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
