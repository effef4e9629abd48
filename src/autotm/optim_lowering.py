"""Optimizer updates as pure functions of (param, grad, state), op for op like torch.optim.

torch.optim mutates in place and reads Adam's step count with `.item()`, which a traced
graph cannot do. These lowerings produce new tensors instead (so no mutation hides from
liveness) and take the step-dependent Adam scalars as 0-dim float64 graph inputs computed
in Python exactly as torch.optim computes them. The arithmetic is the same sequence of ATen
kernels as torch.optim's single-tensor (for-loop) path, which is what eager PyTorch runs
on CPU, so results are bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import CaptureError


@dataclass(frozen=True)
class GroupHyper:
    """Hyperparameters of one param group, read from `optimizer.param_groups`."""

    lr: float
    weight_decay: float
    maximize: bool
    # SGD
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    # Adam / AdamW
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    amsgrad: bool = False
    decoupled_weight_decay: bool = False


@dataclass(frozen=True)
class OptimizerLowering:
    kind: str  # "sgd" or "adam"
    groups: tuple[GroupHyper, ...]

    # ---- what the graph carries per parameter -----------------------------------------
    def state_slots(self, group: int) -> tuple[str, ...]:
        h = self.groups[group]
        if self.kind == "sgd":
            return ("momentum_buffer",) if h.momentum != 0 else ()
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if h.amsgrad else ()) + ("step",)

    def scalar_slots(self, group: int) -> tuple[str, ...]:
        return ("neg_step_size", "bias_correction2_sqrt") if self.kind == "adam" else ()

    def initial_state(self, group: int, param: torch.Tensor, state: dict) -> dict[str, torch.Tensor]:
        """The state tensors for `param`, from the optimizer's own state when it has them.

        A fresh SGD momentum buffer is zeros: torch.optim clones the first gradient instead,
        and 0 * momentum + grad equals grad exactly, so the two agree bit for bit.
        """
        out = {}
        for slot in self.state_slots(group):
            if slot in state and state[slot] is not None:
                out[slot] = state[slot]
            elif slot == "step":
                out[slot] = torch.zeros((), dtype=torch.float32, device="cpu")
            else:
                out[slot] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return out

    def scalars(self, group: int, step: float) -> dict[str, torch.Tensor]:
        """Per-iteration scalars for `group`, where `step` is the count after this iteration's
        increment; the same Python float arithmetic as torch.optim's non-capturable Adam."""
        if self.kind != "adam":
            return {}
        h = self.groups[group]
        bias_correction1 = 1 - h.beta1**step
        bias_correction2 = 1 - h.beta2**step
        step_size = h.lr / bias_correction1
        return {
            "neg_step_size": torch.tensor(-step_size, dtype=torch.float64),
            "bias_correction2_sqrt": torch.tensor(bias_correction2**0.5, dtype=torch.float64),
        }

    # ---- the update, traced into the graph --------------------------------------------
    def update(self, group: int, param, grad, state: dict, scalars: dict):
        """Return (new_param, new_state) without mutating anything."""
        h = self.groups[group]
        if h.maximize:
            grad = torch.neg(grad)
        if self.kind == "sgd":
            return self._sgd(h, param, grad, state)
        return self._adam(h, param, grad, state, scalars)

    @staticmethod
    def _sgd(h: GroupHyper, param, grad, state):
        new_state = {}
        if h.weight_decay != 0:
            grad = grad.add(param, alpha=h.weight_decay)
        if h.momentum != 0:
            buf = state["momentum_buffer"].mul(h.momentum).add(grad, alpha=1 - h.dampening)
            new_state["momentum_buffer"] = buf
            grad = grad.add(buf, alpha=h.momentum) if h.nesterov else buf
        return param.add(grad, alpha=-h.lr), new_state

    @staticmethod
    def _adam(h: GroupHyper, param, grad, state, scalars):
        new_state = {"step": state["step"].add(1)}
        if h.weight_decay != 0:
            if h.decoupled_weight_decay:
                param = param.mul(1 - h.lr * h.weight_decay)
            else:
                grad = grad.add(param, alpha=h.weight_decay)
        exp_avg = state["exp_avg"].lerp(grad, 1 - h.beta1)
        exp_avg_sq = state["exp_avg_sq"].mul(h.beta2).addcmul(grad, grad, value=1 - h.beta2)
        new_state["exp_avg"], new_state["exp_avg_sq"] = exp_avg, exp_avg_sq
        second = exp_avg_sq
        if h.amsgrad:
            second = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
            new_state["max_exp_avg_sq"] = second
        denom = second.sqrt().div(scalars["bias_correction2_sqrt"]).add(h.eps)
        # param.addcdiv_(exp_avg, denom, value=-step_size) computes self + (value * t1) / t2
        # with value cast to the tensor's dtype; the same three roundings in three kernels:
        return param.add(exp_avg.mul(scalars["neg_step_size"]).div(denom)), new_state


def lower_optimizer(optimizer: torch.optim.Optimizer) -> OptimizerLowering:
    """Read an optimizer's type and hyperparameters; refuse what we cannot reproduce exactly."""
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        kind = "sgd"
    elif isinstance(optimizer, torch.optim.Adam):  # AdamW subclasses Adam in torch >= 2.7
        kind = "adam"
    elif isinstance(optimizer, getattr(torch.optim, "AdamW", ())):
        kind = "adam"
    else:
        raise CaptureError(f"optimizer {name} is not supported; use torch.optim.SGD, Adam or AdamW")
    groups = []
    for g in optimizer.param_groups:
        for flag in ("fused", "capturable", "differentiable"):
            if g.get(flag):
                raise CaptureError(f"{name}({flag}=True) is not supported; construct it with {flag}=False")
        lr = g["lr"]
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if kind == "sgd":
            if g.get("dampening", 0) != 0:
                raise CaptureError("SGD with dampening != 0 is not supported (its first step differs)")
            groups.append(GroupHyper(lr=lr, weight_decay=g["weight_decay"], maximize=g.get("maximize", False),
                                     momentum=g["momentum"], dampening=g["dampening"], nesterov=g["nesterov"]))
        else:
            b1, b2 = (float(b) for b in g["betas"])
            decoupled = g.get("decoupled_weight_decay", False) or name == "AdamW"
            groups.append(GroupHyper(lr=lr, weight_decay=g["weight_decay"], maximize=g.get("maximize", False),
                                     beta1=b1, beta2=b2, eps=g["eps"], amsgrad=g["amsgrad"],
                                     decoupled_weight_decay=decoupled))
    return OptimizerLowering(kind=kind, groups=tuple(groups))
