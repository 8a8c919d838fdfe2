"""Synthetic data for pure speed runs: one random batch per rank, made once on the device and yielded again.

No decoding, no host-to-device copies: what is measured is the model and the gradient exchange.
"""

from __future__ import annotations

import torch

from torus_train.data.base import LoaderConfig, LoaderRequest
from torus_train.job.schedule import steps_per_epoch
from torus_train.job.sources import SYNTHETIC_SAMPLES


def open_loader(request: LoaderRequest) -> SyntheticLoader:
    """The synthetic data source's loader (its entry is ``synthetic`` in job/sources.py): labels in the
    model's range (1000 when none is given), request.samples images per epoch (0 = SYNTHETIC_SAMPLES)."""
    return SyntheticLoader(
        request.cfg, request.num_classes or 1000, request.device, request.samples or SYNTHETIC_SAMPLES
    )


class SyntheticLoader:
    """Yields the same (images, labels) batch ``len(self)`` times per epoch."""

    kind = "synthetic"
    decoder = None  # nothing to decode
    pad = 0

    def __init__(self, cfg: LoaderConfig, num_classes: int, device: torch.device, num_samples: int = SYNTHETIC_SAMPLES):
        self.cfg = cfg
        self.device = device
        self.num_classes = num_classes
        self.num_samples = num_samples
        self.batch_size = cfg.batch_size
        self.epoch = 0
        g = torch.Generator().manual_seed(cfg.seed * 7919 + cfg.rank)
        x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=g)
        y = torch.randint(0, num_classes, (cfg.batch_size,), generator=g)
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        self._x, self._y = x.to(device, cfg.torch_dtype()), y.to(device)

    def __len__(self) -> int:
        return steps_per_epoch(self.num_samples, self.cfg.world_size * self.cfg.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        for _ in range(len(self)):
            yield self._x, self._y

    def close(self) -> None:
        pass
