"""Planning with kernels in pieces (ir/split.py, planner/splitting.py): on random graphs
whose elementwise kernels may run in pieces, the floor falls, a plan at it validates and
its objective is its simulation; the validator refuses a malformed split."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotm.checks.simulate import simulate
from autotm.checks.validate import validate
from autotm.ir.graph import Role
from autotm.ir.plan import Plan, PlanError
from autotm.ir.split import split_blocker
from autotm.planner import plan, smallest_feasible_budget
from autotm.planner.floor import accounting, smallest_feasible
from graphs import make_graph
from test_planner import cost_model

KIB64 = 64 * 1024


def splittable(g):
    """A hand-built graph's kernels that ir/split.py admits (no probe: no program)."""
    return dataclasses.replace(g, splittable=frozenset(k for k in range(len(g.kernels)) if split_blocker(g, k) is None))


def update_chain():
    """A weight w (1 MiB) read by k0, its gradient made by k3, and the update k4 = add(w,
    grad) -> w' (carried): whole, k4 holds w, grad and w' (in place: no program, so apart)."""
    mb = 16 * KIB64
    sizes = [mb, 4096, 4096, 4096, mb, mb, 4]  # w, x, a, b, grad, w', loss
    kernels = [([0, 1], [2]), ([2], [3]), ([3], [6]), ([3, 2], [4]), ([0, 4], [5])]
    ops = ["aten.mm.default", "aten.relu.default", "aten.sum.default", "aten.mm.default", "aten.add.Tensor"]
    g = make_graph(sizes, kernels, ops=ops, outputs=(5, 6), roles={0: Role.WEIGHT, 5: Role.WEIGHT, 6: Role.OUTPUT})
    return splittable(g)


def test_the_update_in_pieces_needs_one_piece_of_each_input_and_of_its_output():
    g = update_chain()
    assert g.splittable == {1, 4}
    cm = cost_model(g, [1e-3] * len(g.kernels), bw=1e9)
    whole = smallest_feasible(g, "synchronous", "staged", accounting(g, cm.workspace(len(g.kernels))))
    floor = smallest_feasible_budget(g, cm, "synchronous")
    assert floor.bytes < whole.bytes and floor.kernel == 4 and "in 16 pieces" in floor.what
    for formulation in ("synchronous", "asynchronous"):
        p = plan(g, cm, "min", formulation, arena=False, time_limit=20)
        assert dict(p.split) == {4: 16}
        v = validate(p, g)
        assert v.peak_fast_bytes <= floor.bytes
        assert set(v.steps[4].slow_operands) == {0, 4}  # (w and grad read piece by piece)
        assert simulate(p, g, cm).predicted_seconds == pytest.approx(p.meta.objective_seconds, rel=1e-6)
        # JSON keeps the split, and the loaded plan validates against the unsplit graph
        again = Plan.from_json(p.to_json())
        assert again.split == p.split and validate(again, g).peak_fast_bytes == v.peak_fast_bytes


def test_an_output_born_slow_holds_one_piece_while_its_kernel_runs_and_only_a_split_kernel_makes_one():
    g = update_chain()
    cm = cost_model(g, [1e-3] * len(g.kernels), bw=1e9)
    p = plan(g, cm, "min", "synchronous", arena=False, time_limit=20)
    born = dataclasses.replace(p.tensors[5], initial="slow", actions=())
    fast = dataclasses.replace(p.tensors[5], initial="fast", actions=())
    with_born = dataclasses.replace(p, tensors=p.tensors[:5] + (born,) + p.tensors[6:])
    with_fast = dataclasses.replace(p, tensors=p.tensors[:5] + (fast,) + p.tensors[6:])
    piece = 16 * KIB64 // 16
    a, b = validate(with_born, g, budget_bytes=2**40), validate(with_fast, g, budget_bytes=2**40)
    assert b.fast_bytes[4] - a.fast_bytes[4] == 16 * KIB64 - piece  # (w' whole, against one piece of it)
    assert a.steps[4].born_slow == (5,) and b.steps[4].born_slow == ()
    # born slow, w' costs one sync write of its bytes as it is made (a hand-built graph
    # has no program: nothing is carried or returned after the last kernel)
    assert simulate(with_born, g, cm).sync_move_seconds - simulate(with_fast, g, cm).sync_move_seconds == \
        pytest.approx(cm.move_seconds(16 * KIB64, "to_slow", "sync"))
    # a kernel that runs whole writes its outputs to fast memory
    with pytest.raises(PlanError, match="only a kernel that runs in pieces"):
        validate(dataclasses.replace(with_born, split=()), g, budget_bytes=2**40)


def test_the_validator_refuses_a_malformed_split():
    g = update_chain()
    cm = cost_model(g, [1e-3] * len(g.kernels), bw=1e9)
    p = plan(g, cm, "min", "synchronous", arena=False, time_limit=20)
    with pytest.raises(PlanError, match=r"kernel 0 \(aten.mm.default\) cannot run in pieces: aten.mm.default reads"):
        validate(dataclasses.replace(p, split=((0, 4),) + p.split), g)
    with pytest.raises(PlanError, match="kernels 0..4"):
        validate(dataclasses.replace(p, split=((9, 4),)), g)
    # unsplit, the plan reads w and grad from slow memory at k4: refused
    with pytest.raises(PlanError, match="not resident in fast memory"):
        validate(dataclasses.replace(p, split=((1, 2),)), g)


@st.composite
def random_graph_with_elementwise_kernels(draw):
    n = draw(st.integers(4, 12))
    sizes, kernels, ops, live = [], [], [], []
    for _ in range(n):
        t = len(sizes)
        size = draw(st.sampled_from([1, 2, 8])) * KIB64
        same = [u for u in live if sizes[u] == size]
        if same and draw(st.integers(0, 3)):  # an elementwise kernel over tensors of its size
            reads = draw(st.lists(st.sampled_from(same), min_size=1, max_size=2, unique=True))
            ops.append("aten.add.Tensor" if len(reads) == 2 else "aten.sqrt.default")
        else:
            reads = draw(st.lists(st.sampled_from(live), max_size=3, unique=True)) if live else []
            ops.append("aten.mm.default")
        sizes.append(size)
        kernels.append((reads, [t]))
        live.append(t)
    g = splittable(make_graph(sizes, kernels, ops=ops, outputs=(len(sizes) - 1,), roles={len(sizes) - 1: Role.OUTPUT}))
    seconds = [draw(st.floats(1e-4, 1e-2)) for _ in range(n)]
    return g, seconds, draw(st.floats(0.0, 1.0))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph_with_elementwise_kernels(), st.sampled_from(["synchronous", "asynchronous"]))
def test_plans_with_pieces_validate_and_their_objective_is_their_simulation(case, formulation):
    g, seconds, where = case
    cm = cost_model(g, seconds, bw=5e8, latency=1e-5, async_bw=4e8, overlap=True)
    ws = cm.workspace(len(g.kernels))
    whole = smallest_feasible(g, formulation, "staged", accounting(g, ws)).bytes
    floor = smallest_feasible_budget(g, cm, formulation).bytes
    assert floor <= whole
    budget = floor + int(where * (g.peak_live_bytes - floor)) if g.peak_live_bytes > floor else floor
    p = plan(g, cm, budget, formulation, mip_gap=1e-6, time_limit=20, arena=False)
    assert (budget < whole) or not p.split  # (pieces only where the budget needs them)
    v = validate(p, g)
    assert v.peak_fast_bytes <= budget
    assert simulate(p, g, cm).predicted_seconds == pytest.approx(p.meta.objective_seconds, rel=1e-3, abs=1e-9)
    with pytest.raises(Exception, match="bytes"):
        plan(g, cm, floor - 1, formulation, arena=False, time_limit=20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph_with_elementwise_kernels(), st.sampled_from(["synchronous", "asynchronous"]))
def test_plans_at_the_floor_with_outputs_born_slow_validate_and_their_objective_is_their_simulation(case, formulation):
    """At the floor the planner writes outputs of split kernels to slow memory where that is
    what fits (some of these graphs: born_slow steps); the plan validates there and the
    objective is its simulation, write costs included."""
    g, seconds, _ = case
    cm = cost_model(g, seconds, bw=5e8, latency=1e-5, async_bw=4e8, overlap=True)
    floor = smallest_feasible_budget(g, cm, formulation).bytes
    p = plan(g, cm, floor, formulation, mip_gap=1e-6, time_limit=20, arena=False)
    v = validate(p, g)
    assert v.peak_fast_bytes <= floor
    assert simulate(p, g, cm).predicted_seconds == pytest.approx(p.meta.objective_seconds, rel=1e-3, abs=1e-9)
    for s in v.steps:  # (an output born slow: its kernel runs in pieces, and holds one piece of it)
        for t in s.born_slow:
            assert dict(p.split).get(s.kernel, 1) > 1 and p.tensors[t].initial == "slow"


def test_the_check_before_the_profile_knows_the_floor_in_pieces():
    """check_before_profile (a budget against the graph alone, before the profile) lets a
    budget that only pieces make feasible pass, and names the floor in pieces below it."""
    from autotm.errors import InfeasibleBudget
    from autotm.planner.floor import check_before_profile

    g = update_chain()
    cm = cost_model(g, [1e-3] * len(g.kernels), bw=1e9)
    floor = smallest_feasible_budget(g, cm, "synchronous").bytes
    whole = smallest_feasible(g, "synchronous", "staged", accounting(g, cm.workspace(len(g.kernels)))).bytes
    assert floor < whole
    check_before_profile(g, floor, "synchronous", "staged")
    with pytest.raises(InfeasibleBudget) as e:
        check_before_profile(g, floor - 1, "synchronous", "staged")
    assert e.value.minimum == floor and "pieces" in str(e.value)
    with pytest.raises(InfeasibleBudget):
        check_before_profile(g, floor, "lru", "staged")
