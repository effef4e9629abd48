"""capture() and replay: graph structure, liveness, signatures, errors, and bit-exact training."""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

from autotm.frontend.capture import capture
from autotm.errors import CaptureError, ReplayError
from autotm.ir.graph import Role, check
from autotm.interpret.replay import TrainingState, replay_step


def small_cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-nesterov-wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd-plain": lambda p: torch.optim.SGD(p, lr=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adam-amsgrad-wd": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True, weight_decay=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_replay_is_bit_identical_to_eager_over_three_iterations(opt_name):
    make_opt = OPTIMIZERS[opt_name]
    eager_model, model = small_cnn(), small_cnn()
    eager_opt, opt = make_opt(eager_model.parameters()), make_opt(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    data = batches(3)
    graph = capture(model, loss_fn, opt, data[0])
    state = TrainingState(graph, model, opt)
    for x, y in data:
        eager_opt.zero_grad(set_to_none=True)
        loss = loss_fn(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        r = replay_step(graph, state, (x, y), keep_gradients=True)
        assert torch.equal(loss.detach(), r.loss)
        for n, p in eager_model.named_parameters():
            assert torch.equal(p.grad, r.gradients[n]), n
    state.write_back(model, opt)
    for (n, a), b in zip(eager_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), n
    es, rs = eager_opt.state_dict()["state"], opt.state_dict()["state"]
    assert es.keys() == rs.keys()
    for i in es:
        for k in es[i]:
            assert torch.equal(torch.as_tensor(es[i][k]), torch.as_tensor(rs[i][k])), (i, k)


def test_a_stop_hook_ends_the_replay_before_a_kernel_and_the_next_run_is_whole():
    """Replay's hook tree: stop(k) True ends the iteration cleanly before kernel k (no
    exception; nothing returned, nothing left in env), and the hooks ran in their order
    for every kernel before it. The same interpreter then runs a whole iteration that
    matches eager bit for bit."""
    from autotm.interpret.replay import Replay

    class Traced(Replay):
        def __init__(self, graph, cut):
            super().__init__(graph)
            self.cut, self.trace = cut, []

        def stop(self, k):
            return self.cut is not None and k == self.cut

        def before_kernel(self, k):
            self.trace.append(("before", k))

        def after_kernel(self, k):
            self.trace.append(("after", k))

        def free(self, tid):
            self.trace.append(("free", tid))
            super().free(tid)

    eager_model, model = small_cnn(), small_cnn()
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)  # noqa: E731
    eager_opt, opt = make(eager_model), make(model)
    x, y = batches(1)[0]
    graph = capture(model, nn.CrossEntropyLoss(), opt, (x, y))
    cut = len(graph.kernels) // 2
    interp = Traced(graph, cut)
    state = TrainingState(graph, model, opt)
    assert interp.run(state.inputs((x, y))) == {} and interp.env == {}
    expected = []
    for k in range(cut):
        expected += [("before", k), ("after", k)] + [("free", t) for t in graph.program.free_after[k]]
    assert interp.trace == expected
    interp.cut = None  # (a fresh state: the stopped run may have updated buffers in place)
    r = replay_step(graph, TrainingState(graph, model, opt), (x, y), interpreter=interp)
    eager_opt.zero_grad(set_to_none=True)
    loss = nn.CrossEntropyLoss()(eager_model(x), y)
    loss.backward()
    assert torch.equal(loss.detach(), r.loss)


def test_replay_calls_the_in_place_form_where_the_executor_does():
    """relu on a dying batch-norm output runs as relu_ in the replay as in the executor (the
    profiler's in-situ timings come from the replay: relu at 128 KiB took ~20 us as out=,
    ~7 us in place), and the values stay eager's (the bit-identity test above)."""
    from autotm.runtime.session import ExecutorSession
    from autotm.ir.plan import all_fast_plan
    from autotm.interpret.replay import Replay, reuse_table
    from autotm.tiers import make_memory_system

    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batches(1)[0]
    graph = capture(model, nn.CrossEntropyLoss(), opt, (x, y))
    table = reuse_table(graph)
    relus = [k for k, kn in enumerate(graph.kernels) if kn.op == "aten.relu.default"]
    inplace = [k for k in relus if table[k] is not None and table[k].inplace is not None]
    assert inplace and str(table[inplace[0]].inplace) == "aten.relu_.default"

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):  # which ATen overloads the replay calls
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            called.append(str(func))
            return func(*args, **(kwargs or {}))
    called: list[str] = []
    with Ops():
        replay_step(graph, TrainingState(graph, model, opt), (x, y), interpreter=Replay(graph))
    assert called.count("aten.relu_.default") == len(inplace)
    assert called.count("aten.relu.default") == len(relus) - len(inplace)
    assert "aten.relu.out" not in called
    # the executor takes the same decision from the same table
    with make_memory_system("cpu+file") as ms:
        s = ExecutorSession(graph, all_fast_plan(graph), ms, model, opt)
        try:
            assert [ck.reuse.inplace if ck.reuse else None for ck in s.executor.kernels] == [
                e.inplace if e else None for e in table]
        finally:
            s.close()


def test_graph_structure_roles_and_views_are_aliases():
    model = small_cnn()
    g = capture(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batches(1)[0])
    check(g)
    roles = {t.role for t in g.tensors}
    assert {Role.WEIGHT, Role.OPTIMIZER_STATE, Role.INPUT, Role.ACTIVATION, Role.GRADIENT, Role.OUTPUT, Role.BUFFER} <= roles
    # views are not kernels and create no tensors: the Linear's weight transpose reads the weight storage
    view_ops = {"aten.t.default", "aten.view.default", "aten.detach.default", "aten._unsafe_view.default"}
    assert not view_ops & {k.op for k in g.kernels}
    addmm = next(k for k in g.kernels if k.op == "aten.addmm.default")
    weight = next(t for t in g.tensors if t.state_key == "param:6.weight")
    assert weight.id in addmm.inputs
    assert addmm.index in weight.users
    # every tensor has a producer or is an input, and users come after producers
    for t in g.tensors:
        if t.producer is not None:
            assert all(u > t.producer for u in t.users)
    # phases are ordered forward, backward, optimizer
    phases = [k.phase for k in g.kernels]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    # one updated weight and momentum per parameter leave the iteration
    outs = {t.state_key for t in g.tensors if t.is_graph_output}
    for n, _ in model.named_parameters():
        assert f"param:{n}" in outs and f"opt:{n}:momentum_buffer" in outs
    assert "loss" in outs
    assert g.parameters == sum(p.numel() for p in model.parameters())


def test_liveness_matches_brute_force():
    model = small_cnn()
    g = capture(model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), batches(1)[0])
    for k in range(len(g.kernels)):
        brute = sum(t.nbytes for t in g.tensors if t.live[0] <= k <= t.live[1])
        assert g.live_bytes[k] == brute
        assert sorted(g.live_set(k)) == sorted(t.id for t in g.tensors if t.live[0] <= k <= t.live[1])
    assert g.peak_live_bytes == max(g.live_bytes)
    by_role = g.live_bytes_by_role()
    assert sum(by_role.values()) == g.peak_live_bytes
    # a kernel's operands are live at it
    for k in g.kernels:
        for tid in k.inputs + k.outputs:
            lo, hi = g.tensors[tid].live
            assert lo <= k.index <= hi


def test_signature_includes_stride_and_padding():
    def conv_sigs(stride, padding):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 4, 3, stride=stride, padding=padding), nn.Flatten(), nn.LazyLinear(2))
        x = torch.randn(2, 3, 8, 8)
        m(x)  # materialize the lazy layer
        g = capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), (x, torch.tensor([0, 1])))
        return {k.signature for k in g.kernels if k.op == "aten.convolution.default"}

    base = conv_sigs(1, 1)
    assert len(base) == 1
    assert base != conv_sigs(2, 1)
    assert base != conv_sigs(1, 0)
    assert "[1, 1]" in next(iter(base))


def test_flops_and_bytes_of_a_matmul():
    torch.manual_seed(0)
    m = nn.Linear(64, 32)
    g = capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), (torch.randn(16, 64), torch.randint(0, 32, (16,))))
    addmm = next(k for k in g.kernels if k.op == "aten.addmm.default")
    assert addmm.flops == 2 * 16 * 64 * 32
    assert addmm.bytes_touched == 4 * (32 + 16 * 64 + 64 * 32 + 16 * 32)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.fc(x))


class Gate(nn.Module):
    def forward(self, x):
        idx = torch.nonzero(x > 0)  # output size depends on the data
        return x * idx.shape[0]


def test_uncapturable_op_names_op_and_module():
    m = DataDependent()
    with pytest.raises(CaptureError) as e:
        capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), (torch.randn(2, 4), torch.tensor([0, 1])))
    msg = str(e.value)
    assert "nonzero" in msg and "gate" in msg


def test_batch_that_does_not_match_the_model_names_the_module():
    m = nn.Sequential(nn.Linear(10, 5))
    with pytest.raises(CaptureError) as e:
        capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.1), (torch.randn(2, 7), torch.tensor([0, 1])))
    assert "0 (Linear)" in str(e.value)


def test_bad_arguments_are_clear():
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(CaptureError, match="example_batch"):
        capture(m, nn.CrossEntropyLoss(), opt, torch.randn(2, 4))
    with pytest.raises(CaptureError, match="not supported"):
        capture(m, nn.CrossEntropyLoss(), torch.optim.RMSprop(m.parameters()), (torch.randn(2, 4), torch.tensor([0, 1])))
    other = nn.Linear(4, 2)
    with pytest.raises(CaptureError, match=r"optimizer group 0 holds a tensor of shape \[2, 4\] that is not a parameter of the model"):
        capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(other.parameters(), lr=0.1), (torch.randn(2, 4), torch.tensor([0, 1])))


def test_replay_rejects_a_batch_of_another_shape():
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = capture(m, nn.CrossEntropyLoss(), opt, (torch.randn(2, 4), torch.tensor([0, 1])))
    state = TrainingState(g, m, opt)
    with pytest.raises(ReplayError, match=r"batch\[0\] is float32\[3, 4\]"):
        replay_step(g, state, (torch.randn(3, 4), torch.tensor([0, 1, 1])))


def test_fake_capture_of_a_650GB_workload_allocates_nothing():
    from autotm.frontend.workloads import capture_workload
    from autotm.zoo import workload

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    g = capture_workload(workload("resnet50", "large"), fake=True)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert g.fake
    assert g.peak_live_bytes > 500e9
    assert grown < 2e9
    check(g)
