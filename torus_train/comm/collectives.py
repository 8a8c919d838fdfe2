"""The two row collectives of the torus under the names this torch gives them.

Newer torch (2.14 here) calls ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` ``reduce_scatter_single``
and ``all_gather_single``; the old names are kept as wrappers that call the new ones with the same arguments
and issue a FutureWarning at every call. The oldest torch this package supports (2.4) has only the old names.
The choice is made here, once, so that no call site branches on the version.
"""

from __future__ import annotations

import torch.distributed as dist

reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
"""reduce_scatter(output, input, op=SUM, group=None, async_op=False): input's X equal chunks summed over the
group; chunk i of the sum lands in member i's output."""

all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""all_gather(output, input, group=None, async_op=False): every member's input, in member order, in every
member's output."""
