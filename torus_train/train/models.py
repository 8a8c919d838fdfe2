"""The house models of job/models.py HOUSE_ARCHS, built from torchvision's ResNet blocks.

torchvision's ResNet class fixes the widths at 64-128-256-512; these are the same network at another width
(torchvision's stem, blocks, zero-free initialisation and head), so a ResNet fits a few CPU cores.
"""

from __future__ import annotations

import torch.nn as nn
from torchvision.models.resnet import BasicBlock, Bottleneck, conv1x1

from torus_train.job.models import ResNetLayout


class NarrowResNet(nn.Module):
    """torchvision's ResNet with the stem and first stage at ``layout.width`` channels."""

    def __init__(self, layout: ResNetLayout, num_classes: int):
        super().__init__()
        block = BasicBlock if layout.block == "basic" else Bottleneck
        self._base_width, self._groups = layout.width_per_group, layout.groups
        self.inplanes = layout.width
        self.conv1 = nn.Conv2d(3, layout.width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(layout.width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            self._stage(block, layout.width * 2**i, n, 1 if i == 0 else 2) for i, n in enumerate(layout.layers)
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _stage(self, block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride), nn.BatchNorm2d(planes * block.expansion)
            )
        kw = dict(groups=self._groups, base_width=self._base_width)
        layers = [block(self.inplanes, planes, stride, downsample, **kw)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, **kw) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def build_house_model(layout: ResNetLayout, num_classes: int) -> nn.Module:
    return NarrowResNet(layout, num_classes)
