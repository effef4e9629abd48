"""Which kernels may run in pieces on this machine: ir/split.py's rule, checked by running.

ir/split.py admits elementwise kernels whose operands are whole contiguous storages. An
element's arithmetic must also not depend on where a piece boundary falls: ATen computes
most elements in a vectorized body and the last few of each range in a scalar tail, and
for a fused operation (add with alpha, addcmul, lerp) the two could round differently
(one fused multiply-add against two roundings), and a transcendental's vector code is
not its scalar code (sigmoid, gelu). Which elements a tail gets is not ours to choose:
the whole kernel's threads each end their share in a tail wherever the share ends, so
the pieces agree for every size and thread count only if both codes agree on every
value. Each kind of kernel (op, dtype and its non-tensor arguments) is run here on random
operands of two magnitudes whole, in pieces whose boundaries fall anywhere, and in
pieces shorter than any vector (each element through the scalar code); it is splittable
only if every bit agrees. A row kernel
(ir.split.ROW_OPS) is run on PROBE_ROWS rows of its real row length, whole in its own
rank and in pieces of 1 to 5 rows as the executor runs them (2-d views, dimension -1).
A matmul (ir.split.GEMM_OPS) is run at its real shapes and layouts, whole and in the
blocks the executor will run it in: which GEMM code a shape takes is the library's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from ..ir.graph import TrainingGraph
from ..ir.split import (GEMM_OPS, ROW_OPS, gemm_block, gemm_piece_args, gemm_pieces, gemm_ranges, gemm_split,
                        per_row_operands, piece_args, row_elements, split_blocker)

PROBE_ELEMENTS = 4096 + 37
PROBE_CUTS = (1, 7, 8, 9, 100, 1023, 2500)  # piece boundaries off every vector width
SCALAR_PIECES = (1, 2, 3, 5, 7)  # piece lengths under every vector width, in turn
GEMM_PROBE_PERIOD = 1_000_003  # elements (a prime: each row of a matrix starts elsewhere in it)
SCALAR_ELEMENTS = 2048  # elements run so (the rest one piece): ~560 calls per kind
PROBE_ROWS = 13
PROBE_ROW_CUTS = (1, 2, 5, 8)


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
        if graph.kernels[k].op in GEMM_OPS:  # (its shapes pick its code path)
            key: tuple = (graph.kernels[k].op, _scalars(node), gemm_pieces(graph, k), gemm_split(graph, k).axis,
                          *((tuple(a.meta["val"].shape), a.meta["val"].stride(), str(a.meta["val"].dtype))
                            for a in node.all_input_nodes))
            if key not in verdict:
                verdict[key] = gemm_agrees(graph, k)
        else:  # (a row kernel's row length picks its code path)
            key = (graph.kernels[k].op, str(node.meta["val"].dtype), _scalars(node), row_elements(graph, k))
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
    out = node.meta["val"]
    rule = ROW_OPS.get(str(node.target))
    if rule is None:
        shape, row = (PROBE_ELEMENTS,), 1
        cuts: list[tuple[int, ...]] = [(0, *PROBE_CUTS, PROBE_ELEMENTS), (*_scalar_bounds(SCALAR_ELEMENTS), PROBE_ELEMENTS)]
    else:
        row = out.shape[-1]
        shape = (1,) * (out.dim() - 2) + (PROBE_ROWS, row)
        cuts = [tuple(r * row for r in (0, *PROBE_ROW_CUTS, PROBE_ROWS))]
    per_row = per_row_operands(str(node.target), node.args)
    values = _probe_operands(node, per_row, shape, row)
    target: Any = node.target
    try:
        args: Any = fx.node.map_arg(node.args, values.__getitem__)
        kwargs: Any = fx.node.map_arg(node.kwargs, values.__getitem__)
        whole = target(*args, **kwargs)
        if whole.dtype != out.dtype:
            return False
        for bounds in cuts:
            parts = []
            for lo, hi in zip(bounds, bounds[1:]):
                piece = {a: _slice(v, a in per_row, shape, lo, hi, row if rule else 0) for a, v in values.items()}
                p_args: Any = piece_args(str(node.target), fx.node.map_arg(node.args, piece.__getitem__))
                p_kwargs: Any = fx.node.map_arg(node.kwargs, piece.__getitem__)
                parts.append(target(*p_args, **p_kwargs).reshape(-1))
            pieced = torch.cat(parts)
            if pieced.numel() != whole.numel() or not torch.equal(_bits(whole.reshape(-1)), _bits(pieced)):
                return False
    except Exception:  # (any kernel that cannot run so is not split)
        return False
    return True


def _scalar_bounds(n: int) -> tuple[int, ...]:
    """Boundaries of pieces 1, 2, 3, 5, 7, 1, ... elements long from 0 to n."""
    bounds, i = [0], 0
    while bounds[-1] < n:
        bounds.append(min(n, bounds[-1] + SCALAR_PIECES[i % len(SCALAR_PIECES)]))
        i += 1
    return tuple(bounds)


def gemm_agrees(graph: TrainingGraph, k: int) -> bool:
    """Does matmul k give the same bits whole and in its blocks (ir.split.gemm_split,
    gemm_pieces), on random operands of its real shapes and layouts?"""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    node = graph.program.kernel_nodes[k]
    split, pieces = gemm_split(graph, k), gemm_pieces(graph, k)
    gen = torch.Generator().manual_seed(0)

    def operand(a: fx.Node) -> torch.Tensor:
        v = a.meta["val"]
        n = sum((s - 1) * st for s, st in zip(v.shape, v.stride())) + 1 + v.storage_offset() if v.numel() else 0
        # (random values repeating every GEMM_PROBE_PERIOD: a 392 MiB weight in 0.1 s, not 1.3)
        period = min(n, GEMM_PROBE_PERIOD)
        once = torch.rand(period, generator=gen, dtype=torch.float32).mul_(4).sub_(2)
        base = once.repeat(-(-n // max(period, 1)))[:n].to(v.dtype)
        return base.as_strided(tuple(v.shape), tuple(v.stride()), v.storage_offset())
    with unset_fake_temporarily():
        values = {a: operand(a) for a in node.all_input_nodes}
        target: Any = node.target
        try:
            args: Any = fx.node.map_arg(node.args, values.__getitem__)
            kwargs: Any = fx.node.map_arg(node.kwargs, values.__getitem__)
            whole = target(*args, **kwargs)
            cut = args[split.position]
            for i0, i1 in gemm_ranges(split.extent, pieces):
                block = gemm_block(cut, split, i0, i1)
                got = target(*gemm_piece_args(str(node.target), args, split, block, i0, i1), **kwargs)
                want = whole[i0:i1] if split.axis == 0 else whole[:, i0:i1]
                if got.shape != want.shape or not torch.equal(_bits(got.contiguous()), _bits(want.contiguous())):
                    return False
        except Exception:  # (any kernel that cannot run so is not split)
            return False
    return True


def _probe_operands(node: fx.Node, per_row: set[fx.Node], shape: tuple[int, ...], row: int) -> dict[fx.Node, Any]:
    """Random operands: full-size ones of `shape`, per-row ones of PROBE_ROWS elements
    (class indices under `row` for integers), others in their own shape."""
    gen = torch.Generator().manual_seed(0)
    out_shape = tuple(node.meta["val"].shape)
    elementwise = str(node.target) not in ROW_OPS

    def operand(a: fx.Node) -> Any:
        v = a.meta["val"]
        if v.dim() == 0:
            return torch.rand((), generator=gen, dtype=torch.float64).to(v.dtype) + 0.5
        if a in per_row:
            size: tuple[int, ...] = (PROBE_ROWS,)
        elif elementwise or tuple(v.shape) == out_shape:
            size = shape
        else:
            size = tuple(v.shape)
        if v.dtype.is_floating_point:  # (half in [-2, 2], half in [-32, 32])
            scale = torch.where(torch.arange(size[-1]) % 2 == 0, 2.0, 32.0).to(torch.float64)
            return ((torch.rand(size, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(v.dtype)
        return torch.randint(0 if a in per_row else -100, row if a in per_row else 100, size, generator=gen).to(v.dtype)
    return {a: operand(a) for a in node.all_input_nodes}


def _slice(v: Any, per_row: bool, shape: tuple[int, ...], lo: int, hi: int, row: int) -> Any:
    """Operand `v` for the piece of flat output elements [lo, hi): the same elements of a
    full-size operand (as rows of `row` elements for a row kernel, row 0 for an elementwise
    one), the same rows of a per-row one."""
    if v.dim() == 0:
        return v
    if per_row:
        return v[lo // row:hi // row]
    if tuple(v.shape) != shape:
        return v
    return v[lo:hi] if row == 0 else v.reshape(-1, row)[lo // row:hi // row]


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size(), torch.uint8))
    return t
