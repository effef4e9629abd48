"""Inception-v4 (Szegedy et al., 2016), as in the common (timm / Cadene) implementation.

Every convolution is a :class:`BasicConv2d` unit: conv (no bias) + BatchNorm
(eps=1e-3) + ReLU.  Layout: stem (3 convs, Mixed-3a, Mixed-4a, Mixed-5a);
4x Inception-A; Reduction-A with (k, l, m, n) = (192, 224, 256, 384);
7x Inception-B; Reduction-B; 3x Inception-C; adaptive average pool; Dense
1536 -> num_classes.  No dropout.

Parameter count at 1000 classes: 42,679,816 (same as timm's ``inception_v4``).

The stem and both reductions use valid-padded (un-padded) convolutions and
pools, so small inputs are rejected; :data:`MIN_IMAGE` (75) is the smallest
square input size for which every spatial size stays >= 1.  The canonical
input is 299x299 (-> 35x35 at A, 17x17 at B, 8x8 at C).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["InceptionV4", "inception_v4", "MIN_IMAGE", "feature_size"]


class BasicConv2d(nn.Module):
    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=1e-3)
        self.relu = nn.ReLU(inplace=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.bn(self.conv(x)))


class Mixed3a(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.maxpool = nn.MaxPool2d(3, stride=2)
        self.conv = BasicConv2d(64, 96, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.maxpool(x), self.conv(x)], dim=1)  # 160 ch


class Mixed4a(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch0 = nn.Sequential(BasicConv2d(160, 64, 1), BasicConv2d(64, 96, 3))
        self.branch1 = nn.Sequential(
            BasicConv2d(160, 64, 1),
            BasicConv2d(64, 64, (1, 7), padding=(0, 3)),
            BasicConv2d(64, 64, (7, 1), padding=(3, 0)),
            BasicConv2d(64, 96, 3),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch0(x), self.branch1(x)], dim=1)  # 192 ch


class Mixed5a(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = BasicConv2d(192, 192, 3, stride=2)
        self.maxpool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.conv(x), self.maxpool(x)], dim=1)  # 384 ch


class InceptionA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch0 = BasicConv2d(384, 96, 1)
        self.branch1 = nn.Sequential(BasicConv2d(384, 64, 1), BasicConv2d(64, 96, 3, padding=1))
        self.branch2 = nn.Sequential(
            BasicConv2d(384, 64, 1),
            BasicConv2d(64, 96, 3, padding=1),
            BasicConv2d(96, 96, 3, padding=1),
        )
        self.branch3 = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
            BasicConv2d(384, 96, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch0(x), self.branch1(x), self.branch2(x), self.branch3(x)], dim=1)


class ReductionA(nn.Module):
    def __init__(self, k: int = 192, l: int = 224, m: int = 256, n: int = 384) -> None:  # noqa: E741
        super().__init__()
        self.branch0 = BasicConv2d(384, n, 3, stride=2)
        self.branch1 = nn.Sequential(
            BasicConv2d(384, k, 1),
            BasicConv2d(k, l, 3, padding=1),
            BasicConv2d(l, m, 3, stride=2),
        )
        self.branch2 = nn.MaxPool2d(3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch0(x), self.branch1(x), self.branch2(x)], dim=1)  # 1024 ch


class InceptionB(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch0 = BasicConv2d(1024, 384, 1)
        self.branch1 = nn.Sequential(
            BasicConv2d(1024, 192, 1),
            BasicConv2d(192, 224, (1, 7), padding=(0, 3)),
            BasicConv2d(224, 256, (7, 1), padding=(3, 0)),
        )
        self.branch2 = nn.Sequential(
            BasicConv2d(1024, 192, 1),
            BasicConv2d(192, 192, (7, 1), padding=(3, 0)),
            BasicConv2d(192, 224, (1, 7), padding=(0, 3)),
            BasicConv2d(224, 224, (7, 1), padding=(3, 0)),
            BasicConv2d(224, 256, (1, 7), padding=(0, 3)),
        )
        self.branch3 = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
            BasicConv2d(1024, 128, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch0(x), self.branch1(x), self.branch2(x), self.branch3(x)], dim=1)


class ReductionB(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch0 = nn.Sequential(BasicConv2d(1024, 192, 1), BasicConv2d(192, 192, 3, stride=2))
        self.branch1 = nn.Sequential(
            BasicConv2d(1024, 256, 1),
            BasicConv2d(256, 256, (1, 7), padding=(0, 3)),
            BasicConv2d(256, 320, (7, 1), padding=(3, 0)),
            BasicConv2d(320, 320, 3, stride=2),
        )
        self.branch2 = nn.MaxPool2d(3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch0(x), self.branch1(x), self.branch2(x)], dim=1)  # 1536 ch


class InceptionC(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch0 = BasicConv2d(1536, 256, 1)
        self.branch1_0 = BasicConv2d(1536, 384, 1)
        self.branch1_1a = BasicConv2d(384, 256, (1, 3), padding=(0, 1))
        self.branch1_1b = BasicConv2d(384, 256, (3, 1), padding=(1, 0))
        self.branch2_0 = BasicConv2d(1536, 384, 1)
        self.branch2_1 = BasicConv2d(384, 448, (3, 1), padding=(1, 0))
        self.branch2_2 = BasicConv2d(448, 512, (1, 3), padding=(0, 1))
        self.branch2_3a = BasicConv2d(512, 256, (1, 3), padding=(0, 1))
        self.branch2_3b = BasicConv2d(512, 256, (3, 1), padding=(1, 0))
        self.branch3 = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
            BasicConv2d(1536, 256, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        x0 = self.branch0(x)
        x1 = self.branch1_0(x)
        x2 = self.branch2_2(self.branch2_1(self.branch2_0(x)))
        x3 = self.branch3(x)
        return torch.cat(
            [x0, self.branch1_1a(x1), self.branch1_1b(x1), self.branch2_3a(x2), self.branch2_3b(x2), x3],
            dim=1,
        )


class InceptionV4(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            BasicConv2d(3, 32, 3, stride=2),
            BasicConv2d(32, 32, 3),
            BasicConv2d(32, 64, 3, padding=1),
            Mixed3a(),
            Mixed4a(),
            Mixed5a(),
            *[InceptionA() for _ in range(4)],
            ReductionA(192, 224, 256, 384),
            *[InceptionB() for _ in range(7)],
            ReductionB(),
            *[InceptionC() for _ in range(3)],
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.last_linear = nn.Linear(1536, num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialize every parameter and buffer."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_parameters()  # weight 1, bias 0, running stats reset
            elif isinstance(m, nn.Linear):
                m.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.features(x)).flatten(1)
        return self.last_linear(x)


def inception_v4(num_classes: int = 1000) -> InceptionV4:
    """Inception-v4. 42,679,816 parameters at 1000 classes."""
    return InceptionV4(num_classes)


def feature_size(image: int) -> int:
    """Spatial size of the final (Inception-C) feature map for a square ``image`` input."""

    def valid(s: int, k: int = 3, stride: int = 1) -> int:
        return (s - k) // stride + 1

    s = valid(image, stride=2)  # conv 3x3/2
    s = valid(s)  # conv 3x3
    s = valid(s, stride=2)  # Mixed-3a (pool and conv 3x3/2)
    s = valid(s)  # Mixed-4a (3x3 valid)
    s = valid(s, stride=2)  # Mixed-5a
    s = valid(s, stride=2)  # Reduction-A
    s = valid(s, stride=2)  # Reduction-B
    return s


#: Smallest square input accepted by Inception-v4 (every feature map >= 1x1).
MIN_IMAGE: int = next(i for i in range(1, 400) if feature_size(i) >= 1)
