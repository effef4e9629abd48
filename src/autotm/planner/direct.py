"""The AutoTM synchronous and asynchronous formulations for direct-access memory systems.

Under direct access a kernel may read and write an operand in slow memory, at the time
the profiler measured for that placement (static.py), and tensors may also move between
tiers, synchronously or overlapping a kernel (staged.py). This formulation combines the two,
as the original AutoTM did on Optane: per tensor t with uses u_1 < ... < u_m (producer
first), a state at each use and the moves between consecutive uses.

  Variables (binary unless noted), for a tensor t of size s:
    s[t,i]   t is in slow memory (only) while use u_i runs
    st[t]    a graph input starts the iteration in slow memory
    per gap g between uses a = u_i and b = u_{i+1} (interior a+1..b-1, maybe empty):
    wA[g]    t leaves fast memory in g by a write (its first slow copy)
    dA[g]    t leaves fast memory in g by a drop (it has a slow copy already)
    wS[g], wX[g,c]   the write is sync (at a+1) or overlaps kernel c of the window
    pS[g], pX[g,c]   t comes back for b: sync (at b) or overlapping kernel c of the window
    v[k,c]   kernel k runs with its operands placed as c (static.py: kernel_time_terms; config rows)
    y[k]     >= 0: time of kernel k with the async copies overlapping it
  A graph input has an initial gap (live[0]..u_1-1) before its first use, entered in
  state st; an updated carried tensor has a final gap after its last use, which must end
  in the state its input starts the next iteration in.

  Constraints (families.py's shared ones by name; flow, leave, same kernel and steady
  state are this model's, below)
    flow:         s[t,i+1] = s[t,i] + wA[g] + dA[g] - pS[g] - sum_c pX[g,c]
    leave:        wA[g] + dA[g] <= 1 - s[t,i]
    evict choice: wS[g] + sum_c wX[g,c] = wA[g]
    one write:    (st[t] or s[t,1]) + sum_g wA[g] <= 1
    drop needs a copy: dA[g] <= (st[t] or s[t,1]) + sum_{g' < g} wA[g']
    same kernel:  wA + dA + pS <= 1 in an empty gap; wA + dA + pX[g,a+1] <= 1;
    evict before prefetch: an async write comes before an async prefetch (as staged)
    steady state: s[t',m] + wA[final] + dA[final] = st[t]  (t' carries t)
    capacity:     sum_t s_t R[t,j] <= B at every kernel j, with R = 1 - s at a use and
                  R = 1 - s[t,i] - wA - dA + sum_{c >= j} wX + sum_{c <= j} pX inside a gap
    kernel time:  K_k = sum_c time(k, c) v[k,c] (or the additive model)
    async:        y[k] >= K_k,  y[k] >= the async copies at k (families.async_overlap_at: one copy's
                  fixed cost and the others' bytes, or the plain sum when copies do not overlap),
                  y[k] >= K_k + the compute the copies cost it

  Objective (what autotm.simulate computes for the decoded plan)
    min  sum_{k without async} K_k + sum_{k with async} y[k] + sync copies (+ T_in)
         + sum over async copies of CostModel.async_host_seconds (the issuing thread's part)

Tensors smaller than `min_tensor_bytes`, and those no kernel uses, get one tier for their
whole life (one binary, as in the static formulation), so every static plan is a plan of
this model too: warm starts from it are feasible.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import InfeasibleBudget
from ..ir.costmodel import CostModel, operand_tensors
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan
from ..ir.plan_meta import SolverStats
from . import families as fam
from .decode import decode_direct
from .floor import solver_infeasible, tightest_direct_plan
from .highs_driver import Solve, highs_model, is_feasible, solve_model, solver_stats
from .model import FIXED_FAST, MARGIN_BYTES, SCALE, Block, DirectGap, DirectTensor, RowList, Rows, Vars, \
    add_async_copies
from .segments import carried_pairs
from .static import kernel_time_terms
from .staged import default_min_tensor_bytes
from .warm_start import KernelTime, direct_start


def direct_columns(V: Vars, graph: TrainingGraph, cost: CostModel, movable: list[int], *, async_: bool,
                   window: int, candidates: int, min_tensor_bytes: int) -> dict[int, DirectTensor]:
    """The columns of every movable tensor (module doc), with their costs: a graph input
    that starts slow pays its write each iteration where the executor places it there."""
    n = len(graph.kernels)
    T = np.asarray(cost.kernel_seconds, dtype=float)
    mv = cost.move_seconds
    pairs = carried_pairs(graph)
    p = graph.program
    placed_each_time = ({tid for key, tid in p.input_keys if key not in p.output_keys} if p is not None else set())
    tv: dict[int, DirectTensor] = {}
    for tid in movable:
        t = graph.tensors[tid]
        s = t.nbytes
        uses = sorted(set(t.users) | ({t.producer} if t.producer is not None else set()))
        t_in = mv(s, "to_slow", "sync") if t.producer is None and t.id in placed_each_time else 0.0
        if not uses or s < min_tensor_bytes:
            z = V.one(t_in)
            tv[t.id] = DirectTensor(t.id, uses, [z] * len(uses), start=z if t.producer is None else -1, z=z)
            continue
        x = tv[t.id] = DirectTensor(t.id, uses, [V.one() for _ in uses])
        if t.producer is None:
            x.start = V.one(t_in)
            x.gaps.append(DirectGap("initial", t.live[0], uses[0] - 1, x.start, x.slow[0]))
        x.gaps += [DirectGap("gap", a + 1, b - 1, x.slow[i], x.slow[i + 1]) for i, (a, b) in enumerate(zip(uses, uses[1:]))]
        if t.id in pairs:
            x.gaps.append(DirectGap("final", uses[-1] + 1, n - 1, x.slow[-1], src=pairs[t.id]))
        for i, g in enumerate(x.gaps):
            g.tensor, g.index = t.id, i
            if g.kind != "initial":
                g.wA, g.dA, g.wS = V.one(), V.one(), V.one(mv(s, "to_slow", "sync"))
                if async_ and not g.empty:
                    g.wX = add_async_copies(V, range(g.lo, min(g.lo + window - 1, g.hi) + 1), T,
                                            mv(s, "to_slow", "async"), cost.async_host_seconds(s, "to_slow"), candidates)
            if g.kind == "final":
                continue
            g.pS = V.one(mv(s, "to_fast", "sync"))
            if async_ and not g.empty:
                g.pX = add_async_copies(V, range(max(g.lo, g.hi + 1 - window), g.hi + 1), T, mv(s, "to_fast", "async"),
                                        cost.async_host_seconds(s, "to_fast"), candidates)
    return tv


def leaving(tv: dict[int, DirectTensor]) -> list[tuple[int, list[DirectGap]]]:
    """Per tensor with gaps: its first copy's column and the gaps it may leave fast memory in."""
    return [(v.first_copy, [g for g in v.gaps if g.kind != "initial"]) for v in tv.values() if v.z < 0]


def flow(tv: dict[int, DirectTensor]) -> Block:
    """Flow, per gap g that ends in a use (a = wA + dA, 0 in the initial gap):
        s[t,i+1] - s[t,i] - a[g] + pS[g] + sum_c pX[g,c] = 0"""
    r = RowList("flow")
    for v in tv.values():
        for g in v.gaps:
            if g.kind != "final":
                leave = [g.wA, g.dA] if g.kind != "initial" else []
                r.ones([g.after, g.pS, *g.pX.values()], 0.0, 0.0, minus=[g.before, *leave], key=g.row_key(r.family))
    return r.block()


def leave(tv: dict[int, DirectTensor]) -> Block:
    """Leave, per gap g after a use:  wA[g] + dA[g] + s[t,i] <= 1  (only a fast t leaves)."""
    r = RowList("leave from fast")
    for _, gaps in leaving(tv):
        for g in gaps:
            r.ones([g.wA, g.dA, g.before], -np.inf, 1.0, key=g.row_key(r.family))
    return r.block()


def same_kernel(tv: dict[int, DirectTensor]) -> Block:
    """Same kernel, per gap between uses: one action per kernel, no leave and prefetch at
    the same one:  wA + dA + pS <= 1 (empty gap),  wA + dA + pX[g,lo] <= 1."""
    r = RowList("same kernel")
    for v in tv.values():
        for g in v.gaps:
            if g.kind == "gap" and g.empty:
                r.ones([g.wA, g.dA, g.pS], -np.inf, 1.0, key=g.row_key(r.family))
            elif g.kind == "gap" and g.lo in g.pX:
                r.ones([g.wA, g.dA, g.pX[g.lo]], -np.inf, 1.0, key=g.row_key(r.family))
    return r.block()


def steady_state(tv: dict[int, DirectTensor], pairs: dict[int, int]) -> Block:
    """Steady state, per carried pair (t' replaces t next iteration):
        s[t',m] + wA[final] + dA[final] - st[t] = 0   (z[t'] for a tensor with one tier;
    a term absent where its tensor stays fast): t' ends where t starts."""
    r = RowList("steady state")
    for out, inp in pairs.items():
        cols: list[int] = []
        if out in tv:
            v = tv[out]
            cols = [v.z] if v.z >= 0 else [v.gaps[-1].before, v.gaps[-1].wA, v.gaps[-1].dA]
        start = [tv[inp].start] if inp in tv and tv[inp].start >= 0 else []
        if cols or start:
            r.ones(cols, 0.0, 0.0, minus=start, key=(1, 0, 0, 0))  # (after every tensor's rows)
    return r.block()


def intervals(graph: TrainingGraph, tv: dict[int, DirectTensor]) -> list[fam.Interval]:
    """The residency R[t,j] (module doc) as capacity intervals."""
    iv: list[fam.Interval] = []

    def add(j0: int, j1: int, col: int, coef: float) -> None:
        if j1 >= j0:
            iv.append((j0, j1, col, coef))
    for v in tv.values():
        t = graph.tensors[v.tid]
        s = t.nbytes
        if v.z >= 0:
            add(t.live[0], t.live[1], v.z, -s)
            continue
        for u, col in zip(v.uses, v.slow):
            add(u, u, col, -s)
        if not v.gaps or v.gaps[-1].kind != "final":  # after its last use, t stays where that use had it
            add(v.uses[-1] + 1, t.live[1], v.slow[-1], -s)
        for g in v.gaps:
            add(g.lo, g.hi, g.before, -s)
            for c, col in g.wX.items():
                add(g.lo, c, col, s)
            if g.kind != "initial":
                add(g.lo, g.hi, g.wA, -s)
                add(g.lo, g.hi, g.dA, -s)
            for c, col in g.pX.items():
                add(c, g.hi, col, s)
    return iv


def async_terms(tv: dict[int, DirectTensor], graph: TrainingGraph, cost: CostModel) -> dict[int, list[fam.AsyncTerm]]:
    """kernel c -> the async copy columns over it (wX, pX) with their costs."""
    terms: dict[int, list[fam.AsyncTerm]] = {}
    g_read, g_write = cost.interference_share("to_fast"), cost.interference_share("to_slow")
    for v in tv.values():
        s = graph.tensors[v.tid].nbytes
        for g in v.gaps:
            for cols, d, share in ((g.wX, "to_slow", g_write), (g.pX, "to_fast", g_read)):
                for c, col in cols.items():
                    terms.setdefault(c, []).append((col, cost.move_seconds(s, d, "async"),
                                                    cost.async_marginal_seconds(s, d), share))
    return terms


def solve_direct(graph: TrainingGraph, cost: CostModel, budget: int, *, formulation: str = "synchronous",
                 window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, min_tensor_bytes: int | None = None,
                 pinned: frozenset[int] = frozenset(), budget_extra: np.ndarray | None = None,
                 threads: int | None = None, warm_start: Plan | None = None, verbose: bool = False,
                 candidates: int = 4) -> tuple[Plan, SolverStats]:
    """Solve the direct-access ILP (module doc) and decode the plan."""
    import highspy

    if formulation not in ("synchronous", "asynchronous"):
        raise ValueError(f"solve_direct supports synchronous and asynchronous, not {formulation!r}")
    t_build = time.perf_counter()
    n = len(graph.kernels)
    async_ = formulation == "asynchronous"
    if min_tensor_bytes is None:
        min_tensor_bytes = default_min_tensor_bytes(graph)
    extra = budget_extra if budget_extra is not None else np.zeros(n, dtype=np.int64)
    movable = [t for t in graph.tensors if t.role not in FIXED_FAST and t.id not in pinned and t.nbytes > 0]
    fixed = np.asarray(graph.live_bytes, dtype=np.float64).copy()
    for t in movable:
        fixed[t.live[0]:t.live[1] + 1] -= t.nbytes
    need_k = int(np.argmax(fixed - extra))
    need = int(fixed[need_k] - extra[need_k])
    if need > budget:
        raise InfeasibleBudget(budget, need, f"kernel {need_k} ({graph.kernels[need_k].op}) with tensors that "
                               "must stay fast")
    pairs = carried_pairs(graph)
    share_max = cost.interference_share()

    V, R = Vars(), Rows()
    clock = time.perf_counter()
    tv = direct_columns(V, graph, cost, [m.id for m in movable], async_=async_, window=window, candidates=candidates,
                        min_tensor_bytes=min_tensor_bytes)
    column_seconds = time.perf_counter() - clock
    left = leaving(tv)
    R.timed(lambda: fam.evict_choice(g for _, gaps in left for g in gaps))
    R.timed(lambda: leave(tv))
    R.timed(lambda: fam.drop_needs_copy(left))
    R.timed(lambda: flow(tv))
    R.timed(lambda: same_kernel(tv))
    R.timed(lambda: fam.evict_before_prefetch(g for v in tv.values() for g in v.gaps if g.kind == "gap"))
    R.timed(lambda: fam.one_write(left))
    R.timed(lambda: steady_state(tv, pairs))

    # kernel times (placement columns, config rows), and async overlap: y[c] >= K_c, y[c] >= copies at c
    clock = time.perf_counter()
    terms_at = async_terms(tv, graph, cost)
    config, overlap = RowList("config"), RowList("async overlap")
    constant = 0.0
    configs: dict[int, KernelTime] = {}
    overlaps: dict[int, fam.Overlap] = {}
    for k in range(n):
        kern = graph.kernels[k]
        ops = operand_tensors(kern.inputs, kern.outputs)
        slow_at = {t: tv[t].slow[tv[t].uses.index(k)] for t in ops if t in tv}
        # (each kernel's rows after every tensor's and the steady state's, its config rows first)
        const, terms, is_config = kernel_time_terms(V, config, cost, k, ops, slow_at, key=(2, k, 0, 0))
        configs[k] = (ops, const, terms, is_config)
        if k in terms_at:
            overlaps[k] = fam.async_overlap_at(V, overlap, terms_at[k], share_max, y_lower=0.0, kernel_const=const,
                                               kernel_terms=terms, kernel_row=True, key=(2, k, 1, 0))
        else:
            constant += const
            for col, coef in terms:
                V.add_cost(col, coef)
    kernel_seconds = time.perf_counter() - clock
    R.add(config.block(), kernel_seconds / 2)  # (one loop builds both: half each)
    R.add(overlap.block(), kernel_seconds / 2)
    clock = time.perf_counter()
    rhs = (budget + extra.astype(np.float64) - graph.live_bytes.astype(np.float64) - MARGIN_BYTES) / SCALE
    cap = fam.capacity(V, intervals(graph, tv), rhs, n)
    R.add(cap.block, time.perf_counter() - clock + column_seconds)
    solve = Solve()
    if V.n == 0:
        solve.status, solve.objective, solve.bound = "Optimal", constant, constant
        return (decode_direct(graph, cost, budget, formulation, np.zeros(0), tv),
                solver_stats(V, R, 0, time.perf_counter() - t_build, solve))
    h, lp = highs_model(highspy, V, R, constant, time_limit=time_limit, mip_gap=mip_gap, threads=threads,
                        verbose=verbose)
    build_seconds = time.perf_counter() - t_build
    x0 = direct_start(warm_start, V.n, tv, configs, overlaps, share_max) if warm_start else None
    x0 = cap.fill(x0) if x0 is not None else None
    if x0 is None or not is_feasible(lp, x0):
        # a start the model cannot take (first-touch's updated weights in another tier than
        # their inputs broke 25 steady-state rows at inception_v4's floor, and the solver
        # found no plan in 5 s): the tightest plan, a solution at every budget from the floor
        tight = direct_start(tightest_direct_plan(graph, pinned, cost.memory_system), V.n, tv, configs, overlaps,
                             share_max)
        if tight is not None and is_feasible(lp, cap.fill(tight)):
            x0 = tight
    x = solve_model(h, highspy, lp, x0, constant, time_limit, solve)
    stats = solver_stats(V, R, len(lp.a_matrix_.value_), build_seconds, solve)
    if x is None:
        raise solver_infeasible(graph, formulation, "direct", budget, pinned, budget_extra, cost.memory_system)
    return decode_direct(graph, cost, budget, formulation, x, tv), stats
