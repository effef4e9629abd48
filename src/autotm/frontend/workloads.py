"""Capture zoo workloads, on real or fake tensors, and run them eagerly as the reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .capture import capture
from ..ir.graph import TrainingGraph
from ..zoo import Workload


def capture_workload(w: Workload, *, fake: bool = True, seed: int = 0) -> TrainingGraph:
    """Capture one training iteration of `w`.

    fake=True builds the model and batch inside a FakeTensorMode: nothing the size of the
    workload is allocated, so a 650 GB iteration is captured in seconds. The graph is the
    same either way; only a real capture can be replayed with the model's own weights.
    """
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            model = _fake_on_cpu(w.build_model(device="meta"))
            batch = w.make_batch(seed=seed)
            opt = w.make_optimizer(model.parameters())
            return capture(model, w.loss_fn(), opt, batch, name=w.name)
    model = w.build_model(seed=seed)
    return capture(model, w.loss_fn(), w.make_optimizer(model.parameters()), w.make_batch(seed=seed), name=w.name)


def _fake_on_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """Replace a meta-device model's parameters and buffers with fake CPU tensors of the
    same shape (called inside a FakeTensorMode, so nothing is allocated)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                fake = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="cpu")
                module._parameters[name] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device="cpu")
    return model


@dataclass
class EagerRun:
    """What plain PyTorch computed, iteration by iteration."""

    losses: list[torch.Tensor]
    gradients: list[dict[str, torch.Tensor]]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


def eager_training(w: Workload, iterations: int, *, seed: int = 0, digest=None, device=None) -> EagerRun:
    """Train `w` eagerly for `iterations` on batches seed, seed+1, ... (the reference).

    `device`: train there (default: the CPU). On a GPU the optimizer takes its single-tensor
    (for-loop) path, as it does on the CPU: the captured graph's update is that path's
    kernels, and the multi-tensor (foreach) kernels eager PyTorch picks on a GPU may round
    differently."""
    model = w.build_model(seed=seed, device=device)
    opt = w.make_optimizer(model.parameters())
    if device is not None and torch.device(device).type != "cpu":
        for group in opt.param_groups:
            group["foreach"] = False
    loss_fn = w.loss_fn()
    losses, grads = [], []
    for i in range(iterations):
        x, y = w.make_batch(seed=seed + i, device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        grad = {n: p.grad for n, p in model.named_parameters()}
        grads.append({n: digest(g) for n, g in grad.items()} if digest else {n: g.clone() for n, g in grad.items()})
        opt.step()
        losses.append(loss.detach())
    return EagerRun(losses, grads, model, opt)
