"""gpu_check.sh's part `graphs` (run by it as parts/graphs.py beside parts/shrunk.py): the loop with its step
replayed as a CUDA graph against the same loop eager, a bare eager step, and the ceiling, a bare step with the
torus's three NCCL phases captured whole in one graph, at per-GPU batch 16, 32 and 256, in one process, rounds
alternating. The bare step, the rounds and the agreement line are the package's (torus_train/check/throughput.py,
train/graphs.py: the same code `torus-train check` runs); the loop is the production spec shrunk (shrunk.py).
Writes parts/graphs.json: {"graphs": {"batches": {BATCH: {ours_graphed_img_s, ours_eager_img_s, bare_eager_img_s,
bare_graphed_img_s, ratio, capture_seconds}}, "ok"}}. A rehearsal runs it on the CPU at batch 2, 4 and 8 (nothing
is captured there: capture_seconds is 0.0 and every column is eager; it checks the program, not the speed)."""

import json
import os
import pathlib
import statistics

# agree's runs are deterministic (job.deterministic); cuBLAS reads its workspace setting once per process, so
# it is set before torch loads, for every column alike
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import shrunk
import torch

from torus_train.check.throughput import PASS as GPU_PASS
from torus_train.check.throughput import Setting, alternating, bare_img_s
from torus_train.train.graphs import AGREE_TOLERANCE, max_rel_diff

OUT = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "graphs"
QUICK = os.environ.get("GPU_CHECK_QUICK") == "1"
BATCHES = (2, 4, 8) if shrunk.REHEARSAL else (16, 32, 256)
WARM, STEPS = (5, 2) if shrunk.REHEARSAL else (8, 10 if QUICK else 20)  # WARM > the loop's warm-up + probe
ROUNDS = 1 if QUICK or shrunk.REHEARSAL else 2
PASS = dict(
    zip(BATCHES, GPU_PASS.values(), strict=True)
)  # ratio = ours_graphed / bare_graphed at least this, per batch
EAGER_PASS = 0.90  # ours_eager / bare_eager at batch 32 (the second batch) at least this
BARE = Setting("resnet50", 64 if shrunk.REHEARSAL else 224, 1000, WARM, STEPS, 1)

boot = shrunk.world_of_one()
dev = boot.device


def ours(batch, graphs):
    """img/s of the loop's steps after WARM (train/loop.py, in process), and its capture seconds."""
    img_s, _, captures = shrunk.loop_run(boot, OUT, batch, WARM, STEPS, cuda_graphs="auto" if graphs else "off")
    if graphs and not shrunk.REHEARSAL and not captures:
        raise RuntimeError("the loop did not keep its graph (model.cuda_graphs = auto on NCCL): see its log")
    return img_s, sum(captures)


def measure(batch):
    capture = []

    def graphed():
        img_s, seconds = ours(batch, True)
        capture.append(seconds)
        return img_s

    row = alternating(
        {
            "ours_graphed_img_s": graphed,
            "ours_eager_img_s": lambda: ours(batch, False)[0],
            "bare_eager_img_s": lambda: bare_img_s(boot, batch, BARE, graphed=False),
            "bare_graphed_img_s": lambda: bare_img_s(boot, batch, BARE, graphed=True),
        },
        ROUNDS,
    )
    row["ratio"] = round(row["ours_graphed_img_s"] / row["bare_graphed_img_s"], 3)
    row["capture_seconds"] = round(statistics.median(capture), 3)
    row["ok"] = row["ratio"] >= PASS[batch]
    return row


AGREE_BATCH = BATCHES[1]
AGREE_STEPS = 6 if shrunk.REHEARSAL else 12  # the loop's 3 eager warm-up steps, then the probe and replays
POISON_AT = AGREE_STEPS - 2  # a replayed step whose batch is all NaN: it must be skipped, as eagerly


def params_of(rs):
    return torch.cat([p.detach().float().reshape(-1) for p in rs.ddp.module.parameters()]).cpu()


def trained(graphs, poison_at=None):
    """The loop's parameters after AGREE_STEPS deterministic steps (job.deterministic), graphed or eager; with
    `poison_at`, that step's batch is all NaN and whether it left the parameters as they were."""
    got = {}

    def around(step):
        def poisoned(rs, images, labels, accumulation):
            if rs.pos.global_step != poison_at:
                return step(rs, images, labels, accumulation)
            before = params_of(rs)
            loss = step(rs, torch.full_like(images, float("nan")), labels, accumulation)
            got["unchanged"] = bool(torch.equal(before, params_of(rs)))
            return loss

        return poisoned

    def keep(rs):
        got["params"] = params_of(rs)
        got["skipped"] = int(rs.skip_counts[1]) if rs.skip_counts is not None else 0

    shrunk.loop_run(
        boot,
        OUT,
        AGREE_BATCH,
        0,
        AGREE_STEPS,
        deterministic=True,
        cuda_graphs="auto" if graphs else "off",
        around=around,
        keep=keep,
    )
    return got


def agreement():
    """graphs.agree: the graphed step against the eager one, two graphed runs, and a non-finite step skipped
    inside the graph."""
    eager, first, second = trained(False), trained(True), trained(True)
    poisoned = trained(True, poison_at=POISON_AT)
    rel = max_rel_diff(eager["params"], first["params"])
    res = {
        "batch": AGREE_BATCH,
        "steps": AGREE_STEPS,
        "eager_vs_graphed_max_rel": rel,
        "graphed_runs_equal": bool(torch.equal(first["params"], second["params"])),
        "nonfinite_step_skipped": bool(poisoned.get("unchanged")) and poisoned["skipped"] == 1,
        "all_finite": all(bool(torch.isfinite(r["params"]).all()) for r in (eager, first, second, poisoned)),
    }
    res["ok"] = (
        rel <= AGREE_TOLERANCE and res["graphed_runs_equal"] and res["nonfinite_step_skipped"] and res["all_finite"]
    )
    print(json.dumps({"agree": res}), flush=True)
    return res


rows = {}
for batch in BATCHES:
    rows[str(batch)] = measure(batch)
    print(json.dumps({batch: rows[str(batch)]}), flush=True)
at = rows[str(BATCHES[1])]  # batch 32 (4 in a rehearsal)
eager_ratio = round(at["ours_eager_img_s"] / at["bare_eager_img_s"], 3)
agree = agreement()
res = {
    "batches": rows,
    "eager_ratio_batch_32": eager_ratio,
    "agree": agree,
    "ok": all(r["ok"] for r in rows.values()) and eager_ratio >= EAGER_PASS and agree["ok"],
}
assert all(v is not None for r in [*rows.values(), agree] for v in r.values())
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "graphs.json").write_text(json.dumps({"graphs": res}))
