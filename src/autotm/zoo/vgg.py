"""VGG networks (Simonyan & Zisserman) as used in the AutoTM paper (§5.3).

* ``vgg19``: the standard 16-conv + 3-FC network (143,667,240 parameters at 1000
  classes, identical to torchvision's ``vgg19`` without dropout).
* ``vgg416``: the AutoTM artifact's very deep variant.  It follows the artifact's
  ``vgg416()`` layout exactly: a 3->64 conv, then per stage ``r`` same-width convs
  followed (in stages 1-3) by one channel-doubling conv, then a 2x2 maxpool, with
  ``r`` = (80, 81, 82, 83, 83).  That is 1 + 80+1 + 81+1 + 82+1 + 83 + 83 = 413
  convolutions, plus 3 FC layers = 416 weight layers; 580,217,064 parameters at
  1000 classes.  (Unlike VGG-19, the channel-doubling conv *ends* stages 1-3,
  e.g. the 64->128 conv runs at full resolution -- as in the artifact.)  It is
  initialized delta-orthogonally (see :meth:`VGG.init_weights`) so that signal
  and gradients survive the 413 plain convs.

All convolutions are 3x3, padding 1, followed by ReLU.  There is no dropout and
no batch norm.  An adaptive average pool to 7x7 sits before the classifier so
that the classifier is always 25088 -> 4096 -> 4096 -> num_classes regardless of
image size (at 224x224 input it is the identity).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["VGG", "vgg19", "vgg416", "VGG19_CFG", "VGG416_REPEATS", "vgg416_cfg"]

#: Layer configuration of VGG-19 ("E"): ints are conv output channels, "M" a maxpool.
VGG19_CFG: tuple[int | str, ...] = (
    64, 64, "M",
    128, 128, "M",
    256, 256, 256, 256, "M",
    512, 512, 512, 512, "M",
    512, 512, 512, 512, "M",
)  # fmt: skip

#: Same-width conv repeats per stage of the artifact's VGG-416.
VGG416_REPEATS: tuple[int, int, int, int, int] = (80, 81, 82, 83, 83)


def vgg416_cfg(repeats: Sequence[int] = VGG416_REPEATS) -> tuple[int | str, ...]:
    """Layer configuration of the artifact's VGG-416 (see module docstring)."""
    r1, r2, r3, r4, r5 = repeats
    cfg: list[int | str] = [64]
    cfg += [64] * r1 + [128, "M"]
    cfg += [128] * r2 + [256, "M"]
    cfg += [256] * r3 + [512, "M"]
    cfg += [512] * r4 + ["M"]
    cfg += [512] * r5 + ["M"]
    return tuple(cfg)


def _features(cfg: Sequence[int | str], in_channels: int = 3) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_channels
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            assert isinstance(v, int)
            layers.append(nn.Conv2d(c, v, kernel_size=3, padding=1))
            layers.append(nn.ReLU(inplace=False))
            c = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG-style plain network: ``features`` (3x3 convs + ReLU, 2x2 maxpools),
    adaptive average pool to 7x7, three FC layers (ReLU between, not after the last).

    ``init`` selects the conv initialization (see :meth:`init_weights`):
    ``"kaiming"`` (torchvision's scheme, used by vgg19) or
    ``"delta_orthogonal"`` (used by vgg416, whose 413 plain convs otherwise make
    activations and gradients vanish towards float32 underflow).
    """

    def __init__(self, cfg: Sequence[int | str], num_classes: int = 1000, init: str = "kaiming") -> None:
        super().__init__()
        if init not in ("kaiming", "delta_orthogonal"):
            raise InputError(f"unknown init {init!r}; valid: kaiming, delta_orthogonal")
        self.init = init
        self.features = _features(cfg)
        last = [v for v in cfg if v != "M"][-1]
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(int(last) * 7 * 7, 4096),
            nn.ReLU(inplace=False),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=False),
            nn.Linear(4096, num_classes),
        )
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialize every parameter.

        Linear layers: uniform with std 0.01, zero bias (torchvision's std, drawn
        uniform because uniform draws are ~3x faster on CPU, which matters for
        the 580M-parameter vgg416).  Convs, zero bias, and weights:

        * ``"kaiming"``: variance-matched uniform Kaiming (fan-out, ReLU gain),
          i.e. torchvision's VGG scheme.
        * ``"delta_orthogonal"`` (Xiao et al., 2018, "Dynamical isometry and a
          mean field theory of CNNs"): only the centre tap of each 3x3 kernel is
          non-zero, set to a (semi-)orthogonal matrix with ReLU gain sqrt(2).
          It preserves the signal norm through arbitrarily deep plain conv
          stacks; with Kaiming init the 413 convs of vgg416 shrink activations
          to ~1e-23 (and weight gradients to zero/denormals) at small images,
          mainly through the zero padding at 2x2 / 4x4 feature maps.
        """
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.zeros_(m.bias)
                if self.init == "kaiming":
                    nn.init.kaiming_uniform_(m.weight, mode="fan_out", nonlinearity="relu")
                else:
                    m.weight.zero_()
                    kh, kw = m.kernel_size
                    centre = torch.empty(m.out_channels, m.in_channels)
                    nn.init.orthogonal_(centre, gain=math.sqrt(2.0))
                    m.weight[:, :, kh // 2, kw // 2] = centre.to(m.weight.device)
            elif isinstance(m, nn.Linear):
                bound = 0.01 * math.sqrt(3.0)  # std 0.01
                nn.init.uniform_(m.weight, -bound, bound)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = x.flatten(1)
        return self.classifier(x)


def vgg19(num_classes: int = 1000) -> VGG:
    """VGG-19 (configuration E). 143,667,240 parameters at 1000 classes."""
    return VGG(VGG19_CFG, num_classes)


def vgg416(num_classes: int = 1000) -> VGG:
    """The AutoTM artifact's VGG-416: 413 3x3 convs + 3 FC layers (delta-orthogonal init)."""
    return VGG(vgg416_cfg(), num_classes, init="delta_orthogonal")
