"""One verdict for every rank from each rank's own, with the reason of the first rank that failed.

    found = consensus(why_failed, device)    every rank, at the same point; why_failed: None where this rank passed
    found.ok                                 every rank passed
    found.where()                            "here" (a world of one) or "on F of N ranks"
    found.reason()                           the first failing rank's why ("rank R: ..." in a world of more)

The start-up probes (train/decoder.py, train/graphs.py) use it: a run falls back on every rank or on none, and the
line rank 0 prints names what failed even when rank 0's own check passed. The cost does not grow with the world:
two all-reduces of one integer, and where a rank failed one broadcast of its reason (1 KiB, broadcast_text) from
the lowest such rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Consensus:
    failing: int
    """Ranks whose check failed."""
    world: int
    first: int | None
    """The lowest failing rank (None: none failed)."""
    why: str | None
    """That rank's reason."""

    @classmethod
    def alone(cls, why_failed: str | None) -> Consensus:
        """A world of one: this rank's own verdict."""
        return cls(int(why_failed is not None), 1, None if why_failed is None else 0, why_failed)

    @property
    def ok(self) -> bool:
        return self.failing == 0

    def where(self) -> str:
        return "here" if self.world == 1 else f"on {self.failing} of {self.world} ranks"

    def reason(self) -> str:
        if self.why is None:
            return ""
        return self.why if self.world == 1 else f"rank {self.first}: {self.why}"


def consensus(why_failed: str | None, device: torch.device) -> Consensus:
    """Every rank's verdict (see the module docstring); this rank's alone outside a process group of more than one."""
    failed = why_failed is not None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return Consensus.alone(why_failed)
    world, rank = dist.get_world_size(), dist.get_rank()
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")  # gloo reduces host tensors
    count = torch.tensor([int(failed)], dtype=torch.int64, device=on)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    failing = int(count.item())
    if failing == 0:
        return Consensus(0, world, None, None)
    lowest = torch.tensor([rank if failed else world], dtype=torch.int64, device=on)
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    first = int(lowest.item())
    return Consensus(failing, world, first, broadcast_text(why_failed or "", first, on))


TEXT_BYTES = 1024
"""A broadcast line's bytes (UTF-8, cut there): one fixed-size tensor, no pickling, no size exchange first."""


def broadcast_text(text: str, src: int, device: torch.device) -> str:
    """``src``'s ``text`` on every rank, in one broadcast of TEXT_BYTES bytes on ``device`` (the backend's:
    NCCL's is the GPU); '' stays ''. An object broadcast would pickle on the host and move two tensors."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return text
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    raw = text.encode()[:TEXT_BYTES] if dist.get_rank() == src else b""
    buf = torch.zeros(TEXT_BYTES, dtype=torch.uint8)
    if raw:
        buf[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    buf = buf.to(on)
    dist.broadcast(buf, src=src)
    return bytes(buf.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
