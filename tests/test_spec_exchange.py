"""Spec checks of the gradient exchange: fp16 on the wire only with fp16 training (its loss scaler), and the
synchronous torus hook as a comm.algo for comparisons."""

from __future__ import annotations

import re

import pytest

from torus_train.job.spec import SpecError, load_spec, parse_override


def spec(*overrides: str):
    return load_spec(None, [parse_override(o) for o in overrides])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fp16_exchange_without_a_loss_scaler_is_refused(precision):
    with pytest.raises(SpecError) as e:
        spec("comm.compression=fp16", f"model.precision={precision}")
    msg = str(e.value)
    assert "\n" not in msg and "comm.compression" in msg and "model.precision" in msg and precision in msg


@pytest.mark.parametrize(
    "precision, compression", [("fp16", "fp16"), ("bf16", "bf16"), ("fp32", "bf16"), ("fp32", "none")]
)
def test_exchange_with_a_loss_scaler_or_without_fp16_is_accepted(precision, compression):
    s = spec(f"comm.compression={compression}", f"model.precision={precision}")
    assert (s.model.precision, s.comm.compression) == (precision, compression)


def test_torus_sync_is_an_algo():
    assert spec("comm.algo=torus-sync").comm.algo == "torus-sync"
    with pytest.raises(SpecError, match=re.escape("comm.algo")):
        spec("comm.algo=flat-sync")
