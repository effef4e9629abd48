"""Running a split kernel (ir/split.py) in pieces, its slow inputs read slice by slice.

The output is made whole in fast memory, or where the plan has it born slow written to
slow memory piece by piece through one more bounce buffer (MemorySystem.write_range);
each piece reads the same byte range of every full-size input, from fast memory where
the input is there, else from its slow copy through a bounce buffer
(MemorySystem.read_range), and writes that range of the output.
A row kernel's pieces are whole rows, run on (rows, row length) views with its dimension
argument -1 and its per-row operands sliced to the same rows. A matmul runs by blocks of
its output's rows or columns (GemmPieceRunner), its cut input read a block at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx

from ..interpret.replay import _out_overload
from ..ir.graph import TrainingGraph
from ..ir.split import (GEMM_OPS, ROW_OPS, gemm_block, gemm_piece_args, gemm_ranges, gemm_split, per_row_operands,
                        piece_args, piece_bytes, piece_ranges, piece_unit, row_elements, split_inputs)
from ..tiers.base import MemorySystem, SlowHandle, TensorLayout, TierError
from ..tiers.ranges import bounce_buffer


def flat_storage(v: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The whole storage of `v` as a flat tensor of `numel` elements of `dtype`."""
    return torch.empty(0, dtype=dtype, device=v.device).set_(v.untyped_storage(), 0, (numel,), (1,))


class PieceRunner:
    """Runs kernel k of `graph` (pieces > 1) with its inputs where they are: `fast`
    (tensor id -> storage value) or `slow` (tensor id -> handle on `memory`). Operands
    that are not split inputs (0-dim scalars) come from `value_of(node)`. Bounce buffers
    live for one run (kept, their pages would count against the budget between runs)."""

    def __init__(self, graph: TrainingGraph, k: int, memory: MemorySystem) -> None:
        kern = graph.kernels[k]
        self.node: fx.Node = graph.program.kernel_nodes[k]
        self.pieces = kern.pieces
        self.memory = memory
        out = self.node.meta["val"]
        self.shape, self.dtype = tuple(out.shape), out.dtype
        self.numel, self.itemsize = out.numel(), out.element_size()
        self.nbytes = graph.tensors[kern.outputs[0]].nbytes
        self.split = set(split_inputs(graph, k))
        self.unit, self.row = piece_unit(graph, k), row_elements(graph, k)
        self.op = kern.op
        self.by_rows = kern.op in ROW_OPS  # (its pieces are (rows, row length), even for rows of 1)
        self.per_row = per_row_operands(kern.op, self.node.args)
        self.node_tensor = graph.program.node_tensor
        self.out_overload = _out_overload(self.node.target)

    def run(self, fast: Mapping[int, torch.Tensor], slow: Mapping[int, SlowHandle],
            value_of: Callable[[fx.Node], Any], device: torch.device | None = None,
            born_slow: int | None = None) -> torch.Tensor | SlowHandle:
        """The output, in fast memory; or with `born_slow` (its tensor id) in slow memory,
        written there a piece at a time: its handle."""
        buffers: dict[int, Any] = {}
        handle = None
        try:
            if born_slow is None:
                out = torch.empty(self.shape, dtype=self.dtype, device=device)
                self._run(out.view(-1), buffers, fast, slow, value_of)
                return out
            handle = self.memory.empty_slow(born_slow, _contiguous_layout(self.shape, self.dtype))
            buffers[-1] = bounce_buffer(piece_bytes(self.nbytes, self.pieces, self.unit))
            self._run(None, buffers, fast, slow, value_of, handle)
            return handle
        except BaseException:
            if handle is not None:
                self.memory.free_slow(handle)
            raise
        finally:
            for b in buffers.values():
                with contextlib.suppress(BufferError):  # (a view still alive: the GC closes it)
                    b.close()

    def _run(self, out_flat: torch.Tensor | None, buffers: dict, fast: Mapping[int, torch.Tensor],
             slow: Mapping[int, SlowHandle], value_of: Callable[[fx.Node], Any],
             handle: SlowHandle | None = None) -> None:
        isz = self.itemsize
        sources: dict[fx.Node, Any] = {}
        for a in self.node.all_input_nodes:
            tid = self.node_tensor[a]
            if tid in self.split and tid in fast:
                sources[a] = ("fast", flat_storage(fast[tid], self.dtype, self.numel))
            elif tid in self.split:
                buffers[tid] = bounce_buffer(piece_bytes(self.nbytes, self.pieces, self.unit))
                sources[a] = ("slow", slow[tid])
            else:
                sources[a] = ("row" if a in self.per_row else "whole", value_of(a))
        rows = (-1, self.row) if self.by_rows else (-1,)
        for start, stop in piece_ranges(self.nbytes, self.pieces, self.unit):
            if stop == start:
                continue
            lo, hi = start // isz, stop // isz
            piece = {}
            for a, (where, src) in sources.items():
                if where == "fast":
                    piece[a] = src[lo:hi].view(rows)
                elif where == "slow":
                    tid = self.node_tensor[a]
                    piece[a] = self.memory.read_range(src, start, stop, buffers[tid]).view(self.dtype).view(rows)
                elif where == "row":
                    piece[a] = src[lo // self.row:hi // self.row]
                else:
                    piece[a] = src
            if out_flat is not None:
                self._call(piece, out_flat[lo:hi].view(rows))
                continue
            # born slow: the piece is made in the output's bounce buffer, then written out
            out = torch.frombuffer(buffers[-1], dtype=torch.uint8, count=stop - start)
            self._call(piece, out.view(self.dtype).view(rows))
            del out
            assert handle is not None
            self.memory.write_range(handle, start, buffers[-1], stop - start)

    def _call(self, piece: dict[fx.Node, Any], out: torch.Tensor) -> None:
        """One piece: the kernel on `piece`'s operands, into `out` (its views of the bounce
        buffers die with this frame)."""
        args: Any = piece_args(self.op, fx.node.map_arg(self.node.args, piece.__getitem__))
        kwargs: Any = dict(fx.node.map_arg(self.node.kwargs, piece.__getitem__))
        if self.out_overload is not None:
            op, name = self.out_overload
            op(*args, **kwargs, **{name: out})
        else:
            target: Any = self.node.target
            out.copy_(target(*args, **kwargs))


class GemmPieceRunner:
    """Runs matmul k of `graph` (pieces > 1) by blocks of its output (ir.split.gemm_split):
    the cut input read a block at a time from its slow copy (row by row into a compact
    block where the block is strided there), every other operand from `value_of(node)`.
    Each block of the output is computed apart and copied into place, as the probe
    (frontend/split_probe.py) checked it."""

    def __init__(self, graph: TrainingGraph, k: int, memory: MemorySystem) -> None:
        kern = graph.kernels[k]
        self.node: fx.Node = graph.program.kernel_nodes[k]
        self.op = kern.op
        self.memory = memory
        self.cut = gemm_split(graph, k)
        self.ranges = gemm_ranges(self.cut.extent, kern.pieces)
        self.cut_node = self.node.args[self.cut.position]
        self.split = set(split_inputs(graph, k))
        self.node_tensor = graph.program.node_tensor
        out = self.node.meta["val"]
        self.shape, self.dtype = tuple(out.shape), out.dtype
        self.cut_dtype = self.cut_node.meta["val"].dtype
        self.buffer_bytes = max(b - a for i0, i1 in self.ranges for a, b in self.cut.segments(i0, i1))

    def run(self, fast: Mapping[int, torch.Tensor], slow: Mapping[int, SlowHandle],
            value_of: Callable[[fx.Node], Any], device: torch.device | None = None,
            born_slow: int | None = None) -> torch.Tensor | SlowHandle:
        """The output, in fast memory; or with `born_slow` (its tensor id) in slow memory,
        each block of rows written there as it is made: its handle."""
        if born_slow is not None and self.cut.axis != 0:
            raise TierError(f"{self.op} makes its output by blocks of columns, not ranges: it cannot be born slow")
        out = None if born_slow is not None else torch.empty(self.shape, dtype=self.dtype, device=device)
        values = {a: None if a is self.cut_node else value_of(a) for a in self.node.all_input_nodes}
        args: Any = fx.node.map_arg(self.node.args, values.__getitem__)
        kwargs: Any = dict(fx.node.map_arg(self.node.kwargs, values.__getitem__))
        tid = self.node_tensor[self.cut_node]
        whole = value_of(self.cut_node) if tid in fast else None
        buffer = None if whole is not None else bounce_buffer(self.buffer_bytes)
        row_bytes = self.shape[1] * self.dtype.itemsize
        written = handle = None
        if born_slow is not None:
            handle = self.memory.empty_slow(born_slow, _contiguous_layout(self.shape, self.dtype))
            written = bounce_buffer(max(i1 - i0 for i0, i1 in self.ranges) * row_bytes)
        target: Any = self.node.target
        try:
            for i0, i1 in self.ranges:
                block = gemm_block(whole, self.cut, i0, i1) if whole is not None else \
                    self._read_block(slow[tid], i0, i1, buffer)
                piece = target(*gemm_piece_args(self.op, args, self.cut, block, i0, i1), **kwargs)
                if out is not None:
                    (out[i0:i1] if self.cut.axis == 0 else out[:, i0:i1]).copy_(piece)
                elif handle is not None:  # born slow: the block of rows goes to slow memory through `written`
                    n = (i1 - i0) * row_bytes
                    torch.frombuffer(written, dtype=torch.uint8, count=n).view(self.dtype).view(piece.shape).copy_(piece)
                    self.memory.write_range(handle, i0 * row_bytes, written, n)
                del block, piece
        except BaseException:
            if handle is not None:
                self.memory.free_slow(handle)
            raise
        finally:
            for b in (buffer, written):
                if b is not None:
                    with contextlib.suppress(BufferError):  # (a view still alive: the GC closes it)
                        b.close()
        if out is not None:
            return out
        assert handle is not None
        return handle

    def _read_block(self, h: SlowHandle, i0: int, i1: int, buffer: Any) -> torch.Tensor:
        """Block [i0, i1) of the cut input from its slow copy, laid out as gemm_block's."""
        segments = self.cut.segments(i0, i1)
        shape = self.cut.block_shape(i0, i1)
        if len(segments) == 1:  # (one range: the block is a view of the buffer)
            (a, b), = segments
            block = self.memory.read_range(h, a, b, buffer).view(self.cut_dtype).view(shape)
        else:
            block = torch.empty(shape, dtype=self.cut_dtype)
            for r, (a, b) in enumerate(segments):
                block[r].copy_(self.memory.read_range(h, a, b, buffer).view(self.cut_dtype))
        return block.t() if self.cut.transposed else block


def _contiguous_layout(shape: tuple[int, ...], dtype: torch.dtype) -> TensorLayout:
    """The layout of a split kernel's output (ir.split: the whole of a contiguous storage)."""
    return TensorLayout.of(torch.empty(shape, dtype=dtype, device="meta"))


def piece_runner(graph: TrainingGraph, k: int, memory: MemorySystem) -> PieceRunner | GemmPieceRunner:
    """The runner of split kernel k: by blocks for a matmul, by slices or rows otherwise."""
    return (GemmPieceRunner if graph.kernels[k].op in GEMM_OPS else PieceRunner)(graph, k, memory)
