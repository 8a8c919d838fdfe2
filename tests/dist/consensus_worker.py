"""One rank of tests/dist/test_consensus.py: comm/consensus.py over a gloo world, this rank failing with the
reason FAIL_<rank> names (passing where it is unset); writes the verdict it got as JSON."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.comm.consensus import consensus

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
try:
    found = consensus(os.environ.get(f"FAIL_{rank}"), torch.device("cpu"))
finally:
    dist.destroy_process_group()
Path(os.environ["CHECK_OUT"], f"rank{rank}.json").write_text(
    json.dumps({"ok": found.ok, "where": found.where(), "reason": found.reason(), "first": found.first})
)
