"""On a 1x1 grid the NCCL path of the hook (exchange_cuda) still runs its three phases over groups of one rank,
so that a one-GPU acceptance run exercises the side stream, buffers and Future of the full job. Shown here on
one gloo rank with singleton groups asked for (NCCL gets them by default): each phase is called once, over a
group of one, and the bucket ends as its own mean (the world is one rank)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from torus_train.comm import hooks  # noqa: E402
from torus_train.comm.groups import build_grid_groups  # noqa: E402
from torus_train.job.topology import parse_grid  # noqa: E402


@pytest.fixture()
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


PHASES = [hooks.collectives.REDUCE_SCATTER, "all_reduce", hooks.collectives.ALL_GATHER]
"""torch.distributed's names of the three phases' collectives here (comm/collectives.py picks the row ones')."""


@pytest.mark.parametrize("singletons, phases", [(True, PHASES), (False, [])])
def test_three_phases_on_a_1x1_grid(one_rank, monkeypatch, singletons, phases):
    groups = build_grid_groups(parse_grid("1x1"), use_shm=False, singletons=singletons)
    assert (groups.row_group is not None, groups.col_group is not None) == (singletons, singletons)
    called = []
    for name in PHASES:
        real = getattr(dist, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            called.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(dist, name, spy)
    state = hooks.TorusHookState(groups, algo="torus", compression="bf16")
    bucket = torch.arange(7, dtype=torch.float32) / 4  # 7 values: bf16 holds them exactly
    got = hooks.exchange_cuda(state, bucket.clone())
    assert called == phases
    assert torch.equal(got, bucket) and state.buckets_reduced == 1
    state.close()
    groups.close()
