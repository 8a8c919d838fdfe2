"""Model architectures by name, the input sizes they take, and what one image costs them (pure: no torch import).

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


# torchvision.models.list_models(module=torchvision.models) of torchvision 0.29, kept here so that validating a
# spec never imports torch; tests/test_input_errors.py compares it with the installed torchvision.
CLASSIFICATION_ARCHS = (
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
)


FIXED_INPUT = {**dict.fromkeys(("vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32"), 224), "maxvit_t": 224}
"""Models built for exactly one input size (torchvision's default; their position embeddings or window grid fix it)."""
MIN_INPUT = {
    "inception_v3": 75,
    "alexnet": 64,
    **dict.fromkeys(
        (
            "convnext_base",
            "convnext_large",
            "convnext_small",
            "convnext_tiny",
            "densenet121",
            "densenet161",
            "densenet169",
            "densenet201",
            "vgg11",
            "vgg11_bn",
            "vgg13",
            "vgg13_bn",
            "vgg16",
            "vgg16_bn",
            "vgg19",
            "vgg19_bn",
        ),
        32,
    ),
    "squeezenet1_0": 24,
    "squeezenet1_1": 24,
    "googlenet": 16,
}
"""The smallest input side, of 8, 16, 24, 32, 48, 64, 75, that each model's forward pass takes (the others take
8 px); tests/test_preflight.py checks the table against torchvision."""


def input_size_problem(arch: str, size: int, source: str = "data.image_size") -> str:
    """Why ``arch`` cannot take ``size`` px images ('' when it can), naming ``source`` (the spec's field, or the
    option that sets the size: `plan rehearse --image-size`)."""
    fixed, low = FIXED_INPUT.get(arch), MIN_INPUT.get(arch, 8)
    if fixed and size != fixed:
        return f"{source}: {arch} takes only {fixed} px images, not {size}; set --image-size {fixed}"
    if size < low:
        return f"{source}: {arch} needs images of at least {low} px, not {size}"
    return ""
