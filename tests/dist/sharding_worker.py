"""One rank of the sharding test: read one training epoch and write the sample indices it saw.

Usage: python sharding_worker.py KIND ROOT RANK WORLD BATCH EPOCH OUT.json
Run as a real process per rank; it reads its GLOBAL rank from the command line the way a worker would from
its launcher's environment.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for datahelp

from datahelp import decode_indices

from torus_train.data import make_loader

kind, root, rank, world, batch, epoch, out = sys.argv[1:8]
loader = make_loader(
    kind,
    root,
    "train",
    rank=int(rank),
    world_size=int(world),
    batch_size=int(batch),
    image_size=24,
    num_classes=None,
    seed=5,
    channels_last=False,
    device="cpu",
    num_threads=1,
)
loader.set_epoch(int(epoch))
seen, labels = [], []
for x, y in loader:
    seen += decode_indices(x)
    labels += y.tolist()
loader.close()
Path(out).write_text(
    json.dumps({"rank": int(rank), "steps": len(loader), "pad": loader.pad, "seen": seen, "labels": labels})
)
