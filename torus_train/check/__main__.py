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
    found = load(ACCEPTANCE.get(name).ref)(Shrunk(out, "--rehearse" in flags, "--quick" in flags))
    (out / "parts" / f"{name}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
