"""The ILPs' constraint families (planner/families.py), each against its rows worked out by
hand on a five-kernel graph, and the message after the solver finds a budget infeasible.

    tensor  bytes  role         uses             segments (staged, every tensor movable)
    w        100   weight in    k0, k4           initial (empty, before k0), gap k1..k3
    a       1000   activation   k0 (made), k1, k3  gap k2..k2
    b         10   activation   k1, k2           none
    loss       4   output       k2, k3           none
    ga         8   activation   k3, k4           none
    w2       100   update of w  k4 (made)        final (empty: the carry write after k4)

Synchronous columns without wakes, in the order staged_columns makes them:
    st[w]=0; w initial: pS=1; w gap: wA=2 dA=3 wS=4 pS=5; a gap: wA=6 dA=7 wS=8 pS=9;
    w2 final: wA=10 dA=11 wS=12.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from autotm.errors import InfeasibleBudget
from autotm.ir.costmodel import CostModel, MoveCost
from autotm.ir.graph import Role
from autotm.planner import families as fam
from autotm.planner.direct import solve_direct
from autotm.planner.floor import accounting, smallest_feasible
from autotm.planner.model import SCALE, Block, SegVars, Vars
from autotm.planner.segments import Segment, tensor_segments
from autotm.planner.staged import staged_columns
from graphs import make_graph

MOVES = {(d, m): MoveCost(0.0, 1000.0) for d in ("to_slow", "to_fast") for m in ("sync", "async")}


def graph():
    program = SimpleNamespace(input_keys=[("param:w", 0)], output_keys={"param:w": 5})
    return make_graph([100, 1000, 10, 4, 8, 100],
                      [([0], [1]), ([1], [2]), ([2], [3]), ([1, 3], [4]), ([0, 4], [5])],
                      roles={0: Role.WEIGHT, 3: Role.OUTPUT}, outputs=(3, 5), program=program)


def cost(g, access="staged"):
    return CostModel(g.fingerprint, "hand", access, (1.0,) * 5, {}, MOVES, True)


def layout(g):
    V = Vars()
    lay = staged_columns(V, tensor_segments(g, min_bytes=0), cost(g), async_=False, window=15, candidates=4,
                         sync_candidates=1, warm_start=None)
    return V, lay


def rows(block: Block) -> list[tuple[dict[int, float], float, float]]:
    """Each row as ({column: coefficient}, lo, hi), in block order."""
    out: list[tuple[dict[int, float], float, float]] = [({}, lo, hi) for lo, hi in zip(block.lo, block.hi)]
    for r, c, v in zip(block.rows, block.cols, block.vals):
        out[r][0][int(c)] = float(v)
    return out


def test_the_columns_are_as_worked_out():
    V, lay = layout(graph())
    assert V.n == 13
    assert lay.start_slow == {0: 0}
    sv = lay.seg_vars
    assert (sv[(0, 0)].pS, sv[(0, 1)].wA, sv[(0, 1)].dA, sv[(0, 1)].wS, sv[(0, 1)].pS) == (1, 2, 3, 4, 5)
    assert (sv[(1, 0)].wA, sv[(1, 0)].dA, sv[(1, 0)].wS, sv[(1, 0)].pS) == (6, 7, 8, 9)
    assert (sv[(5, 0)].wA, sv[(5, 0)].dA, sv[(5, 0)].wS, sv[(5, 0)].pS) == (10, 11, 12, -1)
    # the objective: sync writes and prefetches at their copy's seconds, s / 1000 B/s
    assert list(V.cost_vector()) == [0.0, 0.1, 0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.1]


def test_evict_choice():
    # wS + sum wL + sum wX - wA = 0 per segment that may be written out
    _, lay = layout(graph())
    b = fam.evict_choice(s for s in lay.seg_vars.values() if s.seg.kind != "initial")
    assert rows(b) == [({4: 1.0, 2: -1.0}, 0.0, 0.0), ({8: 1.0, 6: -1.0}, 0.0, 0.0), ({12: 1.0, 10: -1.0}, 0.0, 0.0)]


def test_prefetch_choice():
    # pS + pE + pX - st = 0 (initial); - wA - dA (gaps); none for the final segment
    _, lay = layout(graph())
    assert rows(fam.prefetch_choice(lay)) == [({1: 1.0, 0: -1.0}, 0.0, 0.0),
                                              ({5: 1.0, 2: -1.0, 3: -1.0}, 0.0, 0.0),
                                              ({9: 1.0, 6: -1.0, 7: -1.0}, 0.0, 0.0)]


def test_drop_needs_a_copy_and_one_write():
    # dA[g] - st - sum_{g' < g} wA[g'] <= 0;  st + sum wA <= 1 (only with two columns or more)
    from autotm.planner.staged import _leaving

    _, lay = layout(graph())
    leaving = _leaving(lay)
    assert rows(fam.drop_needs_copy(leaving)) == [({3: 1.0, 0: -1.0}, -np.inf, 0.0), ({7: 1.0}, -np.inf, 0.0),
                                                  ({11: 1.0}, -np.inf, 0.0)]
    assert rows(fam.one_write(leaving)) == [({2: 1.0, 0: 1.0}, -np.inf, 1.0)]
    # a second segment: its drop may use the first one's write
    s0, s1 = SegVars(Segment(7, "gap", 1, 2, 0), 8, wA=0, dA=1), SegVars(Segment(7, "gap", 4, 5, 1), 8, wA=2, dA=3)
    assert rows(fam.drop_needs_copy([(-1, [s0, s1])])) == [({1: 1.0}, -np.inf, 0.0),
                                                           ({3: 1.0, 0: -1.0}, -np.inf, 0.0)]
    assert rows(fam.one_write([(-1, [s0, s1])])) == [({0: 1.0, 2: 1.0}, -np.inf, 1.0)]


def test_steady_state():
    # w2 ends where w starts: wA + dA - st[w] = 0
    _, lay = layout(graph())
    assert rows(fam.steady_state(lay)) == [({10: 1.0, 11: 1.0, 0: -1.0}, 0.0, 0.0)]


def test_evict_before_prefetch():
    # a row at each prefetch kernel F <= the last evict kernel: evicts at or after F, prefetches at or before
    sv = SegVars(Segment(0, "gap", 1, 3, 0), 8, wX={1: 10, 2: 11}, pX={2: 12, 3: 13}, wL={3: 14})
    assert rows(fam.evict_before_prefetch([sv])) == [({11: 1.0, 14: 1.0, 12: 1.0}, -np.inf, 1.0),
                                                     ({14: 1.0, 12: 1.0, 13: 1.0}, -np.inf, 1.0)]
    # no evict after the prefetches: no row
    sv = SegVars(Segment(0, "gap", 1, 3, 0), 8, wX={1: 10}, pX={2: 12, 3: 13})
    assert fam.evict_before_prefetch([sv]).count == 0


def test_capacity():
    # L[j] - L[j-1] - (coefs starting at j) + (coefs ending at j-1) = 0, L[j] <= rhs[j] + half a byte where covered
    g = graph()
    V, lay = layout(g)
    iv = fam.staged_intervals(lay)
    assert iv == [(1, 3, 2, -100), (1, 3, 3, -100), (2, 2, 6, -1000), (2, 2, 7, -1000)]
    budget = 300
    rhs = (budget - g.live_bytes.astype(float)) / SCALE
    cap = fam.capacity(V, iv, rhs, 5)
    L = list(range(13, 18))
    assert cap.load is not None and list(cap.load) == L
    k, m = 100 / SCALE, 1000 / SCALE
    assert rows(cap.block) == [({L[0]: 1.0}, 0.0, 0.0),
                               ({L[0]: -1.0, L[1]: 1.0, 2: k, 3: k}, 0.0, 0.0),
                               ({L[1]: -1.0, L[2]: 1.0, 6: m, 7: m}, 0.0, 0.0),
                               ({L[2]: -1.0, L[3]: 1.0, 6: -m, 7: -m}, 0.0, 0.0),
                               ({L[3]: -1.0, L[4]: 1.0, 2: -k, 3: -k}, 0.0, 0.0)]
    upper = np.concatenate(V.upper)[L]
    assert upper[0] == np.inf and upper[4] == np.inf
    assert list(upper[1:4]) == pytest.approx(list(rhs[1:4] + 0.5 / SCALE))
    # fill: w absent in its gap, a present: L = -100 B at k1..k3
    x = np.zeros(V.n)
    x[2] = 1.0
    assert list(cap.fill(x)[L] * SCALE) == pytest.approx([0, -100, -100, -100, 0])


def test_async_overlap():
    # y >= sum a x + z, z >= (m - a) x where m > a, y >= T + sum g a x + g* z; y >= T as its bound
    V = Vars()
    V.add(2)
    T = np.array([1.0, 1.0, 2.0, 1.0])
    terms = {2: [(0, 0.5, 0.3, 0.1), (1, 0.4, 0.4, 0.0)]}
    block, at = fam.async_overlap(V, terms, T, 0.2)
    assert (at[2].y, at[2].z) == (2, 3)
    assert rows(block) == [({0: pytest.approx(0.2), 3: -1.0}, -np.inf, 0.0),
                           ({0: 0.3, 1: 0.4, 2: -1.0, 3: 1.0}, -np.inf, 0.0),
                           ({0: pytest.approx(0.03), 1: 0.0, 2: -1.0, 3: 0.2}, -np.inf, -2.0)]
    assert (np.concatenate(V.lower)[2], np.concatenate(V.upper)[2], V.cost_vector()[2]) == (2.0, np.inf, 1.0)
    # copies that cost their full time and slow nothing: one row, no z
    V = Vars()
    V.add(1)
    block, at = fam.async_overlap(V, {0: [(0, 0.5, 0.5, 0.0)]}, T, 0.0)
    assert at[0].z is None and rows(block) == [({0: 0.5, 1: -1.0}, -np.inf, 0.0)]


def test_wake():
    # x - u[b] <= 0 for each link with W_b > 0; u[b] continuous in [0, 1] with cost W_b
    V = Vars()
    V.add(3)
    block, wk = fam.wake(V, [(0, 1), (1, 2), (2, 2), (0, 3)], np.array([0.0, 1e-3, 2e-3, 0.0]))
    assert wk.u == {1: 3, 2: 4}
    assert rows(block) == [({0: 1.0, 3: -1.0}, -np.inf, 0.0), ({1: 1.0, 4: -1.0}, -np.inf, 0.0),
                           ({2: 1.0, 4: -1.0}, -np.inf, 0.0)]
    assert list(V.cost_vector()[3:]) == [1e-3, 2e-3]
    assert list(wk.set(np.array([0.0, 1.0, 0.0, 0.0, 0.0]))[3:]) == [0.0, 1.0]


def test_infeasible_after_the_solve_states_the_floor_not_less():
    # with w pinned (fast outside the budget, pin_params), the direct model keeps its update
    # w2 fast at k4 (steady state): a budget under that passes the check of the must-fast
    # tensors, the solver finds it infeasible, and the error states the formulation's floor
    g = graph()
    cm = cost(g, "direct")
    acc = accounting(g, np.zeros(5, dtype=np.int64), pin_params=True)
    floor = smallest_feasible(g, "synchronous", "direct", acc)
    opts = dict(pinned=acc.pinned, budget_extra=acc.solver_extra, time_limit=10)
    with pytest.raises(InfeasibleBudget) as e:
        solve_direct(g, cm, floor.bytes - 1, **opts)
    assert e.value.minimum == floor.bytes > e.value.budget
    plan, _ = solve_direct(g, cm, floor.bytes, **opts)
    assert plan.budget_bytes == floor.bytes


def test_each_family_is_counted_into_the_plans_solver_stats():
    from autotm.ir.plan import Plan
    from autotm.planner import plan

    g = graph()
    p = plan(g, cost(g), 1100, "synchronous", arena=False)
    st = p.meta.solver
    assert st is not None and st.status == "Optimal"
    names = {f.name for f in st.families}
    assert {"evict choice", "prefetch choice", "drop needs a slow copy", "one write", "steady state",
            "capacity"} <= names
    assert sum(f.rows for f in st.families) == st.rows and sum(f.nonzeros for f in st.families) == st.nonzeros
    assert all(f.seconds >= 0 for f in st.families)
    assert Plan.from_json(p.to_json()) == p  # saved with the plan
