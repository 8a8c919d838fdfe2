"""One rank of tests/dist/test_stage_dist.py: train/build.py's staged_root on a gloo world of 2 "nodes" x 2 ranks
(node = rank // 2, each node with its own node-local folder), the process group's timeout COMM_TIMEOUT_S, the
copy of node SLOW_NODE slowed by SLOW_S seconds; then an all-reduce on the same process group. Writes what it
saw as JSON (or the error it raised)."""

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import torus_train.data.stage as stage_module
from torus_train.job.rank import Bootstrap, RankInfo
from torus_train.job.spec import load_spec
from torus_train.job.topology import parse_grid
from torus_train.train.build import staged_root

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
node, local = divmod(rank, 2)
out = Path(os.environ["STAGE_OUT"])
slow_node, slow_s = int(os.environ["SLOW_NODE"]), float(os.environ["SLOW_S"])
copy = stage_module._copy_checked


slept: list = []


def slow_copy(src, dst, sha256):
    if not slept:  # a node whose shared file system is slow: longer than the collective timeout
        slept.append(time.sleep(slow_s))
    copy(src, dst, sha256)


if node == slow_node:
    stage_module._copy_checked = slow_copy
dist.init_process_group(
    "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=float(os.environ["COMM_TIMEOUT_S"]))
)
spec = load_spec(
    None,
    [
        ("data.source", os.environ["SHARDS"]),
        ("data.stage", "node"),
        ("data.stage_dir", str(out / f"node{node}")),
        ("data.stage_timeout_s", float(os.environ["STAGE_TIMEOUT_S"])),
    ],
)
boot = Bootstrap(RankInfo(rank, world, local, 2, "test"), parse_grid("2x2"), torch.device("cpu"), "gloo", None)
t0 = time.monotonic()
result: dict = {"rank": rank}
try:
    result["root"] = staged_root(spec, boot, os.environ["SHARDS"])
    result["waited_s"] = time.monotonic() - t0
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)  # the process group is still whole after the wait
    result["sum"] = total.item()
except Exception as e:
    result["error"] = f"{type(e).__name__}: {e}"
finally:
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
