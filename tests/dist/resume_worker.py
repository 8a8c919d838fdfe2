"""One rank of the resume-verdict check (started by tests/dist/test_resume_verdict.py): 4 ranks as 2 nodes of 2.

Writes CHECK_OUT.<rank>: for each case, the chosen step (or none / the refusal), the checkpoint files this rank
read and verified, and the bytes it read from checkpoint files up to loading the chosen one (hand_to_node)."""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.errors import RunFailed
from torus_train.ranks.bootstrap import rank_info
from torus_train.train import checkpoint as ckpt
from torus_train.train.state import agree_on_checkpoint, hand_to_node

HASHED = []
_read_verified = ckpt.read_verified


def counting_read(manifest_path):
    HASHED.append(Path(manifest_path).with_suffix(".pt").name)
    return _read_verified(manifest_path)


def main():
    info = rank_info()  # RANK, WORLD_SIZE and LOCAL_RANK as a launcher sets them
    rank, world, local = info.rank, info.world_size, info.local_rank
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"],
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    ckpt.read_verified = counting_read
    root = Path(os.environ["CKPTS"])
    cases = {
        "shared": [root / "shared"] * 4,
        "stale": [root / "shared", root / "shared", root / "stale", root / "stale"],  # node 2 sees another
        "empty": [root / "empty"] * 4,
    }
    out = {}
    for name, folders in cases.items():
        HASHED.clear()
        read0 = ckpt.BYTES_READ[0]
        try:
            ref = agree_on_checkpoint(folders[rank], rank, local, world)
            chosen = None if ref is None else ref.step
            if ref is not None:
                ref = hand_to_node(ref, info)
                assert ckpt.load_checkpoint(ref)["position"]["global_step"] == ref.step
        except RunFailed as e:
            chosen = f"refused: {e}"
        out[name] = {"chosen": chosen, "hashed": list(HASHED), "bytes_read": ckpt.BYTES_READ[0] - read0}
    Path(f"{os.environ['CHECK_OUT']}.{rank}").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
