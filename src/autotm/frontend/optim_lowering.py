"""Optimizer updates as pure functions of (param, grad, state), op for op like torch.optim.

torch.optim mutates in place and reads Adam's step count with `.item()`, which a traced
graph cannot do. These lowerings produce new tensors instead (so no mutation hides from
liveness) and take the step-dependent Adam scalars as 0-dim float64 graph inputs computed
in Python exactly as torch.optim computes them. The arithmetic is the same sequence of ATen
kernels as torch.optim's single-tensor (for-loop) path, which is what eager PyTorch runs
on CPU, so results are bit-identical.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ..errors import CaptureError, StateChanged


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


# Hyperparameters a compiled step reads at every step (the others shape the graph: changing
# them between steps is refused, see `live_groups`).
REBINDABLE = ("lr", "weight_decay", "momentum", "beta1", "beta2", "eps")


def derived(h: GroupHyper) -> dict[str, float]:
    """Every number an update kernel takes from the hyperparameters, computed in Python as
    torch.optim computes it (`param.add_(grad, alpha=-lr)`, `param.mul_(1 - lr * weight_decay)`,
    `exp_avg.lerp_(grad, 1 - beta1)`, ...), by name: the lowering reads them from here, so
    that a traced graph's kernel arguments can be found and rebound (capture, executor)."""
    return {"neg_lr": -h.lr, "weight_decay": h.weight_decay, "momentum": h.momentum,
            "decay": 1 - h.lr * h.weight_decay, "one_minus_beta1": 1 - h.beta1, "beta2": h.beta2,
            "one_minus_beta2": 1 - h.beta2, "eps": h.eps}


def used_names(kind: str, h: GroupHyper) -> set[str]:
    """The names of `derived` that the update of a parameter of group `h` passes to kernels."""
    if kind == "sgd":
        return {"neg_lr"} | ({"weight_decay"} if h.weight_decay != 0 else set()) | (
            {"momentum"} if h.momentum != 0 else set())
    wd = set()
    if h.weight_decay != 0:
        wd = {"decay"} if h.decoupled_weight_decay else {"weight_decay"}
    return {"one_minus_beta1", "beta2", "one_minus_beta2", "eps"} | wd


def sentinel(h: GroupHyper, seed: int) -> GroupHyper:
    """`h` with its rebindable values replaced by odd random numbers (zero stays zero where
    zero decides the graph's shape), so that the traced kernels' arguments derived from them
    can be told apart: capture traces with these, then puts the real values in."""
    rng = random.Random(0x5EED + seed)
    odd = lambda: rng.uniform(0.05, 0.95)  # noqa: E731
    return replace(h, lr=odd(), eps=odd() * 1e-3, beta1=odd(), beta2=odd(),
                   weight_decay=odd() if h.weight_decay != 0 else 0.0,
                   momentum=odd() if h.momentum != 0 else 0.0)


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

    def scalars(self, group: int, step: float, hyper: GroupHyper | None = None) -> dict[str, torch.Tensor]:
        """Per-iteration scalars for `group`, where `step` is the count after this iteration's
        increment; the same Python float arithmetic as torch.optim's non-capturable Adam.
        `hyper`: the group's hyperparameters now (default: as captured)."""
        if self.kind != "adam":
            return {}
        h = hyper if hyper is not None else self.groups[group]
        bias_correction1 = 1 - h.beta1**step
        bias_correction2 = 1 - h.beta2**step
        step_size = h.lr / bias_correction1
        return {
            "neg_step_size": torch.tensor(-step_size, dtype=torch.float64),
            "bias_correction2_sqrt": torch.tensor(bias_correction2**0.5, dtype=torch.float64),
        }

    # ---- the update, traced into the graph --------------------------------------------
    def with_sentinels(self) -> "OptimizerLowering":
        """This lowering with every group's rebindable values replaced by `sentinel`s."""
        return replace(self, groups=tuple(sentinel(h, gi) for gi, h in enumerate(self.groups)))

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
        d = derived(h)
        if h.weight_decay != 0:
            grad = grad.add(param, alpha=d["weight_decay"])
        if h.momentum != 0:
            buf = state["momentum_buffer"].mul(d["momentum"]).add(grad, alpha=1 - h.dampening)
            new_state["momentum_buffer"] = buf
            grad = grad.add(buf, alpha=d["momentum"]) if h.nesterov else buf
        return param.add(grad, alpha=d["neg_lr"]), new_state

    @staticmethod
    def _adam(h: GroupHyper, param, grad, state, scalars):
        new_state = {"step": state["step"].add(1)}
        d = derived(h)
        if h.weight_decay != 0:
            if h.decoupled_weight_decay:
                param = param.mul(d["decay"])
            else:
                grad = grad.add(param, alpha=d["weight_decay"])
        exp_avg = state["exp_avg"].lerp(grad, d["one_minus_beta1"])
        exp_avg_sq = state["exp_avg_sq"].mul(d["beta2"]).addcmul(grad, grad, value=d["one_minus_beta2"])
        new_state["exp_avg"], new_state["exp_avg_sq"] = exp_avg, exp_avg_sq
        second = exp_avg_sq
        if h.amsgrad:
            second = torch.maximum(state["max_exp_avg_sq"], exp_avg_sq)
            new_state["max_exp_avg_sq"] = second
        denom = second.sqrt().div(scalars["bias_correction2_sqrt"]).add(d["eps"])
        # param.addcdiv_(exp_avg, denom, value=-step_size) computes self + (value * t1) / t2
        # with value cast to the tensor's dtype; the same three roundings in three kernels:
        return param.add(exp_avg.mul(scalars["neg_step_size"]).div(denom)), new_state


def _kind(optimizer: torch.optim.Optimizer) -> str:
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    if isinstance(optimizer, torch.optim.Adam):  # AdamW subclasses Adam in torch >= 2.7
        return "adam"
    if isinstance(optimizer, getattr(torch.optim, "AdamW", ())):
        return "adam"
    raise CaptureError(f"optimizer {name} is not supported; use torch.optim.SGD, Adam or AdamW")


def _scalar(v) -> float:
    return float(v) if isinstance(v, torch.Tensor) else v


def _group_hyper(name: str, kind: str, g: dict) -> GroupHyper:
    for flag in ("fused", "capturable", "differentiable"):
        if g.get(flag):
            raise CaptureError(f"{name}({flag}=True) is not supported; construct it with {flag}=False")
    lr = _scalar(g["lr"])
    if kind == "sgd":
        return GroupHyper(lr=lr, weight_decay=_scalar(g["weight_decay"]), maximize=g.get("maximize", False),
                          momentum=_scalar(g["momentum"]), dampening=g["dampening"], nesterov=g["nesterov"])
    b1, b2 = (float(b) for b in g["betas"])
    decoupled = g.get("decoupled_weight_decay", False) or name == "AdamW"
    return GroupHyper(lr=lr, weight_decay=_scalar(g["weight_decay"]), maximize=g.get("maximize", False),
                      beta1=b1, beta2=b2, eps=g["eps"], amsgrad=g["amsgrad"], decoupled_weight_decay=decoupled)


def lower_optimizer(optimizer: torch.optim.Optimizer) -> OptimizerLowering:
    """Read an optimizer's type and hyperparameters; refuse what we cannot reproduce exactly."""
    name = type(optimizer).__name__
    kind = _kind(optimizer)
    groups = []
    for g in optimizer.param_groups:
        if kind == "sgd" and g.get("dampening", 0) != 0:
            raise CaptureError("SGD with dampening != 0 is not supported (its first step differs)")
        groups.append(_group_hyper(name, kind, g))
    return OptimizerLowering(kind=kind, groups=tuple(groups))


# what may not change between compiled steps, by GroupHyper field: how to say it
_STRUCTURAL = {"maximize": "maximize", "nesterov": "nesterov", "amsgrad": "amsgrad",
               "decoupled_weight_decay": "decoupled_weight_decay", "dampening": "dampening"}


def live_groups(optimizer: torch.optim.Optimizer, lowering: OptimizerLowering,
                params: list[tuple[int, ...]]) -> tuple[GroupHyper, ...]:
    """The optimizer's hyperparameters now, one GroupHyper per group, for a graph captured
    with `lowering` over `params` (per group, the ids of its parameters).

    The values in REBINDABLE may change between steps (a scheduler, a hand edit); anything
    that changes the traced update (its flags, momentum or weight_decay to or from zero, the
    groups or their parameters) raises StateChanged naming the hyperparameter and group."""
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if len(groups) != len(lowering.groups):
        raise StateChanged(f"{name} has {len(groups)} param groups now, {len(lowering.groups)} when compiled; "
                           "compile again after changing the groups")
    out = []
    for gi, (g, before) in enumerate(zip(groups, lowering.groups)):
        if tuple(id(p) for p in g["params"]) != params[gi]:
            raise StateChanged(f"{name} param group {gi}: its parameters changed since compile; compile again")
        try:
            h = _group_hyper(name, lowering.kind, g)
        except CaptureError as e:
            raise StateChanged(f"{name} param group {gi}: {e}") from None
        for field, said in _STRUCTURAL.items():
            if getattr(h, field) != getattr(before, field):
                raise StateChanged(f"{name} param group {gi}: {said} changed from {getattr(before, field)} to "
                                   f"{getattr(h, field)} since compile; it changes the update's kernels, compile again")
        for field in ("momentum", "weight_decay"):
            if (getattr(h, field) != 0) != (getattr(before, field) != 0):
                raise StateChanged(f"{name} param group {gi}: {field} changed from {getattr(before, field)} to "
                                   f"{getattr(h, field)} since compile; a change to or from 0 changes the update's "
                                   "kernels, compile again")
        out.append(h)
    return tuple(out)
