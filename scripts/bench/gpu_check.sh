#!/usr/bin/env bash
# The acceptance test for one GPU: `torus-train check` (the machine), then the production configuration
# (scripts/specs/imagenet_2176.toml) shrunk to one GPU, under 10 minutes on one H200 with 16 cores, nothing
# installed beyond the README's set-up (pip install -e '.[test,mpi,plot]'). Prints one JSON summary on stdout
# (progress goes to stderr).
#
#   bash scripts/bench/gpu_check.sh [--out DIR] [--json FILE] [--quick] [--rehearse] [--parts syncs,speed,...]
#
# --parts runs only the parts named (status "partial" when they pass; the others' checks stay null).
# --rehearse runs every part on the CPU at toy size (gloo, DALI's CPU decoder, 64 px, per-GPU batch 4 and 8,
# parts' limits x5: a shared CPU is slow): a check of this script without a GPU; its figures say nothing of one.
# The configuration: ResNet-50 at 224 px, per-GPU batch 32 and 256 (its two stages), fp16 with a GradScaler and
# fp16 exchange, LARS, channels_last, evaluation on, DALI's mixed decoder (or torchvision's nvJPEG one) on
# photo-size JPEGs (scripts/photo_like_set.py), the torus hook on NCCL on the 1x1 grid (its side stream, Future and its three
# phases, reduce-scatter along the row, all-reduce along the column, all-gather along the row, each over a
# group of one rank, which NCCL accepts). Parts, each under its own limit:
#   check       `torus-train check` (the package's parts: environment, GPUs, NCCL, the graph probe, the
#               decoders, the deterministic repeat; its throughput part is the graphs part's table below)
#   syncs       the loop (train/loop.py, in process, NCCL world of one) in fp16 with the GradScaler, host reads
#               counted per step (torus_train/train/syncs.py)
#   speed       in process, rounds alternating: the loop against a bare PyTorch loop of the same model and batch
#               (256) on synthetic data, in fp16 and in bf16; peak memory at batch 32 and 256
#   production  `torus-train run` of the shrunk production spec on photo-like JPEGs: 2 epochs (batch 32, then
#               256, at least 23 steps each), evaluation after each; DALI, or where nvidia.dali does not import,
#               torchvision with its GPU decoder (data.decoder = auto), said in the check's note
#   digest      the same short `torus-train run --deterministic` twice (1x1, synthetic): equal parameter digests;
#               and the loop at batch 256 with job.deterministic on against off (its cost)
#   graphs      in process, at per-GPU batch 16, 32 and 256, rounds alternating: the loop with its step replayed
#               as a CUDA graph, the loop eager, a bare eager step, a bare step with the torus's three NCCL phases
#               captured in one graph (the ceiling); the program is scripts/gpu_check_graphs.py
# A part is a `part NAME LIMIT` block below (a Python program writing parts/NAME.json) plus its entries in
# ALL_PARTS, PARTS and SKELETON (the checks it fills); the embedded parts' limits add up to under 8 minutes,
# check's 2 minutes apart, graphs (its own file) to at most 3 more. What `torus-train check` and this script
# both measure is written once, in the package (torus_train/check/, train/graphs.py).
# JSON (schema 3): {"gpu_check": 3, "date", "status": ok | partial | failed | no-gpu | rehearsal, "torch", "cuda",
# "dali", "gpu", "wall_seconds", "out", "parts": [the parts run], "checks": {NAME: {...}}}; every check has "ok"
# (its pass line: null without a GPU), "pass_if" (the rule), "seconds" (its part's), "error" (only when its part
# failed); the fields of each check:
#   machine.parts                    `torus-train check`'s verdicts {PART: {ok, why}} (its --json: OUT/machine.json);
#                                    pass_if no part failed (null: cannot run here, not a failure)
#   host_syncs.steps                 steps counted (not logging, not warm-up)
#   host_syncs.syncs_per_step        device-to-host reads per step; pass_if == 0
#   speed_vs_bare.batch              per-GPU batch of both loops
#   speed_vs_bare.torus_train_img_s  the loop's median img/s over the rounds (fp16, GradScaler, LARS, DDP + hook)
#   speed_vs_bare.bare_img_s         a bare PyTorch loop's median img/s (same model, fp16, GradScaler, fused SGD)
#   speed_vs_bare.ratio              torus_train_img_s / bare_img_s; pass_if >= 0.90
#   bf16_vs_fp16.bf16_img_s          the loop in bf16 (bf16 exchange, no GradScaler)
#   bf16_vs_fp16.bare_bf16_img_s     the bare loop in bf16 (no GradScaler)
#   bf16_vs_fp16.ratio               bf16_img_s / bare_bf16_img_s; pass_if >= 0.90
#   bf16_vs_fp16.fp16_img_s          the loop in fp16 (speed_vs_bare.torus_train_img_s)
#   bf16_vs_fp16.bf16_over_fp16      bf16_img_s / fp16_img_s: the GPU's two precisions, reported, not a pass line
#   peak_memory.gib_batch_32         torch.cuda.max_memory_allocated of the loop at batch 32, GiB
#   peak_memory.gib_batch_256        the same at batch 256
#   peak_memory.gpu_gib              the GPU's memory; pass_if gib_batch_256 <= 0.9 x gpu_gib
#   production.backend               summary.json's backend; pass_if nccl, the loader below, 2 evaluations,
#                                    replicas agree
#   production.loader                summary.json's loader and decoder: "dali (mixed)" where nvidia.dali imports
#                                    (data.loader = dali: a run fails rather than fall back), else
#                                    "torchvision (gpu)" (nvJPEG)
#   production.dali_checked          whether the run read through DALI
#   production.note                  what was checked: "DALI", or that nvidia.dali does not import here and DALI
#                                    was not checked (torchvision with its GPU decoder was)
#   production.steps                 steps run
#   production.evaluations           evaluation events in metrics.jsonl
#   production.images_per_s          summary.json's img/s (both stages, evaluation included)
#   production.replicas_agree        summary.json's param_digests_agree
#   data_wait.share_batch_32         data wait / step time over the batch-32 stage, its first 3 steps left out
#                                    (metrics.jsonl, one line per step)
#   data_wait.share_batch_256        the same over the batch-256 stage; pass_if both <= 0.10 over >= 20 steps
#   data_wait.steps_batch_32         steps the share of batch 32 is measured over
#   data_wait.steps_batch_256        and of batch 256
#   digest.first                     param_digest of the first run (--deterministic)
#   digest.second                    of the second; pass_if equal
#   digest.default_img_s             the loop's img/s at batch 256 (fp16, cuDNN autotuning)
#   digest.deterministic_img_s       the same with job.deterministic = true
#   digest.deterministic_cost        deterministic_img_s / default_img_s (reported, not a pass line)
#   graphs.batches                   {BATCH: {ours_graphed_img_s, ours_eager_img_s, bare_eager_img_s,
#                                    bare_graphed_img_s, ratio (ours_graphed / bare_graphed), capture_seconds}};
#                                    pass_if ratio >= 0.85 at 16 and 32, >= 0.95 at 256
#   graphs.eager_ratio_batch_32      ours_eager / bare_eager at batch 32; pass_if >= 0.90
#   graphs.agree                     {batch, steps, eager_vs_graphed_max_rel, graphed_runs_equal,
#                                    nonfinite_step_skipped, all_finite}: 12 deterministic steps at batch 32
#                                    eager against graphed (max |diff| / max |param| <= 0.005), two graphed runs
#                                    bit for bit, a replayed step fed NaN skipped (parameters unchanged, counted)
# Without a CUDA GPU it says so, prints the JSON skeleton (status "no-gpu") and exits 0. With --rehearse the
# status is "rehearsal" (pass lines computed, not required; the "..._32" fields then hold batch 4's figures,
# "..._256" batch 8's) and the exit is 0 when every part ran and filled its fields.
# Exit codes: 0 every check asked for passed (or no GPU, or a rehearsal ran), 1 a check failed, 2 usage.
set -u

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }

OUT="" JSON="" QUICK=0 REHEARSE=0 ALL_PARTS="check,syncs,speed,production,digest,graphs"
RUN_PARTS="$ALL_PARTS"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || { echo "gpu_check: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift 2 ;;
        --json) [ $# -ge 2 ] || { echo "gpu_check: --json needs a file" >&2; exit 2; }; JSON="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --rehearse) REHEARSE=1; shift ;;
        --parts)
            [ $# -ge 2 ] && [ -n "$2" ] || {
                echo "gpu_check: --parts needs a list, e.g. production,digest" >&2; exit 2; }
            for p in ${2//,/ }; do
                case ",$ALL_PARTS," in
                    *",$p,"*) ;;
                    *) echo "gpu_check: --parts: '$p' is not one of $ALL_PARTS" >&2; exit 2 ;;
                esac
            done
            RUN_PARTS="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}"
mkdir -p "$OUT/parts" || { echo "gpu_check: cannot create $OUT" >&2; exit 2; }
T0=$(date +%s)
say() { echo "gpu_check [$(( $(date +%s) - T0 ))s]: $*" >&2; }
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_OUT="$OUT" GPU_CHECK_QUICK="$QUICK" \
    GPU_CHECK_HERE="$HERE" GPU_CHECK_REHEARSAL="$REHEARSE" GPU_CHECK_PARTS="$RUN_PARTS"
[ "$REHEARSE" = 1 ] && export CUDA_VISIBLE_DEVICES=""  # the rehearsal's ranks stay on the CPU, GPU or not

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
                           "count": torch.cuda.device_count(), "capability": f"sm_{p.major}{p.minor}"}
    except Exception:
        pass
    try:
        import nvidia.dali as dali
        info["dali"] = dali.__version__
    except Exception:
        pass
    return info

# the checks, their fields and pass rules (each field is documented in this script's header)
SKELETON = {
    "machine": {"parts": None, "pass_if": "no part of `torus-train check` failed"},
    "host_syncs": {"steps": None, "syncs_per_step": None, "pass_if": "syncs_per_step == 0"},
    "speed_vs_bare": {"batch": 256, "torus_train_img_s": None, "bare_img_s": None, "ratio": None,
                      "pass_if": "ratio >= 0.90"},
    "bf16_vs_fp16": {"bf16_img_s": None, "bare_bf16_img_s": None, "ratio": None, "fp16_img_s": None,
                     "bf16_over_fp16": None, "pass_if": "ratio >= 0.90"},
    "peak_memory": {"gib_batch_32": None, "gib_batch_256": None, "gpu_gib": None,
                    "pass_if": "gib_batch_256 <= 0.9 x gpu_gib"},
    "production": {"backend": None, "loader": None, "dali_checked": None, "note": None, "steps": None,
                   "evaluations": None, "images_per_s": None, "replicas_agree": None,
                   "pass_if": "backend nccl, loader dali (mixed) or without nvidia.dali torchvision (gpu), "
                              "2 evaluations, replicas agree"},
    "data_wait": {"share_batch_32": None, "share_batch_256": None, "steps_batch_32": None, "steps_batch_256": None,
                  "pass_if": "both shares <= 0.10, each over >= 20 steps after the first 3 of its stage"},
    "digest": {"first": None, "second": None, "default_img_s": None, "deterministic_img_s": None,
               "deterministic_cost": None, "pass_if": "first == second (both runs --deterministic)"},
    "graphs": {"batches": None, "eager_ratio_batch_32": None, "agree": None,
               "pass_if": "ratio >= 0.85 at 16 and 32, >= 0.95 at 256; eager_ratio_batch_32 >= 0.90; agree: "
                          "eager_vs_graphed_max_rel <= 0.005, graphed runs equal, the NaN step skipped"},
}
PARTS = {"check": ["machine"], "syncs": ["host_syncs"], "speed": ["speed_vs_bare", "bf16_vs_fp16", "peak_memory"],
         "production": ["production", "data_wait"], "digest": ["digest"], "graphs": ["graphs"]}
out = pathlib.Path(os.environ["GPU_CHECK_OUT"])
asked_for = os.environ["GPU_CHECK_PARTS"].split(",")
ran = [p for p in PARTS if p in asked_for and os.environ["GPU_CHECK_STATUS"] != "no-gpu"]
checks = {k: {"ok": None, "seconds": None, **v} for k, v in SKELETON.items()}
for part, names in PARTS.items():
    path = out / "parts" / f"{part}.json"
    if part not in ran or not path.exists():  # a part not asked for: its checks stay null
        continue
    found = json.loads(path.read_text())
    for name in names:  # a part that failed as a whole fails each of its checks with its error
        checks[name].update(found.get(name) or {"ok": False, "error": found.get("error", "no result")})
        checks[name]["seconds"] = found.get("seconds")
status = os.environ["GPU_CHECK_STATUS"]
asked = [checks[name] for part in ran for name in PARTS[part]]
if status == "done":
    status = ("ok" if len(ran) == len(PARTS) else "partial") if all(c["ok"] for c in asked) else "failed"
elif status == "rehearsal":  # every part asked for ran: no error, every field filled
    filled = all("error" not in c and None not in c.values() for c in asked)
    status = "rehearsal" if filled else "failed"
result = {"gpu_check": 3, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "status": status, **probe(),
          "wall_seconds": int(os.environ["GPU_CHECK_WALL"]), "out": str(out), "parts": ran, "checks": checks}
text = json.dumps(result, indent=1)
print(text)
if os.environ.get("GPU_CHECK_JSON"):
    pathlib.Path(os.environ["GPU_CHECK_JSON"]).write_text(text + "\n")
EOF
}

has_gpu() { "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ "$REHEARSE" = 0 ] && ! has_gpu; then
    say "no CUDA GPU here (torch.cuda.is_available() is False): nothing to check; the JSON below is the skeleton" \
        "(torus-train check says what this machine can run)"
    summarise no-gpu
    exit 0
fi

part() {  # $1 = part name, $2 = time limit (s); the Python program on stdin writes parts/NAME.json
    local name="$1" limit=$(( $2 * (1 + 4 * REHEARSE) )) start rc
    case ",$RUN_PARTS," in *",$name,"*) ;; *) cat > /dev/null; return ;; esac  # not asked for
    rm -f "$OUT/parts/$name.json"  # never a result of an earlier run in the same --out,
    rm -rf "${OUT:?}/$name"         # nor its runs (the part's own folder, written by this script only)
    start=$(date +%s)
    say "$name (limit ${limit}s)"
    cat > "$OUT/parts/$name.py"
    timeout --kill-after=10 "$limit" "$PY" "$OUT/parts/$name.py" > "$OUT/parts/$name.log" 2>&1
    rc=$?
    if [ ! -s "$OUT/parts/$name.json" ]; then
        local why="exit $rc"; [ $rc -eq 124 ] && why="over its ${limit}s limit"
        "$PY" -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' \
            "$why; see $OUT/parts/$name.log" > "$OUT/parts/$name.json"
    fi
    "$PY" - "$OUT/parts/$name.json" $(( $(date +%s) - start )) <<'EOF'
import json, sys
p = sys.argv[1]; d = json.load(open(p)); d["seconds"] = int(sys.argv[2]); json.dump(d, open(p, "w"))
EOF
    say "$name: $(cat "$OUT/parts/$name.json")"
}

# --- the production spec shrunk to one GPU, shared by the parts (imported as `shrunk`) ---------------------
cat > "$OUT/parts/shrunk.py" <<'EOF'
"""scripts/specs/imagenet_2176.toml on one GPU: grid 1x1, no cluster environment, a short schedule; and what
the parts do on the device (CUDA, or the CPU of a rehearsal)."""
import gc
import os
import pathlib
import resource

import torch

SPEC = pathlib.Path(os.environ["GPU_CHECK_HERE"]) / "scripts" / "specs" / "imagenet_2176.toml"
REHEARSAL = os.environ.get("GPU_CHECK_REHEARSAL") == "1"
SMALL, LARGE = (4, 8) if REHEARSAL else (32, 256)  # the per-GPU batches of the two stages
BACKEND, DECODER = ("gloo", "cpu") if REHEARSAL else ("nccl", "mixed")  # DALI's decoder
GPU_DECODER = "cpu" if REHEARSAL else "gpu"  # torchvision's where DALI does not import (data.decoder = auto)
ONE_GPU = ["grid.gpus=1", "grid.grid=1x1", "grid.gpus_per_node=1", "launch.env=[]", "launch.launcher=local",
           "schedule.warmup_epochs=0.5"] + (["data.image_size=64"] if REHEARSAL else [])


def stages(*batches):
    """The `--set` value of one stage per epoch at these global batches."""
    return "schedule.stages=[" + ",".join(f"{{until_epoch={i + 1},global_batch={b}}}"
                                          for i, b in enumerate(batches)) + "]"


def cli_sets(extra):
    """`--set` arguments of a `torus-train run --spec SPEC` on one GPU."""
    return [a for s in ONE_GPU + list(extra) for a in ("--set", s)]


def loop_spec(out, batch, steps, precision="fp16", deterministic=False):
    """The spec for the in-process loop: synthetic data, `steps` steps at per-GPU `batch`, nothing saved."""
    from torus_train.job.spec import load_spec, parse_override

    sets = ONE_GPU + [f"job.deterministic={str(deterministic).lower()}", f"job.out={out}", "data.source=synthetic",
                      f"data.synthetic_samples={batch * (steps + 1)}",
                      "schedule.epochs=1", stages(batch),
                      f"schedule.steps={steps}", "eval.every_epochs=0", "checkpoint.every_epochs=0",
                      "checkpoint.at_end=false", "job.log_every=5", "job.check_every_steps=0",
                      f"model.precision={precision}", "job.max_nonfinite_steps=1000",
                      f"comm.compression={precision}"]  # fp16 exchange needs fp16's loss scaler: bf16 sends bf16
    return load_spec(str(SPEC), [parse_override(s) for s in sets])


def world_of_one():
    from torus_train.job.topology import parse_grid
    from torus_train.ranks.distributed import init_distributed

    return init_distributed(parse_grid("1x1"), 120, environ={})


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_memory(device):
    """Nothing of the last run left, the peak counter reset (on CUDA)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    """The peak of the GPU's allocations since fresh_memory; a rehearsal: the process's peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def memory_gib(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def amp_dtype(device, precision="fp16"):
    """The bare loop's autocast dtype: fp16 or bf16 on a GPU; a rehearsal's CPU runs fp32, as the CPU ranks do."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[precision] if device.type == "cuda" else None


def loop_run(boot, out, batch, warm, steps, precision="fp16", deterministic=False, cuda_graphs="auto",
             around=None, keep=None):
    """The real loop (train/loop.py) in this process: (img/s of the steps after `warm`, peak memory, seconds
    of its CUDA graph captures). `around(real)` may wrap each step (train_step's signature); `keep(rs)` is
    called on the run state at the end, before the loader and the buckets close."""
    import time

    from torus_train.train import loop
    from torus_train.train.stop import StopRequest

    dev = boot.device
    fresh_memory(dev)
    spec = loop_spec(str(out), batch, warm + steps, precision, deterministic)
    spec.model.cuda_graphs = cuda_graphs
    rs = loop.start(spec, boot, out, StopRequest())
    loop.switch_stage(rs, 0)
    mark, real = {}, loop.train_step

    def train_step(rs_, *a, **k):
        if rs_.pos.global_step == warm:
            sync(dev)
            mark["t"] = time.perf_counter()
        return real(rs_, *a, **k)

    loop.train_step = train_step if around is None else around(train_step)
    try:
        loop.run_epoch(rs, 0)
    finally:
        loop.train_step = real
    sync(dev)
    img_s = (rs.pos.global_step - warm) * batch / (time.perf_counter() - mark["t"])
    captures = list(rs.graphs.capture_seconds) if rs.graphs is not None else []
    if keep is not None:
        keep(rs)
    rs.loader.close()
    rs.ddp.close()
    return img_s, peak_gib(dev), captures


def loop_img_s(boot, out, batch, warm, steps, precision="fp16", deterministic=False):
    """(img/s of the steps after `warm`, peak memory) of the real loop in this process (loop_run)."""
    return loop_run(boot, out, batch, warm, steps, precision, deterministic)[:2]


def bare_img_s(dev, batch, warm, steps, precision="fp16"):
    """img/s of a plain PyTorch loop: the same model, batch and numerics, no DDP, no hook, no loader; fp16 with
    a GradScaler, bf16 without."""
    import time

    import torchvision

    fresh_memory(dev)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True  # as the loop's default
    model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    amp, size = amp_dtype(dev, precision), (64 if REHEARSAL else 224)
    scaler = torch.amp.GradScaler(dev.type, enabled=amp == torch.float16)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(batch, 3, size, size, device=dev, dtype=amp).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)
    for i in range(warm + steps):
        if i == warm:
            sync(dev)
            t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync(dev)
    return steps * batch / (time.perf_counter() - t)
EOF

# --- 0. the machine: `torus-train check` (its own parts, one verdict each) -----------------------------------
part check 120 <<'EOF'
import json, os, pathlib, subprocess, sys
out = pathlib.Path(os.environ["GPU_CHECK_OUT"])
machine = out / "machine.json"  # the check's own --json (it replaces only a file it wrote)
# throughput is left out: the graphs part below measures the same table with more columns
asked = "environment,gpus,nccl,graphs,decoder_cpu,decoder_gpu,deterministic"
r = subprocess.run([sys.executable, "-m", "torus_train", "check", "--parts", asked, "--json", str(machine)],
                   capture_output=True, text=True)
print(r.stdout, r.stderr[-4000:], sep="\n")
doc = json.loads(machine.read_text()) if r.returncode in (0, 1) and machine.exists() else {}
found = {name: {"ok": p["ok"], "why": p["why"]} for name, p in doc.get("parts", {}).items()}
res = {"parts": found, "ok": r.returncode == 0 and doc.get("ok") is True and len(found) == len(asked.split(","))}
if r.returncode not in (0, 1):
    res["error"] = (r.stderr or r.stdout)[-800:]
pathlib.Path(out, "parts", "check.json").write_text(json.dumps({"machine": res}))
EOF

# --- 1. host reads per step of the loop (fp16 + GradScaler, LARS, DDP with the torus hook on NCCL) --------
part syncs 40 <<'EOF'
import json, os, pathlib
import shrunk
from torus_train.train.syncs import count_loop_syncs
out = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "syncs"
boot = shrunk.world_of_one()
r = count_loop_syncs(shrunk.loop_spec(str(out), shrunk.SMALL, 12), boot, out, "fp16-scaler")
per_step = r["syncs"] / max(r["steps"], 1)
res = {"host_syncs": {"steps": r["steps"], "syncs_per_step": per_step, "where": r["where"],
                      "backend": boot.backend,
                      "ok": boot.backend == shrunk.BACKEND and r["steps"] > 0 and per_step == 0}}
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "syncs.json").write_text(json.dumps(res))
EOF

# --- 2. speed against a bare loop, bf16 against fp16, peak memory ------------------------------------------
part speed 150 <<'EOF'
import json, os, pathlib, statistics
import shrunk
out = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "speed"
quick = os.environ["GPU_CHECK_QUICK"] == "1"
WARM, STEPS, BATCH = (1, 3, shrunk.LARGE) if shrunk.REHEARSAL else (5, (10 if quick else 25), shrunk.LARGE)
boot = shrunk.world_of_one()
dev = boot.device
runs = {"ours": [], "bare": [], "ours_bf16": [], "bare_bf16": []}
peak = {}
for r in range(1 if quick or shrunk.REHEARSAL else 2):  # alternate the order: drift and clocks hurt both alike
    for which in (("ours", "bare") if r % 2 == 0 else ("bare", "ours")):
        if which == "ours":
            img_s, peak[BATCH] = shrunk.loop_img_s(boot, out, BATCH, WARM, STEPS, "fp16")
            runs["ours"].append(img_s)
        else:
            runs["bare"].append(shrunk.bare_img_s(dev, BATCH, WARM, STEPS, "fp16"))
runs["ours_bf16"].append(shrunk.loop_img_s(boot, out, BATCH, WARM, STEPS, "bf16")[0])
runs["bare_bf16"].append(shrunk.bare_img_s(dev, BATCH, WARM, STEPS, "bf16"))
_, peak[shrunk.SMALL] = shrunk.loop_img_s(boot, out, shrunk.SMALL, WARM, STEPS, "fp16")
fp16, bare, bf16, bare_bf16 = (statistics.median(runs[k]) for k in ("ours", "bare", "ours_bf16", "bare_bf16"))
gpu_gib = shrunk.memory_gib(dev)
speed = {"batch": BATCH, "torus_train_img_s": fp16, "bare_img_s": bare, "rounds": len(runs["ours"]),
         "ratio": fp16 / bare, "ok": fp16 / bare >= 0.90}
prec = {"bf16_img_s": bf16, "bare_bf16_img_s": bare_bf16, "ratio": bf16 / bare_bf16, "ok": bf16 / bare_bf16 >= 0.90,
        "fp16_img_s": fp16, "bf16_over_fp16": bf16 / fp16}
mem = {"gib_batch_32": peak[shrunk.SMALL], "gib_batch_256": peak[BATCH], "gpu_gib": gpu_gib,
       "ok": peak[BATCH] <= 0.9 * gpu_gib}
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "speed.json").write_text(
    json.dumps({"speed_vs_bare": speed, "bf16_vs_fp16": prec, "peak_memory": mem}))
EOF

# --- 3. the production run: photo-like JPEGs through DALI (or torchvision's GPU decoder), two stages ---------
part production 180 <<'EOF'
import json, os, pathlib, subprocess, sys
import shrunk
from torus_train.data.dali import available
here, out = pathlib.Path(os.environ["GPU_CHECK_HERE"]), pathlib.Path(os.environ["GPU_CHECK_OUT"])
dali = available()  # without it: torchvision, decoding on the GPU (data.decoder = auto), and DALI not checked
run = out / "production"
LEFT_OUT, MEASURED = 3, 20  # the first steps of a stage (new loader, cuDNN autotuning) are not the loader's
# 8 classes, the train set a whole number of batch-LARGE steps, more than LEFT_OUT + MEASURED of them:
# 6,144 images: 192 steps at batch 32, 24 at 256; a rehearsal's 192: 48 at batch 4, 24 at batch 8
per_class = shrunk.LARGE * (LEFT_OUT + MEASURED + 1) // 8
# `unique` images per class made, the others links to them: the loader's speed is measured, not the images'
unique, val_per_class = (4, 2) if shrunk.REHEARSAL else (16, 8)
photos = out / f"photos-{per_class}-{unique}"  # kept for the next run into this --out: its size in its name
if not (photos / "train").is_dir():
    subprocess.run([sys.executable, str(here / "scripts" / "photo_like_set.py"), "--out", str(photos),
                    "--classes", "8", "--per-class", str(unique), "--val-per-class", str(val_per_class)],
                   check=True)
    for folder in (photos / "train").iterdir():
        for i in range(unique, per_class):
            os.link(folder / f"img{i % unique:04d}.JPEG", folder / f"img{i:04d}.JPEG")
r = subprocess.run([sys.executable, "-m", "torus_train", "run", "--spec", str(shrunk.SPEC), "--data", str(photos),
                    "--out", str(run), "--epochs", "2",
                    *shrunk.cli_sets(["model.num_classes=8", "eval.every_epochs=1", "checkpoint.every_epochs=1",
                                      "job.log_every=1", "eval.target_top1=0",  # a metrics line per step
                                      shrunk.stages(shrunk.SMALL, shrunk.LARGE),
                                      *([] if dali else ["data.loader=torchvision"])])],
                   capture_output=True, text=True)
s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
metrics = run / "metrics.jsonl"
recs = [json.loads(l) for l in metrics.read_text().splitlines()] if metrics.exists() else []
steps = [x for x in recs if "step_time" in x]

def wait(batch):
    """(data wait / step time, steps) over the stage at `batch` after its first LEFT_OUT steps; a line holds the
    per-step means of the steps since the line before it."""
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

want = f"dali ({shrunk.DECODER})" if dali else f"torchvision ({shrunk.GPU_DECODER})"
loader = s["loader"] + (f" ({s['decoder']})" if s["decoder"] else "") if s else None  # e.g. "dali (mixed)"
prod = {"backend": s.get("backend"), "loader": loader, "dali_checked": dali and loader == want,
        "note": "DALI" if dali else ("nvidia.dali does not import here: DALI was not checked; torchvision with its "
                                     f"{shrunk.GPU_DECODER} decoder was"),
        "steps": s.get("steps"), "evaluations": sum(1 for x in recs if x.get("event") == "eval"),
        "images_per_s": s.get("images_per_second"), "replicas_agree": s.get("param_digests_agree")}
prod["ok"] = (r.returncode == 0 and prod["backend"] == shrunk.BACKEND and prod["loader"] == want
              and prod["evaluations"] == 2 and prod["replicas_agree"] is True)
if r.returncode:
    prod["error"] = (r.stderr or r.stdout)[-800:]
(small, n_small), (large, n_large) = wait(shrunk.SMALL), wait(shrunk.LARGE)
waits = {"share_batch_32": small, "share_batch_256": large, "steps_batch_32": n_small, "steps_batch_256": n_large}
waits["ok"] = all(v is not None and v <= 0.10 for v in (small, large)) and min(n_small, n_large) >= MEASURED
pathlib.Path(out, "parts", "production.json").write_text(json.dumps({"production": prod, "data_wait": waits}))
EOF

# --- 4. two identical deterministic runs end with the same parameters (1x1, synthetic); the mode's cost -------
part digest 100 <<'EOF'
import json, os, pathlib, subprocess, sys
import shrunk
out = pathlib.Path(os.environ["GPU_CHECK_OUT"]) / "digest"
digests, errors = [], []
for i in (1, 2):
    run = out / f"run{i}"
    r = subprocess.run([sys.executable, "-m", "torus_train", "run", "--spec", str(shrunk.SPEC), "--data",
                        "synthetic", "--out", str(run), "--epochs", "1", "--steps", "8", "--deterministic",
                        *shrunk.cli_sets([shrunk.stages(shrunk.SMALL),
                                          "data.synthetic_samples=512", "eval.every_epochs=0",
                                          "checkpoint.every_epochs=0", "checkpoint.at_end=false"])],
                       capture_output=True, text=True)
    s = json.loads((run / "summary.json").read_text()) if r.returncode == 0 else {}
    digests.append(s.get("param_digest"))
    if r.returncode:
        errors.append(r.stderr[-400:])
res = {"first": digests[0], "second": digests[1], "ok": digests[0] is not None and digests[0] == digests[1]}
# the cost: the loop at the large batch in this process, default (cuDNN autotuning), then deterministic
WARM, STEPS = (1, 3) if shrunk.REHEARSAL else (5, 15)
boot = shrunk.world_of_one()
res["default_img_s"] = shrunk.loop_img_s(boot, out / "speed", shrunk.LARGE, WARM, STEPS)[0]
res["deterministic_img_s"] = shrunk.loop_img_s(boot, out / "speed", shrunk.LARGE, WARM, STEPS, deterministic=True)[0]
res["deterministic_cost"] = res["deterministic_img_s"] / res["default_img_s"]
if errors:
    res["error"] = " | ".join(errors)
pathlib.Path(os.environ["GPU_CHECK_OUT"], "parts", "digest.json").write_text(json.dumps({"digest": res}))
EOF

# --- 5. CUDA graphs: the loop graphed and eager against a bare step eager and graphed (its own file) -------
part graphs 180 < "$(dirname "$0")/gpu_check_graphs.py"

summarise "$([ "$REHEARSE" = 1 ] && echo rehearsal || echo done)" > "$OUT/summary.json"
cat "$OUT/summary.json"
"$PY" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["status"] not in ("ok", "partial", "rehearsal"))' \
    "$OUT/summary.json"
