#!/usr/bin/env python
"""Our packed reader against DALI's fn.readers.webdataset on the same shards: images/s side by side, what each
reads per epoch over several ranks, resuming, a damaged sample or shard, a rank's start-up over a large index.

    python scripts/bench/bench_webdataset.py --json OUT [--work DIR] [--per-class 50] [--shard-mb 4]
        [--rounds 8] [--batches 10] [--warmup 4] [--batch 32] [--threads 0] [--io-workers 4] [--split train]
        [--ranks 3] [--epochs 3] [--index-samples 1281167 --index-shards 550 --worlds 8,2176 --startup-rounds 3]

Builds (or reuses) WORK/folder with scripts/photo_like_set.py (8 classes of 500x375 JPEGs, --per-class in each
split), WORK/packed with `torus-train data pack --shard-mb`, and WORK/idx/SHARD.idx with DALI's own wds2idx
(installed with nvidia-dali), outside the packed set: a pack replaces a set only when it holds nothing but its
own files.

- images/s: one child process holds both loaders of one rank, each the DALI pipeline of `torus-train run`
  (data/dali.py: build_pipeline, CPU operators, --threads decode threads, prefetch 2) on --split; they differ
  only in what feeds the decoder. `packed`: our loader (make_loader "dali": --io-workers reader threads pread
  each sample by the index, check it, fn.external_source). `webdataset`: fn.readers.webdataset(paths,
  index_paths, ext jpg/cls, pad_last_batch) in its place, its .cls text parsed to int64 labels on the host;
  training shuffled as our packed set is (random_shuffle with initial_fill = data.shuffle_buffer,
  shuffle_after_epoch: the tar order redrawn every epoch, the same on every rank), validation in order. The
  loaders take turns in alternating order for --rounds rounds (each turn --warmup batches untimed, which drain
  what the idle loader prefetched, then --batches timed); each figure is the median of its rounds; ratio =
  webdataset / packed of the medians (above 1: DALI's reader is faster), and the median of the rounds' ratios.
- sharding: --ranks ranks of each reader (DALI's shard_id/num_shards; our data/sharding.py) over --epochs
  epochs, undecoded (DALI's also without pad_last_batch): batches per rank; per epoch the distinct samples
  read, those missed, and the extra reads (padding); whether a second reader of the same seed reads the same.
- resume: rank 0 resuming at batch 2 of epoch 1: our loader from (seed, epoch) alone; DALI's reader from a
  checkpoint of its pipeline taken there (enable_checkpointing), and a new reader without one (which epoch it
  reads).
- corrupt: per damage of DAMAGES (to the first sample of shard 1, or to shard 1, of a copy of the set), one
  epoch of our loader under data.on_corrupt fail and skip, and of DALI's reader (which has no such setting):
  the error's reason, or the batches delivered and the samples replaced.
- start-up (--index-samples N): a packed set's index and DALI's .idx files for N samples in --index-shards
  shards (sparse tar files: nothing is read from them), then per world size of --worlds the seconds the last
  rank takes before reading (ours: load the index, draw the epoch's order, cut the rank's shard; DALI: build
  the reader's pipeline), in a fresh process each, median of --startup-rounds alternating rounds; with strace,
  the index and shard files each opens (distinct files).

JSON: {"images", "shards", "split", "batch", "threads", "io_workers", "load", "rounds", "results", "ratio",
"ratio_per_round", "sharding", "resume", "corrupt", "startup"}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: torus_train and scripts/
sys.path.insert(0, str(ROOT))  # torus_train from this checkout, installed or not
READERS = ("packed", "webdataset")
READER = "wds"  # the webdataset reader's name in the pipeline (reader_meta)


def say(msg: str) -> None:
    print(msg, flush=True)


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wds2idx() -> str:
    """DALI's index tool: on PATH or beside this interpreter (pip puts it in the environment's bin/)."""
    found = shutil.which("wds2idx") or str(Path(sys.executable).with_name("wds2idx"))
    if not os.access(found, os.X_OK):
        raise SystemExit("DALI's wds2idx is not installed (it comes with nvidia-dali: pip install nvidia-dali-cuda120)")
    return found


# ---------------------------------------------------------------------------------------------------------
# the set: a folder, its packed set (torus-train data pack) and DALI's index files (wds2idx)
# ---------------------------------------------------------------------------------------------------------
def prepare(work: Path, per_class: int, shard_mb: float) -> tuple[Path, Path]:
    """WORK/packed and WORK/idx, reused when they hold 8 x per_class samples per split in shards of shard_mb."""
    folder, packed, idx = work / "folder", work / "packed", work / "idx"
    meta = json.loads((packed / "packed.json").read_text()) if (packed / "packed.json").is_file() else {}
    counts = [meta.get("splits", {}).get(s, {}).get("count") for s in ("train", "val")]
    if counts != [8 * per_class] * 2 or meta.get("shard_mb") != shard_mb:
        for d in (folder, packed, idx):
            shutil.rmtree(d, ignore_errors=True)
        script = ROOT / "scripts" / "photo_like_set.py"
        sizes = ["--classes", "8", "--per-class", str(per_class), "--val-per-class", str(per_class)]
        run([sys.executable, str(script), "--out", str(folder), *sizes])
        pack = ["data", "pack", "--data", str(folder), "--out", str(packed), "--shard-mb", str(shard_mb)]
        run([sys.executable, "-m", "torus_train", *pack])
        meta = json.loads((packed / "packed.json").read_text())
    idx.mkdir(exist_ok=True)
    for sh in (sh for m in meta["splits"].values() for sh in m["shards"]):
        if not (idx / index_name(sh["name"])).is_file():
            run([wds2idx(), str(packed / sh["name"]), str(idx / index_name(sh["name"]))], quiet=True)
    return packed, idx


def index_name(shard: str) -> str:
    return shard[: -len(".tar")] + ".idx"


def run(cmd: list[str], quiet: bool = False) -> None:
    out = subprocess.run(cmd, env=child_env(), capture_output=quiet, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}\n{(out.stderr or '')[-2000:]}")


# ---------------------------------------------------------------------------------------------------------
# the two readers
# ---------------------------------------------------------------------------------------------------------
def shard_paths(packed: Path, split: str) -> list[Path]:
    return [packed / sh["name"] for sh in json.loads((packed / "packed.json").read_text())["splits"][split]["shards"]]


def reader_args(shards: list[Path], idx: Path, cfg) -> dict:
    """fn.readers.webdataset's arguments for this rank: the split's shards and their index files (in ``idx``),
    every rank an equal number of batches (pad_last_batch), training shuffled as the packed set is."""
    train = cfg.split == "train"
    shuffle = {"shuffle_after_epoch": True, "shuffle_after_epoch_seed": cfg.seed} if train else {}
    return dict(
        paths=[str(s) for s in shards],
        index_paths=[str(idx / index_name(s.name)) for s in shards],
        ext=["jpg", "cls"],
        missing_component_behavior="error",
        shard_id=cfg.rank,
        num_shards=cfg.world_size,
        pad_last_batch=True,  # without it a shuffled epoch spills into the next: samples missed, others repeated
        random_shuffle=train,
        initial_fill=cfg.shuffle_buffer,
        **shuffle,  # the tar order redrawn every epoch, the same on every rank
        seed=cfg.seed * 7919 + cfg.rank * 104729,
        name=READER,
    )


def config(split: str, rank: int, world: int, args, on_corrupt: str = "fail"):
    from torus_train.data import loader_config

    return loader_config(
        split, rank, world, args.batch, 224, 0, False, args.threads, "float32", on_corrupt, args.io_workers, 2, 8192
    )


class WebdatasetLoader:
    """One rank's batches from DALI's fn.readers.webdataset through data/dali.py's pipeline (CPU operators)."""

    def __init__(self, packed: Path, idx: Path, cfg):
        from nvidia.dali import fn

        from torus_train.data.dali import build_pipeline

        wds = reader_args(shard_paths(packed, cfg.split), idx, cfg)
        self.pipe = build_pipeline(None, cfg, None, wds["seed"] % 2**31, read=lambda: fn.readers.webdataset(**wds))
        meta = self.pipe.reader_meta(READER)
        self.steps = math.ceil(meta["epoch_size_padded"] / cfg.world_size / cfg.batch_size)

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        pass  # the reader moves to its next epoch by itself (it cannot jump to one)

    def __iter__(self):
        import numpy as np
        import torch

        for _ in range(self.steps):
            images, cls = self.pipe.run()
            x = torch.from_numpy(np.array(images.as_tensor(), copy=True))
            y = torch.tensor([int(np.asarray(cls[i]).tobytes()) for i in range(len(cls))], dtype=torch.int64)
            yield x, y

    def close(self) -> None:
        del self.pipe


def make(name: str, packed: Path, idx: Path, args, on_corrupt: str = "fail"):
    if name == "webdataset":
        return WebdatasetLoader(packed, idx, config(args.split, 0, 1, args))
    from torus_train.data import make_loader

    return make_loader(
        "dali",
        str(packed),
        args.split,
        rank=0,
        world_size=1,
        batch_size=args.batch,
        image_size=224,
        num_classes=None,
        seed=0,
        channels_last=False,
        device="cpu",
        num_threads=args.threads,
        verify=False,
        io_workers=args.io_workers,
        prefetch=2,
        on_corrupt=on_corrupt,
    )


class Endless:
    """A loader's batches without end: epoch after epoch (training), the same pass again (validation)."""

    def __init__(self, ld, train: bool):
        self.ld, self.epoch, self.it, self.train = ld, 0, iter(ld), train

    def next(self):
        while True:
            try:
                return next(self.it)
            except StopIteration:
                self.epoch += self.train  # a validation loader keeps its pipeline when the epoch stays
                self.ld.set_epoch(self.epoch)
                self.it = iter(self.ld)


def rates_child(args) -> None:
    """Both loaders in this one process, taking turns in alternating order (see the module docstring)."""
    packed, idx = Path(args.packed), Path(args.idx)
    loaders = {name: Endless(make(name, packed, idx, args), args.split == "train") for name in READERS}
    per_round: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in READERS if r % 2 == 0 else READERS[::-1]:
            ld = loaders[name]
            for _ in range(args.warmup):
                ld.next()
            t0 = time.perf_counter()
            images = sum(len(ld.next()[1]) for _ in range(args.batches))
            per_round[name].append(images / (time.perf_counter() - t0))
            print(f"round {r + 1}/{args.rounds}: {name:<10} {per_round[name][-1]:7.1f} img/s", file=sys.stderr)
    for ld in loaders.values():
        ld.ld.close()
    print(json.dumps(per_round))


def run_rates(packed: Path, idx: Path, args) -> dict[str, list[float]]:
    flags = ("batch", "threads", "io-workers", "warmup", "batches", "rounds", "split")
    cmd = [sys.executable, __file__, "--rates-child", "--packed", str(packed), "--idx", str(idx)]
    cmd += [f"--{k}={getattr(args, k.replace('-', '_'))}" for k in flags]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=child_env(), timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed ({out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------
# what each reads per epoch over several ranks (undecoded)
# ---------------------------------------------------------------------------------------------------------
def ours_epochs(packed: Path, cfgs, epochs: int) -> list[list]:
    """Per rank, per epoch: the sample indices our loader reads (data/base.py: epoch_shard)."""
    from torus_train.data.base import epoch_shard
    from torus_train.data.packed import load_packed

    split = load_packed(packed).split(cfgs[0].split)
    return [[epoch_shard(split, c, e).indices.tolist() for e in range(epochs)] for c in cfgs]


def dali_epochs(packed: Path, idx: Path, cfgs, epochs: int, **change) -> list[list]:
    """Per rank, per epoch: the samples fn.readers.webdataset gives (its sample's key is its index); ``change``:
    reader arguments other than reader_args's."""
    out = []
    for c in cfgs:
        pipe = reader_pipeline(reader_args(shard_paths(packed, c.split), idx, c) | change, c.batch_size)
        steps = math.ceil(pipe.reader_meta(READER)["epoch_size_padded"] / c.world_size / c.batch_size)
        out.append([[k for batch in keys(pipe, steps) for k in batch] for _ in range(epochs)])
        del pipe
    return out


def reader_pipeline(wds: dict, batch: int, **checkpoint):
    """A pipeline of fn.readers.webdataset alone: its images undecoded (each with its source_info), built;
    ``checkpoint``: DALI's checkpointing arguments (enable_checkpointing, checkpoint)."""
    from nvidia.dali import fn, pipeline_def

    pipe = pipeline_def(lambda: fn.readers.webdataset(**wds)[0], batch_size=batch, num_threads=1, **checkpoint)(
        device_id=None, seed=wds["seed"] % 2**31
    )
    pipe.build()
    return pipe


def keys(pipe, batches: int) -> list[list[int]]:
    """The next ``batches`` batches of a reader pipeline, as sample indices (a sample's key is its index)."""
    out = []
    for _ in range(batches):
        (b,) = pipe.run()
        out.append([int(b[i].source_info().rsplit(":", 1)[1].split(".")[0]) for i in range(len(b))])
    return out


def resume(packed: Path, idx: Path, args) -> dict:
    """Rank 0 of --ranks resuming at batch 2 of epoch 1: ours from (seed, epoch) alone; DALI's reader from a
    checkpoint of its pipeline (enable_checkpointing) taken there, or as a new reader without one."""
    cfg = config(args.split, 0, args.ranks, args)
    b = cfg.batch_size
    ours = ours_epochs(packed, [cfg], 2)[0]
    wds = reader_args(shard_paths(packed, cfg.split), idx, cfg)
    pipe = reader_pipeline(wds, b, enable_checkpointing=True)
    steps = math.ceil(pipe.reader_meta(READER)["epoch_size_padded"] / cfg.world_size / b)
    first = keys(pipe, steps)  # epoch 0
    keys(pipe, 2)
    blob = pipe.checkpoint()
    rest = keys(pipe, steps - 2)  # the rest of epoch 1
    restored = keys(reader_pipeline(wds, b, enable_checkpointing=True, checkpoint=blob), steps - 2)
    fresh = keys(reader_pipeline(wds, b), steps)
    return {
        "ours_epochs_differ": ours[0] != ours[1],
        "dali_checkpoint_bytes": len(blob),
        "dali_from_checkpoint_same": restored == rest,
        "dali_new_reader_repeats_epoch_0": fresh == first,
    }


def sharding(packed: Path, idx: Path, args) -> list[dict]:
    n = json.loads((packed / "packed.json").read_text())["splits"][args.split]["count"]
    cfgs = [config(args.split, r, args.ranks, args) for r in range(args.ranks)]
    readers = {
        "packed": lambda: ours_epochs(packed, cfgs, args.epochs),
        "webdataset": lambda: dali_epochs(packed, idx, cfgs, args.epochs),
        "webdataset, no pad_last_batch": lambda: dali_epochs(packed, idx, cfgs, args.epochs, pad_last_batch=False),
    }
    rows = []
    for name, read in readers.items():
        per_rank = read()
        epochs = []
        for e in range(args.epochs):
            seen = [k for rank in per_rank for k in rank[e]]
            distinct = len(set(seen))
            epochs.append(
                {"read": len(seen), "distinct": distinct, "missed": n - distinct, "repeats": len(seen) - distinct}
            )
        steps = [len(rank[0]) // args.batch for rank in per_rank]
        again = read() == per_rank  # the same seed, a new reader: the same samples in the same order
        rows.append(
            {
                "reader": name,
                "ranks": args.ranks,
                "samples": n,
                "steps_per_rank": steps,
                "epochs": epochs,
                "again": again,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------------------
# a damaged shard: what each reader does
# ---------------------------------------------------------------------------------------------------------
DAMAGES = {
    "altered": "its JPEG data zeroed for 4,000 bytes from byte 1,000 (a bit rot the decoder may not see)",
    "not an image": "its bytes zeroed whole",
    "truncated shard": "the shard cut to half its bytes (its index left as it was)",
}
"""What is done to the first sample of shard 1 (or to shard 1) of a copy of the packed set."""


def damaged(packed: Path, work: Path, split: str, damage: str) -> Path:
    """A copy of the packed set with one of DAMAGES; DALI's index files (WORK/idx) still fit it."""
    from torus_train.data.packed import load_packed

    dest = work / f"damaged-{damage.replace(' ', '-')}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(packed, dest)
    sp = load_packed(dest).split(split)
    shard, i = Path(sp.shard_paths[1]), int(sp.starts[1])
    if damage == "truncated shard":
        os.truncate(shard, shard.stat().st_size // 2)
        return dest
    at, size = int(sp.offsets[i]), int(sp.sizes[i])
    with open(shard, "r+b") as f:
        f.seek(at + 1000 if damage == "altered" else at)
        f.write(bytes(4000 if damage == "altered" else size))
    return dest


def one_epoch(ld) -> str:
    """What one epoch of ``ld`` gives: the error's reason, or the batches and the samples replaced."""
    try:
        batches = sum(1 for _ in ld)
    except Exception as e:  # DataError (ours) or DALI's RuntimeError
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        reason = next((lines[k + 1] for k, ln in enumerate(lines) if ln == "encountered:" and k + 1 < len(lines)), "")
        return f"error: {(reason or lines[0])[:220]}"
    finally:
        ld.close()
    replaced = getattr(getattr(ld, "corrupt", None), "samples", 0)
    return f"no error: {batches} batches" + (f", {replaced} sample(s) replaced" if replaced else "")


def corrupt_child(args) -> None:
    """Per damage: one epoch of our loader (on_corrupt fail, then skip) and of DALI's reader; JSON on stdout."""
    import logging

    logging.getLogger("torus_train.data").setLevel(logging.ERROR)  # a line per replaced sample: counted instead
    packed, idx, rows = Path(args.packed), Path(args.idx), []
    for damage, what in DAMAGES.items():
        copy = damaged(packed, Path(args.work), args.split, damage)
        outcome = {f"packed, on_corrupt {p}": one_epoch(make("packed", copy, idx, args, p)) for p in ("fail", "skip")}
        outcome["webdataset"] = one_epoch(make("webdataset", copy, idx, args))
        rows.append({"damage": damage, "what": what, "outcome": outcome})
        shutil.rmtree(copy)
    print(json.dumps(rows))


def corrupt(packed: Path, idx: Path, args) -> list[dict]:
    cmd = [sys.executable, __file__, "--corrupt-child", "--packed", str(packed), "--idx", str(idx)]
    cmd += [f"--{k}={getattr(args, k.replace('-', '_'))}" for k in ("batch", "threads", "io-workers", "split", "work")]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=child_env(), timeout=1200)
    if out.returncode != 0:
        raise SystemExit(f"corrupt child failed ({out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------
# a rank's start-up over an ImageNet-sized index
# ---------------------------------------------------------------------------------------------------------
def write_big_index(folder: Path, n: int, shards: int) -> Path:
    """A packed set's index (packed.json and the arrays) and DALI's .idx files for n training samples of
    110,000 bytes in ``shards`` sparse tar files (their sizes as packed; holes, never read)."""
    import numpy as np

    from torus_train.data.index import arrays_checksum
    from torus_train.data.packed import VERSION
    from torus_train.job.sources import PACKED_FORMAT

    folder.mkdir(parents=True)
    size, record = 110_000, 512 + 110_080 + 512 + 512  # header, image padded to blocks, header, label block
    splits, arrays = {}, {}
    for split, count, k in (("train", n, shards), ("val", 1000, 1)):
        per = [count // k + (i < count % k) for i in range(k)]
        starts = np.concatenate(([0], np.cumsum(per))).astype(np.int64)
        within = np.arange(count, dtype=np.int64) - np.repeat(starts[:-1], per)
        arrays |= {
            f"{split}.starts": starts,
            f"{split}.offsets": within * record + 512,
            f"{split}.sizes": np.full(count, size, np.int64),
            f"{split}.labels": (np.arange(count) % 1000).astype(np.int32),
            f"{split}.crc32": np.zeros(count, np.uint32),
        }
        listed = []
        for s, c in enumerate(per):
            name, nbytes = f"{split}-{s:06d}.tar", c * record + 1024
            with open(folder / name, "wb") as f:
                f.truncate(nbytes)
            lines = [
                f"jpg {j * record + 512} {size} {j:08d}.jpg cls {j * record + 512 + 110_080 + 512} 3 {j:08d}.cls"
                for j in range(c)
            ]
            (folder / index_name(name)).write_text(f"v1.2 {c}\n" + "\n".join(lines) + "\n")
            listed.append({"name": name, "bytes": nbytes, "samples": c, "sha256": "0" * 64})
        splits[split] = {"classes": [f"c{i:04d}" for i in range(1000)], "count": count, "shards": listed}
    for key, a in arrays.items():
        np.save(folder / f"{key}.npy", a)
    meta = {
        "format": PACKED_FORMAT,
        "version": VERSION,
        "source": "synthetic",
        "checksum": arrays_checksum(arrays),
        "bytes": sum(sh["bytes"] for m in splits.values() for sh in m["shards"]),
        "splits": splits,
    }
    (folder / "packed.json").write_text(json.dumps(meta))
    return folder


def startup_child(args) -> None:
    """One rank's set-up before its first read (see the module docstring): seconds, on stdout as JSON."""
    big, world = Path(args.packed), args.world
    cfg = config("train", world - 1, world, args)
    t0 = time.perf_counter()
    if args.startup_child == "packed":
        from torus_train.data.base import epoch_shard
        from torus_train.data.packed import load_packed

        t1 = time.perf_counter()  # the imports are not the reader's
        entries = len(epoch_shard(load_packed(big).split("train"), cfg, 1).indices)
    else:
        import nvidia.dali  # noqa: F401

        shards = sorted(big.glob("train-*.tar"))  # listed as a user of DALI's reader lists them
        wds = reader_args(shards, big, cfg)
        t1 = time.perf_counter()
        pipe = reader_pipeline(wds, cfg.batch_size)
        meta = pipe.reader_meta(READER)
        entries = meta["epoch_size_padded"] // world
    print(json.dumps({"seconds": time.perf_counter() - t1, "entries": entries, "imports": t1 - t0}))


def startup(args) -> list[dict]:
    n, k = args.index_samples, args.index_shards
    big = Path(args.work) / f"index-{n}-{k}"
    if not (big / "packed.json").is_file():
        shutil.rmtree(big, ignore_errors=True)
        t = time.time()
        write_big_index(big, n, k)
        say(f"index of {n:,} samples in {k} shards written in {time.time() - t:.1f} s")
    idx_mb = sum(f.stat().st_size for f in big.glob("train-*.idx")) / 1e6
    ours_mb = sum(f.stat().st_size for f in [big / "packed.json", *big.glob("train.*.npy")]) / 1e6
    worlds = [int(w) for w in args.worlds.split(",")]
    seconds: dict[tuple[str, int], list[float]] = {}
    entries: dict[tuple[str, int], int] = {}
    for r in range(args.startup_rounds):
        for w in worlds:
            for name in READERS if r % 2 == 0 else READERS[::-1]:
                m = startup_run(name, big, w, args)
                seconds.setdefault((name, w), []).append(m["seconds"])
                entries[(name, w)] = m["entries"]
    opens = {}
    if shutil.which("strace"):
        for name in READERS:
            trace = big.parent / f"strace-{name}.log"
            startup_run(name, big, worlds[-1], args, trace)
            text = trace.read_text(errors="replace")
            opens[name] = len(
                set(re.findall(r'openat\([^"]*"([^"]*index-[^"]*/[^"]+\.(?:tar|idx|npy|json))"[^=]*= \d', text))
            )
    rows = []
    for (name, w), s in seconds.items():
        rows.append(
            {
                "reader": name,
                "world": w,
                "seconds": round(statistics.median(s), 3),
                "entries": entries[(name, w)],
                "rounds_s": [round(x, 3) for x in s],
                "index_mb": round(idx_mb if name == "webdataset" else ours_mb, 1),
                "opens": opens.get(name) if w == worlds[-1] else None,
            }
        )
    return rows


def startup_run(name: str, big: Path, world: int, args, trace: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--startup-child", name, "--packed", str(big), "--world", str(world)]
    if trace is not None:
        cmd = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace), *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=1200)
    if out.returncode != 0:
        raise SystemExit(f"start-up child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------
def per_round_ratios(rates: dict[str, list[float]]) -> list[float]:
    return [w / p for p, w in zip(rates["packed"], rates["webdataset"], strict=True)]


def report(doc: dict, args) -> None:
    rates = doc["rounds"]
    med = {k: statistics.median(v) for k, v in rates.items()}
    pairs = per_round_ratios(rates)
    say(
        f"\nimages/s, {args.split}, batch {args.batch}, 224x224, {args.threads} decode thread(s), median of "
        f"{args.rounds} alternating rounds (packed also has {args.io_workers} reader threads), load "
        f"{doc['load'][0]:.2f} before, {doc['load'][1]:.2f} after:"
    )
    for k in READERS:
        say(f"  {k:<10} {med[k]:8.1f} img/s   rounds: {', '.join(f'{x:.1f}' for x in rates[k])}")
    say(
        f"  webdataset / packed: {doc['ratio']:.3f} (medians); per round {', '.join(f'{x:.2f}' for x in pairs)}, "
        f"median {doc['ratio_per_round']:.3f}"
    )
    say(f"\nsharding: {args.ranks} ranks, batch {args.batch}, {args.epochs} epochs of {args.split}")
    for r in doc["sharding"]:
        ep = "; ".join(f"{e['distinct']} read, {e['missed']} missed, {e['repeats']} extra reads" for e in r["epochs"])
        say(f"  {r['reader']}: batches per rank {r['steps_per_rank']}; per epoch: {ep}; the same again: {r['again']}")
    r = doc["resume"]
    say(f"\nresuming rank 0 of {args.ranks} at batch 2 of epoch 1:")
    say(
        "  packed: an epoch's order is drawn from (seed, epoch) alone: a new loader's set_epoch(1) reads it with no "
        f"state saved, on any grid (each rank its part); epoch 1 differs from epoch 0: {r['ours_epochs_differ']}"
    )
    say(
        f"  webdataset: from a checkpoint of the pipeline ({r['dali_checkpoint_bytes']} bytes, this rank's) the same: "
        f"{r['dali_from_checkpoint_same']}; a new reader without one reads epoch 0 again: "
        f"{r['dali_new_reader_repeats_epoch_0']}"
    )
    say(f"\none epoch of {args.split} from a damaged copy (the first sample of shard 1, or shard 1):")
    for r in doc["corrupt"]:
        say(f"  {r['damage']}: {r['what']}")
        for reader, outcome in r["outcome"].items():
            say(f"    {reader:<24} {outcome}")
    if doc["startup"]:
        say(
            f"\nstart-up of the last rank over {args.index_samples:,} samples in {args.index_shards} shards "
            f"(median of {args.startup_rounds} rounds; index read from the page cache):"
        )
        for r in doc["startup"]:
            opens = f", {r['opens']} files opened" if r["opens"] is not None else ""
            say(
                f"  {r['reader']:<10} world {r['world']:>5}: {r['seconds']:7.3f} s, {r['entries']:,} samples per rank, "
                f"index {r['index_mb']} MB{opens}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "torus-bench-webdataset"))
    ap.add_argument("--per-class", type=int, default=50, help="JPEGs per class and split (8 classes)")
    ap.add_argument("--shard-mb", type=float, default=4.0, help="`data pack --shard-mb`")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4, help="untimed batches before each timed turn (at least 1)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="DALI decode threads (0: this process's cores)")
    ap.add_argument("--io-workers", type=int, default=4, help="our loader's reader threads")
    ap.add_argument("--split", choices=("train", "val"), default="train")
    ap.add_argument("--ranks", type=int, default=3, help="ranks of the sharding comparison")
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the sharding comparison")
    ap.add_argument("--index-samples", type=int, default=0, help="start-up over an index this large (0: skip)")
    ap.add_argument("--index-shards", type=int, default=550, help="its shards (ImageNet at 256 MB: about 550)")
    ap.add_argument("--worlds", default="8,2176", help="world sizes of the start-up comparison")
    ap.add_argument("--startup-rounds", type=int, default=3, help="alternating rounds of the start-up comparison")
    ap.add_argument("--rates-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--startup-child", help=argparse.SUPPRESS)
    ap.add_argument("--corrupt-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--packed", help=argparse.SUPPRESS)
    ap.add_argument("--idx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = args.threads or len(os.sched_getaffinity(0))
    args.warmup = max(1, args.warmup)
    if args.rates_child:
        return rates_child(args)
    if args.startup_child:
        return startup_child(args)
    if args.corrupt_child:
        return corrupt_child(args)
    packed, idx = prepare(Path(args.work), args.per_class, args.shard_mb)
    meta = json.loads((packed / "packed.json").read_text())
    shards = len(meta["splits"][args.split]["shards"])
    say(
        f"{packed}: {meta['splits'][args.split]['count']} {args.split} samples in {shards} shards; DALI's index "
        f"files by wds2idx in {idx}"
    )
    load = os.getloadavg()[0]  # the machine is shared: the 1-minute load before and after the timed rounds
    rates = run_rates(packed, idx, args)
    doc = {
        "images": meta["splits"][args.split]["count"],
        "shards": shards,
        "split": args.split,
        "batch": args.batch,
        "threads": args.threads,
        "io_workers": args.io_workers,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "rounds": rates,
        "results": [{"reader": k, "images_per_s": round(statistics.median(v), 1)} for k, v in rates.items()],
        "ratio": round(statistics.median(rates["webdataset"]) / statistics.median(rates["packed"]), 3),
        "ratio_per_round": round(statistics.median(per_round_ratios(rates)), 3),
        "sharding": sharding(packed, idx, args),
        "resume": resume(packed, idx, args),
        "corrupt": corrupt(packed, idx, args),
        "startup": startup(args) if args.index_samples else [],
    }
    report(doc, args)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
