"""The straggler report's parts on one process: what StepTimes counts as a rank's own compute, how the slowest
ranks are picked against the median rank, and the slow:R:SECONDS fault."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from torus_train.errors import UserError
from torus_train.train.faults import parse
from torus_train.train.report import rank_lines, stragglers
from torus_train.train.timing import StepTimes


def test_compute_ends_at_the_last_gradient_not_after_the_exchange_wait():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    times = StepTimes(model, torch.device("cpu"))
    for _ in range(3):
        times.start(0.05)
        loss = model(torch.randn(4, 8)).sum()
        time.sleep(0.2)  # slow work of this rank, before backward: counted
        loss.backward()
        time.sleep(0.3)  # waiting in the exchange for another rank: not counted
        times.stop()
    assert len(times._handles) == 1  # after the first step, only the hook of the last gradient
    d50, _d90, dmax, c50, _c90, cmax, w50, _w90, _wmax = times.percentiles()
    assert d50 == dmax == pytest.approx(0.05)
    assert 0.2 <= c50 <= cmax < 0.45
    assert w50 == pytest.approx(d50 + c50, abs=0.02)
    times.close()
    model(torch.randn(4, 8)).sum().backward()  # hooks removed: nothing recorded
    assert len(times.compute) == 3


def row(rank, work, compute=None, host="node1"):
    compute = work if compute is None else compute
    return {"rank": rank, "host": host, "work_p50": work, "compute_p50": compute, "data_p50": work - compute}


def test_slowest_against_the_median_rank():
    rows = [row(0, 0.40), row(1, 0.41), row(2, 0.42), row(3, 0.84, 0.80, host="node2")]
    st = stragglers(rows)
    assert st["median_work_p50"] == 0.41  # the lower median: a rank's own figure
    assert [r["rank"] for r in st["slowest"]] == [3, 2, 1, 0]
    assert st["slowest"][0]["vs_median"] == pytest.approx(0.84 / 0.41, abs=1e-3)
    lines = rank_lines({"stragglers": st, "corrupt_skipped": {"files": 0, "reads": 0}})
    assert lines == [
        "straggler: rank 3 on node2, own work p50 0.840 s (compute 0.800, data 0.040) against 0.410 s median (2.0x)"
    ]


def test_no_line_under_the_ratio():
    st = stragglers([row(r, 0.4 + 0.01 * r) for r in range(8)])
    assert rank_lines({"stragglers": st}) == []


def test_slow_fault():
    f = parse("slow:1:0.5")
    assert (f.kind.name, f.rank, f.at, f.targets(1), f.targets(0)) == ("slow", 1, 0.5, True, False)


@pytest.mark.parametrize("fault", ["slow:1:x", "slow:1:-2", "slow:1:inf", "slow:1:4000", "slow:1"])
def test_slow_fault_refused(fault):
    with pytest.raises(UserError, match="TORUS_TRAIN_FAULT="):
        parse(fault)
