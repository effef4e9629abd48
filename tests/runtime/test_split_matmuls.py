"""Matmuls by blocks of their output (ir.split.GEMM_OPS): the byte ranges a block is read
from are the block, in the layout the probe checked, for every storage order and cut;
the probe refuses a matmul whose blocks round otherwise; the transformer's head at the
`cpu` preset runs in pieces (its logits' three matmuls). Training through blocks read
from the file tier: tests/runtime/test_split_pieces.py (the language-model head)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autotm.frontend.split_probe import gemm_agrees
from autotm.ir.split import GEMM_ALIGN, GEMM_OPS, GemmSplit, Operand, gemm_block, gemm_ranges, gemm_split
from test_split_pieces import captured


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 300), q=st.integers(1, 300), transposed=st.booleans(), axis=st.integers(0, 1),
       pieces=st.integers(1, 9), data=st.data())
def test_a_blocks_byte_ranges_hold_the_block_as_the_probe_lays_it_out(p, q, transposed, axis, pieces, data):
    stored = torch.randn(p, q)
    value = stored.t() if transposed else stored
    extent = value.shape[axis]
    operand = Operand(0, tuple(value.shape), tuple(value.stride()), 0, "float32", 0)
    cut = GemmSplit(axis, operand, extent, (p, q), transposed, 4)
    ranges = gemm_ranges(extent, pieces)
    assert ranges[0][0] == 0 and ranges[-1][1] == extent and all(a < b for a, b in ranges)
    assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))
    assert all(a % GEMM_ALIGN == 0 for a, _ in ranges)
    i0, i1 = data.draw(st.sampled_from(ranges))
    storage = stored.reshape(-1).view(torch.uint8)
    read = torch.cat([storage[a:b] for a, b in cut.segments(i0, i1)]).view(torch.float32).view(cut.block_shape(i0, i1))
    assert cut.block_bytes(i0, i1) == read.numel() * 4
    read = read.t() if transposed else read
    block = gemm_block(value, cut, i0, i1)
    want = value[i0:i1] if axis == 0 else value[:, i0:i1]
    assert torch.equal(read, want) and torch.equal(block, want)
    # (the probe's blocks are laid out as the reads; a dimension of one has no stride to keep)
    assert [st for st, n in zip(block.stride(), block.shape) if n > 1] == \
        [st for st, n in zip(read.stride(), read.shape) if n > 1]


def _sums_in_another_order(a, b):
    """A matmul whose blocks of rows are summed in double: other bits than the whole."""
    if a.shape[0] < 256:
        return (a.double() @ b.double()).float()
    return a @ b


def test_the_probe_refuses_a_matmul_whose_blocks_give_other_bits():
    g, _ = captured("sgd-momentum", "lm")
    k = next(k.index for k in g.kernels if k.op == "aten.mm.default" and k.index in g.splittable
             and gemm_split(g, k.index).axis == 0 and not gemm_split(g, k.index).transposed)
    assert gemm_agrees(g, k)
    node = g.program.kernel_nodes[k]
    node.target = _sums_in_another_order
    assert not gemm_agrees(g, k)


def test_every_matmul_op_names_its_matrices():
    for op, rule in GEMM_OPS.items():
        assert rule.a != rule.b and rule.bias in (None, 0), op
