"""The two row collectives of the torus under the names this torch gives them.

Newer torch (2.14 here) calls ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` ``reduce_scatter_single``
and ``all_gather_single``; the old names are kept as wrappers that call the new ones with the same arguments
and issue a FutureWarning at every call. The oldest torch this package supports (2.4) has only the old names.
The name is chosen here, once, so that no call site branches on the version; the function is looked up on
torch.distributed at each call, so that a wrapper installed there later (the rehearsal's recorder, a test's
spy) sees the call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

REDUCE_SCATTER = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
"""torch.distributed's name for the reduce-scatter of one tensor into one tensor, here."""
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
"""torch.distributed's name for the all-gather of one tensor into one tensor, here."""


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None) -> None:
    """input's X equal chunks summed over the group; chunk i of the sum lands in member i's output."""
    getattr(dist, REDUCE_SCATTER)(output, input, group=group)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None) -> None:
    """Every member's input, in member order, in every member's output."""
    getattr(dist, ALL_GATHER)(output, input, group=group)
