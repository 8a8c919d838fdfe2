"""docs/run.md's field table lists the values each table allows, in the table's order: a registered algorithm,
launcher or data source shows up there or this test fails."""

from __future__ import annotations

import re
from pathlib import Path

from torus_train.job.algorithms import training_choices
from torus_train.job.launchers import choices as launcher_choices
from torus_train.job.sources import SOURCES

RUN_MD = (Path(__file__).resolve().parents[1] / "docs" / "run.md").read_text()


def listed(section: str, field: str) -> list[str]:
    row = next(line for line in RUN_MD.splitlines() if line.startswith(f"| `[{section}]` |"))
    return re.search(rf"{field} `([^`]+)`", row).group(1).split("|")


def test_comm_algo_values():
    assert listed("comm", "algo") == list(training_choices())


def test_launcher_values():
    assert listed("launch", "launcher") == list(launcher_choices())


def test_data_source_names():
    named = [s.name for s in SOURCES if not s.takes_path]
    assert listed("data", "source")[: len(named)] == named


def test_data_decoder_values_and_docs_data_table():
    from torus_train.job.sources import DECODERS

    assert listed("data", "decoder") == list(DECODERS.names())
    data_md = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", data_md, flags=re.M)
    assert [(n, h) for n, h in rows if n in DECODERS] == [(d.name, d.help) for d in DECODERS]
