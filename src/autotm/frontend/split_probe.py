"""Which kernels may run in pieces on this machine: ir/split.py's rule, checked by running.

ir/split.py admits elementwise kernels whose operands are whole contiguous storages. An
element's arithmetic must also not depend on where a piece boundary falls: ATen computes
most elements in a vectorized body and the last few of each range in a scalar tail, and
for a fused operation (add with alpha, addcmul, lerp) the two could round differently
(one fused multiply-add against two roundings). Each kind of kernel (op, dtype and its
non-tensor arguments) is run here on random operands whole and in pieces whose
boundaries fall anywhere; it is splittable only if every bit agrees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from ..ir.graph import TrainingGraph
from ..ir.split import split_blocker

PROBE_ELEMENTS = 4096 + 37
PROBE_CUTS = (1, 7, 8, 9, 100, 1023, 2500)  # piece boundaries off every vector width


def with_splittable(graph: TrainingGraph) -> TrainingGraph:
    """`graph` with `splittable` set: the kernels ir/split.py admits whose kind runs
    bit-identically in pieces here."""
    nodes = getattr(graph.program, "kernel_nodes", None)
    if nodes is None:
        return graph
    verdict: dict[tuple, bool] = {}
    ok = set()
    for k in range(len(graph.kernels)):
        if split_blocker(graph, k) is not None:
            continue
        node = nodes[k]
        key = (graph.kernels[k].op, str(node.meta["val"].dtype), _scalars(node))
        if key not in verdict:
            verdict[key] = pieces_agree(node)
        if verdict[key]:
            ok.add(k)
    return dataclasses.replace(graph, splittable=frozenset(ok))


def _scalars(node: fx.Node) -> str:
    """The kernel's non-tensor arguments and its scalar (0-dim) tensors' dtypes."""
    def one(a: object) -> str:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            return f"T{v.dtype}" if v is not None and v.dim() == 0 else "T"
        return repr(a)
    return ",".join(one(a) for a in node.args) + ";" + ",".join(f"{k}={one(v)}" for k, v in node.kwargs.items())


def pieces_agree(node: fx.Node) -> bool:
    """Does `node`'s kernel give the same bits whole and in pieces, on random operands?
    (Run on real tensors, also inside a fake capture's mode.)"""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _agree(node)


def _agree(node: fx.Node) -> bool:
    gen = torch.Generator().manual_seed(0)
    out = node.meta["val"]

    def operand(a: object) -> Any:
        if not isinstance(a, fx.Node):
            return a
        v = a.meta["val"]
        if v.dim() == 0:
            return torch.rand((), generator=gen, dtype=torch.float64).to(v.dtype) + 0.5
        if v.dtype.is_floating_point:
            return (torch.rand(PROBE_ELEMENTS, generator=gen, dtype=torch.float64) * 4 - 2).to(v.dtype)
        return torch.randint(-100, 100, (PROBE_ELEMENTS,), generator=gen).to(v.dtype)
    target: Any = node.target
    try:
        values: dict[fx.Node, Any] = {a: operand(a) for a in node.all_input_nodes}
        args: Any = fx.node.map_arg(node.args, values.__getitem__)
        kwargs: Any = fx.node.map_arg(node.kwargs, values.__getitem__)
        whole = target(*args, **kwargs)
        bounds = (0, *PROBE_CUTS, PROBE_ELEMENTS)
        parts = []
        for lo, hi in zip(bounds, bounds[1:]):
            piece = {a: (v[lo:hi] if v.dim() else v) for a, v in values.items()}
            p_args: Any = fx.node.map_arg(node.args, piece.__getitem__)
            p_kwargs: Any = fx.node.map_arg(node.kwargs, piece.__getitem__)
            parts.append(target(*p_args, **p_kwargs))
        pieced = torch.cat(parts)
    except Exception:  # (any kernel that cannot run so is not split)
        return False
    if whole.dtype != out.dtype or pieced.shape != whole.shape:
        return False
    return bool(torch.equal(_bits(whole), _bits(pieced)))


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size(), torch.uint8))
    return t
