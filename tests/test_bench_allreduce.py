"""The pure parts of bench allreduce: sizes, bandwidths, the reference and the table."""

import json

import pytest
import torch

from torus_train.bench import allreduce as B
from torus_train.bench import sweep as S
from torus_train.errors import UserError


def test_parse_size_suffixes_are_powers_of_1024():
    assert B.parse_size("1K", "-b") == 1024
    assert B.parse_size("64M", "-e") == 64 << 20
    assert B.parse_size("4096", "-b") == 4096
    assert B.parse_size("1G", "-e") == 1 << 30
    with pytest.raises(UserError):
        B.parse_size("lots", "-b")


def test_sizes_sweep_and_element_rounding():
    cfg = B.BenchConfig(min_bytes=1024, max_bytes=8192, factor=2)
    assert cfg.sizes() == [1024, 2048, 4096, 8192]
    cfg = B.BenchConfig(min_bytes=3, max_bytes=3, factor=2, dtype="float32")
    assert cfg.sizes() == [4]


@pytest.mark.parametrize(
    "kwargs",
    [dict(min_bytes=2048, max_bytes=1024), dict(factor=1), dict(dtype="int8"), dict(algos=["ring"]), dict(algos=[])],
)
def test_bad_config_is_a_user_error(kwargs):
    with pytest.raises(UserError):
        B.BenchConfig(**kwargs)


def test_busbw_follows_nccl_tests():
    row = B.make_row("flat", "gloo", "2x2", 4, 1_000_000, "float32", 0.001, 0)
    assert row.algbw_gbps == pytest.approx(1.0)
    assert row.busbw_gbps == pytest.approx(1.5)  # 2(n-1)/n at n = 4
    assert row.count == 250_000


def test_count_wrong_catches_a_wrong_sum():
    world = 4
    good = sum(S.pattern(r, 1000, torch.float32).double() for r in range(world)).float()
    assert S.count_wrong(good, world, "float32") == 0
    bad = good.clone()
    bad[10] += 0.01
    bad[500] = 0
    assert S.count_wrong(bad, world, "float32") == 2
    # a sum missing one rank's contribution is wrong almost everywhere
    partial = sum(S.pattern(r, 1000, torch.float32).double() for r in range(world - 1)).float()
    assert S.count_wrong(partial, world, "float32") > 900


def test_patterns_differ_per_rank_and_fit_half_types():
    a = S.pattern(0, 64, torch.bfloat16)
    b = S.pattern(1, 64, torch.bfloat16)
    assert not torch.equal(a, b)
    assert a.abs().max() <= 0.5


def test_table_json_and_ratio(tmp_path):
    rows = [
        B.make_row(a, "gloo", "2x2", 4, s, "float32", t, 0)
        for s in (1024, 2048)
        for a, t in (("flat", 2e-3), ("torus", 1e-3))
    ]
    text = B.table(rows, "torus")
    assert "# Out of bounds values : 0 OK" in text and "# Avg bus bandwidth" in text
    assert "#wrong" in text and "busbw" in text
    ratios = B.ratio_table(rows)
    assert "2.00" in ratios
    path = tmp_path / "b.json"
    B.write_json(rows, str(path))
    data = json.loads(path.read_text())
    assert set(data[0]) == {
        "algo",
        "backend",
        "grid",
        "size_bytes",
        "count",
        "dtype",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
    }
    assert len(data) == 4


# --- where the ranks run: never two NCCL ranks on one GPU ----------------------------------------------------
@pytest.mark.parametrize(
    "gpus, world, grid, backend, why",
    [
        (0, 4, "2x2", "gloo", "CPU ranks: no GPU here"),
        (1, 4, "2x2", "gloo", "CPU ranks: one GPU here, and NCCL runs one rank per GPU"),
        (2, 2, "2x1", "nccl", "one rank per GPU (2 GPUs here)"),
        (8, 8, "4x2", "nccl", "one rank per GPU (8 GPUs here)"),
    ],
)
def test_the_default_ranks_follow_the_gpus_here(gpus, world, grid, backend, why):
    from torus_train.bench.allreduce import bench_ranks

    r = bench_ranks(None, None, None, gpus)
    assert (r.world, str(r.grid), r.backend) == (world, grid, backend)
    assert r.backend_why.startswith(why)


def test_more_ranks_than_gpus_fall_back_to_gloo_unless_nccl_is_asked():
    from torus_train.bench.allreduce import bench_ranks
    from torus_train.job.topology import Grid

    r = bench_ranks(8, None, None, 4)
    assert (r.world, r.backend) == (8, "gloo") and "--nprocs 4 to measure NCCL" in r.backend_why
    assert bench_ranks(2, None, None, 4).backend == "nccl"
    assert bench_ranks(None, None, "nccl", 1).world == 1  # nccl asked on one GPU: one rank, not four
    for nprocs, grid, gpus in ((2, None, 1), (None, Grid(2, 2), 1), (8, None, 4)):
        with pytest.raises(
            UserError,
            match=f"--backend nccl: {nprocs or 4} ranks but {gpus} GPU.s. here, and "
            "NCCL runs one rank per GPU; run CPU ranks with --backend gloo",
        ):
            bench_ranks(nprocs, grid, "nccl", gpus)
    with pytest.raises(UserError, match="--backend nccl needs CUDA GPUs; CUDA shows none here"):
        bench_ranks(None, None, "nccl", 0)
    assert bench_ranks(None, None, "gloo", 4).world == 4  # gloo asked: CPU ranks, the default 4


def test_ranks_started_by_a_launcher_keep_its_world_and_placement():
    from torus_train.bench.allreduce import bench_ranks

    # srun --gpus-per-task=1 shows each rank one GPU: its world (and NCCL) stand, nothing is refused
    r = bench_ranks(None, None, None, 1, launched_world=16)
    assert (r.world, str(r.grid), r.backend) == (16, "4x4", "nccl")
    assert bench_ranks(None, None, "nccl", 1, launched_world=16).backend == "nccl"
    assert bench_ranks(None, None, None, 0, launched_world=4).backend == "gloo"
