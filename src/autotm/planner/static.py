"""The AutoTM static formulation for direct-access memory systems, and direct baselines.

Under direct access a kernel may read and write slow memory in place, at a cost the
profiler measured per placement of its operands. The static formulation gives each
tensor one tier for its whole life (no moves).

  Variables
    z[t]    binary: tensor t lives in slow memory (it is produced there, or starts there)
    v[k,c]  binary: kernel k runs with its operands placed as c (a profiled placement)

  Constraints
    config:     sum_c v[k,c] = 1
                v[k,c] <= z[t]       for each operand t that c places in slow memory
                v[k,c] <= 1 - z[t]   for each operand t that c places in fast memory
    steady:     z[out] = z[in]       for the state carried between iterations
    capacity:   sum_{t live at k} s_t (1 - z[t]) <= B                         for every kernel k

  Objective (what autotm.simulate computes for the plan)
    min  sum_k sum_c time(k, c) v[k,c]
  For a kernel whose placements were not all profiled, time is additive as in
  CostModel.kernel_time: T_k + sum_t (time(k, t slow) - T_k) z[t].
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..errors import InfeasibleBudget
from ..ir.costmodel import CostModel, operand_tensors
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan, TensorPlan
from ..ir.plan_meta import SolverStats
from . import families as fam
from .floor import solver_infeasible
from .highs_driver import Solve, highs_model, is_feasible, solve_model, solver_stats
from .model import MARGIN_BYTES, SCALE, Block, RowKey, RowList, Rows, Vars, movable
from .segments import carried_pairs


def _direct_plan(graph: TrainingGraph, cost: CostModel, budget: int | None, planner: str, slow: set[int]) -> Plan:
    tensors = tuple(TensorPlan(t.id, "slow" if t.id in slow else "fast", ()) for t in graph.tensors)
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=cost.memory_system,
                access="direct", budget_bytes=None if budget is None else int(budget), planner=planner,
                tensors=tensors)


def all_slow_plan(graph: TrainingGraph, cost: CostModel) -> Plan:
    """Every tensor that may live in slow memory does (the batch and the loss stay fast)."""
    return _direct_plan(graph, cost, None, "all-slow", set(movable(graph)))


def first_touch_direct_plan(graph: TrainingGraph, cost: CostModel, budget: int) -> Plan:
    """Fast memory while it has room when a tensor is created, otherwise slow for life.
    Room counts the kernels' workspace (CostModel.workspace) over the tensor's life."""
    n = len(graph.kernels)
    ws = np.zeros(n + 1, dtype=np.int64)
    ws[:n] = cost.workspace(n)
    home = np.zeros(n + 1, dtype=np.int64)
    slow = set()
    can_move = set(movable(graph))
    # tensors that must be fast take their room first (all of them: one created later
    # than a movable tensor that took its room overflowed the budget, so that first-touch
    # failed at budgets above its floor, floor.py), then first come, first served
    for t in sorted(graph.tensors, key=lambda t: (t.id in can_move, t.live[0], t.id)):
        a, b = t.live
        if t.id in can_move and int((home[a:b + 1] + ws[a:b + 1]).max()) + t.nbytes > budget:
            slow.add(t.id)
        else:
            home[a:b + 1] += t.nbytes
    # (no steady-state fix-up: like the OS, first-touch knows nothing of the next iteration;
    # an updated weight placed elsewhere than its input is moved back after the last kernel)
    need = home[:n] + ws[:n]
    if int(need.max(initial=0)) > budget:
        k = int(need.argmax())
        raise InfeasibleBudget(budget, int(need[k]), f"kernel {k} ({graph.kernels[k].op}) with tensors that must "
                                                     f"stay fast and its workspace")
    return _direct_plan(graph, cost, budget, "first-touch", slow)


def steady_state(z: dict[int, int], pairs: dict[int, int]) -> Block:
    """Steady state, per carried pair (t' replaces t next iteration), both movable:
        z[t'] - z[t] = 0"""
    r = RowList("steady state")
    for out, inp in pairs.items():
        if out in z and inp in z:
            r.ones([z[out]], 0.0, 0.0, minus=[z[inp]])
    return r.block()


def solve_static(graph: TrainingGraph, cost: CostModel, budget: int, *, time_limit: float = 60.0,
                 mip_gap: float = 0.01, pinned: frozenset[int] = frozenset(), budget_extra: np.ndarray | None = None,
                 threads: int | None = None, verbose: bool = False) -> tuple[Plan, SolverStats]:
    """Solve the static ILP (module doc) and decode the plan."""
    import highspy

    t0 = time.perf_counter()
    n = len(graph.kernels)
    extra = budget_extra if budget_extra is not None else np.zeros(n, dtype=np.int64)
    can = movable(graph, pinned)
    fixed = np.asarray(graph.live_bytes, dtype=np.float64).copy()
    for tid in can:
        a, b = graph.tensors[tid].live
        fixed[a:b + 1] -= graph.tensors[tid].nbytes
    k_need = int(np.argmax(fixed - extra))
    if fixed[k_need] > budget + extra[k_need]:
        raise InfeasibleBudget(budget, int(fixed[k_need] - extra[k_need]),
                               f"kernel {k_need} ({graph.kernels[k_need].op}) with tensors that must stay fast")
    V, R = Vars(), Rows()
    z = {tid: int(c) for tid, c in zip(can, V.add(len(can)))}
    R.timed(lambda: steady_state(z, carried_pairs(graph)))
    t = time.perf_counter()
    config = RowList("config")
    constant = 0.0
    placements = []  # per kernel with placement columns: the column of all its free operands slow
    for k in range(n):
        kern = graph.kernels[k]
        ops = operand_tensors(kern.inputs, kern.outputs)
        const, terms, is_config = kernel_time_terms(V, config, cost, k, ops, {t: z[t] for t in ops if t in z})
        if is_config:
            placements.append(terms[-1][0])  # (itertools.product order: all "slow" last)
        constant += const
        for col, coef in terms:
            V.add_cost(col, coef)
    R.add(config.block(), time.perf_counter() - t)
    # capacity: -sum s_t z[t] <= B - live_bytes[k], as a running sum (families.capacity)
    t = time.perf_counter()
    cap_iv = [(graph.tensors[tid].live[0], graph.tensors[tid].live[1], z[tid], -float(graph.tensors[tid].nbytes))
              for tid in can]
    rhs = (budget + extra - np.asarray(graph.live_bytes, dtype=np.float64) - MARGIN_BYTES) / SCALE
    cap = fam.capacity(V, cap_iv, rhs, n)
    R.add(cap.block, time.perf_counter() - t)
    h, lp = highs_model(highspy, V, R, constant, time_limit=time_limit, mip_gap=mip_gap, threads=threads,
                        verbose=verbose)
    build_seconds = time.perf_counter() - t0
    # every movable tensor slow: a solution at every budget from the floor (floor.py), the
    # start that makes the solver return a plan there even at its time limit (densenet264
    # test at its floor: no plan in 5 s without it)
    x0 = np.zeros(V.n)
    x0[list(z.values())] = 1.0
    x0[placements] = 1.0
    x0 = cap.fill(x0)
    solve = Solve()
    x = solve_model(h, highspy, lp, x0 if is_feasible(lp, x0) else None, constant, time_limit, solve)
    stats = solver_stats(V, R, len(lp.a_matrix_.value_), build_seconds, solve)
    if x is None:
        raise solver_infeasible(graph, "static", "direct", budget, pinned, budget_extra, cost.memory_system)
    slow = {tid for tid, col in z.items() if x[col] > 0.5}
    return _direct_plan(graph, cost, budget, "static", slow), stats


def kernel_time_terms(V: Vars, R: RowList, cost: CostModel, k: int, ops: tuple[int, ...],
                      slow: dict[int, int], key: RowKey | None = None) -> tuple[float, list[tuple[int, float]], bool]:
    """Kernel k's time as constant + sum coef * x[col]. `ops` are its operands in placement
    order; `slow` maps an operand to the binary column that says it is in slow memory at k
    (operands not in it are fast).

    With every placement of the free operands profiled, adds one binary v[k,c] per
    placement c, constrained so that exactly the one matching the operands' tiers is 1,
    (config rows, into R) and returns their times; otherwise the additive model of CostModel.kernel_time.
    The flag says which: True when the columns are the v[k,c], in itertools.product
    order over the free operands ("fast" before "slow").
    """
    base = cost.kernel_time(k)
    free = [i for i, t in enumerate(ops) if t in slow]
    if not free:
        return base, [], False
    table = cost.placement_seconds.get(k, {})
    combos: list[tuple[str, ...]] = []
    for bits in itertools.product(("fast", "slow"), repeat=len(free)):
        c = ["fast"] * len(ops)
        for i, b in zip(free, bits):
            c[i] = b
        combos.append(tuple(c))
    if all(c in table or "slow" not in c for c in combos):
        vs = V.add(len(combos))
        R.add(list(vs), [1.0] * len(vs), 1.0, 1.0, key)
        for col, combo in zip(vs, combos):
            for i in free:
                if combo[i] == "slow":
                    R.add([int(col), slow[ops[i]]], [1.0, -1.0], -np.inf, 0.0, key)
                else:
                    R.add([int(col), slow[ops[i]]], [1.0, 1.0], -np.inf, 1.0, key)
        return 0.0, [(int(col), table.get(c, base) if "slow" in c else base) for col, c in zip(vs, combos)], True
    # additive, as CostModel.kernel_time does for partially profiled kernels
    terms = []
    for i in free:
        one = tuple("slow" if j == i else "fast" for j in range(len(ops)))
        terms.append((slow[ops[i]], table.get(one, base) - base))
    return base, terms, False
