"""``python -m torus_train.check PART OUT [--rehearse] [--quick]``: one acceptance part (acceptance.py) in a
process of its own, as acceptance.run_part starts it under the part's limit; its checks go to
OUT/parts/PART.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torus_train.check.acceptance import ACCEPTANCE
from torus_train.check.shrunk import Shrunk
from torus_train.registry import load


def main(argv: list[str]) -> None:
    name, out, flags = argv[0], Path(argv[1]), set(argv[2:])
    if "--rehearse" in flags:
        import torus_train.train.build as build

        # a rehearsal's part plays a GPU's, where CUDA has started (the world of one) before any step runs: a
        # part that turns determinism on without cuBLAS's workspace in its environment is refused here too
        build.cuda_started = lambda: True
    found = load(ACCEPTANCE.get(name).ref)(Shrunk(out, "--rehearse" in flags, "--quick" in flags))
    (out / "parts" / f"{name}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
