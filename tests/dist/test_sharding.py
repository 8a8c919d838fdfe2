"""Sharding across 4 real rank processes: over one epoch every training image is read exactly once across
the ranks, apart from the documented wrap-around padding; every rank takes the same number of steps."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datahelp import make_index_set

from torus_train.data.checks import scan
from torus_train.data.index import ensure_index

WORKER = str(Path(__file__).with_name("sharding_worker.py"))
WORLD = 4


@pytest.fixture(scope="module")
def index_set(tmp_path_factory):
    # 90 images, 4 ranks x batch 4 = 16 per step -> 6 steps, 96 slots, 6 padded
    root = make_index_set(tmp_path_factory.mktemp("shard"), n_train=90, n_val=10)
    # indexed once before the ranks start, as the launcher does (4 ranks indexing one folder at once race)
    ensure_index(root)
    return root


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["dali", "torchvision"])
def test_every_image_once_across_4_ranks(kind, index_set, tmp_path):
    outs = [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, kind, str(index_set), str(r), str(WORLD), "4", "1", str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    try:
        for p in procs:
            out, _ = p.communicate(timeout=200)
            assert p.returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranks = [json.loads(o.read_text()) for o in outs]
    assert {r["steps"] for r in ranks} == {6}
    seen = Counter(i for r in ranks for i in r["seen"])
    pad = sum(r["pad"] for r in ranks)
    assert pad == 96 - 90
    assert set(seen) == set(range(90))  # nothing missed
    assert sum(seen.values()) == 90 + pad  # only the padding repeats
    assert sum(c - 1 for c in seen.values()) == pad
    # the padding sits at the end of the last rank's shard and repeats the start of the epoch's order
    last = ranks[-1]["seen"]
    first = ranks[0]["seen"]
    assert last[-pad:] == first[:pad]
    # labels travel with their images
    files = scan(index_set, "train")
    for r in ranks:
        assert r["labels"] == [files.labels[i] for i in r["seen"]]
