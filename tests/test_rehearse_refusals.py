"""`plan rehearse` refuses bad input in one line before any rank starts (issue 50): the --keep folder it was
given stays empty, and no refusal takes more than a few seconds (a rank takes 10 s or more)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clihelp import assert_one_line_error, invoke

SPEC = str(Path(__file__).resolve().parents[1] / "scripts/specs/cpu_smoke.toml")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks", "\u00b2"], "--ranks: '\u00b2' is not a whole number; give an integer from 0 to 3"),
        (["--ranks", "9" * 5000], "--ranks: '99999999999999999999'...(5000 characters) is not a whole number"),
        (["--ranks", "4"], "--ranks: 4 is out of range; give an integer from 0 to 3"),
        (["--ranks", ","], "--ranks ',': names no rank"),
        (["--gpu-memory-gib", "nan"], "--gpu-memory-gib: nan is not a finite number; give a number from 1 to 65536"),
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib: inf is not a finite number"),
        (["--gpu-memory-gib", "0.5"], "--gpu-memory-gib: 0.5 is out of range"),
        (["--set", "grid.gpus=3", "--set", "grid.grid=2x1"], "grid 2x1 = 2 ranks but grid.gpus is 3"),
        (["--set", "model.arch=vit_b_16"], "--image-size: vit_b_16 takes only 224 px images, not 32"),
        (["--set", "model.arch=alexnet"], "--image-size: alexnet needs images of at least 64 px, not 32"),
        (
            ["--set", "model.arch=inception_v3", "--image-size", "40"],
            "--image-size: inception_v3 needs images of at least",
        ),
        (["--json", "{keep}/x.json"], "--json {keep}/x.json: is inside --keep {keep}, which the rehearsal fills"),
    ],
)
def test_refused_in_one_line_before_any_rank_starts(tmp_path, args, message):
    keep = tmp_path / "keep"
    keep.mkdir()
    args = [a.replace("{keep}", str(keep)) for a in args]
    code, _, err = invoke("plan", "rehearse", "--spec", SPEC, "--keep", str(keep), *args)
    assert_one_line_error(code, err, message.replace("{keep}", str(keep)))
    assert list(keep.iterdir()) == []  # nothing rehearsed
