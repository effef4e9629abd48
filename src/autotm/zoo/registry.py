"""Workload registry: the AutoTM paper's networks (§5.3) at named problem sizes.

A :class:`Workload` is a (model, batch, image) triple plus everything needed to
run one training iteration on it: a deterministic model, a deterministic batch,
the loss and the optimizer.  ``image`` is the square input resolution for the
CNNs and the *sequence length* for the transformer.

Presets (``(batch, image)`` lists, see :data:`_SIZES` for the per-model values
and the reasoning behind each):

* ``test``         -- the smallest sizes each architecture accepts; one training
                      iteration takes well under ~2 s on a 2-core CPU.
* ``cpu``          -- one training iteration takes roughly 1-10 s on a 2-core CPU.
* ``conventional`` -- the paper's "conventional" (fits-in-DRAM-ish) sizes.
* ``large``        -- the paper's large (~650 GB footprint) sizes.
* ``gpu``          -- the paper's GPU experiment sizes (several per model).

Parameter counts are always those of the full 1000-class networks, whatever
the preset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import densenet, inception, resnet, transformer, vgg
from ..errors import InputError

__all__ = [
    "MODELS",
    "PRESETS",
    "NUM_CLASSES",
    "VOCAB",
    "MIN_IMAGE",
    "Workload",
    "preset_sizes",
    "workload",
    "all_workloads",
]

MODELS: tuple[str, ...] = (
    "vgg19",
    "vgg416",
    "resnet50",
    "resnet200",
    "inception_v4",
    "densenet264",
    "transformer",
)

PRESETS: tuple[str, ...] = ("test", "cpu", "conventional", "large", "gpu")

#: Number of classes of every CNN (ImageNet).
NUM_CLASSES: int = 1000
#: Transformer vocabulary size.
VOCAB: int = 20000
#: The transformer's learned positional table always has at least this many rows,
#: so that its parameter count (45,982,240) does not depend on the preset; a
#: longer sequence grows the table to the sequence length.
TRANSFORMER_MIN_POSITIONS: int = 512

#: Smallest ``image`` accepted for each model (CNNs: square resolution,
#: transformer: sequence length).  VGG: five 2x2 maxpools need 32.  Inception-v4:
#: valid-padded stem and reductions need 75 (:data:`autotm.zoo.inception.MIN_IMAGE`).
#: DenseNet (whose 2x2 avgpool transitions need >= 29) and ResNet (any size,
#: all convs padded) are floored at 32, where their last stage is 1x1.
MIN_IMAGE: dict[str, int] = {
    "vgg19": 32,
    "vgg416": 32,
    "resnet50": 32,
    "resnet200": 32,
    "inception_v4": inception.MIN_IMAGE,  # 75
    "densenet264": 32,
    "transformer": 1,
}

# Footprint notes below ("~N GiB") are the bytes of activations autograd saves
# for backward (measured per sample in float32 with saved_tensors_hooks on CPU,
# de-duplicated by storage) times the batch; parameters, gradients and
# optimizer state come on top.  Per sample: vgg19@224 75 MiB, vgg416@224
# ~1.93 GiB, resnet50@224 82 MiB, resnet200@224 244 MiB, inception_v4@299
# 165 MiB, densenet264@224 221 MiB, transformer@512 196 MiB.
#
# `test` and `cpu` seconds: one warm training iteration (forward, backward,
# optimizer step) measured with torch 2.13 on the 2-core development machine
# while it was lightly shared (load ~1.5-2); under heavier sharing (load 4-6,
# OpenMP threads oversubscribed) the same iterations ran 2-20x slower.  The
# first iteration also pays for allocating gradients and optimizer state:
# for vgg416 (580M parameters, ~7 GB resident during training) that first
# iteration takes ~7-9 s and build_model() another ~2-4 s.
_SIZES: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {
    # Smallest sizes that train sanely.  BatchNorm in training mode over a 1x1
    # last stage with batch 2 sees 2 values per channel and the first gradients
    # explode (1e8-1e15, NaN within 1-3 steps), so the BN networks use batch 2 at
    # the smallest image whose last stage is 2x2 (ResNet/DenseNet 64: 2x2 at
    # layer4 / block 4; Inception-v4 107: 2x2 at the Inception-C blocks; the
    # architectures themselves accept 32 / 32 / 75).
    "test": {
        "vgg19": ((16, 32),),  # the artifact's test_vgg batch; 0.5 s
        "vgg416": ((1, 32),),  # no BN, so batch 1; 1.5-1.9 s warm (see note above)
        "resnet50": ((2, 64),),  # 0.12 s
        "resnet200": ((2, 64),),  # 0.3 s
        "inception_v4": ((2, 107),),  # 0.23 s
        "densenet264": ((2, 64),),  # 0.19 s
        "transformer": ((2, 16),),  # full N=8, d=512 config; 0.17-0.45 s
    },
    "cpu": {
        "vgg19": ((8, 224),),  # 3.7-4.3 s
        "vgg416": ((2, 64),),  # ~3 s warm (see note above)
        "resnet50": ((16, 224),),  # 2.0-2.4 s
        "resnet200": ((8, 224),),  # 3.5-3.9 s
        "inception_v4": ((8, 299),),  # 2.9 s
        "densenet264": ((8, 224),),  # 1.7 s
        "transformer": ((8, 256),),  # 1.8-2.6 s
    },
    "conventional": {
        "vgg19": ((2048, 224),),  # paper; ~150 GiB
        "vgg416": ((128, 224),),  # our choice: ~247 GiB, same order as the paper's conventional nets
        "resnet50": ((512, 224),),  # our choice: resnet200's batch; ~41 GiB
        "resnet200": ((512, 224),),  # paper; ~122 GiB
        "inception_v4": ((1024, 299),),  # paper; ~165 GiB
        "densenet264": ((512, 224),),  # paper; ~110 GiB
        "transformer": ((64, 512),),  # our choice: batch 64 x 512 tokens; ~12 GiB
    },
    "large": {
        "vgg19": ((8192, 224),),  # our choice: ~600 GiB, like the paper's large nets
        "vgg416": ((320, 224),),  # paper; ~620 GiB
        "resnet50": ((8192, 224),),  # our choice: ~660 GiB
        "resnet200": ((2560, 224),),  # paper; ~610 GiB
        "inception_v4": ((6144, 299),),  # paper; ~990 GiB by our measure
        "densenet264": ((3072, 224),),  # paper; ~660 GiB
        "transformer": ((3072, 512),),  # our choice: ~590 GiB
    },
    "gpu": {
        "vgg19": ((64, 224), (128, 224)),  # paper
        "vgg416": ((16, 224), (32, 224)),  # paper
        "resnet50": ((64, 224), (128, 224)),  # paper
        "resnet200": ((32, 224), (64, 224), (128, 224)),  # paper
        "inception_v4": ((64, 299), (128, 299), (256, 299)),  # paper
        "densenet264": ((32, 224), (64, 224), (128, 224)),  # paper
        "transformer": ((16, 512), (32, 512)),  # our choice
    },
}

# Learning rates of the paper's training set-ups (SGD, momentum 0.9).  Note:
# repeatedly stepping vgg19 on one fixed random batch at lr 0.05 with momentum
# 0.9 diverges (loss ~1e5 then NaN after ~5-8 iterations at the test and cpu
# sizes); lr 0.005 stays finite.  One iteration, as the planner needs, is fine.
_SGD_LR: dict[str, float] = {
    "vgg19": 0.05,
    "vgg416": 0.05,
    "resnet50": 0.001,
    "resnet200": 0.001,
    "inception_v4": 0.05,
    "densenet264": 0.001,
}
_ADAM_LR: float = 1e-4

_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "vgg19": lambda: vgg.vgg19(NUM_CLASSES),
    "vgg416": lambda: vgg.vgg416(NUM_CLASSES),
    "resnet50": lambda: resnet.resnet50(NUM_CLASSES),
    "resnet200": lambda: resnet.resnet200(NUM_CLASSES),
    "inception_v4": lambda: inception.inception_v4(NUM_CLASSES),
    "densenet264": lambda: densenet.densenet264(NUM_CLASSES),
}


def _check_model(model: str) -> None:
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; valid models: {', '.join(MODELS)}")


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")


def preset_sizes(model: str, preset: str) -> list[tuple[int, int]]:
    """The ``(batch, image)`` sizes of ``model`` in ``preset`` (several for ``gpu``)."""
    _check_model(model)
    _check_preset(preset)
    return list(_SIZES[preset][model])


@dataclass(frozen=True)
class Workload:
    """One network at one problem size.

    ``image`` is the square input resolution for the CNNs and the sequence
    length for the transformer.  ``preset`` records where the size came from
    (``None`` for a hand-picked size).
    """

    model: str
    preset: str | None
    batch: int
    image: int

    def __post_init__(self) -> None:
        _check_model(self.model)
        if self.preset is not None:
            _check_preset(self.preset)
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise InputError(f"batch must be a positive int, got {self.batch!r}")
        lo = MIN_IMAGE[self.model]
        if isinstance(self.image, bool) or not isinstance(self.image, int) or self.image < lo:
            what = "sequence length" if self.is_transformer else "image size"
            raise InputError(f"{self.model}: {what} must be an int >= {lo}, got {self.image!r}")

    # ------------------------------------------------------------------ naming
    @property
    def is_transformer(self) -> bool:
        return self.model == "transformer"

    @property
    def name(self) -> str:
        """E.g. ``vgg19_batchsize_16_image_32`` or ``transformer_batchsize_2_seqlen_16``."""
        if self.is_transformer:
            return f"{self.model}_batchsize_{self.batch}_seqlen_{self.image}"
        return f"{self.model}_batchsize_{self.batch}_image_{self.image}"

    def __str__(self) -> str:
        return self.name

    # ------------------------------------------------------------------- model
    def _construct(self) -> nn.Module:
        if self.is_transformer:
            return transformer.transformer(
                vocab=VOCAB, seq_len=max(TRANSFORMER_MIN_POSITIONS, self.image)
            )
        return _BUILDERS[self.model]()

    def build_model(self, device: str | torch.device | None = None, seed: int = 0) -> nn.Module:
        """Build the network, deterministically from ``seed``, in training mode.

        ``device="meta"`` constructs every parameter and buffer directly on the
        meta device (no storage is allocated), so even the ``large`` workloads
        can be described cheaply.  For any other device the weights are drawn
        on the CPU inside :func:`torch.random.fork_rng` (the global RNG state is
        left untouched) and then moved to ``device``; the weights for a given
        seed are therefore bit-identical whatever the target device.
        """
        dev = torch.device("cpu") if device is None else torch.device(device)
        # Construct on meta first: the layers' default initializers are then
        # no-ops, and the real weights are drawn exactly once, by the model's
        # own ``init_weights()`` (which covers every parameter and buffer).
        with torch.device("meta"):
            model = self._construct()
        if dev.type == "meta":
            return model.train()
        model = model.to_empty(device="cpu")
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            model.init_weights()  # type: ignore[operator]
        if dev.type != "cpu":
            model = model.to(dev)
        return model.train()

    # ------------------------------------------------------------------- data
    def make_batch(self, seed: int = 0, device: str | torch.device | None = None) -> tuple[Tensor, Tensor]:
        """Deterministic ``(inputs, targets)`` drawn from a private generator.

        CNNs: float32 ``randn`` images ``[batch, 3, image, image]`` and int64
        labels ``[batch]`` in ``[0, 1000)``.  Transformer: int64 token ids
        ``[batch, seq]`` in ``[0, vocab)`` and the next-token targets
        ``[batch, seq]`` (the same random stream shifted by one).  Drawn on the
        CPU (so identical for every device) and then moved to ``device``;
        ``device="meta"`` returns uninitialized meta tensors of the right shape
        and dtype without allocating.
        """
        shape_x = (self.batch, self.image) if self.is_transformer else (self.batch, 3, self.image, self.image)
        shape_y = (self.batch, self.image) if self.is_transformer else (self.batch,)
        if device is not None and torch.device(device).type == "meta":
            dtype_x = torch.int64 if self.is_transformer else torch.float32
            return (
                torch.empty(shape_x, dtype=dtype_x, device="meta"),
                torch.empty(shape_y, dtype=torch.int64, device="meta"),
            )
        g = torch.Generator(device="cpu").manual_seed(seed)
        if self.is_transformer:
            stream = torch.randint(0, VOCAB, (self.batch, self.image + 1), generator=g, dtype=torch.int64)
            x = stream[:, :-1].contiguous()
            y = stream[:, 1:].contiguous()
        else:
            x = torch.randn(shape_x, generator=g, dtype=torch.float32)
            y = torch.randint(0, NUM_CLASSES, shape_y, generator=g, dtype=torch.int64)
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x, y

    # -------------------------------------------------------- loss / optimizer
    def loss_fn(self) -> nn.Module:
        """``nn.CrossEntropyLoss()``; for the transformer, the flattened-sequence version."""
        if self.is_transformer:
            return transformer.SequenceCrossEntropy()
        return nn.CrossEntropyLoss()

    @property
    def learning_rate(self) -> float:
        return _ADAM_LR if self.is_transformer else _SGD_LR[self.model]

    def make_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """SGD (paper learning rate, momentum 0.9) for the CNNs; Adam(1e-4) for the transformer."""
        if self.is_transformer:
            return torch.optim.Adam(params, lr=_ADAM_LR)
        return torch.optim.SGD(params, lr=_SGD_LR[self.model], momentum=0.9)


def workload(
    model: str,
    preset: str | None = "test",
    batch: int | None = None,
    image: int | None = None,
) -> Workload:
    """The workload for ``model`` at ``preset``'s first size.

    ``batch`` / ``image`` override the preset's values.  With ``preset=None``
    both must be given.
    """
    _check_model(model)
    if preset is None:
        if batch is None or image is None:
            raise InputError("preset=None needs both batch and image")
        return Workload(model, None, batch, image)
    b, i = preset_sizes(model, preset)[0]
    return Workload(model, preset, b if batch is None else batch, i if image is None else image)


def all_workloads(presets: Sequence[str] = PRESETS) -> list[Workload]:
    """Every (model, preset, size) workload, all sizes of multi-size presets included."""
    out = []
    for p in presets:
        for m in MODELS:
            out += [Workload(m, p, b, i) for b, i in preset_sizes(m, p)]
    return out
