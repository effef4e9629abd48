"""Models as users have them: tied, frozen and optimizer-less parameters, read-only and
mutated buffers, eval mode, compiled and trained bit for bit like eager PyTorch."""

import copy

import pytest
import torch
from torch import nn

import autotm
from autotm.errors import CaptureError, ReplayError
from eager_twin import captured_ops, eager_ops, eager_step, train_twins
from tied_frozen_model import batches, lm_loss, model


@pytest.mark.parametrize("budget", ["1:1", "2:1"])
def test_tied_frozen_parameters_and_buffers_train_like_eager(budget):
    m = model()
    run = train_twins(m, lambda mm: torch.optim.Adam(mm.parameters(), lr=0.01), lm_loss, batches(), budget=budget)
    assert run.mismatches == []
    assert m.head.weight is m.emb.weight  # still one tensor
    if budget == "2:1":
        assert run.bytes_to_slow > 0


def test_tied_parameter_is_carried_once_and_updated_once():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    step = autotm.compile(m, lm_loss, opt, batches()[0], budget="1:1")
    try:
        p = step.graph.program
        assert "emb.weight" in p.param_names and "head.weight" not in p.param_names
        assert sum(k.startswith("param:emb.weight") for k, _ in p.input_keys) == 1
        assert "frozen.weight" in p.param_names and "frozen.weight" not in p.param_groups
        assert "opt:frozen.weight:momentum_buffer" not in p.output_keys
        step.sync()  # (a value the plan keeps slow is an empty tensor in the model between steps)
        before = m.frozen.weight.detach().clone()
        step(*batches()[0])
        step.sync()  # (state the plan keeps in slow memory)
        assert torch.equal(m.frozen.weight, before)
        assert m.frozen.weight.grad is None and m.frozen.weight not in opt.state
        assert len(opt.state) == len([q for q in m.parameters() if q.requires_grad])
    finally:
        step.close()


def test_frozen_parameter_in_the_optimizer_is_skipped_as_eager_skips_it():
    m = model()
    # the optimizer holds every parameter, the frozen ones too (eager skips those without a gradient)
    run = train_twins(m, lambda mm: torch.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
                      lm_loss, batches(), budget="1:1")
    assert run.mismatches == []


def test_trainable_parameter_in_no_optimizer_group_is_refused_by_name():
    m = model()
    opt = torch.optim.SGD([q for n, q in m.named_parameters() if not n.startswith("mix.")], lr=0.1)
    with pytest.raises(CaptureError, match=r"trainable parameters in no optimizer group: mix\.weight, mix\.bias"):
        autotm.compile(m, lm_loss, opt, batches()[0], budget="1:1")


class ConstantBuffer(nn.Module):
    """The issue's repro: a buffer read but never written, on the arena-following executor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)
        self.register_buffer("offset", torch.linspace(-1, 1, 16), persistent=False)

    def forward(self, x):
        return self.lin(x + self.offset)


def test_read_only_buffer_survives_steps_on_the_arena_executor():
    torch.manual_seed(0)
    m = ConstantBuffer()
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(3)]
    xs = [x.clone() for x, _ in data]
    run = train_twins(m, lambda mm: torch.optim.SGD(mm.parameters(), lr=0.1), nn.CrossEntropyLoss(), data,
                      budget="64KiB")
    assert run.follows_layout
    assert run.mismatches == []
    assert all(torch.equal(x, d[0]) for x, d in zip(xs, data))  # the caller's batch is never written


def test_model_compiled_in_eval_mode_updates_no_running_stats():
    m = model().eval()
    stats = m.norm.running_mean.clone()
    run = train_twins(m, lambda mm: torch.optim.SGD(mm.parameters(), lr=0.1), lm_loss, batches(), budget="1:1")
    assert run.mismatches == []
    assert torch.equal(m.norm.running_mean, stats) and int(m.norm.num_batches_tracked) == 0


class Activations(nn.Module):
    """Ops whose eager backward is a fused kernel (SiLU, Mish, GELU, Hardswish) and dropout."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.act = nn.Sequential(nn.SiLU(), nn.Mish(), nn.GELU(), nn.Hardswish())
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.c(self.drop(self.act(self.b(self.drop(torch.tanh(self.a(x)))))))


def activation_data():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]


def test_fused_backward_kernels_stay_fused_as_eager_runs_them():
    torch.manual_seed(0)
    m = Activations()
    data = activation_data()
    graph = autotm.capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), data[0])
    ops = captured_ops(graph)
    assert {"silu_backward", "mish_backward", "gelu_backward", "hardswish_backward"} <= ops
    assert ops == eager_ops(m, nn.CrossEntropyLoss(), data[0])


def test_dropout_consumes_the_rng_as_eager_and_compile_leaves_it_alone():
    torch.manual_seed(0)
    m = Activations()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    run = train_twins(m, lambda mm: torch.optim.Adam(mm.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                      activation_data(), budget="1:1")
    assert run.mismatches == []  # losses, weights and the RNG state after every step
    # compile drew random profile operands and seeded its calibration, then put the RNG back
    torch.manual_seed(123)
    m2 = Activations()
    opt = torch.optim.SGD(m2.parameters(), lr=0.1)
    torch.set_rng_state(state)
    step = autotm.compile(m2, nn.CrossEntropyLoss(), opt, activation_data()[0], budget="64KiB")
    try:
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        step.close()


def test_eager_tensors_made_after_compile_do_not_come_from_the_arena():
    torch.manual_seed(0)
    m = ConstantBuffer()
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(2)]
    step = autotm.compile(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), data[0], budget="64KiB")
    try:
        ex = step.session.executor
        assert ex.follows_layout
        step(*data[0])
        # the arena allocator stays PyTorch's CPU allocator (c10 cannot uninstall one), but
        # between steps it hands every allocation to the allocator it replaced
        mine = [torch.empty(8 << 20, dtype=torch.uint8), torch.randn(64, 64), torch.zeros(1 << 20)]
        for t in mine:
            assert ex.arena.offset_of(t) < 0
            assert ex.pool is None or ex.pool.offset_of(t) < 0
        step(*data[1])
        assert all(ex.arena.offset_of(t) < 0 for t in [torch.ones(4 << 20), torch.ones(3)])
    finally:
        step.close()


def test_a_batch_of_another_shape_or_dtype_is_refused_by_name_and_the_step_goes_on():
    torch.manual_seed(0)
    m = ConstantBuffer()
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(2)]
    twin = copy.deepcopy(m)
    step = autotm.compile(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), data[0], budget="64KiB")
    try:
        with pytest.raises(ReplayError, match=r"batch\[0\] is float32\[4, 16\] but the graph was captured with "
                                              r"float32\[8, 16\]"):
            step(torch.randn(4, 16), torch.randint(0, 4, (4,)))
        with pytest.raises(ReplayError, match=r"batch\[1\] is int32\[8\] but the graph was captured with int64\[8\]"):
            step(data[0][0], data[0][1].int())
        opt = torch.optim.SGD(twin.parameters(), lr=0.1)
        for batch in data:  # refused batches left nothing behind
            assert torch.equal(step(*batch), eager_step(twin, nn.CrossEntropyLoss(), opt, batch))
        assert torch.equal(m.lin.weight, twin.lin.weight)
    finally:
        step.close()


def test_a_trainable_parameter_the_loss_does_not_reach_is_refused():
    m = model()
    m.unused = nn.Linear(4, 4)
    with pytest.raises(CaptureError, match="a trainable parameter does not reach the loss"):
        autotm.capture(m, lm_loss, torch.optim.SGD(m.parameters(), lr=0.1), batches()[0])
    m.unused.requires_grad_(False)  # frozen, it is carried and left alone
    graph = autotm.capture(m, lm_loss, torch.optim.SGD(m.parameters(), lr=0.1), batches()[0])
    assert "unused.weight" in graph.program.param_names and "unused.weight" not in graph.program.param_groups
