"""gpu_check.sh's part `graphs` (run by it as parts/graphs.py beside parts/shrunk.py): the loop with its step
replayed as a CUDA graph against the same loop eager, a bare eager step, and the ceiling, a bare step with the
torus's three NCCL phases captured whole in one graph (shared/probes/graph_step_probe.py's program), at per-GPU
batch 16, 32 and 256, in one process, rounds alternating. Writes parts/graphs.json: {"graphs": {"batches":
{BATCH: {ours_graphed_img_s, ours_eager_img_s, bare_eager_img_s, bare_graphed_img_s, ratio,
capture_seconds}}, "ok"}}. A rehearsal runs it on the CPU at batch 2, 4 and 8 (nothing is captured there:
capture_seconds is 0.0 and every column is eager; it checks the program, not the speed)."""

import json
import os
import pathlib
import statistics
import time

# agree's runs are deterministic (job.deterministic); cuBLAS reads its workspace setting once per process, so
# it is set before torch loads, for every column alike
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import shrunk
import torch
import torch.distributed as dist
import torchvision

OUT = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "graphs"
QUICK = os.environ.get("GPU_CHECK_QUICK") == "1"
BATCHES = (2, 4, 8) if shrunk.REHEARSAL else (16, 32, 256)
WARM, STEPS = (5, 2) if shrunk.REHEARSAL else (8, 10 if QUICK else 20)  # WARM > the loop's warm-up + capture
ROUNDS = 1 if QUICK or shrunk.REHEARSAL else 2
PASS = dict(zip(BATCHES, (0.85, 0.85, 0.95)))  # ratio = ours_graphed / bare_graphed at least this, per batch
EAGER_PASS = 0.90  # ours_eager / bare_eager at batch 32 (the second batch) at least this
BUCKET = 25 * 2**20 // 2  # fp16 elements of a bare bucket (25 MiB)

boot = shrunk.world_of_one()
dev = boot.device


def ours(batch, graphs):
    """img/s of the loop's steps after WARM (train/loop.py, in process), and its capture seconds."""
    img_s, _, captures = shrunk.loop_run(boot, OUT, batch, WARM, STEPS, cuda_graphs="auto" if graphs else "off")
    if graphs and not shrunk.REHEARSAL and not captures:
        raise RuntimeError("the loop did not capture its step (model.cuda_graphs = auto on NCCL)")
    return img_s, sum(captures)


def bare(batch, graphed):
    """The probe's bare step: ResNet-50, fp16 autocast, a fixed loss scale, fused SGD, gradients exchanged in
    25 MiB buckets with the torus's three phases over the world of one; captured whole when `graphed`."""
    shrunk.fresh_memory(dev)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    params = list(model.parameters())
    buckets, cur, n = [], [], 0
    for p in reversed(params):
        cur.append(p)
        n += p.numel()
        if n >= BUCKET:
            buckets.append(cur)
            cur, n = [], 0
    buckets += [cur] if cur else []
    amp = shrunk.amp_dtype(dev)
    flats = [torch.empty(sum(p.numel() for p in b), device=dev, dtype=amp or torch.float32) for b in buckets]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    size = 64 if shrunk.REHEARSAL else 224
    x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None, cache_enabled=False):
            loss = loss_fn(model(x), y)
        (loss * 1024.0).backward()
        for b, flat in zip(buckets, flats):
            torch.cat([p.grad.reshape(-1) for p in b], out=flat)
            piece = torch.empty_like(flat)  # a world of one: the row's piece is the whole bucket
            dist.reduce_scatter_tensor(piece, flat)
            dist.all_reduce(piece)
            dist.all_gather_into_tensor(flat, piece)
            pieces = torch.split(flat, [p.numel() for p in b])
            torch._foreach_copy_([p.grad for p in b], [t.view(p.shape) for t, p in zip(pieces, b)])
        opt.step()

    run = step
    if dev.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        if graphed:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            run = g.replay
    for i in range(WARM + STEPS):
        if i == WARM:
            shrunk.sync(dev)
            t = time.perf_counter()
        run()
    shrunk.sync(dev)
    return STEPS * batch / (time.perf_counter() - t)


def measure(batch):
    runs = {"ours_graphed": [], "ours_eager": [], "bare_eager": [], "bare_graphed": []}
    capture = []
    for r in range(ROUNDS):  # alternate the order: drift and clocks hurt every column alike
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for which in order:
            if which == "ours_graphed":
                img_s, seconds = ours(batch, True)
                capture.append(seconds)
            elif which == "ours_eager":
                img_s, _ = ours(batch, False)
            else:
                img_s = bare(batch, which == "bare_graphed")
            runs[which].append(img_s)
    row = {f"{k}_img_s": round(statistics.median(v), 1) for k, v in runs.items()}
    row["ratio"] = round(row["ours_graphed_img_s"] / row["bare_graphed_img_s"], 3)
    row["capture_seconds"] = round(statistics.median(capture), 3)
    row["ok"] = row["ratio"] >= PASS[batch]
    return row


AGREE_BATCH = BATCHES[1]
AGREE_STEPS = 6 if shrunk.REHEARSAL else 12  # the loop's 3 eager warm-up steps, then the capture and replays
POISON_AT = AGREE_STEPS - 2  # a replayed step whose batch is all NaN: it must be skipped, as eagerly
AGREE_TOLERANCE = 5e-3  # eager against graphed: max |difference| / max |parameter|, fp16 arithmetic


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
    scale = float(eager["params"].abs().max())
    rel = float((eager["params"] - first["params"]).abs().max()) / max(scale, 1e-30)
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
