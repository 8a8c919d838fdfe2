"""docs/extending.md's worked example of an all-reduce algorithm, run as written: taken from the doc,
registered inside the ranks, run over gloo on 2x2 with every other algorithm and checked exact against a plain
sum (tests/dist/transport_worker.py), and seen by the spec and the bench's choices through the table alone."""

import re
from pathlib import Path

import pytest

from torus_train.bench.allreduce import BenchConfig
from torus_train.job.algorithms import ALGORITHMS, runnable
from torus_train.job.spec import load_spec

from .test_transports import expected, run_torch_transports

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
NAME = "row-then-column"


def example_code() -> str:
    """The first python block of the section "Adding an all-reduce algorithm"."""
    text = DOC.read_text()
    section = text[text.index("## Adding an all-reduce algorithm") :]
    section = section[: section.index("\n## ", 3)]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def example(tmp_path):
    path = tmp_path / "example_algorithm.py"
    path.write_text(example_code())
    return path


def test_the_table_alone_makes_the_example_a_choice(example):
    namespace = {}
    exec(compile(example.read_text(), str(example), "exec"), namespace)
    try:
        assert NAME in runnable()
        assert load_spec(None, [("comm.algo", NAME)]).comm.algo == NAME
        assert BenchConfig(algos=[NAME]).algos == [NAME]
    finally:
        ALGORITHMS.remove(NAME)
    assert NAME not in runnable()


@pytest.mark.timeout(240)
def test_the_example_runs_exact_over_gloo(example, tmp_path):
    counts = run_torch_transports("2x2", tmp_path, register=str(example), transports="gloo")
    assert counts == [expected("2x2", ["gloo"], [*runnable(), NAME])] * 4
