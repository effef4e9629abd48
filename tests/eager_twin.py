"""Train a model with autotm.compile and an eager copy side by side; compare bit for bit.

Shared by the tests of models as users have them (test_user_models.py) and the
compatibility suite (test_compat_models.py).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

import autotm
from autotm.errors import InfeasibleBudget


@dataclass
class TwinRun:
    compile_seconds: float
    kernels: int
    budget_bytes: int
    bytes_to_slow: int
    follows_layout: bool
    graph: object = None  # the captured TrainingGraph
    compiled_step_seconds: list[float] = field(default_factory=list)
    eager_step_seconds: list[float] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def eager_step(model, loss_fn, opt, batch, clip=None):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(*batch[:-1]), batch[-1])
    loss.backward()
    if clip is not None:  # e.g. clip_grad_norm_(model.parameters(), max_norm)
        clip(model)
    opt.step()
    return loss.detach()


def train_twins(model, make_optimizer, loss_fn, batches, *, budget="2:1", cache=None, seed=0, eager_clip=None,
                **compile_options) -> TwinRun:
    """Compile `model` (the eager twin is a deep copy made first) for `budget`, or 10 % over the
    smallest feasible budget where `budget` is under it, run every batch through
    both from the same RNG state, and list what differs: losses, the RNG state after each
    step, state_dict entries (parameters and buffers), optimizer state."""
    twin = copy.deepcopy(model)
    opt, twin_opt = make_optimizer(model), make_optimizer(twin)
    t0 = time.perf_counter()
    for attempt in range(3):
        try:
            step = autotm.compile(model, loss_fn, opt, batches[0], memory="cpu+file", budget=budget, cache=cache,
                                  **compile_options)
            break
        except InfeasibleBudget as e:  # a tiny model's ratio can fall under one kernel's operands
            if attempt == 2:
                raise
            # (the floor found before the profile can rise once it has measured the kernels' workspaces)
            budget = e.minimum * 11 // 10
    run = TwinRun(compile_seconds=time.perf_counter() - t0, kernels=len(step.graph.kernels),
                  budget_bytes=int(step.plan.meta.budget_bytes), bytes_to_slow=int(step.plan.meta.bytes_to_slow),
                  follows_layout=step.session.executor.follows_layout, graph=step.graph)
    try:
        for i, batch in enumerate(batches):
            torch.manual_seed(seed + i)
            t = time.perf_counter()
            got = step(*batch)
            run.compiled_step_seconds.append(time.perf_counter() - t)
            rng_after = torch.get_rng_state()
            torch.manual_seed(seed + i)
            t = time.perf_counter()
            want = eager_step(twin, loss_fn, twin_opt, batch, eager_clip)
            run.eager_step_seconds.append(time.perf_counter() - t)
            if not torch.equal(got, want):
                run.mismatches.append(f"loss of step {i}: {got.item()!r} != eager {want.item()!r}")
            if not torch.equal(rng_after, torch.get_rng_state()):
                run.mismatches.append(f"global RNG state after step {i}")
        run.mismatches += compare_state(model, opt, twin, twin_opt)
    finally:
        step.close()
    return run


def compare_state(model, opt, twin, twin_opt) -> list[str]:
    out = []
    mine, theirs = model.state_dict(), twin.state_dict()
    if list(mine) != list(theirs):
        out.append(f"state_dict keys {sorted(set(mine) ^ set(theirs))}")
    for k, v in theirs.items():
        if k in mine and not (mine[k].dtype == v.dtype and torch.equal(mine[k], v)):
            out.append(f"state_dict[{k!r}] (max |diff| {_maxdiff(mine[k], v)})")
    names = {id(p): n for n, p in twin.named_parameters()}
    for (n, p), q in zip(twin.named_parameters(), model.parameters()):
        a, b = twin_opt.state.get(p, {}), opt.state.get(q, {})
        if sorted(a) != sorted(b):
            out.append(f"optimizer state slots of {names[id(p)]}: {sorted(b)} != eager {sorted(a)}")
            continue
        for s in a:
            if not torch.equal(torch.as_tensor(a[s]), torch.as_tensor(b[s])):
                out.append(f"optimizer state {n}:{s}")
    return out


def _maxdiff(a, b) -> str:
    if a.shape != b.shape:
        return f"shapes {list(a.shape)} and {list(b.shape)}"
    return f"{(a.double() - b.double()).abs().max().item():.3g}"


# ---- which ATen ops run ------------------------------------------------------------------
# Functionalization writes in-place ops out of place (bernoulli_ -> bernoulli) and makes views
# free; the optimizer is lowered separately (optim_lowering). What is left must be eager's
# forward and backward op for op: a fused kernel eager calls must not be a decomposition here.
_NOT_KERNELS = {"detach", "alias", "lift_fresh", "copy", "clone", "_to_copy", "empty", "zeros", "zeros_like",
                "expand", "view", "_unsafe_view", "t", "transpose", "permute", "unsqueeze", "squeeze", "select",
                "slice", "as_strided", "reshape", "split", "split_with_sizes", "unbind", "unsafe_split",
                "diagonal", "narrow", "chunk", "expand_as", "view_as", "ones_like", "fill", "new_empty_strided",
                "empty_strided", "new_zeros", "set_", "resize_", "_reshape_alias", "unfold", "index_select",
                "_assert_tensor_metadata", "lift_fresh_copy"}
# functional forms of what eager does in place: the same kernel (BatchNorm's running-stat
# update), or eager's write into a view done as a scatter over its base
_FUNCTIONAL_FORM = {"_native_batch_norm_legit_functional": "native_batch_norm", "as_strided_scatter": "copy",
                    # (autotm's name for it: oneDNN's LSTM layer run with its training workspace)
                    "mkldnn_rnn_layer_train": "mkldnn_rnn_layer"}


def _op_name(op) -> str:
    """aten.bernoulli_.float -> bernoulli (an in-place op counts as its functional form)."""
    name = op._schema.name.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def eager_ops(model, loss_fn, batch) -> set[str]:
    """ATen ops eager PyTorch runs for one forward and backward of `model` (a throwaway copy:
    BatchNorm statistics and the RNG are left alone)."""
    return set(eager_op_counts(model, loss_fn, batch))


def eager_op_counts(model, loss_fn, batch) -> Counter:
    """eager_ops, with how many calls of each."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[_op_name(func)] += 1
            return func(*args, **(kwargs or {}))

    m = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]), Record():
        loss_fn(m(*batch[:-1]), batch[-1]).backward()
    return Counter({n: c for n, c in seen.items() if n not in _NOT_KERNELS})


def captured_ops(graph) -> set[str]:
    """ATen ops of the captured forward and backward kernels."""
    return set(captured_op_counts(graph))


def captured_op_counts(graph) -> Counter:
    """captured_ops, with how many kernels of each."""
    names = Counter(_FUNCTIONAL_FORM.get(n, n) for n in (_op_name(eval_op(k.op)) for k in graph.kernels
                                                          if k.phase != "optimizer"))
    return Counter({n: c for n, c in names.items() if n not in _NOT_KERNELS})


def eval_op(name: str):
    namespace, packet, overload = name.split(".") if name.count(".") == 2 else (*name.split("."), "default")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
