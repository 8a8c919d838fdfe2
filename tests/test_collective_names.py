"""torus_train calls no torch.distributed function that this torch has deprecated.

Two checks, because a deprecation warning can be missed two ways:
- by reading: every ``dist.NAME`` (and ``torch.distributed.NAME``) that the package and scripts/ spell is looked
  up in the installed torch; none may carry ``__deprecated__`` (what torch's ``@deprecated`` sets, kept by the
  logging wrapper around the collectives). Also catches code no test runs (the CUDA-only paths);
- by running: the torus's NCCL exchange (exchange_torus_nccl, what a GPU job runs) and the row group's
  reduce-scatter and all-gather (GroupRow) run on torch's fake backend with every warning an error.
pyproject's filterwarnings makes the rest of the suite fail on such a warning too (the reason it names
torch.distributed.c10d_logger is there).
"""

from __future__ import annotations

import ast
import warnings
from contextlib import nullcontext
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from torus_train.comm import collectives  # noqa: E402
from torus_train.comm.groups import build_grid_groups  # noqa: E402
from torus_train.comm.hooks import TorusHookState, exchange_cuda  # noqa: E402
from torus_train.job.topology import parse_grid  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _distributed_names(tree: ast.AST) -> set[str]:
    """NAME of every ``alias.NAME`` where alias is bound to torch.distributed, and of ``torch.distributed.NAME``."""
    aliases = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "torch.distributed" and a.asname
    }
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if (isinstance(base, ast.Name) and base.id in aliases) or ast.unparse(base) == "torch.distributed":
            names.add(node.attr)
    return names


def deprecated_uses(paths) -> list[str]:
    """'file: name (torch's message)' for each deprecated torch.distributed function the files use."""
    found = []
    for path in paths:
        for name in sorted(_distributed_names(ast.parse(path.read_text(), str(path)))):
            message = getattr(getattr(dist, name, None), "__deprecated__", None)
            if message:
                found.append(f"{path.name if ROOT not in path.parents else path.relative_to(ROOT)}: {name} ({message})")
    return found


def test_the_package_and_scripts_spell_no_deprecated_collective():
    files = [*sorted((ROOT / "torus_train").rglob("*.py")), *sorted((ROOT / "scripts").rglob("*.py"))]
    assert deprecated_uses(files) == []
    for name in (collectives.REDUCE_SCATTER, collectives.ALL_GATHER):
        assert not getattr(getattr(dist, name), "__deprecated__", None), name


def test_the_reading_check_sees_an_old_name(tmp_path):
    """The check above is live: on a torch that deprecates the old names, a file that calls one is named."""
    if not getattr(dist.reduce_scatter_tensor, "__deprecated__", None):
        pytest.skip("this torch does not deprecate reduce_scatter_tensor")
    (tmp_path / "old.py").write_text("import torch.distributed as d\nd.reduce_scatter_tensor(a, b)\n")
    found = deprecated_uses([tmp_path / "old.py"])
    assert len(found) == 1 and "reduce_scatter_tensor" in found[0]


@pytest.fixture()
def fake_world():
    """Rank 1 of a world of 4 on torch's fake backend (collectives return at once, values unspecified)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("compression", [None, "bf16"])
def test_the_torus_exchanges_raise_no_warning(fake_world, compression):
    groups = build_grid_groups(parse_grid("2x2"), use_shm=False, method="per-group")
    state = TorusHookState(groups, algo="torus", compression=compression)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exchange_cuda(state, torch.ones(7))  # the NCCL path's three collectives, on CPU tensors
        flat, bounds = torch.ones(7), [(0, 4), (4, 7)]
        groups.rows.reduce_scatter(flat, bounds)
        groups.rows.all_gather(flat, bounds)
        with (
            pytest.raises(FutureWarning)
            if getattr(dist.all_gather_into_tensor, "__deprecated__", None)
            else nullcontext()
        ):
            dist.all_gather_into_tensor(torch.empty(4), torch.empty(2), group=groups.row_group)  # the filter is live
    assert state.buckets_reduced == 1
