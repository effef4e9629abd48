"""Kernels that may run in pieces: which, into how many, and what the pieces hold.

A kernel whose operands do not fit the budget at once may still run if it can be cut
into pieces that each read a slice of every input and write the same slice of its
output, with the result bit for bit what the whole call gives. That holds for the
elementwise kernels below when every tensor operand is the whole of its storage, in the
same shape, dtype and contiguous order (the optimizer's per-parameter updates after
lowering, the backward's gradient sums): element i of the output is then computed from
element i of each input alone, by the same arithmetic wherever a piece boundary falls.
The same holds row by row for the kernels of ROW_OPS (a softmax over the last dimension,
its backward, the loss's backward): row i of the output reads row i of each full-size
input, element i of each per-row input (the targets) and all of the small ones; their
pieces fall on row boundaries and run on (rows, row length) views. The last condition,
that the arithmetic of an element does not depend on whether the kernel's vectorized body
or its scalar tail computed it, or on how many rows a call holds, is checked on the
machine by frontend/split_probe.py before a kernel is marked splittable.

A matmul of GEMM_OPS (C = A @ B, + bias) runs by blocks of C's rows or columns: rows
i0..i1 of C read rows i0..i1 of A and all of B, columns j0..j1 read all of A and columns
j0..j1 of B (and of the bias). The pieces cut the larger input, which they read a block at
a time; the other must be in fast memory; where the output is larger than both, they cut
its rows (so that each block may go to slow memory as it is made). A block of a transposed operand is strided in
its storage (a column block of the stored matrix): it is read row by row into a compact
block. Its sums run over the same K in the same order in every piece, but which GEMM code
path a shape takes is the library's choice, so split_probe.py runs each matmul at its real
shapes, whole and in its real pieces, before it is marked splittable; and only matmuls
that hold a sixteenth of the graph's peak or more are tried (smaller ones never decide a
budget at the ratios planned, and each probe costs two real matmuls).

A split kernel runs its pieces in order over the flat index; an input absent from fast
memory there is read from its slow copy slice by slice through a bounce buffer of one
piece (runtime/pieces.py), so the kernel holds its output, its inputs in fast memory
and one piece of each other input. Pieces start on 4 KiB (direct I/O) boundaries. An
elementwise or row kernel may also write its output straight to slow memory, a piece at
a time (born_slow_piece): it then holds one piece of its output instead of all of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .graph import TrainingGraph

if TYPE_CHECKING:
    from .costmodel import CostModel

# elementwise ATen kernels whose output element i reads element i of each input only
# (gelu, silu, elu, mish and softplus are left out: on x86 their vectorized bodies and
# scalar tails round differently and the probe refuses them)
SPLIT_OPS = frozenset({
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.neg.default",
    "aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar", "aten.div.Scalar", "aten.rsub.Scalar",
    "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default", "aten.square.default",
    "aten.pow.Tensor_Scalar", "aten.exp.default", "aten.log.default", "aten.erf.default",
    "aten.sin.default", "aten.cos.default", "aten.addcmul.default", "aten.addcdiv.default",
    "aten.lerp.Scalar", "aten.lerp.Tensor", "aten.maximum.default", "aten.minimum.default",
    "aten.abs.default", "aten.sign.default", "aten.clamp.default", "aten.clamp_min.default",
    "aten.clamp_max.default", "aten.relu.default", "aten.threshold_backward.default",
    "aten.sigmoid.default", "aten.sigmoid_backward.default", "aten.tanh.default", "aten.tanh_backward.default",
    "aten.hardtanh.default", "aten.hardtanh_backward.default", "aten.hardswish.default",
    "aten.hardswish_backward.default", "aten.hardsigmoid.default", "aten.hardsigmoid_backward.default",
    "aten.leaky_relu.default", "aten.leaky_relu_backward.default",
})


@dataclasses.dataclass(frozen=True)
class RowRule:
    """A kernel that computes each row (along the last dimension) from that row alone."""

    dim_arg: int | None  # the argument naming the row's dimension (the pieces pass -1)
    per_row_args: tuple[int, ...] = ()  # arguments holding one element per row, where not 0-dim


ROW_OPS = {
    "aten._softmax.default": RowRule(1),
    "aten._log_softmax.default": RowRule(1),
    "aten._softmax_backward_data.default": RowRule(2),
    "aten._log_softmax_backward_data.default": RowRule(2),
    # (grad_output, self, target, weight, reduction, ignore_index, total_weight): row i is
    # zero but at target[i]; grad_output is per row only for reduction="none"
    "aten.nll_loss_backward.default": RowRule(None, (0, 2)),
}


@dataclasses.dataclass(frozen=True)
class GemmRule:
    """Positions of a matmul's operands: C = bias + A @ B (beta and alpha scale them)."""

    a: int
    b: int
    bias: int | None = None


GEMM_OPS = {"aten.mm.default": GemmRule(0, 1), "aten.addmm.default": GemmRule(1, 2, 0)}
GEMM_ALIGN = 64  # rows or columns: a block a multiple of every GEMM micro-kernel's tile
GEMM_PEAK_SHARE = 16  # a matmul is tried in pieces only if it holds >= 1/16 of the peak
GEMM_STRIDED_READ = 16 * 1024  # bytes at least per read where a block is read row by row
PIECE_ALIGN = 4096  # bytes: a piece starts on a direct-I/O boundary
MIN_PIECE_BYTES = 64 * 1024  # smaller pieces cost more in calls than they save in memory
MAX_PIECES = 64


class Operand(NamedTuple):
    """A tensor operand of a kernel as the kernel reads it."""

    position: int | None  # in the call's positional arguments (None: a keyword)
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    tensor: int


def _operands(graph: TrainingGraph, k: int) -> list[Operand] | str:
    """Kernel k's tensor operands (or why they cannot be known)."""
    kern = graph.kernels[k]
    nodes = getattr(graph.program, "kernel_nodes", None)
    if nodes is None:  # a hand-built graph: its tensors are the operands
        return [Operand(i, graph.tensors[t].shape, graph.tensors[t].stride, 0, graph.tensors[t].dtype, t)
                for i, t in enumerate(kern.inputs)]
    node, node_tensor = nodes[k], graph.program.node_tensor
    found = []
    for pos, a in [(i, a) for i, a in enumerate(node.args)] + [(None, a) for a in node.kwargs.values()]:
        if not hasattr(a, "meta"):
            if isinstance(a, (list, tuple)):
                return f"{kern.op} takes a list of tensors"
            continue
        v = a.meta.get("val")
        tid = node_tensor.get(a)
        if v is None or tid is None or not hasattr(v, "shape"):
            return f"{kern.op} reads an operand without a recorded layout"
        found.append(Operand(pos, tuple(v.shape), tuple(v.stride()), int(v.storage_offset()), _dtype(v.dtype), tid))
    return found


def _out_value(graph: TrainingGraph, k: int) -> tuple[Any, ...] | None:
    """(shape, stride, offset, dtype) of kernel k's output as the kernel writes it."""
    nodes = getattr(graph.program, "kernel_nodes", None)
    if nodes is None:
        out = graph.tensors[graph.kernels[k].outputs[0]]
        return (out.shape, out.stride, 0, out.dtype)
    val = nodes[k].meta.get("val")
    if val is None or not hasattr(val, "shape"):
        return None
    return (tuple(val.shape), tuple(val.stride()), int(val.storage_offset()), _dtype(val.dtype))


def _role(kern_op: str, o: Operand, shape: tuple[int, ...]) -> str:
    """'full' (split with the output), 'row' (one element per row) or 'whole' (every
    piece reads all of it) for operand `o` of a kernel whose output is `shape`."""
    rule = ROW_OPS.get(kern_op)
    if rule is not None and o.position in rule.per_row_args and len(o.shape) > 0:
        return "row"
    if len(o.shape) == 0 or _numel(o.shape) == 1:
        return "whole"
    if rule is not None and o.shape != shape:
        return "whole"  # (a class weight, the loss's total weight)
    return "full"


def split_blocker(graph: TrainingGraph, k: int) -> str | None:
    """Why kernel k cannot run in pieces (None: it can, once the probe agrees)."""
    kern = graph.kernels[k]
    if kern.op in GEMM_OPS:
        return gemm_blocker(graph, k)
    rule = ROW_OPS.get(kern.op)
    if kern.op not in SPLIT_OPS and rule is None:
        return f"{kern.op} is not elementwise: an output element reads more than one element of an input"
    if len(kern.outputs) != 1:
        return f"{kern.op} writes {len(kern.outputs)} tensors"
    out = graph.tensors[kern.outputs[0]]
    out_value = _out_value(graph, k)
    if out_value is None:
        return f"{kern.op}'s output has no recorded layout"
    operands = _operands(graph, k)
    if isinstance(operands, str):
        return operands
    shape, _, _, dtype = out_value
    if not _whole(out_value, out.nbytes, out.dtype):
        return f"{kern.op}'s output is not the whole of a contiguous storage"
    if rule is not None:
        why = _row_blocker(graph, k, rule, shape)
        if why:
            return why
    for o in operands:
        t = graph.tensors[o.tensor]
        role = _role(kern.op, o, shape)
        if role == "row" and o.shape != shape[:1]:
            return f"{kern.op} reads {t.name} as {o.shape}, not one element per row of {shape}"
        if role != "full":
            continue
        if o.shape != shape or o.dtype != dtype:
            return f"{kern.op} reads {t.name} as {o.shape} {o.dtype}, its output is {shape} {dtype} (broadcast)"
        if not _whole((o.shape, o.stride, o.offset, o.dtype), t.nbytes, t.dtype):
            return f"{kern.op} reads {t.name} through a view that is not its whole contiguous storage"
    return None


def _row_blocker(graph: TrainingGraph, k: int, rule: RowRule, shape: tuple[int, ...]) -> str | None:
    """Why row kernel k cannot run in pieces of rows, beyond what every split needs."""
    op = graph.kernels[k].op
    if len(shape) < 2:
        return f"{op} computes a single row"
    if rule.per_row_args and len(shape) != 2:
        return f"{op} reads per-row operands of a {len(shape)}-d output"
    nodes = getattr(graph.program, "kernel_nodes", None)
    if rule.dim_arg is not None and nodes is not None:
        if len(nodes[k].args) <= rule.dim_arg:
            return f"{op} names its dimension by keyword"  # (the pieces set it by position)
        dim = nodes[k].args[rule.dim_arg]
        if dim not in (-1, len(shape) - 1):
            return f"{op} runs along dimension {dim}, not the last: its rows are not contiguous"
    return None


def split_inputs(graph: TrainingGraph, k: int) -> tuple[int, ...]:
    """The inputs of split kernel k that it may read from slow memory: those the size of
    its output, split with it (not scalars, per-row targets or class weights)."""
    kern = graph.kernels[k]
    if kern.op in GEMM_OPS:
        return (gemm_split(graph, k).operand.tensor,)
    out = graph.tensors[kern.outputs[0]]
    operands = _operands(graph, k)
    out_value = _out_value(graph, k)
    if isinstance(operands, str) or out_value is None:
        return ()
    full = {o.tensor for o in operands if _role(kern.op, o, out_value[0]) == "full"}
    return tuple(t for t in kern.inputs if t in full and graph.tensors[t].nbytes == out.nbytes)


def row_elements(graph: TrainingGraph, k: int) -> int:
    """Elements in one row of kernel k's output for a row kernel; 1 for an elementwise one."""
    kern = graph.kernels[k]
    if kern.op not in ROW_OPS:
        return 1
    return graph.tensors[kern.outputs[0]].shape[-1]


def per_row_operands(op: str, args: Sequence[Any]) -> set[Any]:
    """The traced arguments of a row kernel `op` that hold one element per row (not 0-dim):
    each piece takes the same rows of them."""
    rule = ROW_OPS.get(op)
    if rule is None:
        return set()
    return {a for i, a in enumerate(args)
            if i in rule.per_row_args and hasattr(a, "meta") and len(a.meta["val"].shape) > 0}


def piece_args(op: str, args: Sequence[Any]) -> list[Any]:
    """A piece's positional arguments: a row kernel's dimension is -1 (its pieces are 2-d)."""
    out = list(args)
    rule = ROW_OPS.get(op)
    if rule is not None and rule.dim_arg is not None:
        out[rule.dim_arg] = -1
    return out


def piece_unit(graph: TrainingGraph, k: int) -> int:
    """Bytes every piece boundary of kernel k falls on a multiple of: a direct-I/O page,
    and for a row kernel also a row."""
    out = graph.tensors[graph.kernels[k].outputs[0]]
    return math.lcm(PIECE_ALIGN, row_elements(graph, k) * _itemsize(out.dtype))


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


def pieces_for(nbytes: int, unit: int = PIECE_ALIGN) -> int:
    """How many pieces a split kernel whose largest operand holds `nbytes` runs in: as
    many as MAX_PIECES of at least MIN_PIECE_BYTES, and of whole units, allow."""
    return max(1, min(MAX_PIECES, nbytes // max(MIN_PIECE_BYTES, unit)))


def kernel_pieces(graph: TrainingGraph, k: int) -> int:
    """pieces_for kernel k's output and piece unit (a matmul: gemm_pieces)."""
    if graph.kernels[k].op in GEMM_OPS:
        return gemm_pieces(graph, k)
    return pieces_for(graph.tensors[graph.kernels[k].outputs[0]].nbytes, piece_unit(graph, k))


def piece_ranges(nbytes: int, pieces: int, unit: int = PIECE_ALIGN) -> list[tuple[int, int]]:
    """[start, stop) byte ranges of `pieces` pieces of a `nbytes` operand, each starting on
    a multiple of `unit` (some may be empty if the operand is small)."""
    step = -(-nbytes // pieces)
    step = -(-step // unit) * unit
    return [(min(i * step, nbytes), min((i + 1) * step, nbytes)) for i in range(pieces)]


def piece_bytes(nbytes: int, pieces: int, unit: int = PIECE_ALIGN) -> int:
    """The bounce buffer an operand of `nbytes` needs when read in `pieces` pieces."""
    return max((b - a for a, b in piece_ranges(nbytes, pieces, unit)), default=0)


def piece_reads(graph: TrainingGraph) -> dict[int, frozenset[int]]:
    """Kernel -> the inputs it may read from slow memory: those of kernels that run in
    pieces."""
    return {kn.index: frozenset(split_inputs(graph, kn.index)) for kn in graph.kernels if kn.pieces > 1}


def piece_read_seconds(graph: TrainingGraph, k: int, t: int, cost: CostModel) -> float:
    """What split kernel k pays to read input t from slow memory, in blocking reads
    (cost.move_seconds(n, "to_fast", "sync")): one read's worth of the whole tensor (its
    ranges follow one another), or for a matmul's strided blocks one read per stored row
    of each block."""
    kern = graph.kernels[k]

    def seconds(n: int) -> float:
        return cost.move_seconds(n, "to_fast", "sync")
    if kern.op in GEMM_OPS and kern.pieces > 1:
        cut = gemm_split(graph, k)
        if cut.stored_cut == 1 and cut.operand.tensor == t:
            return sum(cut.stored[0] * seconds((i1 - i0) * cut.itemsize) for i0, i1 in gemm_ranges(cut.extent, kern.pieces))
    return seconds(graph.tensors[t].nbytes)


def bounce_bytes(graph: TrainingGraph, k: int) -> int:
    """Bytes kernel k needs beyond its fast operands when it runs in pieces: one piece of
    each input it may read from slow memory (0 for an unsplit kernel)."""
    kern = graph.kernels[k]
    if kern.pieces <= 1:
        return 0
    if kern.op in GEMM_OPS:
        return gemm_bounce_bytes(graph, k, kern.pieces)
    unit = piece_unit(graph, k)
    return sum(piece_bytes(graph.tensors[t].nbytes, kern.pieces, unit) for t in split_inputs(graph, k))


def born_slow_piece(graph: TrainingGraph, k: int) -> int:
    """Bytes of fast memory split kernel k holds while it writes its output straight to
    slow memory, a piece at a time through one bounce buffer (runtime/pieces.py): one piece
    of the output (a matmul's block of rows, copied from the block it computes); 0 where it
    cannot (it runs whole, writes several tensors, or is a matmul cut by columns, whose
    blocks are not ranges of its output, or whose blocks of rows start off a page)."""
    kern = graph.kernels[k]
    if kern.pieces <= 1 or len(kern.outputs) != 1:
        return 0
    out = graph.tensors[kern.outputs[0]]
    if kern.op in GEMM_OPS:  # (blocks of rows only, each starting on a page)
        row = out.shape[1] * _itemsize(out.dtype)
        ranges = gemm_ranges(out.shape[0], kern.pieces)
        if gemm_split(graph, k).axis != 0 or any(i0 * row % PIECE_ALIGN for i0, _ in ranges):
            return 0
        return max(i1 - i0 for i0, i1 in ranges) * row
    return piece_bytes(out.nbytes, kern.pieces, piece_unit(graph, k))


def piece_write_seconds(graph: TrainingGraph, k: int, cost: CostModel) -> float:
    """What split kernel k pays to write its output to slow memory piece by piece: one
    blocking write's worth of the whole output (its ranges follow one another)."""
    return cost.move_seconds(graph.tensors[graph.kernels[k].outputs[0]].nbytes, "to_slow", "sync")


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
    odd = [(k, p) for k, p in pieces.items() if p > 1 and graph.kernels[k].op in GEMM_OPS and p != gemm_pieces(graph, k)]
    if odd:
        from ..errors import GraphError
        k, p = odd[0]
        raise GraphError(f"kernel {k} ({graph.kernels[k].op}) runs in {gemm_pieces(graph, k)} blocks, the ones the "
                         f"probe checked bit-identical, not {p}")
    kernels = tuple(dataclasses.replace(kn, pieces=pieces[kn.index]) if kn.index in pieces else kn
                    for kn in graph.kernels)
    return dataclasses.replace(graph, kernels=kernels)


def split_of(graph: TrainingGraph) -> tuple[tuple[int, int], ...]:
    """(kernel, pieces) of every split kernel, as a plan records them."""
    return tuple((kn.index, kn.pieces) for kn in graph.kernels if kn.pieces > 1)


# ---- matmuls in pieces (GEMM_OPS) ----------------------------------------------------


class GemmSplit(NamedTuple):
    """How a matmul C = A @ B runs in pieces: by blocks of C's rows (axis 0: A cut, B
    whole) or columns (axis 1: B cut, A whole, and the bias with it)."""

    axis: int
    operand: Operand  # the input read a block at a time
    extent: int  # C's rows (axis 0) or columns (axis 1)
    stored: tuple[int, int]  # the operand's storage as a row-major matrix
    transposed: bool  # the operand is the transpose of that matrix
    itemsize: int

    @property
    def position(self) -> int:
        """The cut operand's position in the call's arguments (matrices are positional)."""
        assert self.operand.position is not None
        return self.operand.position

    @property
    def stored_cut(self) -> int:
        """The stored matrix's dimension the blocks cut (1: a range per stored row)."""
        return 1 - self.axis if self.transposed else self.axis

    def block_shape(self, i0: int, i1: int) -> tuple[int, int]:
        """A block's compact shape, as stored (row-major)."""
        p, q = self.stored
        return (i1 - i0, q) if self.stored_cut == 0 else (p, i1 - i0)

    def block_bytes(self, i0: int, i1: int) -> int:
        r, c = self.block_shape(i0, i1)
        return r * c * self.itemsize

    def segments(self, i0: int, i1: int) -> list[tuple[int, int]]:
        """The block's [start, stop) byte ranges in the operand's storage, in order."""
        p, q = self.stored
        s = self.itemsize
        if self.stored_cut == 0:
            return [(i0 * q * s, i1 * q * s)]
        return [((r * q + i0) * s, (r * q + i1) * s) for r in range(p)]


def _stored(o: Operand, nbytes: int) -> tuple[tuple[int, int], bool] | None:
    """(stored matrix, transposed) of a 2-d operand that views all of a contiguous storage
    as it is or transposed; None for any other view."""
    if len(o.shape) != 2 or o.offset != 0 or _numel(o.shape) * _itemsize(o.dtype) != nbytes:
        return None
    r, c = o.shape
    if (r == 1 or o.stride[0] == c) and (c == 1 or o.stride[1] == 1):
        return (r, c), False
    if (r == 1 or o.stride[0] == 1) and (c == 1 or o.stride[1] == r):
        return (c, r), True
    return None


def _gemm_operands(graph: TrainingGraph, k: int) -> tuple[Operand, Operand, Operand | None] | str:
    """(A, B, bias) of matmul k, or why they cannot be cut."""
    kern = graph.kernels[k]
    rule = GEMM_OPS[kern.op]
    operands = _operands(graph, k)
    if isinstance(operands, str):
        return operands
    by_pos = {o.position: o for o in operands}
    a, b = by_pos.get(rule.a), by_pos.get(rule.b)
    if a is None or b is None:
        return f"{kern.op} names its matrices by keyword"
    return a, b, by_pos.get(rule.bias) if rule.bias is not None else None


def gemm_blocker(graph: TrainingGraph, k: int) -> str | None:
    """Why matmul k cannot run by blocks of its output's rows or columns (None: it can,
    once the probe agrees at its real shapes)."""
    kern = graph.kernels[k]
    ops = _gemm_operands(graph, k)
    if isinstance(ops, str):
        return ops
    a, b, bias = ops
    out = graph.tensors[kern.outputs[0]]
    out_value = _out_value(graph, k)
    if out_value is None or len(kern.outputs) != 1 or not _whole(out_value, out.nbytes, out.dtype):
        return f"{kern.op}'s output is not the whole of a contiguous storage"
    if not _dtype(out.dtype).startswith(("float", "bfloat")):
        return f"{kern.op} multiplies {out.dtype} matrices"
    if a.tensor == b.tensor:
        return f"{kern.op} multiplies a matrix by itself"
    for name, o in (("A", a), ("B", b)):
        if _stored(o, graph.tensors[o.tensor].nbytes) is None:
            return (f"{kern.op} reads {graph.tensors[o.tensor].name} ({name}) through a view that is not its "
                    "whole storage, as it is or transposed")
    if bias is not None and (bias.shape != (b.shape[1],) or bias.stride != (1,) or bias.offset != 0):
        return f"{kern.op} adds a bias of shape {bias.shape}, not one value per column"
    held = sum(graph.tensors[t].nbytes for t in set(kern.inputs) | set(kern.outputs))
    if held * GEMM_PEAK_SHARE < graph.peak_live_bytes:
        return (f"{kern.op} holds {held:,} bytes, under 1/{GEMM_PEAK_SHARE} of the graph's peak: not tried "
                "in pieces (each try runs the matmul twice at capture)")
    split = gemm_split(graph, k)
    if split.extent < 2 * GEMM_ALIGN:
        return f"{kern.op}'s output has {split.extent} {'rows' if split.axis == 0 else 'columns'}, too few to cut"
    if gemm_pieces(graph, k) < 2:
        return f"{kern.op} reads {graph.tensors[split.operand.tensor].nbytes:,} bytes at most, too few to cut"
    return None


def _output_decides(graph: TrainingGraph, k: int) -> bool:
    """Is matmul k's output larger than either input, with enough rows to cut and each
    block of rows starting on a page (so that the blocks may be written to slow memory as
    they are made: born_slow_piece)?"""
    kern = graph.kernels[k]
    out = graph.tensors[kern.outputs[0]]
    if len(out.shape) != 2 or out.shape[0] < 2 * GEMM_ALIGN or out.shape[1] * _itemsize(out.dtype) * GEMM_ALIGN % PIECE_ALIGN:
        return False
    return out.nbytes > max(graph.tensors[t].nbytes for t in kern.inputs)


def gemm_split(graph: TrainingGraph, k: int) -> GemmSplit:
    """The cut of matmul k (gemm_blocker says it has one): by blocks of its output's rows
    where the output is the largest operand (_output_decides), else along the larger input."""
    ops = _gemm_operands(graph, k)
    assert not isinstance(ops, str)
    a, b, _ = ops
    axis = 0 if (_output_decides(graph, k) or graph.tensors[a.tensor].nbytes >= graph.tensors[b.tensor].nbytes) else 1
    o = a if axis == 0 else b
    stored = _stored(o, graph.tensors[o.tensor].nbytes)
    assert stored is not None
    return GemmSplit(axis, o, a.shape[0] if axis == 0 else b.shape[1], stored[0], stored[1], _itemsize(o.dtype))


def gemm_pieces(graph: TrainingGraph, k: int) -> int:
    """How many blocks matmul k runs in: as many as MAX_PIECES of at least MIN_PIECE_BYTES
    and GEMM_ALIGN rows or columns allow, and where a block is read row by row, as many as
    leave each read GEMM_STRIDED_READ bytes (each read costs a device round trip)."""
    split = gemm_split(graph, k)
    if _output_decides(graph, k):  # (blocks of the output: it sets their number)
        out = graph.tensors[graph.kernels[k].outputs[0]].nbytes
        return max(1, min(MAX_PIECES, out // MIN_PIECE_BYTES, split.extent // GEMM_ALIGN))
    n = min(MAX_PIECES, graph.tensors[split.operand.tensor].nbytes // MIN_PIECE_BYTES, split.extent // GEMM_ALIGN)
    if split.stored_cut == 1:
        n = min(n, split.stored[1] * split.itemsize // GEMM_STRIDED_READ)
    return max(1, n)


def gemm_ranges(extent: int, pieces: int) -> list[tuple[int, int]]:
    """[i0, i1) of the blocks: GEMM_ALIGN-multiples long, all but the last alike."""
    step = -(-extent // max(1, pieces))
    step = -(-step // GEMM_ALIGN) * GEMM_ALIGN
    return [(i, min(extent, i + step)) for i in range(0, extent, step)]


def gemm_bounce_bytes(graph: TrainingGraph, k: int, pieces: int) -> int:
    """A block of the cut input and the block of the output each piece computes."""
    split = gemm_split(graph, k)
    out = graph.tensors[graph.kernels[k].outputs[0]]
    rows, cols = out.shape
    ranges = gemm_ranges(split.extent, pieces)
    per_index = (cols if split.axis == 0 else rows) * _itemsize(out.dtype)
    return max(split.block_bytes(i0, i1) + (i1 - i0) * per_index for i0, i1 in ranges)


def gemm_block(value: Any, split: GemmSplit, i0: int, i1: int) -> Any:
    """Block [i0, i1) of the cut operand (a tensor in fast memory) in the layout a block
    read from slow memory has: compact as stored, transposed as the operand is."""
    stored = value.t() if split.transposed else value
    block = stored[i0:i1] if split.stored_cut == 0 else stored[:, i0:i1].contiguous()
    return block.t() if split.transposed else block


def gemm_piece_args(op: str, args: Sequence[Any], split: GemmSplit, block: Any, i0: int, i1: int) -> list[Any]:
    """A piece's positional arguments: the block in place of the cut operand, and for a
    block of columns the bias's same columns."""
    rule = GEMM_OPS[op]
    out = list(args)
    out[split.position] = block
    if split.axis == 1 and rule.bias is not None:
        out[rule.bias] = out[rule.bias][i0:i1]
    return out
