import pytest

from torus_train.job.topology import Grid, GridError, check_grid_size, choose_grid, parse_grid


def test_rank_position_round_trip_and_rings():
    g = Grid(4, 3)
    assert g.size == 12
    for r in range(12):
        row, col = g.position(r)
        assert g.rank_at(row, col) == r
    assert g.position(5) == (1, 1)
    assert g.row_ranks(1) == [4, 5, 6, 7]
    assert g.col_ranks(2) == [2, 6, 10]
    assert sorted(r for row in g.rows() for r in row) == list(range(12))
    assert sorted(r for col in g.cols() for r in col) == list(range(12))


def test_nodes_hold_rows():
    g = Grid(32, 68, gpus_per_node=4)
    assert g.nodes == 544
    assert g.row_nodes(0) == list(range(8))
    assert g.col_nodes(0) == list(range(0, 544, 8))
    assert g.rows_inside_nodes
    assert g.node_of(35) == 8 and g.local_rank(35) == 3
    assert not Grid(6, 2, gpus_per_node=4).rows_inside_nodes


def test_step_counts_from_the_paper():
    assert Grid(32, 68).torus_steps == 196
    assert Grid(32, 68).ring_steps == 4350


@pytest.mark.parametrize("text,xy", [("2x2", (2, 2)), ("32x68", (32, 68)), (" 3X4 ", (3, 4)), ("1x1", (1, 1))])
def test_parse_grid(text, xy):
    g = parse_grid(text)
    assert (g.x, g.y) == xy


@pytest.mark.parametrize("text", ["abc", "0x4", "4x0", "4", "2x2x2", "-2x2", ""])
def test_parse_grid_rejects(text):
    with pytest.raises(GridError):
        parse_grid(text)


def test_mismatch_prints_every_factor():
    with pytest.raises(GridError) as e:
        check_grid_size(parse_grid("32x68"), 2048)
    assert "grid 32x68 = 2176 ranks but --gpus is 2048" in str(e.value)


@pytest.mark.parametrize(
    "n,k,xy", [(4, 1, (2, 2)), (2176, 4, (64, 34)), (16, 4, (4, 4)), (7, 1, (7, 1)), (8, 8, (4, 2)), (1, 1, (1, 1))]
)
def test_choose_grid(n, k, xy):
    grid, why = choose_grid(n, k)
    assert (grid.x, grid.y) == xy
    assert grid.size == n
    aligned = lambda x: x % k == 0 or (n <= k and k % x == 0)  # noqa: E731
    assert aligned(grid.x)
    # no aligned factor pair has fewer steps
    best = min(2 * (x - 1) + 2 * (n // x - 1) for x in range(1, n + 1) if n % x == 0 and aligned(x))
    assert grid.torus_steps == best
    assert why
    if n == 2176:
        assert "192 sequential steps" in why and "4350" in why


def test_positions_outside_the_grid():
    with pytest.raises(GridError):
        Grid(2, 2).position(4)
    with pytest.raises(GridError):
        Grid(0, 2)
