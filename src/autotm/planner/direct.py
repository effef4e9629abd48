"""The AutoTM synchronous and asynchronous formulations for direct-access memory systems.

Under direct access a kernel may read and write an operand in slow memory, at the time
the profiler measured for that placement (static.py), and tensors may also move between
tiers, synchronously or overlapping a kernel (ilp.py). This formulation combines the two,
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
    v[k,c]   kernel k runs with its operands placed as c (static.py: kernel_time_terms)
    y[k]     >= 0: time of kernel k with the async copies overlapping it
  A graph input has an initial gap (live[0]..u_1-1) before its first use, entered in
  state st; an updated carried tensor has a final gap after its last use, which must end
  in the state its input starts the next iteration in.

  Constraints
    flow:         s[t,i+1] = s[t,i] + wA[g] + dA[g] - pS[g] - sum_c pX[g,c]
    leave:        wA[g] + dA[g] <= 1 - s[t,i];  wS[g] + sum_c wX[g,c] = wA[g]
    one write:    (st[t] or s[t,1]) + sum_g wA[g] <= 1
    drop:         dA[g] <= (st[t] or s[t,1]) + sum_{g' < g} wA[g']
    same kernel:  wA + dA + pS <= 1 in an empty gap; wA + dA + pX[g,a+1] <= 1;
                  an async write comes before an async prefetch (as in ilp.py)
    steady state: s[t',m] + wA[final] + dA[final] = st[t]  (t' carries t)
    capacity:     sum_t s_t R[t,j] <= B at every kernel j, with R = 1 - s at a use and
                  R = 1 - s[t,i] - wA - dA + sum_{c >= j} wX + sum_{c <= j} pX inside a gap
    kernel time:  K_k = sum_c time(k, c) v[k,c] (or the additive model)
    async:        y[k] >= K_k,  y[k] >= the async copies at k (ilp.add_async_overlap: one copy's
                  fixed cost and the others' bytes, or the plain sum when copies do not overlap),
                  y[k] >= K_k + the compute the copies cost it (ilp.add_async_slowdown)

  Objective (what autotm.simulate computes for the decoded plan)
    min  sum_{k without async} K_k + sum_{k with async} y[k] + sync copies (+ T_in)
         + sum over async copies of CostModel.async_host_seconds (the issuing thread's part)

Tensors smaller than `min_tensor_bytes`, and those no kernel uses, get one tier for their
whole life (one binary, as in the static formulation), so every static plan is a plan of
this model too: warm starts from it are feasible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..ir.costmodel import CostModel, operand_tensors
from ..ir.graph import TrainingGraph
from ..ir.plan import Action, Plan, TensorPlan
from .ilp import MARGIN_BYTES, SCALE, ILPStats, InfeasibleBudget, _candidates, _feasible, _Rows, _Vars, \
    add_async_overlap, \
    add_async_slowdown, \
    capacity_chain, set_async_overlap, \
    default_min_tensor_bytes, highs_model, solve_model
from .segments import carried_pairs
from .static import FIXED_FAST, kernel_time_terms


@dataclass
class _Gap:
    kind: str  # "initial", "gap" or "final"
    lo: int  # first interior kernel
    hi: int  # last interior kernel (hi < lo: empty)
    before: int  # column: t is slow before the gap (st for the initial gap)
    after: int = -1  # column: t is slow at the use after the gap (-1 for the final gap)
    src: int = -1  # final gap: the input tensor this one replaces next iteration
    wA: int = -1
    dA: int = -1
    wS: int = -1
    pS: int = -1
    wX: dict = field(default_factory=dict)  # kernel -> column
    pX: dict = field(default_factory=dict)


@dataclass
class _Tensor:
    tid: int
    uses: list[int]
    slow: list[int]  # column per use
    start: int = -1  # st column (graph inputs)
    z: int = -1  # one tier for life: the column that says slow (else -1)
    gaps: list[_Gap] = field(default_factory=list)


def solve_direct(graph: TrainingGraph, cost: CostModel, budget: int, *, formulation: str = "synchronous",
                 window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, min_tensor_bytes: int | None = None,
                 pinned: frozenset[int] = frozenset(), budget_extra: np.ndarray | None = None,
                 threads: int | None = None, warm_start: Plan | None = None, verbose: bool = False,
                 candidates: int = 4) -> tuple[Plan, ILPStats]:
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
    T = np.asarray(cost.kernel_seconds, dtype=float)
    mv = cost.move_seconds
    pairs = carried_pairs(graph)
    p = graph.program
    # graph inputs the executor writes to slow memory each iteration if they start there
    placed_each_time = ({tid for key, tid in p.input_keys if key not in p.output_keys} if p is not None else set())

    V, R = _Vars(), _Rows()
    cap_iv: list[tuple[int, int, int, float]] = []
    async_terms: dict[int, list[tuple[int, float, float]]] = {}  # kernel -> (col, full, marginal)
    shares: dict[int, list[float]] = {}  # kernel -> per async term, its interference share
    g_read, g_write = cost.interference_share("to_fast"), cost.interference_share("to_slow")

    def cap_add(j0: int, j1: int, col: int, coef: float) -> None:
        if j1 >= j0:
            cap_iv.append((j0, j1, col, coef))

    def new(cost_: float = 0.0) -> int:
        return int(V.add(1, cost=cost_)[0])

    tv: dict[int, _Tensor] = {}
    for t in movable:
        s = t.nbytes
        uses = sorted(set(t.users) | ({t.producer} if t.producer is not None else set()))
        t_in = mv(s, "to_slow", "sync") if t.producer is None and t.id in placed_each_time else 0.0
        if not uses or s < min_tensor_bytes:
            z = new(t_in)
            tv[t.id] = _Tensor(t.id, uses, [z] * len(uses), start=z if t.producer is None else -1, z=z)
            cap_add(t.live[0], t.live[1], z, -s)
            continue
        w_sync, r_sync = mv(s, "to_slow", "sync"), mv(s, "to_fast", "sync")
        w_async, r_async = mv(s, "to_slow", "async"), mv(s, "to_fast", "async")
        w_async_m, r_async_m = cost.async_marginal_seconds(s, "to_slow"), cost.async_marginal_seconds(s, "to_fast")
        w_host, r_host = cost.async_host_seconds(s, "to_slow"), cost.async_host_seconds(s, "to_fast")
        slow = [new() for _ in uses]
        x = tv[t.id] = _Tensor(t.id, uses, slow)
        for u, col in zip(uses, slow):
            cap_add(u, u, col, -s)
        gaps: list[_Gap] = []
        if t.producer is None:
            x.start = new(t_in)
            gaps.append(_Gap("initial", t.live[0], uses[0] - 1, x.start, slow[0]))
        gaps += [_Gap("gap", a + 1, b - 1, slow[i], slow[i + 1]) for i, (a, b) in enumerate(zip(uses, uses[1:]))]
        if t.id in pairs:
            gaps.append(_Gap("final", uses[-1] + 1, n - 1, slow[-1], src=pairs[t.id]))
        else:  # after its last use, t stays where that use had it until it is freed
            cap_add(uses[-1] + 1, t.live[1], slow[-1], -s)
        first_copy = x.start if t.producer is None else slow[0]
        writes: list[int] = []
        for g in gaps:
            lo, hi, empty = g.lo, g.hi, g.hi < g.lo
            cap_add(lo, hi, g.before, -s)
            flow_cols, flow_vals = [g.after, g.before], [1.0, -1.0]
            if g.kind != "initial":
                g.wA, g.dA, g.wS = new(), new(), new(w_sync)
                evict = [g.wS]
                if async_ and not empty:
                    for c in _candidates(range(lo, min(lo + window - 1, hi) + 1), T, w_async, candidates):
                        g.wX[c] = new(w_host)
                        async_terms.setdefault(c, []).append((g.wX[c], w_async, w_async_m))
                        shares.setdefault(c, []).append(g_write)
                        cap_add(lo, c, g.wX[c], s)
                        evict.append(g.wX[c])
                R.add("evict choice", evict + [g.wA], [1.0] * len(evict) + [-1.0], 0.0, 0.0)
                R.add("leave from fast", [g.wA, g.dA, g.before], [1.0, 1.0, 1.0], -np.inf, 1.0)
                copies = [first_copy] + writes
                R.add("drop needs a slow copy", [g.dA] + copies, [1.0] + [-1.0] * len(copies), -np.inf, 0.0)
                writes.append(g.wA)
                cap_add(lo, hi, g.wA, -s)
                cap_add(lo, hi, g.dA, -s)
                flow_cols += [g.wA, g.dA]
                flow_vals += [-1.0, -1.0]
            if g.kind == "final":
                continue
            g.pS = new(r_sync)
            pre = [g.pS]
            if async_ and not empty:
                for c in _candidates(range(max(lo, hi + 1 - window), hi + 1), T, r_async, candidates):
                    g.pX[c] = new(r_host)
                    async_terms.setdefault(c, []).append((g.pX[c], r_async, r_async_m))
                    shares.setdefault(c, []).append(g_read)
                    cap_add(c, hi, g.pX[c], s)
                    pre.append(g.pX[c])
            R.add("flow", flow_cols + pre, flow_vals + [1.0] * len(pre), 0.0, 0.0)
            if g.kind == "gap":
                # one action per kernel: no leave and prefetch at the same kernel
                if empty:
                    R.add("same kernel", [g.wA, g.dA, g.pS], [1.0] * 3, -np.inf, 1.0)
                elif lo in g.pX:
                    R.add("same kernel", [g.wA, g.dA, g.pX[lo]], [1.0] * 3, -np.inf, 1.0)
                if g.wX and g.pX:
                    for j in range(min(g.pX), max(g.wX) + 1):
                        cols = [col for c, col in g.wX.items() if c >= j] + [col for c, col in g.pX.items() if c <= j]
                        if len(cols) > 1:
                            R.add("evict before prefetch", cols, [1.0] * len(cols), -np.inf, 1.0)
        if writes:
            R.add("one write", [first_copy] + writes, [1.0] * (len(writes) + 1), -np.inf, 1.0)
        x.gaps = gaps
    # steady state: a carried tensor ends the iteration in the tier its input starts the next
    # one in (slow at the end: slow at its last use, or left fast memory after it)
    for out, inp in pairs.items():
        if out in tv:
            v = tv[out]
            cols = [v.z] if v.z >= 0 else [v.gaps[-1].before, v.gaps[-1].wA, v.gaps[-1].dA]
        else:
            cols = []  # the output stays fast
        if inp in tv and tv[inp].start >= 0:
            cols = cols + [tv[inp].start]
            vals = [1.0] * (len(cols) - 1) + [-1.0]
        else:
            vals = [1.0] * len(cols)
        if cols:
            R.add("steady state", cols, vals, 0.0, 0.0)

    # kernel times, and async overlap: y[c] >= K_c, y[c] >= copies at c
    constant = 0.0
    configs: dict[int, tuple[tuple[int, ...], float, list[tuple[int, float]]]] = {}
    y: dict[int, int] = {}
    z: dict[int, int | None] = {}
    for k in range(n):
        kern = graph.kernels[k]
        ops = operand_tensors(kern.inputs, kern.outputs)
        slow_at = {t: tv[t].slow[tv[t].uses.index(k)] for t in ops if t in tv}
        const, terms, is_config = kernel_time_terms(V, R, cost, k, ops, slow_at)
        configs[k] = (ops, const, terms, is_config)
        if k in async_terms:
            y[k] = col = int(V.add(1, cost=1.0, lower=0.0, upper=np.inf, integer=False)[0])
            z[k] = add_async_overlap(V, R, col, async_terms[k])
            R.add("async overlap", [c for c, _ in terms] + [col], [v for _, v in terms] + [-1.0], -np.inf, -const)
            add_async_slowdown(R, col, z[k], async_terms[k], shares[k], cost.interference_share(), const, terms)
        else:
            constant += const
            for col, coef in terms:
                V.add_cost(col, coef)

    rhs = (budget + extra.astype(np.float64) - graph.live_bytes.astype(np.float64) - MARGIN_BYTES) / SCALE
    fill, _ = capacity_chain(R, V, cap_iv, rhs, n)
    stats = ILPStats(variables=V.n, families={k: tuple(v) for k, v in R.family_counts.items()})
    if V.n == 0:
        stats.status, stats.objective, stats.bound = "Optimal", constant, constant
        return _decode(graph, cost, budget, formulation, np.zeros(0), tv), stats
    h, lp = highs_model(highspy, V, R, constant, time_limit=time_limit, mip_gap=mip_gap, threads=threads,
                        verbose=verbose)
    stats.binaries = int(np.concatenate(V.integer).sum())
    stats.rows, stats.nonzeros = R.n, len(lp.a_matrix_.value_)
    stats.build_seconds = time.perf_counter() - t_build
    x0 = (_warm_start_vector(warm_start, V.n, tv, configs, (y, z), async_terms, shares, cost.interference_share())
          if warm_start else None)
    x0 = fill(x0) if x0 is not None else None
    if x0 is None or not _feasible(lp, x0):
        # a start the model cannot take (first-touch's updated weights in another tier than
        # their inputs broke 25 steady-state rows at inception_v4's floor, and the solver
        # found no plan in 5 s): the tightest plan, a solution at every budget from the floor
        from .floor import tightest_direct_plan

        tight = _warm_start_vector(tightest_direct_plan(graph, pinned, cost.memory_system), V.n, tv, configs,
                                   (y, z), async_terms, shares, cost.interference_share())
        if tight is not None and _feasible(lp, fill(tight)):
            x0 = tight
    x = solve_model(h, highspy, lp, x0, constant, time_limit, stats)
    if x is None:
        raise InfeasibleBudget(budget, need, f"kernel {need_k} ({graph.kernels[need_k].op})")
    return _decode(graph, cost, budget, formulation, x, tv), stats


def _on(x: np.ndarray, col: int) -> bool:
    return col >= 0 and x[col] > 0.5


def _decode(graph: TrainingGraph, cost: CostModel, budget: int, formulation: str, x: np.ndarray,
            tv: dict[int, _Tensor]) -> Plan:
    tensors = []
    for t in graph.tensors:
        v = tv.get(t.id)
        if v is None:
            tensors.append(TensorPlan(t.id, "fast", ()))
            continue
        if v.z >= 0:
            tensors.append(TensorPlan(t.id, "slow" if _on(x, v.z) else "fast", ()))
            continue
        initial = "slow" if _on(x, v.start if t.producer is None else v.slow[0]) else "fast"
        actions: list[Action] = []
        for g in v.gaps:
            empty = g.hi < g.lo
            if _on(x, g.wA):
                if not (g.kind == "final" and empty):  # (an empty final gap: the executor's carry write)
                    on = [c for c, col in g.wX.items() if _on(x, col)]
                    actions.append(Action("evict", on[0], "async") if on else Action("evict", g.lo, "sync"))
            elif _on(x, g.dA) and not (g.kind == "final" and empty):
                actions.append(Action("drop", g.lo, "sync"))
            if _on(x, g.pS):
                actions.append(Action("prefetch", g.hi + 1, "sync"))
            else:
                on = [c for c, col in g.pX.items() if _on(x, col)]
                if on:
                    actions.append(Action("prefetch", on[0], "async"))
        tensors.append(TensorPlan(t.id, initial, tuple(sorted(actions, key=lambda a: a.at))))
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint,
                memory_system=cost.memory_system, access="direct", budget_bytes=int(budget), planner=formulation,
                tensors=tuple(tensors), meta={})


def _warm_start_vector(plan: Plan, nvars: int, tv: dict[int, _Tensor], configs, yz, async_terms,
                       shares, share_max):
    """A full assignment reproducing `plan` (a static, first-touch, lru or synchronous plan),
    or None when the plan uses moves this model cannot express (HiGHS then starts cold).
    Sync leaves are moved to the start of their gap and sync prefetches to its end: the
    same cost, and never more fast bytes."""
    x = np.zeros(nvars)
    by_id = {tp.id: tp for tp in plan.tensors}
    for tid, v in tv.items():
        tp = by_id[tid]
        slow0 = tp.initial == "slow"
        if v.z >= 0:
            if tp.actions:
                return None
            x[v.z] = slow0
            continue
        if any(a.keep_fast for a in tp.actions):
            return None
        if v.start >= 0:
            x[v.start] = slow0
        else:
            x[v.slow[0]] = slow0
        used = 0
        for g in v.gaps:
            end = g.hi if g.kind == "final" else g.hi + 1
            acts = [a for a in tp.actions if g.lo <= a.at <= end]
            used += len(acts)
            state = x[g.before] > 0.5
            leaves = [a for a in acts if a.kind != "prefetch"]
            pres = [a for a in acts if a.kind == "prefetch"]
            if len(leaves) > 1 or len(pres) > 1 or (leaves and pres and pres[0].at < leaves[0].at):
                return None
            if leaves:
                a = leaves[0]
                if a.kind == "evict":
                    col = g.wX.get(a.at) if a.mode == "async" else g.wS
                    if col is None or g.wA < 0:
                        return None
                    x[g.wA] = x[col] = 1
                elif a.mode == "sync" and g.dA >= 0:
                    x[g.dA] = 1
                else:
                    return None
                state = True
            elif g.kind == "final":
                # no move left: the executor's carry write after the last kernel (the
                # simulator charges a sync write), here a sync write or drop
                want = g.src in tv and by_id[g.src].initial == "slow"
                if want and not state:
                    if _has_copy(v, g, x):
                        x[g.dA] = 1
                    else:
                        x[g.wA] = x[g.wS] = 1
                    state = True
            if g.kind == "final" and state != (g.src in tv and by_id[g.src].initial == "slow"):
                return None
            if pres:
                a = pres[0]
                col = g.pX.get(a.at) if a.mode == "async" else g.pS
                if col is None or col < 0:
                    return None
                x[col] = 1
                state = False
            if g.after >= 0:
                x[g.after] = state
        if used != len(tp.actions):
            return None  # an action outside the gaps (e.g. a move right at a use)
    for k, (ops, _const, terms, is_config) in configs.items():
        if is_config:
            _set_config(x, terms, k, ops, tv)
    y, z = yz
    for k, col in y.items():
        ops, const, terms, _ = configs[k]
        set_async_overlap(x, col, z[k], async_terms[k], const + sum(c * x[t] for t, c in terms),
                          shares[k], share_max)
    return x


def _has_copy(v: _Tensor, g: _Gap, x) -> bool:
    first = v.start if v.start >= 0 else v.slow[0]
    return x[first] > 0.5 or any(x[h.wA] > 0.5 for h in v.gaps if h is not g and h.wA >= 0)


def _set_config(x, terms, k, ops, tv) -> None:
    """Set the v[k,c] that matches the operands' tiers."""
    slow = {t: x[tv[t].slow[tv[t].uses.index(k)]] > 0.5 for t in ops if t in tv}
    free = [t for t in ops if t in tv]
    # the v columns come in itertools.product order over the free operands, fast first
    idx = 0
    for t in free:
        idx = idx * 2 + (1 if slow[t] else 0)
    x[terms[idx][0]] = 1
