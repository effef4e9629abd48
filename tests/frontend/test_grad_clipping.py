"""Gradient clipping inside the compiled step (`autotm.compile(..., clip_grad_norm=...)`),
bit for bit like an eager loop that calls torch.nn.utils.clip_grad_norm_ (or
clip_grad_value_) between backward and step, with its default (foreach) implementation."""

import math

import pytest
import torch

import autotm
from autotm.errors import CaptureError
from compat_models import MODELS
from eager_twin import train_twins
from tied_frozen_model import batches, lm_loss, model


def _two_groups(m):
    # (the tied embedding and the frozen layer: the clip's gradient list skips the frozen
    # one and holds the tied one once, in model.parameters() order)
    head = [p for n, p in m.named_parameters() if n.startswith(("mix.", "norm."))]
    rest = [p for n, p in m.named_parameters() if not n.startswith(("mix.", "norm."))]
    return torch.optim.Adam([{"params": rest}, {"params": head, "lr": 0.003}], lr=0.01)


def test_clip_grad_norm_is_eagers_clip_grad_norm_bit_for_bit():
    m = model()
    norms = []
    run = train_twins(m, _two_groups, lm_loss, batches(4), budget="1:1", clip_grad_norm=0.5,
                      eager_clip=lambda mm: norms.append(float(torch.nn.utils.clip_grad_norm_(mm.parameters(), 0.5))))
    assert run.mismatches == []  # losses, parameters, buffers, optimizer state, every step
    assert min(norms) > 0.5  # the clip scaled every step's gradients
    trainable = [p for p in m.parameters() if p.requires_grad]
    # one norm per gradient and one of the norms, not a foreach kernel over all gradients
    assert sum(k.op == "aten.linalg_vector_norm.default" for k in run.graph.kernels) == len(trainable) + 1


@pytest.mark.parametrize("options", [dict(clip_grad_value=0.02), dict(clip_grad_norm=0.1, clip_norm_type=math.inf)])
def test_clip_grad_value_and_inf_norm_are_eagers(options):
    def eager_clip(mm):
        if "clip_grad_value" in options:
            torch.nn.utils.clip_grad_value_(mm.parameters(), options["clip_grad_value"])
        else:
            torch.nn.utils.clip_grad_norm_(mm.parameters(), options["clip_grad_norm"], options["clip_norm_type"])

    m = model()
    run = train_twins(m, lambda mm: torch.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9), lm_loss, batches(),
                      budget="1:1", eager_clip=eager_clip, **options)
    assert run.mismatches == []


def test_lstm_trained_with_clip_grad_norm_as_eager():
    """The usual recipe for recurrent networks: an LSTM (oneDNN's fused layer) with clipping."""
    torch.manual_seed(0)
    net, make_optimizer, loss_fn, data = MODELS["lstm_direct"]()
    run = train_twins(net, make_optimizer, loss_fn, data, budget="2:1", clip_grad_norm=0.05,
                      eager_clip=lambda mm: torch.nn.utils.clip_grad_norm_(mm.parameters(), 0.05))
    assert run.mismatches == []


def test_clip_options_are_checked_before_anything_runs():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(CaptureError, match="clip_grad_norm and clip_grad_value together"):
        autotm.compile(m, lm_loss, opt, batches()[0], clip_grad_norm=1.0, clip_grad_value=0.1)
    with pytest.raises(CaptureError, match="clip_grad_norm must be a number"):
        autotm.compile(m, lm_loss, opt, batches()[0], clip_grad_norm="1.0")
    with pytest.raises(CaptureError, match="clip_norm_type must be positive"):
        autotm.compile(m, lm_loss, opt, batches()[0], clip_grad_norm=1.0, clip_norm_type=0)


@pytest.mark.parametrize("layout", ["transposed", "channels_last", "strided"])
def test_a_gradient_is_clipped_in_the_layout_eagers_grad_has(layout):
    """(torch's export has handed every gradient tried in its parameter's strides; should
    one come otherwise, the clip reduces it in the layout AccumulateGrad gives `.grad`.)"""
    from autotm.frontend.grad_clipping import _like

    base = {"transposed": lambda: torch.randn(10, 16).t(),
            "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
            "strided": lambda: torch.randn(4, 6)[:, ::2]}[layout]()
    p = base.detach().requires_grad_(True)
    incoming = torch.randn(p.shape)  # contiguous, as a kernel's output
    (p * incoming).sum().backward()
    got = _like(incoming, p)
    assert got.stride() == p.grad.stride() and torch.equal(got, p.grad)
