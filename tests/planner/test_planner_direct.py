"""The synchronous and asynchronous formulations on direct-access memory systems.

Kernels may read operands in slow memory in place (at the profiled placement cost) and
tensors may move between tiers: hand-solved optima, then properties on random graphs.
Plans are made with arena=False: the comparisons are at one budget.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotm.ir.graph import Role
from autotm.planner import InfeasibleBudget, plan
from autotm.checks.simulate import simulate
from autotm.checks.validate import validate
from graphs import make_graph
from test_planner import chain_with_one_big_activation, direct_cost_model


def weight_read_by_four_kernels():
    """W (100 B, a weight) is read by k2..k5; k0 makes `a` (100 B) that k1 reads.

        kernel    0     1     2     3     4     5      seconds: k0, k1 10 s; k2..k5 1 s
        live     a,x   a,b   W,b,c W,c,d W,d,e W,e,o   (x, b..e, o: 1 B each)
        With a budget of 103 W cannot be fast at k0 and k1 (with a); an operand in slow
        memory costs its kernel 50 % more.
          static: W slow for life: k2..k5 take 1.5 s each              = 26.0 s
          synchronous: W starts slow, prefetched before k2 (0.1 s)     = 24.1 s
    """
    sizes = [100, 1, 100, 1, 1, 1, 1, 1]  # W, x, a, b, c, d, e, out
    kernels = [([1], [2]), ([2], [3]), ([0, 3], [4]), ([0, 4], [5]), ([0, 5], [6]), ([0, 6], [7])]
    return make_graph(sizes, kernels, outputs=(7,), roles={0: Role.WEIGHT, 1: Role.INPUT, 7: Role.OUTPUT})


def test_a_tensor_read_by_many_kernels_is_prefetched_not_read_in_place():
    g = weight_read_by_four_kernels()
    cm = direct_cost_model(g, [10.0, 10.0, 1.0, 1.0, 1.0, 1.0])
    static = plan(g, cm, 103, "static", arena=False)
    assert static.meta.predicted_seconds == pytest.approx(26.0)
    for f in ("synchronous", "asynchronous"):
        p = plan(g, cm, 103, f, arena=False, mip_gap=1e-6)
        assert p.meta.predicted_seconds == pytest.approx(24.1)
        w = next(tp for tp in p.tensors if tp.id == 0)
        assert w.initial == "slow" and [(a.kind, a.at, a.mode) for a in w.actions] == [("prefetch", 2, "sync")]
        assert validate(p, g).peak_fast_bytes <= 103
        assert simulate(p, g, cm).predicted_seconds == pytest.approx(p.meta.objective_seconds, rel=1e-9)
    # with room for W all along, it simply stays fast
    assert plan(g, cm, 203, "synchronous", arena=False).meta.predicted_seconds == pytest.approx(24.0)


def test_asynchronous_moves_overlap_kernels_and_slow_reads_stay_in_place():
    g = chain_with_one_big_activation()
    # big (tensor 0) is needed only by k5, a cheap kernel: reading it in place there (0.05 s)
    # beats bringing it back (0.1 s); async, both copies hide under the 1 s kernels
    cm = direct_cost_model(g, [1.0, 1.0, 1.0, 5.0, 1.0, 0.1])
    sync = plan(g, cm, 102, "synchronous", arena=False, mip_gap=1e-6)
    assert sync.meta.predicted_seconds == pytest.approx(9.1 + 0.1 + 0.05)
    big = next(tp for tp in sync.tensors if tp.id == 0)
    assert [(a.kind, a.at, a.mode) for a in big.actions] == [("evict", 1, "sync")]
    asyn = plan(g, cm, 102, "asynchronous", arena=False, mip_gap=1e-6)
    assert asyn.meta.predicted_seconds == pytest.approx(9.1)
    big = next(tp for tp in asyn.tensors if tp.id == 0)
    assert [(a.kind, a.mode) for a in big.actions] == [("evict", "async"), ("prefetch", "async")]
    assert big.actions[-1].at == 4  # over k4, the only kernel between the tmp's death and k5
    for p in (sync, asyn):
        assert validate(p, g).peak_fast_bytes <= 102
        assert p.access == "direct"


def test_lru_runs_on_direct_access_too():
    g = chain_with_one_big_activation()
    cm = direct_cost_model(g, [1.0] * 6)
    p = plan(g, cm, 102, "lru", arena=False)
    assert p.access == "direct" and p.meta.predicted_seconds == pytest.approx(6.2)
    assert plan(g, cm, 102, "synchronous", arena=False, mip_gap=1e-6).meta.predicted_seconds <= 6.2 + 1e-9


@st.composite
def direct_case(draw):
    n = draw(st.integers(4, 10))
    sizes, kernels, live = [], [], []
    roles = {}
    for k in range(n):
        reads = draw(st.lists(st.sampled_from(live), max_size=3, unique=True)) if live else []
        if draw(st.booleans()) and k < n - 1:  # a weight this kernel reads
            sizes.append(draw(st.integers(1, 64)) * 1024)
            roles[len(sizes) - 1] = Role.WEIGHT
            reads = reads + [len(sizes) - 1]
        t = len(sizes)
        sizes.append(draw(st.integers(1, 64)) * 1024)
        kernels.append((reads, [t]))
        live.append(t)
    roles[len(sizes) - 1] = Role.OUTPUT
    g = make_graph(sizes, kernels, outputs=(len(sizes) - 1,), roles=roles)
    seconds = [draw(st.floats(1e-4, 1e-2)) for _ in range(n)]
    slow_factor = draw(st.floats(1.05, 4.0))
    fixed = max(sum(sizes[t] for t in ins + outs if g.tensors[t].role in (Role.OUTPUT, Role.INPUT))
                for ins, outs in kernels)
    budget = draw(st.integers(fixed, max(fixed, g.peak_live_bytes)))
    return g, seconds, slow_factor, budget


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(direct_case(), st.booleans())
def test_direct_plans_validate_match_the_simulator_and_beat_static_and_first_touch(case, overlap):
    g, seconds, slow_factor, budget = case
    cm = direct_cost_model(g, seconds, slow_factor)
    # moves cost about as much as a kernel: some are worth it, some not; with `overlap`
    # the async copies at one kernel share one fixed cost, each costs its issuing thread
    # 0.2 ms, and a copy in flight slows its kernel
    moves = {k: type(v)(1e-3 if overlap else 1e-5, 5e6) for k, v in cm.moves.items()}
    if overlap:
        moves.update({(d, "host"): type(cm.moves[(d, "sync")])(2e-4, 1e18) for d in ("to_slow", "to_fast")})
    cm = type(cm)(**{**cm.__dict__, "moves": moves, "async_overlap": overlap,
                     "copy_interference": {"to_slow": 0.4, "to_fast": 0.1} if overlap else {}})
    try:
        static = plan(g, cm, budget, "static", mip_gap=1e-6, time_limit=20, arena=False)
    except InfeasibleBudget:
        return
    try:
        ft = plan(g, cm, budget, "first-touch", arena=False).meta.predicted_seconds
    except InfeasibleBudget:  # first-touch may fill fast memory with what must not be slow
        ft = float("inf")
    sync = plan(g, cm, budget, "synchronous", mip_gap=1e-6, time_limit=20, arena=False)
    asyn = plan(g, cm, budget, "asynchronous", mip_gap=1e-6, time_limit=20, arena=False)
    for p in (sync, asyn):
        assert validate(p, g).peak_fast_bytes <= budget
        predicted = simulate(p, g, cm).predicted_seconds
        assert predicted == pytest.approx(p.meta.objective_seconds, rel=1e-3)
        assert predicted <= static.meta.predicted_seconds * (1 + 1e-6) + 1e-12
        assert predicted <= ft * (1 + 1e-6) + 1e-12
    assert asyn.meta.predicted_seconds <= sync.meta.predicted_seconds * (1 + 1e-6) + 1e-12
