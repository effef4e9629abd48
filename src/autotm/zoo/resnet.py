"""Bottleneck ResNets (He et al.), torchvision layout (ResNet v1.5: stride on the 3x3).

Stem: 7x7/2 conv + BN + ReLU + 3x3/2 maxpool; post-activation bottlenecks
(conv1x1-BN-ReLU, conv3x3-BN-ReLU, conv1x1-BN, add, ReLU) with a conv1x1+BN
projection shortcut on the first block of each stage; adaptive avgpool; fc.

* ``resnet50``:  blocks [3, 4, 6, 3]   -> 25,557,032 parameters at 1000 classes
  (identical to torchvision's ``resnet50``).
* ``resnet200``: blocks [3, 24, 36, 3] -> 64,673,832 parameters at 1000 classes
  (identical to timm's / pytorchcv's ``resnet200``, which use this layout).

Note: the figure 64,669,864 that is sometimes quoted for "ResNet-200" belongs
to a *pre-activation* bottleneck variant (BN-ReLU before each conv, the first
BN over the block input) -- 3,968 fewer BN parameters; it is not this layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["Bottleneck", "ResNet", "resnet50", "resnet200"]


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        # One ReLU module per use (no shared modules: per-module hooks fire once).
        self.relu1 = nn.ReLU(inplace=False)
        self.relu2 = nn.ReLU(inplace=False)
        self.relu3 = nn.ReLU(inplace=False)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu3(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: Sequence[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=False)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = 64
        stages = []
        for i, n in enumerate(layers):
            width = 64 * 2**i
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(in_ch, width, stride if j == 0 else 1))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_ch, num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialize every parameter and buffer (torchvision's ResNet scheme)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_parameters()  # weight 1, bias 0, running stats reset
            elif isinstance(m, nn.Linear):
                m.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).flatten(1)
        return self.fc(x)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50. 25,557,032 parameters at 1000 classes."""
    return ResNet([3, 4, 6, 3], num_classes)


def resnet200(num_classes: int = 1000) -> ResNet:
    """ResNet-200. 64,669,864 parameters at 1000 classes."""
    return ResNet([3, 24, 36, 3], num_classes)
