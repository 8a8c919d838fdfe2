"""The data sources' table (job/sources.py) and the loader contract (data/base.py: Loader): which entry a
data.source is, the contract kept by the built-in loaders, the docs' list, and docs/extending.md's worked
example run as written through train/build.py's build_loader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torus_train.data.base import MEAN, PAD_LABEL, STD, Loader
from torus_train.errors import UserError
from torus_train.job import sources
from torus_train.job.sources import SOURCES, SYNTHETIC_SAMPLES, choices_text, source_of
from torus_train.job.spec import load_spec

DOCS = Path(__file__).resolve().parents[1] / "docs"


def boot(rank: int, world: int):
    """What build_loader reads of a rank's Bootstrap."""
    info = SimpleNamespace(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
    return SimpleNamespace(info=info, device=torch.device("cpu"))


def test_source_of_names_and_paths(tmp_path):
    packed = tmp_path / "shards"
    packed.mkdir()
    (packed / "packed.json").write_text(json.dumps({"format": sources.PACKED_FORMAT, "splits": {}}))
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "packed.json").write_text(json.dumps({"format": "someone else's"}))
    assert source_of("synthetic").name == "synthetic" and source_of("demo").name == "demo"
    assert source_of(str(packed)).name == "packed"
    assert source_of(str(foreign)).name == "folder"
    assert source_of(str(tmp_path / "missing")).name == "folder"
    # a path source's name is not a value of data.source: "packed" is a folder called packed
    assert source_of("packed").name == "folder" and source_of("folder").name == "folder"
    assert choices_text() == "synthetic | demo | an ImageNet-layout folder | a packed set"
    # the spec's default (job/sections.py, below the table) is a source that takes no path
    from torus_train.job.sections import DEFAULT_SOURCE

    assert source_of(DEFAULT_SOURCE).name == DEFAULT_SOURCE and not SOURCES.get(DEFAULT_SOURCE).takes_path


def test_stage_and_missing_folder_are_asked_of_the_entry(tmp_path):
    spec = load_spec(None, [("data.source", "demo"), ("data.stage", "node")])
    with pytest.raises(UserError, match=r"data.stage = node needs a packed set .*data.source is demo"):
        source_of("demo").check(spec)
    source_of("synthetic").check(load_spec(None, [("data.source", "synthetic"), ("data.stage", "node")]))
    missing = load_spec(None, [("data.source", str(tmp_path / "nope"))])
    with pytest.raises(UserError, match="nope: no such folder"):
        source_of(missing.data.source).check(missing)


def test_synthetic_loader_keeps_the_contract_and_the_tables_default():
    spec = load_spec(
        None,
        [
            ("data.source", "synthetic"),
            ("data.image_size", 16),
            ("model.num_classes", 7),
            ("model.channels_last", False),
        ],
    )
    ld = SOURCES.get("synthetic").open_loader(_request(spec, "train", rank=1, world=4, batch=8))
    assert isinstance(ld, Loader) and ld.num_samples == SYNTHETIC_SAMPLES
    assert len(ld) == -(-SYNTHETIC_SAMPLES // 32)
    x, y = next(iter(ld))
    assert x.shape == (8, 3, 16, 16) and y.dtype == torch.int64 and int(y.max()) < 7


def test_folder_loader_through_build_loader(tmp_path):
    from datahelp import make_index_set

    root = make_index_set(tmp_path, n_train=12, n_val=6)
    spec = load_spec(
        None,
        [
            ("data.source", str(root)),
            ("data.loader", "torchvision"),
            ("data.image_size", 16),
            ("model.num_classes", 3),
            ("model.channels_last", False),
            ("data.num_threads", 1),
        ],
    )
    source_of(spec.data.source).prepare_data(spec)  # the launcher's step: the index built, its place set
    from torus_train.train.build import build_loader

    ld = build_loader(spec, boot(0, 1), "val", 4)
    try:
        assert isinstance(ld, Loader) and ld.kind == "torchvision" and ld.num_samples == 6
        assert sum(int((y >= 0).sum()) for _, y in ld) == 6
    finally:
        ld.close()


def test_docs_list_every_source():
    text = (DOCS / "data.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", text.split("## The data sources")[1].split("\n## ")[0], re.M)
    assert rows == [(s.name, s.help) for s in SOURCES]


def test_run_help_lists_the_sources():
    from click.testing import CliRunner

    from torus_train.cli import cli

    out = CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output
    assert f"{choices_text()} (data.source)." in " ".join(out.split())


def test_the_table_imports_no_torch():
    code = (
        "import sys, torus_train.job.sources, torus_train.job.spec, torus_train.ranks.preflight; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def _request(spec, split, rank, world, batch):
    from torus_train.data import loader_config
    from torus_train.data.base import LoaderRequest

    d = spec.data
    cfg = loader_config(
        split,
        rank,
        world,
        batch,
        d.image_size,
        spec.job.seed,
        spec.model.channels_last,
        1,
        "float32",
        d.on_corrupt,
        1,
        1,
        d.shuffle_buffer,
    )
    return LoaderRequest(cfg, torch.device("cpu"), None, d.loader, spec.model.num_classes, samples=d.synthetic_samples)


# ----------------------------------------------------------------------------------------------------------
# docs/extending.md, "Adding a data source", run as written
# ----------------------------------------------------------------------------------------------------------
def example_blocks() -> list[str]:
    section = (DOCS / "extending.md").read_text().split("## Adding a data source")[1].split("\n## ")[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture
def constant_source():
    """The example's loader module installed as torus_train.data.constant and its entry registered, as a
    contributor's two edits would; both removed afterwards."""
    loader_code, entry_code = example_blocks()
    module = types.ModuleType("torus_train.data.constant")
    sys.modules[module.__name__] = module
    exec(compile(loader_code, "docs/extending.md (torus_train/data/constant.py)", "exec"), module.__dict__)
    try:
        exec(compile(entry_code, "docs/extending.md (job/sources.py)", "exec"), dict(vars(sources)))
        yield SOURCES.get("constant")
    finally:
        SOURCES.remove("constant")
        del sys.modules[module.__name__]


def test_extending_example_constant_source(constant_source):
    from torus_train.job.work import work_text
    from torus_train.ranks.preflight import check_data_classes
    from torus_train.train.build import build_loader

    classes, world, batch, n = 5, 4, 4, 37
    spec = load_spec(
        None,
        [
            ("data.source", "constant"),
            ("data.image_size", 8),
            ("model.num_classes", classes),
            ("data.synthetic_samples", n),
            ("model.channels_last", False),
        ],
    )
    assert source_of("constant") is constant_source
    assert check_data_classes(spec) == ""  # no classes to check, no folder to prepare
    constant_source.prepare_data(spec)
    assert f"{n} per epoch from the constant source" in work_text(spec, spec.schedule.at(world))
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    for split in ("train", "val"):
        seen, pads = [], 0
        for rank in range(world):
            ld = build_loader(spec, boot(rank, world), split, batch)
            assert isinstance(ld, Loader) and len(ld) == 3  # ceil(37 / 16)
            ld.set_epoch(1)
            for x, y in ld:
                assert x.shape == (batch, 3, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
                grey = x * std + mean  # back to 0..1: one flat grey per image, its shade the class
                assert torch.allclose(grey, grey[:, :1, :1, :1].expand_as(grey), atol=1e-6)
                counted = y != PAD_LABEL
                assert torch.allclose(grey[counted, 0, 0, 0], (y[counted] + 0.5) / classes, atol=1e-6)
                seen += y[counted].tolist() if split == "val" else y.tolist()
            pads += ld.pad
            ld.close()
        if split == "val":  # every sample counted once over the ranks, padding labelled -1
            assert sorted(seen) == sorted(i % classes for i in range(n)) and pads == 3 * batch * world - n
        else:  # padding wraps real samples around: each class as often as the epoch's samples give it
            assert len(seen) == 3 * batch * world and set(seen) == set(range(classes))
