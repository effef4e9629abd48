"""Model zoo: the AutoTM paper's networks (§5.3) in plain PyTorch, plus a workload registry."""

from .densenet import densenet264
from .inception import inception_v4
from .registry import (
    MIN_IMAGE,
    MODELS,
    NUM_CLASSES,
    PRESETS,
    VOCAB,
    Workload,
    all_workloads,
    preset_sizes,
    workload,
)
from .resnet import resnet50, resnet200
from .transformer import SequenceCrossEntropy, transformer
from .vgg import vgg19, vgg416

__all__ = [
    "MIN_IMAGE",
    "MODELS",
    "NUM_CLASSES",
    "PRESETS",
    "VOCAB",
    "SequenceCrossEntropy",
    "Workload",
    "all_workloads",
    "densenet264",
    "inception_v4",
    "preset_sizes",
    "resnet200",
    "resnet50",
    "transformer",
    "vgg19",
    "vgg416",
    "workload",
]
