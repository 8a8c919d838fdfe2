"""Local arithmetic on CPU buffers shared by the row transports (shared memory, MPI point-to-point).

numpy is used rather than torch because its slicing and in-place add cost a fraction of torch's per call,
which matters for small messages; half types are summed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np
import torch

# numpy storage of each supported dtype (bfloat16 has none in numpy: its 16-bit words are moved as uint16)
STORAGE = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16, torch.float64: np.float64}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous 1-D CPU tensor (bfloat16 as its uint16 words)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def accumulate(out: np.ndarray, others: list[np.ndarray], dtype: torch.dtype) -> None:
    """out += sum(others), in the order given; half types accumulate in float32 and round once."""
    if dtype == torch.bfloat16:

        def as_bf16(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)

        acc = as_bf16(out).float()
        for t in others:
            acc += as_bf16(t)
        as_bf16(out).copy_(acc)
    elif dtype == torch.float16:
        acc32 = out.astype(np.float32)
        for t in others:
            acc32 += t
        out[:] = acc32
    else:
        for t in others:
            np.add(out, t, out=out)
