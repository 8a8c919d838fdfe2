"""The all-reduce algorithms: one table that every reader derives its names from (pure: no torch, no numpy).

Each entry says, for one name, everything torus-train knows about it: what it does (one line), the function
that runs it over the transport contract (torus_train.comm.transport.Transport) and the transport operations
it calls, the cost model's phases (torus_train.plan.cost), the virtual-rank simulation (torus_train.plan.simulate)
and how a training job uses it (comm.algo). Implementations are named as ``"package.module:function"`` and
imported only when used (torus_train.registry.load), so the spec, `--help` and `plan` read this table without
importing torch.

Why the table lives in job/ and not in comm/: the spec (job/) is its lowest reader and job/ must not import
from comm/ (docs/extending.md, "The floors"); the entries point up into comm/ and plan/ by name only.

Three kinds of entry, told apart by their fields (not by a second table, so a name is spelled once):
- an algorithm that runs (``run`` set): flat, torus, hierarchical. The bench measures it, the DDP hook
  exchanges with it, and where the cost model has its phases (``phases``) `plan` predicts it;
- a cost-model-only algorithm (``run`` None, ``phases`` set): tree, the textbook binomial tree that `plan`
  prints beside the others and that no rank runs;
- a training mode (``same_as`` set): another entry's algorithm used differently by DDP. ddp is DDP's own
  all-reduce without a hook (what it computes is the backend's all-reduce: flat); torus-sync is the torus
  hook exchanging inside the hook (no overlap), for comparisons. Bench and calibration measure a mode as the
  algorithm it is ``same_as``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torus_train.errors import UserError
from torus_train.registry import Registry

# The operations of the transport contract (torus_train.comm.transport.Transport) an algorithm may call.
OPERATIONS = (
    "pieces",
    "world_allreduce",
    "col_allreduce",
    "row_reduce_scatter",
    "row_all_gather",
    "row_reduce_to_leader",
    "row_broadcast_from_leader",
)


@dataclass(frozen=True)
class Algorithm:
    """One all-reduce algorithm (or a training mode of one), as every part of torus-train needs it."""

    name: str
    """What comm.algo, `bench allreduce --algo` and `plan` call it."""
    summary: str
    """One line: what it does (help, docs)."""
    run: str | Callable | None = None
    """``"module:function"`` of ``function(buf, transport) -> None`` (or the function itself), summing buf over
    all ranks in place through the transport's operations; None: no rank runs it (cost model only, or a mode
    of another entry)."""
    uses: tuple[str, ...] = ()
    """The transport operations `run` calls (of OPERATIONS); the shared transport test checks the list."""
    phases: str | None = None
    """``"module:function"`` adding its phases to the cost model (torus_train.plan.cost); None: not modelled."""
    phases_label: str = ""
    """What the cost model's phases stand for, printed beside `plan`'s table."""
    simulate: str | None = None
    """``"module:function"`` of its exact data movement on virtual ranks (torus_train.plan.simulate)."""
    trains: bool = True
    """A value of comm.algo: the gradient exchange of a training job."""
    hook: bool = True
    """Training exchanges through torus-train's DDP hook; False: through DDP's own all-reduce."""
    asynchronous: bool = True
    """The hook returns before the exchange is done (overlap with the backward pass); False: it waits."""
    same_as: str | None = None
    """A training mode of another entry: the algorithm that bench and calibration measure for it."""
    grids: str = "one"
    """Which grids `plan` weighs it on for a GPU count: "any" (every X x Y; the torus), "per_node" (rows of one
    node's GPUs, a leader per node; hierarchical) or "one" (its cost does not depend on the grid)."""
    nccl: str | None = None
    """``"module:function"`` of a specialised exchange for CUDA buckets on NCCL (whole-tensor collectives on
    a side stream), where the algorithm has one; else the hook runs `run` on the bucket."""


ALGORITHMS: Registry[Algorithm] = Registry("all-reduce algorithm")


def register(algo: Algorithm) -> Algorithm:
    """Add an algorithm to the table (the one step a new algorithm needs besides its function)."""
    if algo.same_as is not None and algo.same_as not in ALGORITHMS:
        raise ValueError(f"all-reduce algorithm {algo.name!r}: same_as {algo.same_as!r} is not registered")
    bad = [op for op in algo.uses if op not in OPERATIONS]
    if bad:
        raise ValueError(
            f"all-reduce algorithm {algo.name!r} uses unknown transport operations {bad}; "
            f"the contract has {', '.join(OPERATIONS)}"
        )
    return ALGORITHMS.add(algo.name, algo)


_ALGOS = "torus_train.comm.algos"
_COST = "torus_train.plan.cost"
_SIM = "torus_train.plan.simulate"

# Registered in the order tables print them: the baselines first, this project's torus last, then the modes.
register(
    Algorithm(
        "flat",
        "the backend's own all-reduce over the whole world (the baseline)",
        run=f"{_ALGOS}:flat_allreduce",
        uses=("world_allreduce",),
        phases=f"{_COST}:flat_phases",
        phases_label="textbook ring (one ring, no channels)",
        simulate=f"{_SIM}:simulate_flat",
    )
)
register(
    Algorithm(
        "tree",
        "binomial reduce to rank 0 and binomial broadcast (cost model only)",
        phases=f"{_COST}:tree_phases",
        phases_label="textbook binomial tree (whole buffer per round)",
        trains=False,
    )
)
register(
    Algorithm(
        "hierarchical",
        "reduce to the row leader, all-reduce among the leaders, broadcast along the row",
        run=f"{_ALGOS}:hierarchical_allreduce",
        uses=("pieces", "col_allreduce", "row_reduce_to_leader", "row_broadcast_from_leader"),
        phases=f"{_COST}:hierarchical_phases",
        phases_label="reduce to node leader, leaders' ring, broadcast",
        grids="per_node",
    )
)
register(
    Algorithm(
        "torus",
        "2D torus: reduce-scatter along rows, all-reduce along columns, all-gather along rows",
        run=f"{_ALGOS}:torus_allreduce",
        uses=("pieces", "col_allreduce", "row_reduce_scatter", "row_all_gather"),
        phases=f"{_COST}:torus_phases",
        phases_label="2D torus (this project)",
        simulate=f"{_SIM}:simulate_torus",
        nccl="torus_train.comm.hooks:exchange_torus_nccl",
        grids="any",
    )
)
register(
    Algorithm("ddp", "DDP's own all-reduce, no hook (the backend's all-reduce per bucket)", hook=False, same_as="flat")
)
register(
    Algorithm(
        "torus-sync",
        "the torus hook exchanging inside the hook (no overlap), for comparisons",
        asynchronous=False,
        same_as="torus",
    )
)

DEFAULT = "torus"
"""comm.algo when the spec names none, and the algorithm `plan` picks grids for and weighs against NCCL."""
BASELINE = "flat"
"""What the bench divides the others' bandwidth by."""


def runnable() -> tuple[str, ...]:
    """Algorithms a rank can run (bench allreduce --algo, the DDP hook), in table order."""
    return tuple(a.name for a in ALGORITHMS if a.run is not None)


def modelled() -> tuple[str, ...]:
    """Algorithms the cost model has phases for, in the order `plan` prints them."""
    return tuple(a.name for a in ALGORITHMS if a.phases is not None)


def simulated() -> tuple[str, ...]:
    """Algorithms whose data movement the virtual-rank simulator runs."""
    return tuple(a.name for a in ALGORITHMS if a.simulate is not None)


def training_choices() -> tuple[str, ...]:
    """The values comm.algo accepts."""
    return tuple(a.name for a in ALGORITHMS if a.trains)


def measured_as(name: str) -> str:
    """The runnable algorithm that bench and calibration measure for comm.algo `name` (UserError if unknown)."""
    try:
        algo = ALGORITHMS.get(name)
    except ValueError as exc:
        raise UserError(f"comm.algo: {exc}") from None
    return algo.same_as or algo.name
