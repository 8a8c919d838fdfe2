#!/usr/bin/env bash
# The GPU check: one CUDA GPU, under 8 minutes, nothing installed beyond the README's set-up
# (pip install -e '.[test,mpi,plot]'). Prints one JSON summary on stdout (progress goes to stderr).
#
#   bash scripts/gpu_check.sh [--out DIR] [--json FILE] [--quick]
#
# Checks, each timed and under its own time limit:
#   run_path       torus-train run on NCCL, world 1, grid 1x1, resnet18 on the demo set with DALI "mixed"
#                  decoding: steps with a checkpoint, then --resume to the end; backend, loader, replicas.
#   input          torus-train bench input --device cuda: DALI GPU decoding against the torchvision loader.
#   resnet50       training img/s in bf16 + channels_last at the largest batch that fits (doubling from 64
#                  until out of memory), on synthetic data and fed by DALI; against NVIDIA's published
#                  figures (A100 80GB ~2,470 img/s DeepLearningExamples PyTorch; H200 ~8,000 img/s MLPerf
#                  v4.0 MXNet + DALI, batch 400).
#   hook_cuda_gloo the torus hook's exchange on CUDA tensors, 4 ranks on the one GPU over gloo (2x2; several
#                  NCCL ranks cannot share one GPU): gradients against gloo's own DDP all-reduce, ms per step.
# Without a CUDA GPU it says so, prints the JSON skeleton (status "no-gpu") and exits 0.
# Exit codes: 0 every check passed (or no GPU), 1 a check failed, 2 usage.
set -u

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

OUT="" JSON="" QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || { echo "gpu_check: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift 2 ;;
        --json) [ $# -ge 2 ] || { echo "gpu_check: --json needs a file" >&2; exit 2; }; JSON="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}"
mkdir -p "$OUT/parts" || { echo "gpu_check: cannot create $OUT" >&2; exit 2; }
T0=$(date +%s)
say() { echo "gpu_check [$(( $(date +%s) - T0 ))s]: $*" >&2; }
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_OUT="$OUT" GPU_CHECK_QUICK="$QUICK"

# --- the summary: skeleton, parts merged in, printed (and written to --json) --------------------------------
summarise() {  # $1 = status
    GPU_CHECK_STATUS="$1" GPU_CHECK_WALL=$(( $(date +%s) - T0 )) GPU_CHECK_JSON="$JSON" "$PY" - <<'EOF'
import json, os, pathlib, time

def probe():
    info = {"torch": None, "cuda": None, "dali": None, "gpu": None}
    try:
        import torch
        info["torch"], info["cuda"] = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["gpu"] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                           "count": torch.cuda.device_count()}
    except Exception:
        pass
    try:
        import nvidia.dali as dali
        info["dali"] = dali.__version__
    except Exception:
        pass
    return info

SKELETON = {
    "run_path": {"ok": None, "seconds": None, "backend": None, "loader": None, "steps": None, "resumed_from": None,
                 "images_per_s": None, "replicas_agree": None},
    "input": {"ok": None, "seconds": None, "dali_gpu_img_s": None, "torchvision_img_s": None, "ratio": None},
    "resnet50": {"ok": None, "seconds": None, "batch": None, "precision": "bf16", "channels_last": True,
                 "synthetic_img_s": None, "dali_img_s": None,
                 "reference_img_s": {"A100 80GB, DeepLearningExamples PyTorch AMP": 2470,
                                     "H200, MLPerf v4.0 MXNet + DALI": 8000},
                 "synthetic_vs_reference": None},
    "hook_cuda_gloo": {"ok": None, "seconds": None, "ranks": None, "grid": None, "max_rel_err": None,
                       "ms_per_step_torus_async": None, "ms_per_step_ddp_gloo": None},
}
out = pathlib.Path(os.environ["GPU_CHECK_OUT"])
checks = {k: dict(v) for k, v in SKELETON.items()}
for name in checks:
    part = out / "parts" / f"{name}.json"
    if part.exists():
        checks[name].update(json.loads(part.read_text()))
status = os.environ["GPU_CHECK_STATUS"]
if status == "done":
    status = "ok" if all(c["ok"] for c in checks.values()) else "failed"
result = {"gpu_check": 1, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "status": status, **probe(),
          "wall_seconds": int(os.environ["GPU_CHECK_WALL"]), "out": str(out), "checks": checks}
text = json.dumps(result, indent=1)
print(text)
if os.environ.get("GPU_CHECK_JSON"):
    pathlib.Path(os.environ["GPU_CHECK_JSON"]).write_text(text + "\n")
EOF
}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "no CUDA GPU here (torch.cuda.is_available() is False): nothing to check; the JSON below is the skeleton"
    summarise no-gpu
    exit 0
fi

part() {  # $1 = check name, $2 = time limit (s); the Python program on stdin writes parts/NAME.json
    local name="$1" limit="$2" start rc
    start=$(date +%s)
    say "$name (limit ${limit}s)"
    cat > "$OUT/parts/$name.py"
    timeout --kill-after=10 "$limit" "$PY" "$OUT/parts/$name.py" > "$OUT/parts/$name.log" 2>&1
    rc=$?
    if [ ! -s "$OUT/parts/$name.json" ]; then
        local why="exit $rc"; [ $rc -eq 124 ] && why="over its ${limit}s limit"
        "$PY" -c 'import json,sys; print(json.dumps({"ok": False, "error": sys.argv[1]}))' \
            "$why; see $OUT/parts/$name.log" > "$OUT/parts/$name.json"
    fi
    "$PY" - "$OUT/parts/$name.json" $(( $(date +%s) - start )) <<'EOF'
import json, sys
p = sys.argv[1]; d = json.load(open(p)); d["seconds"] = int(sys.argv[2]); json.dump(d, open(p, "w"))
EOF
    say "$name: $(cat "$OUT/parts/$name.json")"
}

# --- 1. the run path on NCCL: world 1, grid 1x1, demo set, DALI mixed, checkpoint + resume ------------------
part run_path 170 <<'EOF'
import json, os, subprocess, sys, pathlib
from torus_train.data.demo import ensure_demo_dataset
out = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "run"
quick = os.environ["GPU_CHECK_QUICK"] == "1"
first, total = (50, 100) if quick else (150, 300)
ensure_demo_dataset(workers=min(8, os.cpu_count() or 1))
common = [sys.executable, "-m", "torus_train", "run", "--gpus", "1", "--grid", "1x1", "--data", "demo",
          "--model", "resnet18", "--image-size", "64", "--out", str(out), "--set", "data.loader=dali",
          "--set", "model.precision=bf16", "--set", "eval.every_epochs=0", "--set", "checkpoint.every_epochs=0",
          "--set", "job.log_every=50", "--set", "schedule.stages=[{until_epoch=100,global_batch=256}]",
          "--epochs", "100"]
a = subprocess.run(common + ["--steps", str(first)], capture_output=True, text=True)
b = subprocess.run(common + ["--steps", str(total), "--resume"], capture_output=True, text=True)
s = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
# data.loader = dali is explicit: the run fails rather than fall back; on a CUDA rank DALI decodes "mixed"
res = {"backend": s.get("backend"), "loader": "dali (mixed)" if s.get("device") == "cuda" else None,
       "steps": s.get("steps"),
       "resumed_from": first if f"step {first}" in b.stdout else None, "images_per_s": s.get("images_per_second"),
       "replicas_agree": s.get("param_digests_agree")}
res["ok"] = (a.returncode == 0 and b.returncode == 0 and res["backend"] == "nccl" and res["steps"] == total
             and res["resumed_from"] == first and bool(res["replicas_agree"]))
if not res["ok"]:
    res["error"] = (a.stderr[-600:] + b.stderr[-600:]) or b.stdout[-600:]
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "run_path.json").write_text(json.dumps(res))
EOF

# --- 2. DALI GPU decoding against the torchvision loader, same files -------------------------------------
part input 60 <<'EOF'
import json, os, subprocess, sys, pathlib
from torus_train.data.demo import ensure_demo_dataset
root = ensure_demo_dataset(log=None)
js = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "input.json"
r = subprocess.run([sys.executable, "-m", "torus_train", "bench", "input", "--data", str(root), "--device", "cuda",
                    "--batch-size", "256", "--image-size", "224", "--rounds", "2", "--batches", "20",
                    "--channels-last", "--json", str(js)], capture_output=True, text=True)
res = {"ok": r.returncode == 0 and js.exists()}
if res["ok"]:
    d = json.loads(js.read_text())
    rows = {row["loader"]: row["images_per_s"] for row in d["results"]}
    res.update(dali_gpu_img_s=rows.get("dali"), torchvision_img_s=rows.get("torchvision"))
    if res["dali_gpu_img_s"] and res["torchvision_img_s"]:
        res["ratio"] = res["dali_gpu_img_s"] / res["torchvision_img_s"]
else:
    res["error"] = r.stderr[-800:]
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "input.json").write_text(json.dumps(res))
EOF

# --- 3. ResNet-50 training throughput, bf16 + channels_last, largest batch that fits ----------------------
part resnet50 150 <<'EOF'
import json, os, pathlib, time
import torch, torchvision
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda", 0)
quick = os.environ["GPU_CHECK_QUICK"] == "1"
model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()

def step(x, y):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()

def batch_of(n):
    x = torch.randn(n, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, 1000, (n,), device=dev)

best, n = None, 64
while n <= 2048:  # double until out of memory; keep the last batch that ran
    try:
        x, y = batch_of(n)
        step(x, y); step(x, y); torch.cuda.synchronize()
        best = n
        n *= 2
    except torch.OutOfMemoryError:
        break
    finally:
        x = y = None
        torch.cuda.empty_cache()
res = {"batch": best}
x, y = batch_of(best)
for _ in range(5):
    step(x, y)
torch.cuda.synchronize()
steps = 10 if quick else 30
t = time.perf_counter()
for _ in range(steps):
    step(x, y)
torch.cuda.synchronize()
res["synthetic_img_s"] = steps * best / (time.perf_counter() - t)
ref = 8000 if "H200" in torch.cuda.get_device_name(0) else 2470
res["synthetic_vs_reference"] = res["synthetic_img_s"] / ref
x = y = None
try:  # fed by DALI (GPU decoding) on the demo set's JPEGs, cropped and resized to 224
    from torus_train.data import make_loader
    from torus_train.data.demo import ensure_demo_dataset
    root = ensure_demo_dataset(log=None)
    loader = make_loader("dali", str(root), "train", rank=0, world_size=1, batch_size=best, image_size=224,
                         num_classes=None, seed=0, channels_last=True, device=dev,
                         num_threads=min(8, os.cpu_count() or 1), verify=False)
    loader.set_epoch(0)
    it, done, t = iter(loader), 0, None
    for i in range(5 + steps):
        if i == 5:
            torch.cuda.synchronize(); t = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            loader.set_epoch(i); it = iter(loader); x, y = next(it)
        step(x, y.clamp(min=0))
        done += x.shape[0] if i >= 5 else 0
    torch.cuda.synchronize()
    res["dali_img_s"] = done / (time.perf_counter() - t)
    loader.close()
except Exception as e:
    res["dali_error"] = f"{type(e).__name__}: {e}"[:400]
res["ok"] = bool(best) and res.get("dali_img_s") is not None
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "resnet50.json").write_text(json.dumps(res))
EOF

# --- 4. the torus hook on CUDA tensors: 4 ranks on the one GPU over gloo ---------------------------------
part hook_cuda_gloo 60 <<'EOF'
import json, os, pathlib, subprocess, sys, time
out = pathlib.Path(os.environ["GPU_CHECK_OUT"])
worker = out / "parts" / "hook_worker.py"
worker.write_text('''
import json, os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist, torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState, allreduce_hook
from torus_train.job.topology import parse_grid
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"], rank=rank,
                        world_size=world, timeout=timedelta(seconds=60))
groups = build_grid_groups(parse_grid("2x2"), timeout=60)
x = torch.randn(16, 3, 64, 64, device=dev, generator=torch.Generator(dev).manual_seed(rank)) * (rank + 1)
def run(hook):
    torch.manual_seed(0)
    ddp = DDP(torchvision.models.resnet18(num_classes=10).to(dev), device_ids=[dev], bucket_cap_mb=4)
    state = None
    if hook:
        state = TorusHookState(groups, algo="torus")
        ddp.register_comm_hook(state, allreduce_hook)
    times = []
    for i in range(6):
        ddp.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); t = time.perf_counter()
        ddp(x).square().mean().backward()
        torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    g = torch.cat([p.grad.flatten() for p in ddp.parameters()])
    if state: state.close()
    return g, sorted(times[2:])[len(times[2:]) // 2] * 1e3
ref, t_ddp = run(False)
got, t_torus = run(True)
err = ((got - ref).abs().max() / ref.abs().max()).item()
if rank == 0:
    print(json.dumps({"ranks": world, "grid": "2x2", "max_rel_err": err, "ms_per_step_torus_async": t_torus,
                      "ms_per_step_ddp_gloo": t_ddp, "ok": err < 1e-5}))
dist.destroy_process_group()
''')
from torus_train.ranks.bootstrap import free_port
port = str(free_port())
procs = [subprocess.Popen([sys.executable, str(worker)], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "RANK": str(r), "WORLD_SIZE": "4", "MASTER_PORT": port,
                               "OMP_NUM_THREADS": "2"}) for r in range(4)]
outs = [p.communicate(timeout=50)[0] for p in procs]
res = json.loads(outs[0].strip().splitlines()[-1]) if all(p.returncode == 0 for p in procs) else \
    {"ok": False, "error": "exit codes " + str([p.returncode for p in procs])}
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "hook_cuda_gloo.json").write_text(json.dumps(res))
EOF

summarise done > "$OUT/summary.json"
cat "$OUT/summary.json"
"$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["status"] == "ok" else 1)' "$OUT/summary.json"
