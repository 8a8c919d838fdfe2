"""One rank of the resume-verdict check (started by tests/dist/test_resume_verdict.py): 4 ranks as 2 nodes of 2.

Writes CHECK_OUT.<rank>: for each case, the chosen step (or none / the refusal) and how many sha256 reads
this rank did."""
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.errors import RunFailed
from torus_train.ranks.bootstrap import rank_info
from torus_train.train import checkpoint as ckpt
from torus_train.train.state import agree_on_checkpoint

HASHED = []
_sha256 = ckpt._sha256


def counting_sha256(path):
    HASHED.append(Path(path).name)
    return _sha256(path)


def main():
    info = rank_info()  # RANK, WORLD_SIZE and LOCAL_RANK as a launcher sets them
    rank, world, local = info.rank, info.world_size, info.local_rank
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["MASTER_PORT"], rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    ckpt._sha256 = counting_sha256
    root = Path(os.environ["CKPTS"])
    cases = {"shared": [root / "shared"] * 4,
             "stale": [root / "shared", root / "shared", root / "stale", root / "stale"],  # node 2 sees another
             "empty": [root / "empty"] * 4}
    out = {}
    for name, folders in cases.items():
        HASHED.clear()
        try:
            ref = agree_on_checkpoint(folders[rank], rank, local, world)
            chosen = None if ref is None else ref.step
            if ref is not None:
                assert ckpt.load_checkpoint(ref)["position"]["global_step"] == ref.step
        except RunFailed as e:
            chosen = f"refused: {e}"
        out[name] = {"chosen": chosen, "hashed": list(HASHED)}
    Path(f"{os.environ['CHECK_OUT']}.{rank}").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
