"""Row and column process groups of the grid, on torch.distributed (gloo on CPU, NCCL on GPU).

Every rank must call build_grid_groups() after dist.init_process_group(), in the same order relative to its
other collectives: it creates every row group and every column group of the grid (torch requires all ranks to
take part in creating each group), then finds out whether each row lies inside one host, in which case a
gloo job exchanges the rows through shared memory (see torus_train.comm.shm).

How the groups are made (``method``):
- ``split``: two ``dist.split_group`` calls, one for all rows and one for all columns. Needs a backend that can
  split its communicator and a device bound at init (NCCL with ``device_id``, as bootstrap does): 2 collective
  communicator splits in all, where one group at a time costs 100 at 32x68 (with a bound device, torch makes
  every ``new_group`` an NCCL split in which every rank of the world takes part, member or not).
- ``enumerate``: two ``dist.new_subgroups_by_enumeration`` calls. In torch 2.14 this is one ``new_group`` per
  group inside torch, so gloo (which connects only the members of each group) costs the same as one at a time.
- ``per-group``: one ``dist.new_group`` per row and per column, the fallback for a torch without the others.
``auto`` takes the first that the backend allows; every rank decides alike (same torch, backend and device
binding), which matters because the group calls are collective.

Why not torch's DeviceMesh (``init_device_mesh(device, (Y, X), mesh_dim_names=...)``, weighed in issue 45):
it makes the same groups the same way (torch's ``DeviceMesh._init_one_process_group``: one ``split_group``
per dimension with a bound device, else one ``new_group`` per group; 2 or 100 at 32x68, as here), so it saves
no communicator, and it lacks what this module does: the job's timeout on each group (torch 2.8's
``init_device_mesh`` takes none; 2.11 and 2.14 only inside the backend's own Options class through
``backend_override``), a row group of its own on a one-row grid (2.11 and 2.14 hand back the world's group
for a dimension that spans the world, so the exchange would share the world's communicator), and groups
along one dimension only (the nodes' groups at resume, partition_groups). docs/extending.md has the figures.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from torus_train.comm import collectives
from torus_train.comm.shm import DEFAULT_CAPACITY, SETS, ShmRow
from torus_train.comm.shm_size import piece_bytes
from torus_train.comm.transport import RowExchange
from torus_train.errors import UserError
from torus_train.job.topology import Grid


@dataclass
class GridGroups:
    """This rank's view of the grid: its position and the groups of its row and column."""

    grid: Grid
    """The grid of the job."""
    rank: int
    """Global rank."""
    row: int
    """Row index (which horizontal ring)."""
    col: int
    """Column index (which vertical ring); column 0 holds the row leaders."""
    backend: str
    """The torch.distributed backend ('gloo', 'nccl', ...)."""
    row_group: dist.ProcessGroup | None = None
    """Process group of this rank's row (X ranks)."""
    col_group: dist.ProcessGroup | None = None
    """Process group of this rank's column (Y ranks)."""
    rows: RowExchange | None = None
    """How this rank's row exchanges (torus_train.comm.transport.RowExchange): its process group (GroupRow), or
    shared memory (ShmRow) when the row lies inside one host and the backend is gloo."""
    row_leader: int = 0
    """Global rank of this row's leader (its column 0)."""
    notes: list = field(default_factory=list)
    """What was decided while building, for logs."""

    # --- the transport contract (torus_train.comm.transport.Transport) ------------------------------
    @staticmethod
    def buffer(tensor):
        """What the methods below take: a 1-D view of the tensor."""
        if not tensor.is_contiguous():
            raise ValueError("allreduce needs a contiguous tensor")
        return tensor.view(-1)

    def run(self, algorithm, t) -> None:
        algorithm(t, self)

    def pieces(self, t):
        return self.rows.pieces(t)

    def world_allreduce(self, t) -> None:
        dist.all_reduce(t)

    def world_max(self, t) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)

    def col_allreduce(self, t) -> None:
        if self.grid.y > 1:
            dist.all_reduce(t, group=self.col_group)

    def row_reduce_scatter(self, piece, bounds) -> None:
        self._rows().reduce_scatter(piece, bounds)

    def row_all_gather(self, piece, bounds) -> None:
        self._rows().all_gather(piece, bounds)

    def row_reduce_to_leader(self, piece) -> None:
        self._rows().reduce_to_leader(piece)

    def row_broadcast_from_leader(self, piece) -> None:
        self._rows().broadcast_from_leader(piece)

    def _rows(self) -> RowExchange:
        if self.rows is None:
            raise RuntimeError("the grid's groups are not built yet (build_grid_groups)")
        return self.rows

    def close(self) -> None:
        if self.rows is not None:
            self.rows.close()
        self.rows = GroupRow(self.row_group, self.col, self.row_leader, self.backend)  # a shm row is gone


class GroupRow:
    """A row exchanged through its torch.distributed process group (NCCL, gloo across hosts): one piece."""

    def __init__(self, group, index: int, leader: int, backend: str):
        self.group = group
        self.index = index  # my column: my place in the group (rows are made in column order)
        self.leader = leader  # global rank of the row's column 0
        self.kind = backend

    @staticmethod
    def pieces(flat):
        return (flat,)

    def reduce_scatter(self, flat, bounds) -> None:
        """Leave chunk `col` of the row's sum in flat[bounds[col]] (padded to equal chunks for the backend)."""
        x = len(bounds)
        m = -(-flat.numel() // x)
        buf = flat.new_zeros(m * x)
        for i, (a, b) in enumerate(bounds):
            buf[i * m : i * m + (b - a)].copy_(flat[a:b])
        chunk = flat.new_empty(m)
        collectives.reduce_scatter(chunk, buf, group=self.group)
        a, b = bounds[self.index]
        flat[a:b].copy_(chunk[: b - a])

    def all_gather(self, flat, bounds) -> None:
        x = len(bounds)
        m = -(-flat.numel() // x)
        a, b = bounds[self.index]
        chunk = flat.new_zeros(m)
        chunk[: b - a].copy_(flat[a:b])
        buf = flat.new_empty(m * x)
        collectives.all_gather(buf, chunk, group=self.group)
        for i, (a, b) in enumerate(bounds):
            flat[a:b].copy_(buf[i * m : i * m + (b - a)])

    def reduce_to_leader(self, t) -> None:
        dist.reduce(t, dst=self.leader, group=self.group)

    def broadcast_from_leader(self, t) -> None:
        dist.broadcast(t, src=self.leader, group=self.group)

    def close(self) -> None:
        pass


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_capacity(x: int) -> int:
    """Bytes per slot of a row segment: up to 8 MiB, at most about 256 MiB per row in all (SETS x X slots)."""
    asked = piece_bytes(os.environ)  # refused by name at the preflight, before any rank started
    if asked is not None:
        return asked
    return max(1 << 20, min(DEFAULT_CAPACITY, (256 << 20) // (SETS * x)) // 64 * 64)


def can_split() -> bool:
    """True when dist.split_group can split the default group here (bound device, backend that splits)."""
    if not hasattr(dist, "split_group") or not hasattr(torch, "accelerator"):  # torch 2.5 has the first only
        return False
    pg = dist.distributed_c10d._get_default_group()
    device = getattr(pg, "bound_device_id", None)
    accelerator = torch.accelerator.current_accelerator()
    if device is None or accelerator is None or not torch.accelerator.is_available():
        return False
    try:
        return bool(pg._get_backend(accelerator).supports_splitting)
    except RuntimeError:
        return False


def group_method(requested: str = "auto") -> str:
    """split | enumerate | per-group, for `requested` (auto: the first one this torch and backend allow)."""
    if requested == "auto":
        if can_split():
            return "split"
        return "enumerate" if hasattr(dist, "new_subgroups_by_enumeration") else "per-group"
    if requested not in ("split", "enumerate", "per-group"):
        raise ValueError(f"group method {requested!r} is not one of auto, split, enumerate, per-group")
    return requested


def partition_groups(members: list[list[int]], mine: int, timeout: float = 300.0):
    """Groups `members` (a partition of the world; every rank calls it alike) made the cheapest way this torch
    and backend allow (group_method), and this rank's, the one with index `mine`."""
    return _my_group(group_method(), members, mine, timedelta(seconds=max(timeout, 1.0)))


def _my_group(method: str, members: list[list[int]], mine: int, tmo: timedelta):
    """Create the groups `members` (each a list of global ranks; together a partition of the world) and return
    the one with index `mine`, this rank's."""
    if method == "split":
        return dist.split_group(split_ranks=members, timeout=tmo)
    if method == "enumerate":
        return dist.new_subgroups_by_enumeration(members, timeout=tmo)[0]
    found = None
    for i, ranks in enumerate(members):
        pg = dist.new_group(ranks, timeout=tmo)
        if i == mine:
            found = pg
    return found


def build_grid_groups(
    grid: Grid,
    use_shm: bool | None = None,
    timeout: float = 300.0,
    method: str = "auto",
    singletons: bool | None = None,
) -> GridGroups:
    """Create the row and column groups of `grid` (collective over the whole world) and return this rank's view.

    use_shm: None = shared-memory rows wherever a gloo row lies inside one host; False = never.
    timeout: seconds a shared-memory row waits for a peer before failing with the peer's rank.
    method: auto | split | enumerate | per-group (see the module docstring).
    singletons: also make rows of one rank (X = 1) and columns of one rank (Y = 1); None = on NCCL, where the
    hook's three phases then run as on any grid (a collective over one rank is a valid NCCL call), so a 1x1
    run on one GPU exercises the same side stream, buffers and Future as the full job.
    """
    g = _my_view(grid)
    how = group_method(method)
    _make_groups(g, how, g.backend == "nccl" if singletons is None else singletons, max(timeout, 1.0))
    if use_shm is None:
        use_shm = g.backend == "gloo" and os.environ.get("TORUS_TRAIN_SHM", "1") != "0"
    if use_shm and grid.x > 1:
        _shared_memory_row(g, timeout)
    return g


def _my_view(grid: Grid) -> GridGroups:
    """This rank's place on the grid, before any group exists (the world must be the grid)."""
    if not dist.is_initialized():
        raise RuntimeError("build_grid_groups needs torch.distributed to be initialised first")
    world = dist.get_world_size()
    if world != grid.size:
        raise UserError(f"grid {grid.x}x{grid.y} = {grid.size} ranks but the world size is {world}")
    rank = dist.get_rank()
    row, col = grid.position(rank)
    return GridGroups(
        grid=grid, rank=rank, row=row, col=col, backend=str(dist.get_backend()), row_leader=grid.rank_at(row, 0)
    )


def _make_groups(g: GridGroups, how: str, singletons: bool, timeout: float) -> None:
    """The row and column process groups (collective: every rank makes every group), and the rows' exchange."""
    grid, tmo = g.grid, timedelta(seconds=timeout)
    if grid.x > 1 or singletons:
        g.row_group = _my_group(how, [grid.row_ranks(r) for r in range(grid.y)], g.row, tmo)
    if grid.y > 1 or singletons:
        g.col_group = _my_group(how, [grid.col_ranks(c) for c in range(grid.x)], g.col, tmo)
    g.notes.append(f"row and column groups: {how}")
    g.rows = GroupRow(g.row_group, g.col, g.row_leader, g.backend)


def _shared_memory_row(g: GridGroups, timeout: float) -> None:
    """Rows that lie inside one host exchange through shared memory instead (every rank takes part: the host
    names are gathered over the world)."""
    grid, rank, row, col = g.grid, g.rank, g.row, g.col
    hosts: list = [None] * grid.size
    dist.all_gather_object(hosts, _host_id())
    token = [uuid.uuid4().hex[:12] if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    if len({hosts[r] for r in grid.row_ranks(row)}) != 1:
        g.notes.append(f"row {row} spans hosts: rows use {g.backend}")
        return
    name, cap = f"torus-train-{token[0]}-row{row}", shm_capacity(grid.x)
    if col == 0:
        shm = ShmRow(name, col, grid.row_ranks(row), capacity=cap, timeout=timeout)
    dist.barrier(group=g.row_group)  # the leader has created the segment
    if col != 0:
        shm = ShmRow(name, col, grid.row_ranks(row), capacity=cap, timeout=timeout)
    dist.barrier(group=g.row_group)  # everyone has mapped it and made its wake-up FIFO
    shm.connect()
    dist.barrier(group=g.row_group)  # everyone has opened its peers' FIFOs: the names can go
    shm.unlink()
    g.rows = shm
    g.notes.append(f"row {row} lies inside one host: shared memory, {cap >> 10} KiB pieces; columns on {g.backend}")
