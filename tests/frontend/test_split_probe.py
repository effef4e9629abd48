"""The split probe (frontend/split_probe.py) against the kernels' real sizes: a kind it
admits gives the whole kernel's bits in pieces where the whole kernel's threads end their
shares off every vector width, so that their scalar tails fall elsewhere than the pieces'.
(Sigmoid's vector and scalar code round differently on x86; the probe's boundaries alone,
with a handful of elements changing code, had admitted it.)"""

import pytest
import torch
import torch.fx as fx

from autotm.frontend.split_probe import pieces_agree
from autotm.ir.split import PIECE_ALIGN, SPLIT_OPS, piece_ranges

A = torch.ops.aten
# (op, tensor operands, other arguments): every kind of SPLIT_OPS with float operands
KINDS = [
    (A.add.Tensor, 2, (), {"alpha": 0.3}), (A.sub.Tensor, 2, (), {}), (A.mul.Tensor, 2, (), {}),
    (A.div.Tensor, 2, (), {}), (A.neg.default, 1, (), {}), (A.add.Scalar, 1, (0.7,), {}),
    (A.sub.Scalar, 1, (0.7,), {}), (A.mul.Scalar, 1, (0.7,), {}), (A.div.Scalar, 1, (0.7,), {}),
    (A.rsub.Scalar, 1, (0.7,), {}), (A.sqrt.default, 1, (), {}), (A.rsqrt.default, 1, (), {}),
    (A.reciprocal.default, 1, (), {}), (A.square.default, 1, (), {}), (A.pow.Tensor_Scalar, 1, (2,), {}),
    (A.pow.Tensor_Scalar, 1, (0.5,), {}), (A.pow.Tensor_Scalar, 1, (2.5,), {}), (A.exp.default, 1, (), {}),
    (A.log.default, 1, (), {}), (A.erf.default, 1, (), {}), (A.sin.default, 1, (), {}), (A.cos.default, 1, (), {}),
    (A.addcmul.default, 3, (), {"value": 0.1}), (A.addcdiv.default, 3, (), {"value": 0.1}),
    (A.lerp.Scalar, 2, (0.3,), {}), (A.lerp.Tensor, 3, (), {}), (A.maximum.default, 2, (), {}),
    (A.minimum.default, 2, (), {}), (A.abs.default, 1, (), {}), (A.sign.default, 1, (), {}),
    (A.clamp.default, 1, (-0.5, 0.5), {}), (A.clamp_min.default, 1, (0.1,), {}), (A.clamp_max.default, 1, (0.1,), {}),
    (A.relu.default, 1, (), {}), (A.sigmoid.default, 1, (), {}), (A.sigmoid_backward.default, 2, (), {}),
    (A.tanh.default, 1, (), {}), (A.tanh_backward.default, 2, (), {}), (A.hardtanh.default, 1, (), {}),
    (A.hardtanh_backward.default, 2, (-1.0, 1.0), {}), (A.hardswish.default, 1, (), {}),
    (A.hardswish_backward.default, 2, (), {}), (A.hardsigmoid.default, 1, (), {}),
    (A.hardsigmoid_backward.default, 2, (), {}), (A.leaky_relu.default, 1, (0.01,), {}),
    (A.leaky_relu_backward.default, 2, (0.01, False), {}),
]
# each thread's share of the whole kernel ends 8 or 12 elements off a 16-element vector
ELEMENTS = 3 * 65536 + 24


BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def _node(op, inputs, args, kwargs, dtype):
    graph = fx.Graph()
    xs = []
    for i in range(inputs):
        x = graph.placeholder(f"x{i}")
        x.meta["val"] = torch.empty(ELEMENTS, dtype=dtype)
        xs.append(x)
    y = graph.call_function(op, (*xs, *args), kwargs)
    y.meta["val"] = torch.empty(ELEMENTS, dtype=dtype)
    return y


def test_every_kind_here_is_in_the_split_list():
    assert {str(op) for op, *_ in KINDS} <= SPLIT_OPS


@pytest.mark.parametrize(("dtype", "threads"), [(torch.float32, 2), (torch.float32, 3), (torch.bfloat16, 2),
                                                (torch.float64, 3)], ids=str)
@pytest.mark.parametrize(("op", "inputs", "args", "kwargs"), KINDS, ids=str)
def test_a_kind_the_probe_admits_gives_the_whole_kernels_bits_at_real_sizes(op, inputs, args, kwargs, dtype, threads):
    if not pieces_agree(_node(op, inputs, args, kwargs, dtype)):
        return  # (refused here: it never runs in pieces on this machine)
    gen = torch.Generator().manual_seed(threads)
    scale = torch.where(torch.arange(ELEMENTS) % 3 == 0, 40.0, 3.0).to(torch.float64)
    xs = [((torch.rand(ELEMENTS, generator=gen, dtype=torch.float64) * 2 - 1) * scale).to(dtype) for _ in range(inputs)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = op(*xs, *args, **kwargs)
        for pieces in (2, 7, 64):
            size = whole.element_size()
            ranges = piece_ranges(ELEMENTS * size, pieces, PIECE_ALIGN)
            got = torch.cat([op(*(x[a // size:b // size] for x in xs), *args, **kwargs) for a, b in ranges])
            assert torch.equal(whole.view(BITS[dtype]), got.view(BITS[dtype])), \
                f"{op} ({dtype}) admitted by the probe, but {pieces} pieces on {threads} threads give other bits"
    finally:
        torch.set_num_threads(before)
