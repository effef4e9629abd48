"""Kernels that run in pieces (ir/split.py): which may, that their pieces give the bits
of the whole kernel with inputs read from a real slow tier, and that training at a
budget only pieces make feasible is bit-identical to eager PyTorch. Three models: a wide
layer (its update splits elementwise), a language-model head over an 8,192-word
vocabulary (its loss's softmax and backward split by rows, its matmuls by blocks, one of
them read row by row) and a self-attention."""

import copy
import re

import pytest
import torch
import torch.fx as fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import autotm
from autotm.checks.validate import validate
from autotm.frontend.capture import capture
from autotm.frontend.split_probe import pieces_agree
from autotm.interpret.replay import Replay, TrainingState
from autotm.errors import GraphError
from autotm.ir.split import (GEMM_OPS, PIECE_ALIGN, born_slow_piece, gemm_split, kernel_pieces, piece_ranges,
                             piece_unit, split_blocker, split_inputs, with_pieces)
from autotm.planner.floor import accounting, smallest_feasible
from autotm.profile import profile
from autotm.runtime.pieces import piece_runner
from autotm.tiers import make_memory_system
from eager_twin import compare_state, eager_step

OPTIMIZERS = {
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
}


def wide_model():
    """One wide layer (a 2 MiB weight): its update sets the smallest budget whole."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 8))


VOCAB, ROWS = 8192, 256


class LanguageModelHead(nn.Module):
    """Embedding and a projection to the vocabulary: its logits (8 MiB) and their
    gradient set the smallest budget whole, in the loss's log-softmax backward."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(VOCAB, 64), nn.Linear(64, VOCAB)

    def forward(self, x):
        return self.head(self.emb(x)).view(-1, VOCAB)


def lm_model():
    torch.manual_seed(0)
    return LanguageModelHead()


class Attention(nn.Module):
    """Self-attention over 128 positions in 2 heads: a softmax over the last dimension of
    a 4-d tensor (512 KiB), and its backward."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 3 * 32), nn.Linear(32 * 128, 8)

    def forward(self, x):
        b = x.shape[0]
        q, k, v = (t.view(b, 128, 2, 16).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return self.out((a @ v).transpose(1, 2).reshape(b, -1))


def attention_model():
    torch.manual_seed(0)
    return Attention()


MODELS = {"wide": wide_model, "lm": lm_model, "attention": attention_model}


def batches(n=3, model="wide"):
    g = torch.Generator().manual_seed(1)
    if model == "lm":
        return [(torch.randint(0, VOCAB, (ROWS,), generator=g), torch.randint(0, VOCAB, (ROWS,), generator=g))
                for _ in range(n)]
    if model == "attention":
        return [(torch.randn(4, 128, 16, generator=g), torch.randint(0, 8, (4,), generator=g)) for _ in range(n)]
    return [(torch.randn(2, 256, generator=g), torch.randint(0, 8, (2,), generator=g)) for _ in range(n)]


def captured(optimizer, model="wide"):
    m = MODELS[model]()
    return capture(m, nn.CrossEntropyLoss(), OPTIMIZERS[optimizer](m), batches(model=model)[0]), m


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_updates_may_run_in_pieces_and_the_matmuls_by_blocks_of_their_largest_operand(optimizer):
    g, _ = captured(optimizer)
    updates = [k.index for k in g.kernels if k.phase == "optimizer" and g.tensors[k.outputs[0]].nbytes > 4]
    assert updates and set(updates) <= g.splittable
    matmuls = [k for k in g.kernels if k.op in GEMM_OPS]
    assert matmuls and any(k.index in g.splittable for k in matmuls)
    for k in matmuls:
        if k.index in g.splittable:
            cut = gemm_split(g, k.index)
            assert split_inputs(g, k.index) == (cut.operand.tensor,)
            largest = max(g.tensors[t].nbytes for t in k.inputs)
            if g.tensors[k.outputs[0]].nbytes > largest:  # (blocks of its rows, each written as made)
                assert cut.axis == 0 and born_slow_piece(with_pieces(g, {k.index: kernel_pieces(g, k.index)}), k.index)
            else:
                assert g.tensors[cut.operand.tensor].nbytes == largest
        else:  # (the 2 x 8 logits' matmuls hold too little to matter; the weight's gradient
            # reads a 2 x 2,048 gradient: too few bytes for one block)
            assert re.search("not tried in pieces|too few to cut", split_blocker(g, k.index))
    k = next(k.index for k in matmuls if k.index in g.splittable)
    with pytest.raises(GraphError, match="blocks"):  # (only the blocks the probe checked)
        with_pieces(g, {k: kernel_pieces(g, k) + 1})


def test_the_loss_runs_in_rows_and_a_softmax_across_rows_says_why_not():
    g, _ = captured("sgd-momentum", "lm")
    rows = {k.op: k.index for k in g.kernels if "softmax" in k.op or "nll_loss" in k.op}
    for op in ("aten._log_softmax.default", "aten.nll_loss_backward.default",
               "aten._log_softmax_backward_data.default"):
        k = rows[op]
        assert k in g.splittable, op
        unit = piece_unit(g, k)
        assert unit % PIECE_ALIGN == 0 and unit % (VOCAB * 4) == 0
        # the targets (one per row) are read whole and sliced, not read from slow memory
        assert all(g.tensors[t].shape == (ROWS, VOCAB) for t in split_inputs(g, k)), op
    assert "not elementwise" in split_blocker(g, rows["aten.nll_loss_forward.default"])
    node = g.program.kernel_nodes[rows["aten._log_softmax.default"]]
    node.args, node.kwargs = node.args[:1], {"dim": node.args[1], "half_to_float": node.args[2]}
    assert "by keyword" in split_blocker(g, rows["aten._log_softmax.default"])  # (the pieces set it by position)

    class Columns(nn.Module):
        def forward(self, x):
            return torch.log_softmax(x, dim=0)
    m = nn.Sequential(nn.Linear(8, 4096), Columns())
    g2 = capture(m, nn.NLLLoss(), torch.optim.SGD(m.parameters(), lr=0.1),
                 (torch.randn(64, 8), torch.randint(0, 4096, (64,))))
    k = next(k.index for k in g2.kernels if k.op == "aten._log_softmax.default")
    assert k not in g2.splittable and "not the last" in split_blocker(g2, k)


@settings(max_examples=40, deadline=None)
@given(row=st.integers(1, 9000), rows=st.integers(1, 600), itemsize=st.sampled_from([2, 4, 8]),
       pieces=st.integers(1, 64))
def test_pieces_of_rows_start_on_rows_and_pages_and_cover_the_tensor(row, rows, itemsize, pieces):
    import math
    nbytes, unit = row * rows * itemsize, math.lcm(PIECE_ALIGN, row * itemsize)
    ranges = piece_ranges(nbytes, pieces, unit)
    assert len(ranges) == pieces and ranges[0][0] == 0 and ranges[-1][1] == nbytes
    for (a, b), (c, _) in zip(ranges, ranges[1:]):
        assert b == c and a <= b
    for a, b in ranges:
        assert (a == nbytes or a % unit == 0) and (b == nbytes or b % unit == 0)  # (empty pieces at the end)


def _node(fn, n=10):
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(n)
    y = graph.call_function(fn, (x,))
    y.meta["val"] = torch.empty(n)
    return y


def _minus_mean(a):
    return a - a.mean()


def test_the_probe_refuses_a_kernel_whose_pieces_give_other_bits():
    assert pieces_agree(_node(torch.ops.aten.sqrt.default))
    assert not pieces_agree(_node(_minus_mean))  # (each piece would subtract its own mean)


class _PiecesBesideWhole(Replay):
    """Runs the iteration; at each split kernel also runs it in pieces, some inputs read
    from the slow tier, and records whether every bit agrees with the whole kernel."""

    def __init__(self, graph, pieces, slow_every, memory):
        super().__init__(graph)
        self.pieces, self.slow_every, self.memory = pieces, slow_every, memory
        self.checked: dict[int, bool] = {}
        self.born: set[int] = set()  # the kernels also run with their output born slow
        self.gemms = {kn.index for kn in graph.kernels if kn.op in GEMM_OPS}  # (in the probe's blocks only)

    def run_kernel(self, k):
        if k in self.graph.splittable:
            args, kwargs = self.operands(k)
            node = self.program.kernel_nodes[k]
            whole = node.target(*args, **kwargs)
            # each operand as the kernel reads it (a view of its storage: W.t() for a Linear)
            read = dict(zip(node.args, args)) | {node.kwargs[n]: v for n, v in kwargs.items()}
            split = with_pieces(self.graph, {k: kernel_pieces(self.graph, k) if k in self.gemms else self.pieces})
            ins = split_inputs(split, k)
            slow = {t: self.memory.to_slow(t, self.env[t]) for i, t in enumerate(ins) if i % self.slow_every == 0}
            runner = piece_runner(split, k, self.memory)
            fast = {t: self.env[t] for t in ins if t not in slow}
            try:
                got = [runner.run(fast, slow, read.__getitem__)]
                if born_slow_piece(split, k):  # and its output written to the file piece by piece
                    h = runner.run(fast, slow, read.__getitem__, born_slow=split.kernels[k].outputs[0])
                    got.append(self.memory.to_fast(h))
                    self.memory.free_slow(h)
                    self.born.add(k)
            finally:
                for h in slow.values():
                    self.memory.free_slow(h)
            self.checked[k] = all(whole.dtype == v.dtype and torch.equal(
                whole.view(torch.int32) if whole.dtype == torch.float32 else whole,
                v.view(torch.int32) if v.dtype == torch.float32 else v) for v in got)
        super().run_kernel(k)


@pytest.mark.parametrize("model", sorted(MODELS))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(optimizer=st.sampled_from(sorted(OPTIMIZERS)), pieces=st.sampled_from([2, 7, 64]),
       slow_every=st.sampled_from([1, 2]))
def test_pieces_read_from_the_file_tier_give_the_whole_kernels_bits(model, optimizer, pieces, slow_every):
    g, m = captured(optimizer, model)
    state = TrainingState(g, m, OPTIMIZERS[optimizer](m))
    with make_memory_system("cpu+file") as memory:
        r = _PiecesBesideWhole(g, pieces, slow_every, memory)
        r.run(state.inputs(batches(model=model)[0]))
    assert set(r.checked) == set(g.splittable) and all(r.checked.values()), r.checked
    # every split kernel but a matmul by columns may write its output to slow memory
    assert r.born == {k for k in g.splittable if g.kernels[k].op not in GEMM_OPS or gemm_split(g, k).axis == 0}


@pytest.mark.parametrize("model_name,optimizer", [("wide", "adamw"), ("wide", "sgd-momentum"), ("lm", "sgd-momentum")])
def test_training_where_only_pieces_fit_is_bit_identical_to_eager(model_name, optimizer, tmp_path):
    """The smallest budget with kernels in pieces is under the smallest without (the update
    of the wide layer, whole, needs parameter and gradient, or moment and gradient, at
    once; the head's log-softmax backward its logits, their gradient and its own); training
    there on cpu+file reads inputs from the file piece by piece and gives eager PyTorch's
    bits."""
    model = MODELS[model_name]()
    twin = copy.deepcopy(model)
    opt, twin_opt = OPTIMIZERS[optimizer](model), OPTIMIZERS[optimizer](twin)
    step = autotm.compile(model, nn.CrossEntropyLoss(), opt, batches(model=model_name)[0], memory="cpu+file",
                          budget="min", cache=str(tmp_path / "c.sqlite"))
    try:
        g, p = step.graph, step.plan
        whole = smallest_feasible(g, "asynchronous", "staged", accounting(g, step.cost_model.workspace(len(g.kernels))))
        assert p.split and p.meta.budget_bytes < whole.bytes
        steps = validate(p, g).steps
        assert any(s.slow_operands for s in steps if s.kernel in dict(p.split))  # (read from slow memory)
        assert any(s.born_slow for s in steps)  # (an output written to slow memory piece by piece)
        if model_name == "lm":  # (the head's three matmuls too: its logits, their gradient and the weight's)
            assert {g.kernels[k].op for k, _ in p.split} >= {"aten._log_softmax_backward_data.default",
                                                              "aten.addmm.default", "aten.mm.default"}
            assert any(gemm_split(g, k).stored_cut == 1 for k, _ in p.split if g.kernels[k].op in GEMM_OPS)
        for i, batch in enumerate(batches(model=model_name)):
            torch.manual_seed(i)
            got = step(*batch)
            torch.manual_seed(i)
            want = eager_step(twin, nn.CrossEntropyLoss(), twin_opt, batch)
            assert torch.equal(got, want), i
    finally:
        step.close()
    assert compare_state(model, opt, twin, twin_opt) == []


def test_a_budget_under_the_pieces_floor_names_the_kernel_and_its_pieces(tmp_path):
    g, _ = captured("sgd-momentum")
    cm = profile(g, "sim:nvme", str(tmp_path / "c.sqlite"))
    floor = autotm.planner.smallest_feasible_budget(g, cm, "synchronous")
    with pytest.raises(autotm.InfeasibleBudget, match="pieces") as e:
        autotm.planner.plan(g, cm, floor.bytes - 1, "synchronous", arena=False)
    assert e.value.minimum == floor.bytes
    lru = autotm.planner.smallest_feasible_budget(g, cm, "lru")
    assert lru.bytes > floor.bytes and "runs every kernel whole" in lru.what
