"""DenseNet-264 (Huang et al.) as configured in the AutoTM paper / artifact.

Growth rate k = 32, dense blocks of (6, 12, 64, 48) layers.  Each dense layer is
BN-ReLU-Conv1x1(4k) then BN-ReLU-Conv3x3(k); its output is concatenated onto
the running feature map.  Stem: Conv7x7/2 (3 -> 2k = 64) + BN + ReLU +
MaxPool3x3/2.  Transitions (after blocks 1-3): BN-ReLU-Conv1x1 down to
k0 = 2k = 64 channels (the paper's/artifact's width, *not* the usual 0.5
compression) + AvgPool2x2/2.  Head: BN-ReLU, adaptive average pool, Dense
(48k + 2k = 1600 -> num_classes).  Convolutions have no bias (they are all
preceded by or feed a BatchNorm), as in torchvision.

Because the transitions squeeze back to 64 channels (instead of halving), this
DenseNet-264 has fewer parameters than the usual compression-0.5 DenseNet-264
(~33.3M): 21,122,792 parameters at 1000 classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["DenseNet", "densenet264", "DENSENET264_BLOCKS"]

DENSENET264_BLOCKS: tuple[int, int, int, int] = (6, 12, 64, 48)


class DenseLayer(nn.Module):
    def __init__(self, in_ch: int, growth: int, bn_size: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_ch)
        self.relu1 = nn.ReLU(inplace=False)
        self.conv1 = nn.Conv2d(in_ch, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=False)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(y)))


class DenseBlock(nn.Module):
    def __init__(self, num_layers: int, in_ch: int, growth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(in_ch + i * growth, growth) for i in range(num_layers))
        self.out_channels = in_ch + num_layers * growth

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class Transition(nn.Sequential):
    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__(
            nn.BatchNorm2d(in_ch),
            nn.ReLU(inplace=False),
            nn.Conv2d(in_ch, out_ch, 1, bias=False),
            nn.AvgPool2d(2, stride=2),
        )


class DenseNet(nn.Module):
    def __init__(
        self,
        blocks: Sequence[int] = DENSENET264_BLOCKS,
        growth: int = 32,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        k0 = 2 * growth
        layers: list[nn.Module] = [
            nn.Conv2d(3, k0, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(k0),
            nn.ReLU(inplace=False),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        for i, n in enumerate(blocks):
            block = DenseBlock(n, k0, growth)
            layers.append(block)
            if i != len(blocks) - 1:
                layers.append(Transition(block.out_channels, k0))
        c = k0 + blocks[-1] * growth
        layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=False)]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(c, num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialize every parameter and buffer (torchvision's DenseNet scheme)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_parameters()  # weight 1, bias 0, running stats reset
            elif isinstance(m, nn.Linear):
                m.reset_parameters()
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.features(x)).flatten(1)
        return self.classifier(x)


def densenet264(num_classes: int = 1000, growth: int = 32) -> DenseNet:
    """DenseNet-264, k=32, transitions to 2k channels (see module docstring)."""
    return DenseNet(DENSENET264_BLOCKS, growth, num_classes)
