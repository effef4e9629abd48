"""Tests for autotm.zoo: architectures, parameter counts, presets and workloads."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from autotm.zoo import (
    MIN_IMAGE,
    MODELS,
    PRESETS,
    VOCAB,
    Workload,
    all_workloads,
    preset_sizes,
    workload,
)
from autotm.zoo.inception import MIN_IMAGE as INCEPTION_MIN_IMAGE
from autotm.zoo.inception import feature_size
from autotm.zoo.transformer import SequenceCrossEntropy, transformer_param_count

# Exact parameter counts at 1000 classes (transformer: vocab 20000, 512 positions).
PARAMS = {
    "vgg19": 143_667_240,  # torchvision vgg19
    "vgg416": 580_217_064,
    "resnet50": 25_557_032,  # torchvision resnet50
    # torchvision-layout (post-activation) ResNet-200, as in timm / pytorchcv.  The
    # sometimes-quoted 64,669,864 is a pre-activation variant (3,968 fewer BN params).
    "resnet200": 64_673_832,
    "inception_v4": 42_679_816,  # timm inception_v4
    "densenet264": 21_122_792,  # transitions to 2k = 64 channels (paper), not 0.5x
    "transformer": 45_982_240,
}


@pytest.fixture(autouse=True, scope="module")
def _single_thread():  # type: ignore[no-untyped-def]
    # The development machine has 2 cores shared with other jobs.  When it is
    # oversubscribed, 2 OpenMP threads per op turn a 0.4 s training step into
    # ~40 s (threads wait at barriers for descheduled peers); 1 thread is immune.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def meta_model(name: str) -> nn.Module:
    return workload(name, "test").build_model(device="meta")


# --------------------------------------------------------------------------- counts


@pytest.mark.parametrize("name", MODELS)
def test_param_count_exact(name: str) -> None:
    assert n_params(meta_model(name)) == PARAMS[name]


def test_param_counts_published() -> None:
    assert n_params(meta_model("vgg19")) == 143_667_240
    assert n_params(meta_model("resnet50")) == 25_557_032
    assert n_params(meta_model("resnet200")) == 64_673_832
    assert abs(n_params(meta_model("inception_v4")) - 42.7e6) / 42.7e6 < 0.01


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", MODELS)
def test_param_count_independent_of_preset(name: str, preset: str) -> None:
    for batch, image in preset_sizes(name, preset):
        assert n_params(Workload(name, preset, batch, image).build_model(device="meta")) == PARAMS[name]


def test_layer_counts() -> None:
    def count(model: nn.Module, kind: type) -> int:
        return sum(isinstance(m, kind) for m in model.modules())

    assert (count(meta_model("vgg19"), nn.Conv2d), count(meta_model("vgg19"), nn.Linear)) == (16, 3)
    vgg416 = meta_model("vgg416")
    assert count(vgg416, nn.Conv2d) + count(vgg416, nn.Linear) == 416
    assert count(vgg416, nn.Conv2d) == 413
    assert count(vgg416, nn.MaxPool2d) == 5
    for name in ("vgg19", "vgg416"):
        m = meta_model(name)
        assert count(m, nn.BatchNorm2d) == 0
        assert count(m, nn.Dropout) == 0
    # 1 stem conv + 3 convs per bottleneck + 4 projection shortcuts.
    assert count(meta_model("resnet50"), nn.Conv2d) == 1 + 3 * 16 + 4
    assert count(meta_model("resnet200"), nn.Conv2d) == 1 + 3 * 66 + 4
    # 264 = stem conv + 2 convs per dense layer + 3 transitions + classifier.
    dn = meta_model("densenet264")
    assert count(dn, nn.Conv2d) + count(dn, nn.Linear) == 1 + 2 * (6 + 12 + 64 + 48) + 3 + 1


def test_transformer_param_formula() -> None:
    assert transformer_param_count(seq_len=512) == PARAMS["transformer"]
    longer = Workload("transformer", None, 1, 1024).build_model(device="meta")
    assert n_params(longer) == transformer_param_count(seq_len=1024)


def test_no_inplace_or_dropout() -> None:
    for name in MODELS:
        for m in meta_model(name).modules():
            assert not isinstance(m, nn.Dropout | nn.Dropout2d)
            assert not getattr(m, "inplace", False), f"{name}: in-place {type(m).__name__}"


# ----------------------------------------------------------------------- training


@pytest.mark.parametrize("name", MODELS)
def test_train_step_test_preset(name: str) -> None:
    w = workload(name, "test")
    model = w.build_model()
    x, y = w.make_batch()
    opt = w.make_optimizer(model.parameters())
    loss_fn = w.loss_fn()
    # The classifier's weight: in the 413-conv vgg416 the first layers' updates
    # are below float32 resolution (vanishing gradients through a plain stack).
    probe = [p for p in model.parameters() if p.dim() > 1][-1]
    before = probe.detach().clone()

    opt.zero_grad(set_to_none=True)
    out = model(x)
    if w.is_transformer:
        assert out.shape == (w.batch, w.image, VOCAB)
    else:
        assert out.shape == (w.batch, 1000)
    loss = loss_fn(out, y)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)
    opt.step()
    assert not torch.equal(before, probe.detach())
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --------------------------------------------------------------------- meta / large


@pytest.mark.parametrize("name", MODELS)
def test_meta_large_no_allocation(name: str) -> None:
    for batch, image in preset_sizes(name, "large"):
        w = Workload(name, "large", batch, image)
        model = w.build_model(device="meta")
        tensors = list(model.parameters()) + list(model.buffers())
        assert tensors and all(t.is_meta for t in tensors)
        x, y = w.make_batch(device="meta")
        assert x.is_meta and y.is_meta and y.dtype == torch.int64
        out = model(x)  # shape propagation only
        assert out.is_meta
        expected = (batch, image, VOCAB) if w.is_transformer else (batch, 1000)
        assert tuple(out.shape) == expected
        assert w.loss_fn()(out, y).is_meta


# -------------------------------------------------------------------- determinism


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_build_model_deterministic_and_rng_untouched() -> None:
    w = workload("resnet50", "test")
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    a = _state(w.build_model(seed=0))
    b = _state(w.build_model(seed=0))
    c = _state(w.build_model(seed=1))
    assert torch.equal(rng, torch.get_rng_state())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("name", [m for m in MODELS if m != "vgg416"])  # same class as vgg19
def test_init_weights_covers_everything(name: str) -> None:
    # Workload.build_model relies on init_weights() writing every parameter and
    # buffer of a to_empty() model; poison them first to prove it.
    model = meta_model(name).to_empty(device="cpu")
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.fill_(float("nan") if t.is_floating_point() else -1)
    model.init_weights()
    for k, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point():
            assert torch.isfinite(t).all(), k
        else:
            assert (t >= 0).all(), k


def test_make_batch() -> None:
    w = workload("vgg19", "test")
    x, y = w.make_batch(seed=3)
    x2, y2 = w.make_batch(seed=3)
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    assert 0 <= int(y.min()) and int(y.max()) < 1000
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, w.make_batch(seed=4)[0])

    t = workload("transformer", "test")
    ids, tgt = t.make_batch()
    assert ids.shape == tgt.shape == (2, 16)
    assert ids.dtype == tgt.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < VOCAB
    assert torch.equal(ids[:, 1:], tgt[:, :-1])  # next-token targets


def test_transformer_is_causal() -> None:
    w = workload("transformer", "test")
    model = w.build_model().eval()
    ids, _ = w.make_batch()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


# ------------------------------------------------------------- loss / optimizer


def test_loss_and_optimizer() -> None:
    lrs = {
        "vgg19": 0.05,
        "vgg416": 0.05,
        "resnet50": 0.001,
        "resnet200": 0.001,
        "inception_v4": 0.05,
        "densenet264": 0.001,
    }
    p = [nn.Parameter(torch.zeros(2))]
    for name, lr in lrs.items():
        w = workload(name)
        assert isinstance(w.loss_fn(), nn.CrossEntropyLoss)
        opt = w.make_optimizer(p)
        assert isinstance(opt, torch.optim.SGD)
        assert opt.param_groups[0]["lr"] == lr and opt.param_groups[0]["momentum"] == 0.9
    t = workload("transformer")
    assert isinstance(t.loss_fn(), SequenceCrossEntropy)
    opt = t.make_optimizer(p)
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["lr"] == 1e-4
    logits = torch.randn(2, 3, 7)
    target = torch.randint(0, 7, (2, 3))
    torch.testing.assert_close(
        t.loss_fn()(logits, target), nn.functional.cross_entropy(logits.reshape(6, 7), target.reshape(6))
    )


# ------------------------------------------------------------------------ presets


def test_presets_shape() -> None:
    for name in MODELS:
        for preset in PRESETS:
            sizes = preset_sizes(name, preset)
            assert sizes and all(isinstance(b, int) and isinstance(i, int) for b, i in sizes)
            assert all(b >= 1 and i >= MIN_IMAGE[name] for b, i in sizes)
            if preset == "gpu":
                assert len(sizes) >= 2
            else:
                assert len(sizes) == 1
    assert len(all_workloads()) == sum(len(preset_sizes(m, p)) for m in MODELS for p in PRESETS)


def test_paper_sizes() -> None:
    assert preset_sizes("vgg19", "test") == [(16, 32)]
    assert preset_sizes("transformer", "test") == [(2, 16)]
    conventional = {"vgg19": (2048, 224), "resnet200": (512, 224), "inception_v4": (1024, 299), "densenet264": (512, 224)}
    for name, size in conventional.items():
        assert preset_sizes(name, "conventional") == [size]
    large = {"vgg416": (320, 224), "resnet200": (2560, 224), "inception_v4": (6144, 299), "densenet264": (3072, 224)}
    for name, size in large.items():
        assert preset_sizes(name, "large") == [size]
    assert preset_sizes("vgg19", "gpu") == [(64, 224), (128, 224)]
    assert [b for b, _ in preset_sizes("resnet200", "gpu")] == [32, 64, 128]
    assert preset_sizes("inception_v4", "gpu") == [(64, 299), (128, 299), (256, 299)]
    assert [b for b, _ in preset_sizes("densenet264", "gpu")] == [32, 64, 128]


def test_inception_min_image() -> None:
    assert INCEPTION_MIN_IMAGE == 75
    assert feature_size(299) == 8
    assert feature_size(74) < 1 <= feature_size(75)
    # (batch 2: BatchNorm in training mode needs > 1 value per channel at 1x1)
    out = Workload("inception_v4", None, 2, 75).build_model(device="meta")(torch.empty(2, 3, 75, 75, device="meta"))
    assert out.shape == (2, 1000)
    with pytest.raises(ValueError, match="image size must be an int >= 75"):
        Workload("inception_v4", None, 1, 74)


def test_workload_overrides_and_name() -> None:
    w = workload("vgg19")
    assert (w.model, w.preset, w.batch, w.image) == ("vgg19", "test", 16, 32)
    assert w.name == "vgg19_batchsize_16_image_32"
    w2 = workload("resnet200", "gpu", batch=7)
    assert (w2.batch, w2.image) == (7, 224)
    assert workload("resnet50", "cpu", image=128).image == 128
    assert workload("transformer").name == "transformer_batchsize_2_seqlen_16"
    assert workload("densenet264", None, batch=3, image=96) == Workload("densenet264", None, 3, 96)
    with pytest.raises(AttributeError):
        w.batch = 3  # type: ignore[misc]


# ------------------------------------------------------------------------- errors


def test_unknown_model_and_preset() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg20'; valid models: vgg19, vgg416, .*transformer$"):
        workload("vgg20")
    with pytest.raises(ValueError, match="unknown preset 'huge'; valid presets: test, cpu, conventional, large, gpu$"):
        workload("vgg19", "huge")
    with pytest.raises(ValueError, match="unknown model"):
        preset_sizes("alexnet", "test")
    with pytest.raises(ValueError, match="unknown preset"):
        preset_sizes("vgg19", "tiny")
    with pytest.raises(ValueError, match="unknown model"):
        Workload("alexnet", None, 1, 224)
    with pytest.raises(ValueError, match="unknown preset"):
        Workload("vgg19", "tiny", 1, 224)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        Workload("vgg19", None, 0, 224)
    with pytest.raises(ValueError, match="image size must be an int >= 32"):
        Workload("vgg19", None, 1, 16)
    with pytest.raises(ValueError, match="needs both batch and image"):
        workload("vgg19", None, batch=4)
    for msg in (
        _message(lambda: workload("nope")),
        _message(lambda: workload("vgg19", "nope")),
    ):
        assert "\n" not in msg


def _message(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)
