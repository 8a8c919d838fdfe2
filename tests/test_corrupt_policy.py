"""data.on_corrupt on real JPEG files, both loaders: fail names the file; skip replaces it by the next readable
file (batch size and step count unchanged), names it once in a warning and counts it."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
from datahelp import decode_indices, make_index_set, wreck_jpeg

from torus_train.data import make_loader
from torus_train.data.base import PAD_LABEL, CorruptLog
from torus_train.data.checks import DataError
from torus_train.errors import UserError

KINDS = ["dali", "torchvision"]


def loader(kind, root, split, **kw):
    args = dict(
        rank=0,
        world_size=1,
        batch_size=4,
        image_size=24,
        num_classes=None,
        seed=0,
        channels_last=False,
        device="cpu",
        num_threads=1,
        verify=False,
    )
    args.update(kw)
    return make_loader(kind, root, split, **args)


def wreck_inside(path):
    """Zero the JPEG's tables: the content check passes, only decoding finds it."""
    wreck_jpeg(path)


def truncate(path):
    path.write_bytes(path.read_bytes()[:200])


@pytest.fixture()
def folder(tmp_path):
    return make_index_set(tmp_path / "d", n_train=12, n_val=6)


def victim(root, split="train"):
    """The first file of class c1: index 4 of the split (files are listed by class, then name)."""
    return sorted((root / split / "c1").iterdir())[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", [wreck_inside, truncate])
def test_fail_names_the_file(kind, damage, folder):
    bad = victim(folder)
    damage(bad)
    with pytest.raises(DataError) as e:
        for _ in loader(kind, folder, "train", on_corrupt="fail"):
            pass
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{bad}: ")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", [wreck_inside, truncate])
def test_skip_replaces_by_the_next_file(kind, damage, folder, caplog):
    bad = victim(folder)
    damage(bad)
    files = [str(p) for c in ("c0", "c1", "c2") for p in sorted((folder / "train" / c).iterdir())]
    assert files.index(str(bad)) == 4
    log = CorruptLog()
    caplog.set_level(logging.WARNING, logger="torus_train.data")
    for epoch in (0, 1):  # the file is met once per epoch, named once
        ld = loader(kind, folder, "train", on_corrupt="skip", corrupt=log)
        ld.set_epoch(epoch)
        order = ld.shard.indices
        batches = list(ld)
        assert len(batches) == len(ld) == 3 and all(x.shape[0] == 4 for x, _ in batches)
        got = [i for x, _ in batches for i in decode_indices(x)]
        # the colour of file k is index k; file 4 is read as file 5, every other file as itself
        assert got == [5 if i == 4 else i for i in order]
        labels = [int(v) for _, y in batches for v in y]
        assert labels == [ld.split.labels[5 if i == 4 else i] for i in order]
        ld.close()
    assert list(log.files) == [str(bad)] and log.samples >= 2  # DALI also counts reads it prefetched
    # a file only decoding finds (DALI: a pipeline failure) is remembered for the run's later loaders
    assert list(log.undecodable) == ([str(bad)] if kind == "dali" and damage is wreck_inside else [])
    named = [r.getMessage() for r in caplog.records if "corrupt image skipped" in r.getMessage()]
    assert len(named) == 1 and str(bad) in named[0] and files[5] in named[0]


@pytest.mark.parametrize("kind", KINDS)
def test_skip_in_validation_is_not_counted(kind, folder):
    bad = victim(folder, "val")
    wreck_inside(bad)
    ld = loader(kind, folder, "val", on_corrupt="skip", batch_size=3)
    labels = [int(v) for _, y in ld for v in y]
    assert len(labels) == 6 and labels.count(PAD_LABEL) == 1 and labels[2] == PAD_LABEL  # val file 2 is c1's first
    assert list(ld.corrupt.files) == [str(bad)]


@pytest.mark.parametrize("kind", KINDS)
def test_skip_with_nothing_readable_after_it_fails(kind, tmp_path):
    root = make_index_set(tmp_path / "d", n_train=6, n_val=3)
    for p in (root / "train").rglob("*.JPEG"):
        truncate(p)
    with pytest.raises(DataError, match="none of the 5 files after it could replace it"):
        list(loader(kind, root, "train", on_corrupt="skip"))


def test_bad_policy(folder):
    with pytest.raises(UserError, match=re.escape("data.on_corrupt: 'ignore' must be one of fail, skip")):
        loader("torchvision", folder, "train", on_corrupt="ignore")


class SlowHandler(logging.Handler):
    """A log write that takes a while (a shared file system's log file): it widens the window of a race."""

    def emit(self, record):
        time.sleep(0.05)


def test_reader_threads_noting_one_file_warn_once(caplog):
    """DALI's reader threads replace the same file at once (prefetched batches): one warning, every read counted."""
    log, start, slow = CorruptLog(), threading.Barrier(8), SlowHandler()

    def note():
        start.wait()
        for _ in range(5):
            log.note("a/bad.JPEG", "truncated", "a/next.JPEG")

    logging.getLogger("torus_train.data").addHandler(slow)
    try:
        with caplog.at_level(logging.WARNING, logger="torus_train.data"):
            threads = [threading.Thread(target=note) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        logging.getLogger("torus_train.data").removeHandler(slow)
    assert [r.getMessage().count("a/bad.JPEG") for r in caplog.records] == [1]
    assert log.files == {"a/bad.JPEG": 40} and log.samples == 40
