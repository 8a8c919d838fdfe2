"""Where the two-lane torus exchange runs (comm/pipeline.py: torus_lanes): the lanes for CPU buckets by default,
the serial exchange on NCCL unless asked, TORUS_TRAIN_PIPELINE's three values, and a request that cannot be met
refused with the reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from torus_train.comm import pipeline
from torus_train.comm.hooks import TorusHookState
from torus_train.job.topology import parse_grid


def state(grid="2x2", algo="torus", asynchronous=True, pipelined=None) -> TorusHookState:
    groups = SimpleNamespace(grid=parse_grid(grid), row_group=object(), col_group=object(), backend="gloo")
    return TorusHookState(groups, algo=algo, asynchronous=asynchronous, pipelined=pipelined)


def kind(s: TorusHookState, nccl=False, cuda=False) -> str | None:
    lanes = pipeline.torus_lanes(s, nccl, cuda)
    if lanes is not None:
        lanes.close()
    return type(lanes).__name__ if lanes is not None else None


def test_by_default_cpu_buckets_take_the_lanes_and_nccl_does_not(monkeypatch):
    monkeypatch.delenv(pipeline.PIPELINE_ENV, raising=False)
    monkeypatch.setattr(pipeline, "nccl_orders_launches", lambda: True)
    assert kind(state()) == "ThreadLanes" and kind(state("3x2")) == "ThreadLanes"
    assert kind(state(), nccl=True, cuda=True) is None
    assert kind(state(pipelined=True), nccl=True, cuda=True) == "StreamLanes"
    assert kind(state(pipelined=True), nccl=True, cuda=False) == "StreamLanes"  # a rehearsal's CPU buckets: inline
    assert kind(state(), cuda=True) is None  # CUDA buckets on gloo go through host memory
    assert kind(None) is None


@pytest.mark.parametrize(
    "grid, algo, asynchronous, why",
    [
        ("1x4", "torus", True, "no row phase or no column phase"),
        ("4x1", "torus", True, "no row phase or no column phase"),
        ("2x2", "flat", True, "flat is not the torus"),
        ("2x2", "torus", False, "synchronous"),
    ],
)
def test_where_there_is_nothing_to_overlap_auto_is_serial_and_a_request_is_refused(grid, algo, asynchronous, why):
    assert kind(state(grid, algo, asynchronous)) is None
    with pytest.raises(ValueError, match=why):
        kind(state(grid, algo, asynchronous, pipelined=True))


def test_nccl_lanes_need_nccls_launch_order(monkeypatch):
    monkeypatch.setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "0")
    assert pipeline.nccl_orders_launches() is False  # whatever NCCL this torch has
    with pytest.raises(ValueError, match=r"from 2\.26 with NCCL_LAUNCH_ORDER_IMPLICIT=1"):
        kind(state(pipelined=True), nccl=True, cuda=True)


def test_the_variable_decides_when_the_state_does_not(monkeypatch):
    for value, want in (("0", None), ("1", "ThreadLanes"), ("auto", "ThreadLanes"), ("", "ThreadLanes")):
        monkeypatch.setenv(pipeline.PIPELINE_ENV, value)
        assert kind(state()) == want, value
    monkeypatch.setenv(pipeline.PIPELINE_ENV, "1")
    assert kind(state(pipelined=False)) is None  # the state's own setting wins
    with pytest.raises(ValueError, match="not the torus"):
        kind(state(algo="hierarchical"))
    monkeypatch.setenv(pipeline.PIPELINE_ENV, "yes")
    with pytest.raises(ValueError, match="TORUS_TRAIN_PIPELINE='yes': use 0, 1 or auto"):
        kind(state())
