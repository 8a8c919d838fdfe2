import itertools

import pytest

from torus_train.comm.chunks import chunk_bounds, chunk_sizes


@pytest.mark.parametrize("n", [0, 1, 2, 7, 97, 1009, 4096])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 32])
def test_chunks_cover_exactly_and_differ_by_at_most_one(n, parts):
    sizes = chunk_sizes(n, parts)
    assert len(sizes) == parts and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    bounds = chunk_bounds(n, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b[1] == c[0] for b, c in itertools.pairwise(bounds))


def test_bad_arguments():
    with pytest.raises(ValueError):
        chunk_sizes(4, 0)
    with pytest.raises(ValueError):
        chunk_sizes(-1, 2)
