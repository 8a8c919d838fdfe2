"""The GPU grid: ranks laid out as Y rows of X ranks (pure; no torch import).

``--grid XxY`` means X ranks per horizontal ring (a row) and Y ranks per vertical ring (a column), so
N = X * Y. Rank r sits at row r // X and column r % X. With K GPUs per node the ranks of one node are
consecutive, so they fall into one row: the horizontal rings run inside nodes first, and only the
vertical rings cross the network (Mikami et al. 2018, section 3.2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from torus_train.errors import UserError

_GRID_RE = re.compile(r"^\s*(\d{1,12})\s*[xX\*]\s*(\d{1,12})\s*$")

MAX_WORLD = 1_000_000
"""The largest world size (ranks) accepted anywhere: a larger --gpus or --grid is refused at once, before any
per-rank work (environments, rings, rank tables) is done."""


class GridError(UserError):
    """A grid that cannot be built from what the user gave; the message says what to change."""


@dataclass(frozen=True)
class Grid:
    """A 2D grid of ranks: X ranks in each row (horizontal ring), Y ranks in each column (vertical ring)."""

    x: int
    """Ranks per row, i.e. the length of each horizontal ring."""
    y: int
    """Ranks per column, i.e. the length of each vertical ring."""
    gpus_per_node: int = 1
    """Ranks placed on one node; consecutive ranks share a node, so a node's ranks sit in one row."""

    def __post_init__(self) -> None:
        for name, value in (("x", self.x), ("y", self.y), ("gpus_per_node", self.gpus_per_node)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GridError(f"grid.{name} must be a positive integer, got {value!r}")
        check_world_size(self.x * self.y, f"grid {self.x}x{self.y}")

    # --- sizes -------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """World size N = X * Y."""
        return self.x * self.y

    @property
    def nodes(self) -> int:
        """Number of nodes needed at gpus_per_node ranks each."""
        return math.ceil(self.size / self.gpus_per_node)

    def __str__(self) -> str:
        return f"{self.x}x{self.y}"

    # --- rank <-> position -------------------------------------------------------------------
    def position(self, rank: int) -> tuple[int, int]:
        """(row, column) of a rank."""
        self._check_rank(rank)
        return divmod(rank, self.x)

    def rank_at(self, row: int, col: int) -> int:
        """Rank at (row, column)."""
        if not (0 <= row < self.y and 0 <= col < self.x):
            raise GridError(f"position ({row}, {col}) is outside grid {self} ({self.y} rows x {self.x} columns)")
        return row * self.x + col

    def node_of(self, rank: int) -> int:
        """Node index of a rank (consecutive ranks fill a node)."""
        self._check_rank(rank)
        return rank // self.gpus_per_node

    def local_rank(self, rank: int) -> int:
        """Index of a rank within its node."""
        self._check_rank(rank)
        return rank % self.gpus_per_node

    # --- rings --------------------------------------------------------------------------------
    def row_ranks(self, row: int) -> list[int]:
        """Ranks of one horizontal ring, in ring order."""
        return [self.rank_at(row, c) for c in range(self.x)]

    def col_ranks(self, col: int) -> list[int]:
        """Ranks of one vertical ring, in ring order."""
        return [self.rank_at(r, col) for r in range(self.y)]

    def rows(self) -> list[list[int]]:
        return [self.row_ranks(r) for r in range(self.y)]

    def cols(self) -> list[list[int]]:
        return [self.col_ranks(c) for c in range(self.x)]

    def row_nodes(self, row: int) -> list[int]:
        """Nodes that one row spans (one node when the row fits in a node)."""
        return sorted({self.node_of(r) for r in self.row_ranks(row)})

    def col_nodes(self, col: int) -> list[int]:
        """Nodes that one column spans."""
        return sorted({self.node_of(r) for r in self.col_ranks(col)})

    @property
    def rows_inside_nodes(self) -> bool:
        """True when no node holds ranks of two rows partially, i.e. node and row boundaries line up."""
        k = self.gpus_per_node
        return self.x % k == 0 or k % self.x == 0

    # --- step counts (paper section 3.2) --------------------------------------------------------
    @property
    def torus_steps(self) -> int:
        """Sequential communication steps of the 2D torus: 2(X-1) + 2(Y-1)."""
        return 2 * (self.x - 1) + 2 * (self.y - 1)

    @property
    def ring_steps(self) -> int:
        """Sequential communication steps of one flat ring over all N ranks: 2(N-1)."""
        return 2 * (self.size - 1)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise GridError(f"rank {rank} is outside grid {self} of {self.size} ranks")


def parse_grid(text: str, gpus_per_node: int = 1) -> Grid:
    """Parse ``XxY`` (e.g. ``32x68``) into a Grid; raise GridError with the accepted form otherwise."""
    m = _GRID_RE.match(str(text))
    if not m:
        shown = repr(text) if len(str(text)) <= 40 else f"{str(text)[:30]!r}... ({len(str(text))} characters)"
        if re.match(r"^\s*\d+\s*[xX\*]\s*\d+\s*$", str(text)):
            raise GridError(f"grid {shown}: a side has more than 12 digits; at most {MAX_WORLD:,} ranks in all")
        raise GridError(f"grid {shown} is not of the form XxY with positive integers, e.g. 2x2 or 32x68")
    x, y = int(m.group(1)), int(m.group(2))
    if x < 1 or y < 1:
        raise GridError(f"grid {text!r} has a zero side; X and Y must both be at least 1, e.g. 2x2")
    return Grid(x, y, gpus_per_node)


def check_world_size(n: int, what: str = "--gpus") -> None:
    """Raise GridError when n ranks exceed MAX_WORLD (checked before anything per-rank is built)."""
    if n > MAX_WORLD:
        raise GridError(f"{what}: {n:,} ranks is more than this launcher plans for (at most {MAX_WORLD:,})")


def check_grid_size(grid: Grid, n: int, what: str = "--gpus") -> None:
    """Raise GridError printing every factor when X * Y is not the requested world size."""
    if grid.size != n:
        raise GridError(
            f"grid {grid.x}x{grid.y} = {grid.size} ranks but {what} is {n}; "
            f"choose X and Y with X*Y = {n} or leave --grid out to have one chosen"
        )


def factor_pairs(n: int) -> list[tuple[int, int]]:
    """All (X, Y) with X * Y = n, X ascending; O(sqrt n) trial divisions, n at most MAX_WORLD."""
    check_world_size(n, "the world size")
    small = [x for x in range(1, math.isqrt(n) + 1) if n % x == 0]
    xs = small + [n // x for x in reversed(small) if x * x != n]
    return [(x, n // x) for x in xs]


def choose_grid(n: int, gpus_per_node: int = 1) -> tuple[Grid, str]:
    """Pick a grid for n ranks and say why.

    Rule: rows must line up with nodes (X a multiple of the GPUs per node, or a divisor of it when a node is
    larger than the whole job); among those, the fewest sequential torus steps 2(X-1) + 2(Y-1); on a tie the
    wider row, because the vertical (inter-node) rings then carry 1/X of the data.
    """
    if not isinstance(n, int) or n < 1:
        raise GridError(f"--gpus must be a positive integer, got {n!r}")
    check_world_size(n)
    k = gpus_per_node
    pairs = factor_pairs(n)
    aligned = [(x, y) for x, y in pairs if x % k == 0 or (n <= k and k % x == 0)]
    pool = aligned or pairs
    x, y = min(pool, key=lambda p: (2 * (p[0] - 1) + 2 * (p[1] - 1), -p[0]))
    grid = Grid(x, y, k)
    if n == 1:
        return grid, "one rank: a 1x1 grid"
    why = (
        f"{x}x{y}: {grid.torus_steps} sequential steps (2({x}-1) + 2({y}-1)) against {grid.ring_steps} for a flat ring"
    )
    if aligned and k > 1:
        why += f"; rows of {x} fill whole nodes of {k} GPUs, so horizontal rings stay inside nodes"
    elif k > 1:
        why += f"; no factor pair of {n} lines rows up with nodes of {k} GPUs"
    if x == 1 or y == 1:
        why += f" ({n} is prime or has no better split: the torus degenerates to one ring)"
    return grid, why
