"""Kernels that may run in pieces: which, into how many, and what the pieces hold.

A kernel whose operands do not fit the budget at once may still run if it can be cut
into pieces that each read a slice of every input and write the same slice of its
output, with the result bit for bit what the whole call gives. That holds for the
elementwise kernels below when every tensor operand is the whole of its storage, in the
same shape, dtype and contiguous order (the optimizer's per-parameter updates after
lowering, the backward's gradient sums): element i of the output is then computed from
element i of each input alone, by the same arithmetic wherever a piece boundary falls.
The last condition, that the arithmetic of an element does not depend on whether the
kernel's vectorized body or its scalar tail computed it, is checked on the machine by
frontend/split_probe.py before a kernel is marked splittable.

A split kernel runs its pieces in order over the flat index; an input absent from fast
memory there is read from its slow copy slice by slice through a bounce buffer of one
piece (runtime/pieces.py), so the kernel holds its output, its inputs in fast memory
and one piece of each other input. Pieces start on 4 KiB (direct I/O) boundaries.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .graph import TrainingGraph

# elementwise ATen kernels whose output element i reads element i of each input only
SPLIT_OPS = frozenset({
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.neg.default",
    "aten.sqrt.default", "aten.addcmul.default", "aten.addcdiv.default", "aten.lerp.Scalar",
    "aten.lerp.Tensor", "aten.maximum.default", "aten.minimum.default", "aten.abs.default",
    "aten.sign.default", "aten.clamp.default", "aten.relu.default", "aten.threshold_backward.default",
})
PIECE_ALIGN = 4096  # bytes: a piece starts on a direct-I/O boundary
MIN_PIECE_BYTES = 64 * 1024  # smaller pieces cost more in calls than they save in memory
MAX_PIECES = 64


def split_blocker(graph: TrainingGraph, k: int) -> str | None:
    """Why kernel k cannot run in pieces (None: it can, once the probe agrees)."""
    kern = graph.kernels[k]
    if kern.op not in SPLIT_OPS:
        return f"{kern.op} is not elementwise: an output element reads more than one element of an input"
    if len(kern.outputs) != 1:
        return f"{kern.op} writes {len(kern.outputs)} tensors"
    out = graph.tensors[kern.outputs[0]]
    program = graph.program
    nodes = getattr(program, "kernel_nodes", None)
    if nodes is None:  # a hand-built graph: its tensors are the operands
        operands = [(graph.tensors[t].shape, graph.tensors[t].stride, 0, graph.tensors[t].dtype, t)
                    for t in kern.inputs]
        out_value = (out.shape, out.stride, 0, out.dtype)
    else:
        node = nodes[k]
        val = node.meta.get("val")
        if val is None or not hasattr(val, "shape"):
            return f"{kern.op}'s output has no recorded layout"
        out_value = (tuple(val.shape), tuple(val.stride()), int(val.storage_offset()), _dtype(val.dtype))
        operands = []
        for a in list(node.args) + list(node.kwargs.values()):
            if not hasattr(a, "meta"):
                if isinstance(a, (list, tuple)):
                    return f"{kern.op} takes a list of tensors"
                continue
            v = a.meta.get("val")
            tid = program.node_tensor.get(a)
            if v is None or tid is None or not hasattr(v, "shape"):
                return f"{kern.op} reads an operand without a recorded layout"
            operands.append((tuple(v.shape), tuple(v.stride()), int(v.storage_offset()), _dtype(v.dtype), tid))
    shape, _, _, dtype = out_value
    if not _whole(out_value, out.nbytes, out.dtype):
        return f"{kern.op}'s output is not the whole of a contiguous storage"
    for o_shape, o_stride, o_offset, o_dtype, tid in operands:
        t = graph.tensors[tid]
        if len(o_shape) == 0 or _numel(o_shape) == 1:
            continue  # a scalar operand: every piece reads all of it
        if o_shape != shape or o_dtype != dtype:
            return f"{kern.op} reads {t.name} as {o_shape} {o_dtype}, its output is {shape} {dtype} (broadcast)"
        if not _whole((o_shape, o_stride, o_offset, o_dtype), t.nbytes, t.dtype):
            return f"{kern.op} reads {t.name} through a view that is not its whole contiguous storage"
    return None


def _dtype(d: object) -> str:
    return str(d).removeprefix("torch.")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _whole(value: tuple[Any, ...], storage_bytes: int, storage_dtype: str) -> bool:
    """Is the value (shape, stride, offset, dtype) all of its storage, in contiguous order?"""
    shape, stride, offset, dtype = value
    expect, want = [], 1
    for s in reversed(shape):
        expect.append(want)
        want *= s
    contiguous = all(st == e for st, e, s in zip(stride, reversed(expect), shape) if s != 1)
    return (offset == 0 and contiguous and dtype == _dtype(storage_dtype)
            and _numel(shape) * _itemsize(dtype) == storage_bytes)


def _itemsize(dtype: str) -> int:
    name = _dtype(dtype)
    for bits in (128, 64, 32, 16, 8):
        if name.endswith(str(bits)):
            return bits // 8
    return {"bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}.get(name, 4)


def pieces_for(nbytes: int) -> int:
    """How many pieces a split kernel whose largest operand holds `nbytes` runs in: as
    many as MAX_PIECES of at least MIN_PIECE_BYTES allow."""
    return max(1, min(MAX_PIECES, nbytes // MIN_PIECE_BYTES))


def piece_ranges(nbytes: int, pieces: int) -> list[tuple[int, int]]:
    """[start, stop) byte ranges of `pieces` pieces of a `nbytes` operand, each starting on
    a PIECE_ALIGN boundary (some may be empty if the operand is small)."""
    step = -(-nbytes // pieces)
    step = -(-step // PIECE_ALIGN) * PIECE_ALIGN
    return [(min(i * step, nbytes), min((i + 1) * step, nbytes)) for i in range(pieces)]


def piece_bytes(nbytes: int, pieces: int) -> int:
    """The bounce buffer an operand of `nbytes` needs when read in `pieces` pieces."""
    return max((b - a for a, b in piece_ranges(nbytes, pieces)), default=0)


def split_inputs(graph: TrainingGraph, k: int) -> tuple[int, ...]:
    """The inputs of split kernel k that it may read from slow memory (all but scalars)."""
    kern = graph.kernels[k]
    size = graph.tensors[kern.outputs[0]].nbytes
    return tuple(t for t in kern.inputs if graph.tensors[t].nbytes == size)


def piece_reads(graph: TrainingGraph) -> dict[int, frozenset[int]]:
    """Kernel -> the inputs it may read from slow memory: those of kernels that run in
    pieces."""
    return {kn.index: frozenset(split_inputs(graph, kn.index)) for kn in graph.kernels if kn.pieces > 1}


def bounce_bytes(graph: TrainingGraph, k: int) -> int:
    """Bytes kernel k needs beyond its fast operands when it runs in pieces: one piece of
    each input it may read from slow memory (0 for an unsplit kernel)."""
    kern = graph.kernels[k]
    if kern.pieces <= 1:
        return 0
    return sum(piece_bytes(graph.tensors[t].nbytes, kern.pieces) for t in split_inputs(graph, k))


def with_pieces(graph: TrainingGraph, pieces: dict[int, int]) -> TrainingGraph:
    """`graph` with kernel k split into pieces[k] pieces (1: unsplit); the same graph if
    nothing changes. A plan records its split (Plan.split; ir.plan.plan_graph)."""
    if all(graph.kernels[k].pieces == p for k, p in pieces.items()):
        return graph
    bad = [k for k, p in pieces.items() if p > 1 and k not in graph.splittable]
    if bad:
        from ..errors import GraphError
        raise GraphError(f"kernel {bad[0]} ({graph.kernels[bad[0]].op}) cannot run in pieces: "
                         f"{split_blocker(graph, bad[0]) or 'its pieces were not checked bit-identical'}")
    kernels = tuple(dataclasses.replace(kn, pieces=pieces[kn.index]) if kn.index in pieces else kn
                    for kn in graph.kernels)
    return dataclasses.replace(graph, kernels=kernels)


def split_of(graph: TrainingGraph) -> tuple[tuple[int, int], ...]:
    """(kernel, pieces) of every split kernel, as a plan records them."""
    return tuple((kn.index, kn.pieces) for kn in graph.kernels if kn.pieces > 1)
