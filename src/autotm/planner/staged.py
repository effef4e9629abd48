"""The AutoTM ILP for staged memory systems (synchronous and asynchronous), on HiGHS.

The columns are made here (staged_columns); each constraint family is one function of
families.py, named below; decode.py turns a solution into a plan, warm_start.py a plan
into a start.

Notation (one tensor t of size s_t, one movable segment g of it; see segments.py):

  Variables (binary unless noted)
    wA[g]   t is written to slow memory at the start of segment g and is absent in it
    dA[g]   t is absent in g after dropping its fast copy (a slow copy already exists)
    st[t]   carried input t starts the iteration in slow memory (its initial segment);
            an output t that may be born slow (segments.py) is: its producer k writes it
            there piece by piece (cost m(s, to_slow, sync)), holding b_t bytes of it at k
    wS[g]   the write of g is synchronous, before kernel start(g)
    wL[g,e] the write of g is synchronous, before kernel e later in g (where waking is cheap)
    wX[g,c] the write of g is asynchronous, overlapping kernel c (window after start(g))
    pS[g]   the prefetch ending g is synchronous, before the use after g
    pX[g,c] the prefetch ending g overlaps kernel c (window before the use)
    pE[g,p] the prefetch ending g is synchronous, before kernel p earlier in g
    y[c]    >= 0, continuous: time of kernel c with its async copies
    u[b]    in [0, 1], continuous: kernel b starts after the compute thread waited idle

  Residency of t at a kernel j inside g (1 = in fast memory at step 3 of the timeline):
    R[t,j] = 1 - a[g] + sum_{c >= j} wX[g,c] + sum_{e > j} wL[g,e] + sum_{c <= j} pX[g,c]
             + sum_{p <= j} pE[g,p],  a[g] = wA[g] + dA[g]
  and R = 1 at t's uses and outside its segments while it is live.

  Constraints
    one write:           sum_g wA[g] + st[t] <= 1                       (written at most once)
    drop needs a copy:   dA[g] <= st[t] + sum_{g' < g} wA[g']
    evict choice:        wS[g] + sum_e wL[g,e] + sum_c wX[g,c] = wA[g]
    prefetch choice:     pS[g] + sum_p pE[g,p] + sum_c pX[g,c] = a[g]   (gaps),  = st[t]  (initial)
    steady state:        a[final of t'] = st[t]  where t' carries t into the next iteration
    born slow:           st[t] <= dA[g0]  for an output t born slow, g0 its first segment (k + 1 on);
                         at its producer k, R[t,k] = 1 - st[t] (s_t - b_t) / s_t
    evict before prefetch: sum_{E >= j} (wX, wL)[g,E] + sum_{F <= j} (pX, pE)[g,F] <= 1
                         at each F: the evict's kernel E comes before the prefetch's F
    capacity:            sum_t s_t R[t,j] <= B                          for every kernel j
                         (as a running sum L[j] = L[j-1] + changes at j, L[j] <= B - fixed bytes:
                         two nonzeros per interval of a variable instead of one per kernel)
    async overlap:       y[c] >= T_c,  y[c] >= sum_m x_m a_m + z[c],  z[c] >= (m_m - a_m) x_m  for each m
                         over the copies m at c (x_m = wX[.,c] or pX[.,c], m_m = m(s, dir, async),
                         a_m = its marginal, CostModel.async_marginal_seconds): one copy's whole
                         time and what each other adds (= the plain sum when copies do not overlap)
    async slowdown:      y[c] >= T_c + sum_m g_m a_m x_m + g* z[c]   (the kernel computes slower
                         while copies are in flight; g = CostModel.interference_share)
    wake:                u[b] >= x  for every copy column x that leaves the thread idle right
                         before kernel b: wS[g] (b = start(g)), pS[g] (b = the use after g),
                         wL[g,e] (b = e), pE[g,p] (b = p), and
                         wX[g,c], pX[g,c] whose async time exceeds T_c (b = c + 1; the thread
                         waits for the copy after kernel c) (CostModel.woken); only where W_b > 0

  Objective (predicted iteration seconds, exactly what autotm.simulate computes):
    min  sum_{c without async} T_c + sum_{c with async} y[c]
         + sum_g (wS[g] + sum_e wL[g,e]) m(s, to_slow, sync) + sum_g (pS[g] + sum_p pE[g,p]) m(s, to_fast, sync)
         + sum_{g,c} wX[g,c] h(s, to_slow) + sum_{g,c} pX[g,c] h(s, to_fast)
         + sum_b W_b u[b]
         + sum_{k in pieces, t read there} m(s_t, to_fast, sync) (1 - R[t,k])   (piece reads)

  where m(s, direction, mode) = latency + s / bandwidth from the cost model and h(s, dir)
  = CostModel.async_host_seconds, the issuing thread's own part of an async copy, and
  W_b = CostModel.wake_seconds[b]. A kernel k that runs in pieces (ir/split.py) reads an
  input t absent there from its slow copy, a piece at a time (segments.py: no use there
  needs t fast); no async copy of t overlaps k. The synchronous formulation has no wX, pX, y. Bytes
  are scaled to KiB inside the model only.

  wL and pE exist only where wakes are profiled (W not all zero): without wakes a sync copy
  costs the same anywhere in its segment and is best at the end that frees memory soonest.
  Offered are the `sync_candidates` kernels within `window` of the natural place that wake
  cheapest (cheaper than there), and the warm start's own places, so that the start is a
  solution.
"""

from __future__ import annotations

import time
import numpy as np

from ..errors import InfeasibleBudget
from ..ir.costmodel import CostModel
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan
from ..ir.plan_meta import SolverStats
from . import families as fam
from .decode import decode_staged
from .floor import in_place_bytes, solver_infeasible, tightest_staged_plan
from .highs_driver import Solve, highs_model, is_feasible, solve_model, solver_stats
from .model import MARGIN_BYTES, SCALE, Rows, SegVars, StagedLayout, Vars, add_async_copies, cheap_wakes, \
    sync_positions
from ..ir.split import piece_read_seconds, piece_reads, piece_write_seconds
from .segments import NO_PREFETCH, STARTS_SLOW, TensorSegments, carried_pairs, tensor_segments
from .warm_start import overlap_greedily, staged_start


def default_min_tensor_bytes(graph: TrainingGraph) -> int:
    """Tensors smaller than this stay in fast memory: moving one cannot change a plan's
    speed measurably, and leaving them out keeps the model small."""
    return graph.peak_live_bytes // 20000


def min_tensor_bytes_for(graph: TrainingGraph, budget: int, extra: np.ndarray | None = None,
                         pinned: frozenset[int] = frozenset()) -> int:
    """The size below which tensors stay fast for this budget: default_min_tensor_bytes,
    or, near the smallest feasible budget, where the small tensors must move too, the
    largest of 1/4, 1/16, 1/64 of it and 0 that lets the budget hold (0 if none does)."""
    pairs = carried_pairs(graph)
    default = default_min_tensor_bytes(graph)
    for m in (default, default >> 2, default >> 4, default >> 6):
        if minimum_budget(graph, tensor_segments(graph, min_bytes=m, pinned=pinned, pairs=pairs), extra)[0] <= budget:
            return m
    return 0


def smallest_budget(graph: TrainingGraph, extra: np.ndarray | None = None,
                    pinned: frozenset[int] = frozenset()) -> int:
    """The smallest budget any staged plan fits: minimum_budget with every tensor movable
    (min_tensor_bytes_for's last resort)."""
    return minimum_budget(graph, tensor_segments(graph, min_bytes=0, pinned=pinned, pairs=carried_pairs(graph)),
                          extra)[0]


def staged_extra(graph: TrainingGraph, extra: np.ndarray | None, pinned: frozenset[int] = frozenset()) -> np.ndarray:
    """The staged model's budget_extra: `extra` (pinned tensors, workspace) and the bytes
    an output written over its dying input holds of it (floor.in_place_bytes)."""
    shared = in_place_bytes(graph, pinned)
    return shared if extra is None else extra + shared


def minimum_budget(graph: TrainingGraph, segs: list[TensorSegments],
                   extra: np.ndarray | None = None) -> tuple[int, int]:
    """(bytes, kernel): the most bytes any kernel must hold in fast memory under staged
    access, less `extra[k]` (per kernel: bytes the budget gains there, pinned tensors; or
    loses, negative, to a kernel's workspace)."""
    n = len(graph.kernels)
    movable = np.zeros(n + 1, dtype=np.int64)
    for ts in segs:
        for s in ts.segments:
            if s.end >= s.start:
                movable[s.start] += ts.nbytes
                movable[s.end + 1] -= ts.nbytes
        if ts.born is not None:  # (born slow, at its producer it holds one piece)
            k, piece = ts.born
            movable[k] += ts.nbytes - piece
            movable[k + 1] -= ts.nbytes - piece
    need = graph.live_bytes - np.cumsum(movable[:-1])
    if extra is not None:
        need = need - extra
    k = int(np.argmax(need))
    return int(need[k]), k


def staged_columns(V: Vars, segs: list[TensorSegments], cost: CostModel, *, async_: bool, window: int,
                   candidates: int, sync_candidates: int, warm_start: Plan | None,
                   reads: dict[int, frozenset[int]] | None = None) -> StagedLayout:
    """The move columns of every segment (SegVars), with their costs in the objective:
    sync copies m(s, dir, sync), async copies their host seconds h(s, dir); wL and pE only
    where wakes are profiled (model.cheap_wakes), wX and pX only in the asynchronous model
    (model.async_candidates, within `window` of the copy's natural place; not over a kernel
    in `reads` that reads the tensor in pieces, ir.split.piece_reads)."""
    reads = reads or {}
    n = len(cost.kernel_seconds)
    T = np.asarray(cost.kernel_seconds, dtype=float)
    W = cost.wake(n)
    # where the start moves synchronously (tensor -> kernels), offered as wL / pE positions
    start_evicts, start_prefetches = sync_positions(warm_start) if W.any() else ({}, {})

    def elsewhere(kernels: range, natural: int, keep: set[int]) -> list[int]:
        return cheap_wakes(kernels, W, natural, sync_candidates, window, keep) if W.any() else []
    layout = StagedLayout({}, {}, {})
    for ts in segs:
        s = ts.nbytes
        w_sync, r_sync = cost.move_seconds(s, "to_slow", "sync"), cost.move_seconds(s, "to_fast", "sync")
        w_async, r_async = cost.move_seconds(s, "to_slow", "async"), cost.move_seconds(s, "to_fast", "async")
        w_host, r_host = cost.async_host_seconds(s, "to_slow"), cost.async_host_seconds(s, "to_fast")
        if ts.carried_input:
            layout.start_slow[ts.tensor] = V.one()
        elif ts.born is not None:  # born slow: its producer writes it there (its cost: solve_staged)
            layout.start_slow[ts.tensor] = V.one()
            layout.born[ts.tensor] = ts.born
        if ts.carried_output_of is not None:
            layout.carried_output_of[ts.tensor] = ts.carried_output_of
        for seg in ts.segments:
            sv = layout.seg_vars[(ts.tensor, seg.index)] = SegVars(seg, s)
            lo, hi = seg.start, seg.end
            if seg.kind not in STARTS_SLOW:
                sv.wA, sv.dA = V.one(), V.one()
                sv.wS = V.one(w_sync)
                if not sv.empty:  # (an empty final segment: the carry write, after the last kernel)
                    for e in elsewhere(range(lo + 1, hi + 1), lo, start_evicts.get(ts.tensor, set())):
                        sv.wL[e] = V.one(w_sync)
                    if async_:
                        last = hi if seg.kind in NO_PREFETCH else hi - 1  # leave room for the prefetch
                        over = [c for c in range(lo, min(lo + window - 1, last) + 1)
                                if ts.tensor not in reads.get(c, ())]  # (not over a kernel reading it in pieces)
                        sv.wX = add_async_copies(V, over, T, w_async, w_host, candidates)
            if seg.kind in NO_PREFETCH:
                continue
            sv.pS = V.one(r_sync)
            first = lo if seg.kind == "initial" else lo + 1  # (not at lo: a sync evict or drop happens there)
            for p in elsewhere(range(first, hi + 1), hi + 1, start_prefetches.get(ts.tensor, set())):
                sv.pE[p] = V.one(r_sync)
            if async_:
                over = [c for c in range(max(first if seg.kind == "gap" else 0, hi + 1 - window), hi + 1)
                        if ts.tensor not in reads.get(c, ())]  # (not over a kernel reading it in pieces)
                sv.pX = add_async_copies(V, over, T, r_async, r_host, candidates)
    return layout


def _leaving(layout: StagedLayout) -> list[tuple[int, list[SegVars]]]:
    """Per tensor: its st column (-1: none) and its segments it may be written out in."""
    out: dict[int, tuple[int, list[SegVars]]] = {}
    for (tid, _), sv in layout.seg_vars.items():
        first, segs = out.setdefault(tid, (layout.start_slow.get(tid, -1), []))
        if sv.seg.kind not in STARTS_SLOW:
            segs.append(sv)
    return list(out.values())


def solve_staged(graph: TrainingGraph, cost: CostModel, budget: int, *, formulation: str = "synchronous",
                 window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, min_tensor_bytes: int | None = None,
                 pinned: frozenset[int] = frozenset(), budget_extra: np.ndarray | None = None,
                 threads: int | None = None, warm_start: Plan | None = None, verbose: bool = False,
                 candidates: int = 4, sync_candidates: int = 1,
                 reference: Plan | None = None) -> tuple[Plan, SolverStats]:
    """Solve the AutoTM ILP for a staged memory system and decode the plan.

    warm_start: a plan of this budget to start from. reference: a plan that may break
    this budget (the one that fragmented, for the arena's re-solve): the solver first
    searches its neighbourhood (highs_worker.rins) and starts from what it finds there if
    that is cheaper than warm_start.

    window: async copies may overlap kernels up to this many positions from the move's
    natural place; candidates: of those, how many (the longest kernels) are offered.
    budget_extra[k]: bytes the budget gains at kernel k (pinned tensors, counted outside
    it) or, negative, loses (the kernel's workspace); the capacity row at k is
    budget + budget_extra[k] + the bytes of an input k's output is written over
    (staged_extra).
    """
    import highspy

    if formulation not in ("synchronous", "asynchronous"):
        raise ValueError(f"staged memory systems support the synchronous and asynchronous formulations, not {formulation!r}")
    t_build = time.perf_counter()
    n = len(graph.kernels)
    pairs = carried_pairs(graph)
    extra = staged_extra(graph, budget_extra, pinned)
    if min_tensor_bytes is None:
        min_tensor_bytes = min_tensor_bytes_for(graph, budget, extra, pinned)
    segs = tensor_segments(graph, min_bytes=min_tensor_bytes, pinned=pinned, pairs=pairs)
    need, need_k = minimum_budget(graph, segs, extra)
    if need > budget:
        raise InfeasibleBudget(budget, need, f"kernel {need_k} ({graph.kernels[need_k].op})")
    async_ = formulation == "asynchronous"
    T = np.asarray(cost.kernel_seconds, dtype=float)
    share_max = cost.interference_share()

    V, R = Vars(), Rows()
    reads = piece_reads(graph)
    layout = staged_columns(V, segs, cost, async_=async_, window=window, candidates=candidates,
                            sync_candidates=sync_candidates, warm_start=warm_start, reads=reads)
    fam.piece_reads(V, layout, reads, lambda k, t: piece_read_seconds(graph, k, t, cost))
    for tid, (k, _) in layout.born.items():  # (the piece writes of an output born slow, as simulate charges them)
        V.add_cost(layout.start_slow[tid], piece_write_seconds(graph, k, cost))
    leaving = _leaving(layout)
    gaps = [sv for sv in layout.seg_vars.values() if sv.seg.kind == "gap"]
    R.timed(lambda: fam.evict_choice(sv for sv in layout.seg_vars.values() if sv.seg.kind not in STARTS_SLOW))
    R.timed(lambda: fam.prefetch_choice(layout))
    R.timed(lambda: fam.drop_needs_copy(leaving))
    R.timed(lambda: fam.one_write(leaving))
    R.timed(lambda: fam.steady_state(layout))
    R.timed(lambda: fam.born_slow(layout))
    R.timed(lambda: fam.evict_before_prefetch(gaps))
    # y[c] >= T_c and y[c] >= the copies at c; T_c of other kernels is a constant
    t = time.perf_counter()
    block, overlaps = fam.async_overlap(V, fam.staged_async_terms(layout, cost), T, share_max)
    R.add(block, time.perf_counter() - t)
    constant_time = float(sum(T[c] for c in range(n) if c not in overlaps))
    t = time.perf_counter()
    block, wakes = fam.wake(V, fam.staged_idle_links(layout, cost, T, n), cost.wake(n))
    R.add(block, time.perf_counter() - t)
    t = time.perf_counter()
    cap_iv = fam.staged_intervals(layout)
    rhs = (budget + extra.astype(np.float64) - graph.live_bytes.astype(np.float64) - MARGIN_BYTES) / SCALE
    cap = fam.capacity(V, cap_iv, rhs, n)
    R.add(cap.block, time.perf_counter() - t)

    solve = Solve()
    if V.n == 0:  # nothing can move: every tensor stays in fast memory, and that fits
        solve.status, solve.objective, solve.bound = "Optimal", constant_time, constant_time
        return (decode_staged(graph, cost, budget, formulation, np.zeros(0), layout),
                solver_stats(V, R, 0, time.perf_counter() - t_build, solve))
    h, lp = highs_model(highspy, V, R, constant_time, time_limit=time_limit, mip_gap=mip_gap,
                        threads=threads, verbose=verbose)
    build_seconds = time.perf_counter() - t_build

    def encoded(p: Plan | None) -> np.ndarray | None:  # the plan as a full assignment of the columns, or None
        v = (staged_start(p, V.n, layout.seg_vars, layout.start_slow, overlaps, T, share_max, pairs)
             if p is not None else None)
        return cap.fill(wakes.set(v)) if v is not None else None
    x0 = encoded(warm_start)
    if x0 is None or not is_feasible(lp, x0):
        # a start the model cannot take (or none): the tightest plan, a solution wherever
        # the budget is at least minimum_budget (floor.py), so that a plan is always found
        tight = encoded(tightest_staged_plan(graph, pinned, cost.memory_system, min_bytes=min_tensor_bytes))
        if tight is not None and is_feasible(lp, tight):
            x0 = tight
    if x0 is not None and async_ and cap.load is not None:
        x0 = overlap_greedily(x0, lp, layout.seg_vars, cap_iv, rhs - x0[cap.load], overlaps, T, share_max, cap.fill,
                              wakes)
    x = solve_model(h, highspy, lp, x0, constant_time, time_limit, solve, reference=encoded(reference))
    stats = solver_stats(V, R, len(lp.a_matrix_.value_), build_seconds, solve)
    if x is None:
        raise solver_infeasible(graph, formulation, "staged", budget, pinned, budget_extra, cost.memory_system,
                                restricted=(need, f"kernel {need_k} ({graph.kernels[need_k].op})"))
    return decode_staged(graph, cost, budget, formulation, x, layout), stats
