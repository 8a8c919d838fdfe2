"""Model architectures by name and what one image costs them (pure: no torch import).

Two kinds of names are accepted in ``model.arch``: torchvision's classification models, and the house models of
``HOUSE_ARCHS`` (ResNets narrower than torchvision's, built in train/models.py from torchvision's own blocks),
which small jobs such as the embedded default use.

``forward_flops`` counts the multiply-adds of the convolutions and the final linear layer of one forward pass
on one image, times 2 (the convention of torch.utils.flop_counter; torchvision's "GFLOPS" column counts
multiply-adds once). BatchNorm, ReLU, pooling and additions are left out (under 1% for these models). It is
computed from the layer shapes for the ResNet family (torchvision's ResNets, wide ResNets, ResNeXts and the
house models) and is None for other architectures. tests/test_job_models.py compares it with torch's counter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResNetLayout:
    """A ResNet in the shape of torchvision's: a 7x7 stride-2 stem and max-pool, four stages of blocks (the
    first at stride 1, the others halving the side), global average pooling, one linear layer."""

    block: str
    """basic (two 3x3 convolutions) | bottleneck (1x1, 3x3, 1x1 with expansion 4)."""
    layers: tuple[int, int, int, int]
    """Blocks per stage."""
    width: int = 64
    """Channels of the stem and of the first stage's blocks; each stage doubles it."""
    groups: int = 1
    """Groups of the bottleneck's 3x3 convolution (ResNeXt)."""
    width_per_group: int = 64
    """Bottleneck inner width factor: inner channels = planes * width_per_group / 64 * groups."""


HOUSE_ARCHS: dict[str, ResNetLayout] = {
    "resnet18_w32": ResNetLayout("basic", (2, 2, 2, 2), width=32),
}
"""ResNets of this project, built by train/models.py: resnet18_w32 is ResNet-18 at half width (32-64-128-256
channels, a quarter of its multiply-adds and parameters), for jobs on a few CPU cores."""

TORCHVISION_RESNETS: dict[str, ResNetLayout] = {
    "resnet18": ResNetLayout("basic", (2, 2, 2, 2)),
    "resnet34": ResNetLayout("basic", (3, 4, 6, 3)),
    "resnet50": ResNetLayout("bottleneck", (3, 4, 6, 3)),
    "resnet101": ResNetLayout("bottleneck", (3, 4, 23, 3)),
    "resnet152": ResNetLayout("bottleneck", (3, 8, 36, 3)),
    "wide_resnet50_2": ResNetLayout("bottleneck", (3, 4, 6, 3), width_per_group=128),
    "wide_resnet101_2": ResNetLayout("bottleneck", (3, 4, 23, 3), width_per_group=128),
    "resnext50_32x4d": ResNetLayout("bottleneck", (3, 4, 6, 3), groups=32, width_per_group=4),
    "resnext101_32x8d": ResNetLayout("bottleneck", (3, 4, 23, 3), groups=32, width_per_group=8),
    "resnext101_64x4d": ResNetLayout("bottleneck", (3, 4, 23, 3), groups=64, width_per_group=4),
}


def _conv_out(side: int, kernel: int, stride: int, pad: int) -> int:
    return (side + 2 * pad - kernel) // stride + 1


def _conv_macs(side_out: int, c_in: int, c_out: int, kernel: int, groups: int = 1) -> int:
    return side_out * side_out * c_out * (c_in // groups) * kernel * kernel


def _block_macs(lay: ResNetLayout, side: int, c_in: int, planes: int, stride: int) -> tuple[int, int, int]:
    """(multiply-adds, output side, output channels) of one block, its downsampling shortcut included."""
    out = _conv_out(side, 3, stride, 1)
    if lay.block == "basic":
        c_out = planes
        macs = _conv_macs(out, c_in, planes, 3) + _conv_macs(out, planes, planes, 3)
    else:
        inner = planes * lay.width_per_group // 64 * lay.groups
        c_out = planes * 4
        macs = (
            _conv_macs(side, c_in, inner, 1)
            + _conv_macs(out, inner, inner, 3, lay.groups)
            + _conv_macs(out, inner, c_out, 1)
        )
    if stride != 1 or c_in != c_out:
        macs += _conv_macs(out, c_in, c_out, 1)
    return macs, out, c_out


def resnet_macs(lay: ResNetLayout, image_size: int, num_classes: int) -> int:
    """Multiply-adds of one forward pass of ``lay`` on one image_size x image_size RGB image."""
    side = _conv_out(image_size, 7, 2, 3)
    macs = _conv_macs(side, 3, lay.width, 7)
    side, channels = _conv_out(side, 3, 2, 1), lay.width  # max-pool
    for stage, blocks in enumerate(lay.layers):
        planes = lay.width * 2**stage
        for b in range(blocks):
            m, side, channels = _block_macs(lay, side, channels, planes, 2 if stage and not b else 1)
            macs += m
    return macs + channels * num_classes


def forward_flops(arch: str, image_size: int, num_classes: int) -> int | None:
    """FLOPs (2 x multiply-adds) of one forward pass on one image; None where the layout is not known here."""
    lay = HOUSE_ARCHS.get(arch) or TORCHVISION_RESNETS.get(arch)
    return None if lay is None else 2 * resnet_macs(lay, image_size, num_classes)
