"""The AutoTM ILP for staged memory systems (synchronous and asynchronous), on HiGHS.

Notation (one tensor t of size s_t, one movable segment g of it; see segments.py):

  Variables (binary unless noted)
    wA[g]   t is written to slow memory at the start of segment g and is absent in it
    dA[g]   t is absent in g after dropping its fast copy (a slow copy already exists)
    st[t]   carried input t starts the iteration in slow memory (its initial segment)
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
    flow/one write:      sum_g wA[g] + st[t] <= 1                       (written at most once)
                         dA[g] <= st[t] + sum_{g' < g} wA[g']           (drop needs a slow copy)
    evict choice:        wS[g] + sum_e wL[g,e] + sum_c wX[g,c] = wA[g]
    prefetch choice:     pS[g] + sum_p pE[g,p] + sum_c pX[g,c] = a[g]   (gaps),  = st[t]  (initial)
    steady state:        a[final of t'] = st[t]  where t' carries t into the next iteration
    order:               sum_{E >= j} (wX, wL)[g,E] + sum_{F <= j} (pX, pE)[g,F] <= 1
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

  where m(s, direction, mode) = latency + s / bandwidth from the cost model and h(s, dir)
  = CostModel.async_host_seconds, the issuing thread's own part of an async copy, and
  W_b = CostModel.wake_seconds[b]. The synchronous formulation has no wX, pX, y. Bytes
  are scaled to KiB inside the model only.

  wL and pE exist only where wakes are profiled (W not all zero): without wakes a sync copy
  costs the same anywhere in its segment and is best at the end that frees memory soonest.
  Offered are the `sync_candidates` kernels within `window` of the natural place that wake
  cheapest (cheaper than there), and the warm start's own places, so that the start is a
  solution.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InfeasibleBudget, SolverTimeout
from ..ir.costmodel import CostModel
from ..ir.graph import TrainingGraph
from ..ir.plan import Action, Plan, TensorPlan
from .highs_worker import (REFERENCE_SHARE, RINS_SHARE, cheaper, feasible, improve_start, model_arrays, request,
                           run_isolated, set_start)
from .segments import TensorSegments, carried_pairs, tensor_segments

# Capacity in KiB, as a running sum along the kernels (capacity_chain): the solver's
# feasibility tolerance (FEASIBILITY_TOL, per row) adds up along the chain and stays far
# under a byte, so integer byte counts that pass the solver pass the validator's exact check.
SCALE = float(2**10)
MARGIN_BYTES = 0.0
# HiGHS runs in a worker process, killed at the time limit, for models with this many
# integer columns or more (highs_worker: HiGHS overran 9.5 s by 47 s on densenet264's
# asynchronous model, 25k; 15 s by 9 s on its synchronous one, 14k); smaller models (the
# demo's: 3k and 5k) solve in-process, without the process's start-up
ISOLATE_MIN_INTEGERS = 10_000
FEASIBILITY_TOL = 1e-9  # HiGHS's primal and MIP feasibility tolerances (capacity_chain)


@dataclass
class ILPStats:
    variables: int = 0
    binaries: int = 0
    rows: int = 0
    nonzeros: int = 0
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    status: str = ""
    gap: float = 0.0
    objective: float = 0.0
    bound: float = float("nan")  # the solver's lower bound on the objective (seconds); nan: none
    families: dict = field(default_factory=dict)
    start: np.ndarray | None = field(default=None, repr=False)  # the start found near a reference (_run)


class _Vars:
    """Column bookkeeping: named families of variables with bounds, costs, integrality."""

    def __init__(self):
        self.n = 0
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.cost: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.extra_cost: dict[int, float] = {}  # added to a column's cost after it was made

    def add(self, count: int, *, cost=0.0, lower=0.0, upper=1.0, integer=True) -> np.ndarray:
        idx = np.arange(self.n, self.n + count)
        self.n += count
        self.lower.append(np.broadcast_to(np.asarray(lower, float), (count,)).copy())
        self.upper.append(np.broadcast_to(np.asarray(upper, float), (count,)).copy())
        self.cost.append(np.broadcast_to(np.asarray(cost, float), (count,)).copy())
        self.integer.append(np.full(count, 1 if integer else 0, dtype=np.int8))
        return idx

    def add_cost(self, col: int, delta: float) -> None:
        self.extra_cost[col] = self.extra_cost.get(col, 0.0) + delta

    def cost_vector(self) -> np.ndarray:
        c = np.concatenate(self.cost) if self.cost else np.zeros(0)
        for col, d in self.extra_cost.items():
            c[col] += d
        return c


class _Rows:
    """Rows as COO triples plus bounds, grouped by constraint family."""

    def __init__(self):
        self.n = 0
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.family_counts: dict[str, list[int]] = {}

    def add(self, family: str, cols, vals, lo: float, hi: float) -> None:
        cols = np.asarray(cols, dtype=np.int64)
        self.r.append(np.full(len(cols), self.n, dtype=np.int64))
        self.c.append(cols)
        self.v.append(np.asarray(vals, dtype=float))
        self.lo.append(lo)
        self.hi.append(hi)
        self.n += 1
        fc = self.family_counts.setdefault(family, [0, 0])
        fc[0] += 1
        fc[1] += len(cols)

    def add_block(self, family: str, rows, cols, vals, lo, hi) -> None:
        """Many rows at once: `rows` are 0-based within the block."""
        count = len(lo)
        self.r.append(np.asarray(rows, dtype=np.int64) + self.n)
        self.c.append(np.asarray(cols, dtype=np.int64))
        self.v.append(np.asarray(vals, dtype=float))
        self.lo.extend(np.asarray(lo, dtype=float).tolist())
        self.hi.extend(np.asarray(hi, dtype=float).tolist())
        self.n += count
        fc = self.family_counts.setdefault(family, [0, 0])
        fc[0] += count
        fc[1] += len(cols)


@dataclass
class _SegVars:
    seg: object
    wA: int = -1
    dA: int = -1
    wS: int = -1
    pS: int = -1
    wX: dict = field(default_factory=dict)  # kernel -> column
    pX: dict = field(default_factory=dict)
    wL: dict = field(default_factory=dict)  # kernel -> column: a later sync write (before that kernel)
    pE: dict = field(default_factory=dict)  # kernel -> column: an earlier sync prefetch

    def evicts_at(self) -> list[tuple[int, int]]:
        """(kernel of the action, column) of the evicts that can meet a prefetch of the
        same stay: wX (async over c) and wL (sync before e); wS, at the start, meets none."""
        return list(self.wX.items()) + list(self.wL.items())

    def prefetches_at(self) -> list[tuple[int, int]]:
        """(first kernel the tensor is back, column) of the prefetches: pX and pE."""
        return list(self.pX.items()) + list(self.pE.items())


@dataclass
class _Wakes:
    """The wake rows' bookkeeping: u[b] >= x for each copy column x in links[b]."""
    u: dict = field(default_factory=dict)  # kernel b -> u column
    links: dict = field(default_factory=dict)  # kernel b -> copy columns
    at: dict = field(default_factory=dict)  # copy column -> kernel b

    def set(self, x: np.ndarray, kernels=None) -> np.ndarray:
        """Warm starts: u[b] = max of its copy columns (at `kernels`, default all)."""
        for b in self.u if kernels is None else kernels:
            if b in self.u:
                x[self.u[b]] = max((x[c] for c in self.links[b]), default=0.0)
        return x


def add_wakes(V: "_Vars", R: "_Rows", links: list[tuple[int, int]], W: np.ndarray) -> _Wakes:
    """u[b] in [0, 1] with cost W_b, and u[b] - x <= 0 for each (x, b) in `links` with W_b > 0
    (continuous u: the minimum makes it max_x x, which is 0 or 1)."""
    wk = _Wakes()
    links = [(col, b) for col, b in links if W[b] > 0.0]
    for col, b in links:
        wk.links.setdefault(b, []).append(col)
        wk.at[col] = b
    for b in sorted(wk.links):
        wk.u[b] = int(V.add(1, cost=W[b], integer=False)[0])
    if links:
        cols = np.asarray([c for c, _ in links], dtype=np.int64)
        ucols = np.asarray([wk.u[b] for _, b in links], dtype=np.int64)
        r = np.arange(len(links))
        R.add_block("wake", np.concatenate([r, r]), np.concatenate([cols, ucols]),
                    np.concatenate([np.ones(len(r)), -np.ones(len(r))]), np.full(len(r), -np.inf), np.zeros(len(r)))
    return wk


def add_async_overlap(V: "_Vars", R: "_Rows", y: int, terms: list[tuple[int, float, float]]) -> int | None:
    """y >= the async copies at one kernel, terms (col, full seconds, marginal seconds):
        y >= sum_m a_m x_m + z,   z >= (m_m - a_m) x_m  for each m
    (z: the one fixed cost that shows; absent when every copy costs its full time)."""
    cols = [t for t, _, _ in terms] + [y]
    vals = [a for _, _, a in terms] + [-1.0]
    extra = [(t, full - a) for t, full, a in terms if full - a > 0.0]
    if extra:
        z = int(V.add(1, lower=0.0, upper=np.inf, integer=False)[0])
        cols.append(z)
        vals.append(1.0)
        for t, e in extra:
            R.add("async fixed cost", [t, z], [e, -1.0], -np.inf, 0.0)
    R.add("async overlap", cols, vals, -np.inf, 0.0)
    return z if extra else None


def add_async_slowdown(R: "_Rows", y: int, z: int | None, terms: list[tuple[int, float, float]],
                       shares: list[float], share_max: float, kernel_const: float,
                       kernel_terms: list[tuple[int, float]] = ()) -> None:
    """y >= K + sum_m g_m a_m x_m + g* z: the kernel computes slower while its copies are in
    flight (CostModel.async_interference_seconds); K = kernel_const + sum coef x over
    kernel_terms (direct access: the placement's time). Nothing when no copy slows it."""
    if not any(shares) and not (z is not None and share_max):
        return
    cols = [c for c, _ in kernel_terms] + [t for t, _, _ in terms] + [y]
    vals = [v for _, v in kernel_terms] + [g * a for (_, _, a), g in zip(terms, shares)] + [-1.0]
    if z is not None:
        cols.append(z)
        vals.append(share_max)
    R.add("async slowdown", cols, vals, -np.inf, -kernel_const)


def set_async_overlap(x, y: int, z: int | None, terms: list[tuple[int, float, float]], floor: float,
                      shares: list[float] | None = None, share_max: float = 0.0) -> None:
    """Warm starts: the y (at least `floor`, the kernel's time) and z values
    add_async_overlap and add_async_slowdown need for the move choices already in x."""
    extra = max([(full - a) * x[t] for t, full, a in terms], default=0.0)
    if z is not None:
        x[z] = extra
    copies = sum(a * x[t] for t, _, a in terms)
    slowed = sum(g * a * x[t] for (t, _, a), g in zip(terms, shares or [0.0] * len(terms))) + share_max * extra
    x[y] = max(floor, copies + extra, floor + slowed)


def _candidates(kernels: range, T: np.ndarray, copy_seconds: float, limit: int) -> list[int]:
    """Kernels of a window worth overlapping a copy with: the `limit` longest ones, and only
    those at least a quarter as long as the copy (a copy over a shorter kernel mostly adds
    its own time, which a sync move costs too). Fewer candidates, much faster solves."""
    ks = [c for c in kernels]
    if not ks:
        return []
    ks.sort(key=lambda c: -T[c])
    good = [c for c in ks[:limit] if T[c] >= 0.25 * copy_seconds]
    return sorted(good or ks[:1])


def _cheap_wakes(kernels: range, W: np.ndarray, natural: int, limit: int, window: int, keep=()) -> list[int]:
    """Places in `kernels` for a sync copy other than its natural kernel: of those within
    `window` of it (further, the tensor holds fast memory longer), the `limit` that wake
    cheapest, only if cheaper than `natural` (nearest first on ties); and the kernels in
    `keep` (the warm start's places)."""
    cheaper = [k for k in kernels if abs(k - natural) < window and W[k] < W[natural]]
    cheaper.sort(key=lambda k: (W[k], abs(k - natural)))
    return sorted(set(cheaper[:limit]) | {k for k in keep if k in kernels})


def _sync_positions(plan: Plan | None) -> tuple[dict[int, set], dict[int, set]]:
    """tensor -> kernels of its sync evicts, and of its sync prefetches, in `plan`."""
    evicts: dict[int, set] = {}
    prefetches: dict[int, set] = {}
    for tp in plan.tensors if plan is not None else ():
        for a in tp.actions:
            if a.mode == "sync" and a.kind in ("evict", "prefetch"):
                (evicts if a.kind == "evict" else prefetches).setdefault(tp.id, set()).add(a.at)
    return evicts, prefetches


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
    need = graph.live_bytes - np.cumsum(movable[:-1])
    if extra is not None:
        need = need - extra
    k = int(np.argmax(need))
    return int(need[k]), k


def solve_staged(graph: TrainingGraph, cost: CostModel, budget: int, *, formulation: str = "synchronous",
                 window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, min_tensor_bytes: int | None = None,
                 pinned: frozenset[int] = frozenset(), budget_extra: np.ndarray | None = None,
                 threads: int | None = None, warm_start: Plan | None = None, verbose: bool = False,
                 candidates: int = 4, sync_candidates: int = 1,
                 reference: Plan | None = None) -> tuple[Plan, ILPStats]:
    """Solve the AutoTM ILP for a staged memory system and decode the plan.

    warm_start: a plan of this budget to start from. reference: a plan that may break
    this budget (the one that fragmented, for the arena's re-solve): the solver first
    searches its neighbourhood (highs_worker.rins) and starts from what it finds there if
    that is cheaper than warm_start.

    window: async copies may overlap kernels up to this many positions from the move's
    natural place; candidates: of those, how many (the longest kernels) are offered.
    budget_extra[k]: bytes the budget gains at kernel k (pinned tensors, counted outside
    it) or, negative, loses (the kernel's workspace); the capacity row at k is
    budget + budget_extra[k].
    """
    import highspy

    if formulation not in ("synchronous", "asynchronous"):
        raise ValueError(f"staged memory systems support the synchronous and asynchronous formulations, not {formulation!r}")
    t_build = time.perf_counter()
    n = len(graph.kernels)
    pairs = carried_pairs(graph)
    extra = budget_extra if budget_extra is not None else np.zeros(n, dtype=np.int64)
    if min_tensor_bytes is None:
        min_tensor_bytes = min_tensor_bytes_for(graph, budget, extra, pinned)
    segs = tensor_segments(graph, min_bytes=min_tensor_bytes, pinned=pinned, pairs=pairs)
    need, need_k = minimum_budget(graph, segs, extra)
    if need > budget:
        raise InfeasibleBudget(budget, need, f"kernel {need_k} ({graph.kernels[need_k].op})")
    async_ = formulation == "asynchronous"
    T = np.asarray(cost.kernel_seconds, dtype=float)
    mv = lambda s, d, m: cost.move_seconds(s, d, m)  # noqa: E731

    V, Rw = _Vars(), _Rows()
    seg_vars: dict[tuple[int, int], _SegVars] = {}
    start_slow: dict[int, int] = {}
    async_terms: dict[int, list[tuple[int, float, float]]] = {}  # kernel -> (col, full, marginal)
    shares: dict[int, list[float]] = {}  # kernel -> per async term, its interference share g
    idle: list[tuple[int, int]] = []  # (copy column, kernel b): the copy leaves the thread idle before b
    W = cost.wake(n)
    # where the start moves synchronously (tensor -> kernels), offered as wL / pE positions
    start_evicts, start_prefetches = _sync_positions(warm_start) if W.any() else ({}, {})

    def sync_elsewhere(kernels: range, natural: int, keep) -> list[int]:
        return _cheap_wakes(kernels, W, natural, sync_candidates, window, keep) if W.any() else []

    def offer_earlier_prefetches(sv: _SegVars, kernels: range, hi: int, s: int, r_sync: float, choice: list) -> None:
        # pE[g,p]: a sync prefetch before kernel p of the segment, resident from p to hi
        for p in sync_elsewhere(kernels, hi + 1, start_prefetches.get(sv.seg.tensor, ())):
            col = sv.pE[p] = int(V.add(1, cost=r_sync)[0])
            idle.append((col, p))
            cap_add(p, hi, col, s)
            choice.append(col)

    def idle_after(col: int, copy_seconds: float, c: int) -> None:
        # an async copy longer than its kernel c: the thread waits for it before c + 1
        if copy_seconds > T[c] and c + 1 < n:
            idle.append((col, c + 1))
    g_read, g_write = cost.interference_share("to_fast"), cost.interference_share("to_slow")
    # capacity terms as intervals: variable `col` adds `coef` bytes at kernels j0..j1
    cap_iv: list[tuple[int, int, int, float]] = []
    cap_const = graph.live_bytes.astype(np.float64).copy()

    def cap_add(j0: int, j1: int, col: int, coef: float) -> None:
        if j1 >= j0:
            cap_iv.append((j0, j1, col, coef))

    for ts in segs:
        s = ts.nbytes
        w_sync, r_sync = mv(s, "to_slow", "sync"), mv(s, "to_fast", "sync")
        w_async, r_async = mv(s, "to_slow", "async"), mv(s, "to_fast", "async")
        w_async_m, r_async_m = cost.async_marginal_seconds(s, "to_slow"), cost.async_marginal_seconds(s, "to_fast")
        w_host, r_host = cost.async_host_seconds(s, "to_slow"), cost.async_host_seconds(s, "to_fast")
        writes: list[int] = []
        st = -1
        if ts.carried_input:
            st = int(V.add(1)[0])
            start_slow[ts.tensor] = st
        for seg in ts.segments:
            sv = _SegVars(seg)
            seg_vars[(ts.tensor, seg.index)] = sv
            lo, hi = seg.start, seg.end  # live_bytes counts t at every interior kernel already
            if seg.kind == "initial":
                # absent = st; prefetch before the first use
                sv.pS = int(V.add(1, cost=r_sync)[0])
                idle.append((sv.pS, hi + 1))
                cap_add(lo, hi, st, -s)
                choice = [sv.pS]
                offer_earlier_prefetches(sv, range(lo, hi + 1), hi, s, r_sync, choice)
                if async_:
                    for c in _candidates(range(max(0, hi + 1 - window), hi + 1), T, r_async, candidates):
                        col = int(V.add(1, cost=r_host)[0])
                        sv.pX[c] = col
                        idle_after(col, r_async, c)
                        async_terms.setdefault(c, []).append((col, r_async, r_async_m))
                        shares.setdefault(c, []).append(g_read)
                        cap_add(c, hi, col, s)
                        choice.append(col)
                Rw.add("prefetch choice", choice + [st], [1.0] * len(choice) + [-1.0], 0.0, 0.0)
                continue
            sv.wA, sv.dA = (int(c) for c in V.add(2))
            writes.append(sv.wA)
            # dA[g] <= st + sum_{g' < g} wA[g']
            prior = writes[:-1] + ([st] if st >= 0 else [])
            Rw.add("drop needs a slow copy", [sv.dA] + prior, [1.0] + [-1.0] * len(prior), -np.inf, 0.0)
            empty = hi < lo
            # evict choice: wS + sum wX = wA (an empty final segment is the carry write)
            sv.wS = int(V.add(1, cost=w_sync)[0])
            if not empty:  # (the carry write comes after the last kernel)
                idle.append((sv.wS, lo))
            evict = [sv.wS]
            if not empty:
                for e in sync_elsewhere(range(lo + 1, hi + 1), lo, start_evicts.get(ts.tensor, ())):
                    col = sv.wL[e] = int(V.add(1, cost=w_sync)[0])
                    idle.append((col, e))
                    cap_add(lo, e - 1, col, s)
                    evict.append(col)
            if async_ and not empty:
                last = hi if seg.kind == "final" else hi - 1  # leave room for the prefetch
                for c in _candidates(range(lo, min(lo + window - 1, last) + 1), T, w_async, candidates):
                    col = int(V.add(1, cost=w_host)[0])
                    sv.wX[c] = col
                    idle_after(col, w_async, c)
                    async_terms.setdefault(c, []).append((col, w_async, w_async_m))
                    shares.setdefault(c, []).append(g_write)
                    cap_add(lo, c, col, s)
                    evict.append(col)
            Rw.add("evict choice", evict + [sv.wA], [1.0] * len(evict) + [-1.0], 0.0, 0.0)
            if not empty:
                cap_add(lo, hi, sv.wA, -s)
                cap_add(lo, hi, sv.dA, -s)
            if seg.kind == "gap":
                sv.pS = int(V.add(1, cost=r_sync)[0])
                idle.append((sv.pS, hi + 1))
                pre = [sv.pS]
                offer_earlier_prefetches(sv, range(lo + 1, hi + 1), hi, s, r_sync, pre)
                if async_:
                    # not at lo: a sync evict or drop happens there
                    for c in _candidates(range(max(lo + 1, hi + 1 - window), hi + 1), T, r_async, candidates):
                        col = int(V.add(1, cost=r_host)[0])
                        sv.pX[c] = col
                        idle_after(col, r_async, c)
                        async_terms.setdefault(c, []).append((col, r_async, r_async_m))
                        shares.setdefault(c, []).append(g_read)
                        cap_add(c, hi, col, s)
                        pre.append(col)
                Rw.add("prefetch choice", pre + [sv.wA, sv.dA], [1.0] * len(pre) + [-1.0, -1.0], 0.0, 0.0)
                # order: the evict's kernel comes before the prefetch's (a row at each
                # prefetch kernel F covers every pair E >= F)
                ev, pf = sv.evicts_at(), sv.prefetches_at()
                if ev and pf:
                    last_e = max(E for E, _ in ev)
                    for j in sorted({F for F, _ in pf if F <= last_e}):
                        cols = [col for E, col in ev if E >= j] + [col for F, col in pf if F <= j]
                        if len(cols) > 1:
                            Rw.add("evict before prefetch", cols, [1.0] * len(cols), -np.inf, 1.0)
            else:  # final: end the iteration where the next one starts
                src = ts.carried_output_of
                src_st = start_slow.get(src, -1) if src is not None else -1
                if src_st >= 0:
                    Rw.add("steady state", [sv.wA, sv.dA, src_st], [1.0, 1.0, -1.0], 0.0, 0.0)
                else:
                    Rw.add("steady state", [sv.wA, sv.dA], [1.0, 1.0], 0.0, 0.0)
        # one write per tensor, none if it starts slow
        cols = writes + ([st] if st >= 0 else [])
        if len(cols) > 1:
            Rw.add("one write", cols, [1.0] * len(cols), -np.inf, 1.0)

    # async overlap: y[c] >= T_c and y[c] >= copies at c; T_c of other kernels is a constant
    y, z = {}, {}
    for c, terms in sorted(async_terms.items()):
        col = int(V.add(1, cost=1.0, lower=T[c], upper=np.inf, integer=False)[0])
        y[c] = col
        z[c] = add_async_overlap(V, Rw, col, terms)
        add_async_slowdown(Rw, col, z[c], terms, shares[c], cost.interference_share(), T[c])
    constant_time = float(sum(T[c] for c in range(n) if c not in y))
    wakes = add_wakes(V, Rw, idle, W)

    rhs = (budget + extra.astype(np.float64) - cap_const - MARGIN_BYTES) / SCALE
    fill, load_cols = capacity_chain(Rw, V, cap_iv, rhs, n)

    # ---- pass the model to HiGHS as arrays -----------------------------------------
    stats = ILPStats(variables=V.n, families={k: tuple(v) for k, v in Rw.family_counts.items()})
    if V.n == 0:  # nothing can move: every tensor stays in fast memory, and that fits
        plan = _decode(graph, cost, budget, formulation, np.zeros(0), segs, seg_vars, start_slow)
        stats.status, stats.objective, stats.bound = "Optimal", constant_time, constant_time
        return plan, stats
    h, lp = highs_model(highspy, V, Rw, constant_time, time_limit=time_limit, mip_gap=mip_gap,
                        threads=threads, verbose=verbose)
    stats.binaries = int(np.concatenate(V.integer).sum())
    stats.rows, stats.nonzeros = Rw.n, len(lp.a_matrix_.value_)
    stats.build_seconds = time.perf_counter() - t_build

    def encoded(p: Plan | None):  # the plan as a full assignment of the columns, or None
        v = (_warm_start_vector(p, V.n, seg_vars, start_slow, (y, z), T, async_terms, shares,
                                cost.interference_share(), pairs) if p is not None else None)
        return fill(wakes.set(v)) if v is not None else None
    x0 = encoded(warm_start)
    if x0 is None or not _feasible(lp, x0):
        # a start the model cannot take (or none): the tightest plan, a solution wherever
        # the budget is at least minimum_budget (floor.py), so that a plan is always found
        from .floor import tightest_staged_plan

        tight = encoded(tightest_staged_plan(graph, pinned, cost.memory_system, min_bytes=min_tensor_bytes))
        if tight is not None and _feasible(lp, tight):
            x0 = tight
    if x0 is not None and async_ and load_cols is not None:
        x0 = _overlap_greedily(x0, lp, seg_vars, cap_iv, rhs - x0[load_cols], (y, z), T, async_terms, shares,
                               cost.interference_share(), fill, wakes)
    x = solve_model(h, highspy, lp, x0, constant_time, time_limit, stats, reference=encoded(reference))
    if x is None:
        raise InfeasibleBudget(budget, need, f"kernel {need_k} ({graph.kernels[need_k].op})")
    plan = _decode(graph, cost, budget, formulation, x, segs, seg_vars, start_slow)
    return plan, stats


def capacity_chain(R: _Rows, V: _Vars, cap_iv: list[tuple[int, int, int, float]], rhs: np.ndarray, n: int):
    """Add the capacity constraints in running-sum form: a continuous L[j], the bytes
    (in KiB) the variables add at kernel j, with L[j] <= rhs[j] as a bound and

        L[j] - L[j-1] = sum of the coefs of intervals starting at j - those ending at j-1.

    Each interval (variable `col` adds `coef` bytes at kernels j0..j1) is then 2 nonzeros
    instead of one per kernel it covers: the model is much sparser where many tensors live
    long (the forward activations held for the backward pass), with the same relaxation.
    The row tolerances add up along the chain: with the solver's feasibility tolerance
    FEASIBILITY_TOL, L[j] is within (n + 1) * FEASIBILITY_TOL KiB of the true sum, well
    under half a byte; sums of whole bytes that pass L[j] <= rhs[j] + half a byte pass the
    validator's exact check.

    Returns (fill, L): fill(x) sets the L columns of a full assignment `x` of the other
    variables (for warm starts); L, the columns (None without any interval)."""
    if not cap_iv:
        return (lambda x: x), None
    iv = np.asarray(cap_iv, dtype=np.float64)
    j0, j1, col, coef = iv[:, 0].astype(np.int64), iv[:, 1].astype(np.int64), iv[:, 2].astype(np.int64), iv[:, 3]
    coef = coef / SCALE
    has = np.zeros(n + 1, dtype=np.int64)
    np.add.at(has, j0, 1)
    np.add.at(has, j1 + 1, -1)
    covered = np.cumsum(has)[:n] > 0
    assert (n + 1) * FEASIBILITY_TOL < 0.25 / SCALE, "too many kernels for the solver tolerance"
    upper = np.where(covered, rhs + 0.5 / SCALE, np.inf)
    L = V.add(n, lower=-np.inf, upper=upper, integer=False)
    ends = j1 + 1 < n
    rows = np.concatenate([np.arange(n), np.arange(1, n), j0, j1[ends] + 1])
    cols = np.concatenate([L, L[:-1], col, col[ends]])
    vals = np.concatenate([np.ones(n), -np.ones(n - 1), -coef, coef[ends]])
    # one entry per (row, column): a variable's intervals may start where another ends
    key, inv = np.unique(rows * V.n + cols, return_inverse=True)
    vals = np.bincount(inv, weights=vals)
    rows, cols = key // V.n, key % V.n
    keep = vals != 0
    R.add_block("capacity", rows[keep], cols[keep], vals[keep], np.zeros(n), np.zeros(n))

    def fill(x: np.ndarray) -> np.ndarray:
        delta = np.zeros(n + 1)
        np.add.at(delta, j0, coef * x[col])
        np.add.at(delta, j1 + 1, -coef * x[col])
        x[L] = np.cumsum(delta)[:n]
        return x

    return fill, L


def highs_model(highspy, V: _Vars, R: _Rows, offset: float, *, time_limit: float, mip_gap: float,
                threads: int | None, verbose: bool):
    """A Highs object holding the model, passed in one call as row-wise arrays."""
    h = _quiet_highs(highspy)
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("primal_feasibility_tolerance", FEASIBILITY_TOL)
    h.setOptionValue("mip_feasibility_tolerance", FEASIBILITY_TOL)
    # no restart of the tree search (a second presolve): HiGHS 1.16's, in
    # HPresolve::strengthenInequalities, ran 20 minutes past a 20 s limit on a 231-binary
    # model of a property test without reading its clock. (A model solved in the worker
    # process, ISOLATE_MIN_INTEGERS, keeps restarts: a hang there is killed at the limit.)
    h.setOptionValue("mip_allow_restart", False)
    if threads:
        h.setOptionValue("threads", int(threads))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = V.n, R.n
    lp.col_cost_ = V.cost_vector()
    lp.col_lower_ = np.concatenate(V.lower)
    lp.col_upper_ = np.concatenate(V.upper)
    lp.row_lower_ = np.asarray(R.lo, dtype=float)
    lp.row_upper_ = np.asarray(R.hi, dtype=float)
    lp.offset_ = offset
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in np.concatenate(V.integer)]
    rows = np.concatenate(R.r) if R.r else np.zeros(0, dtype=np.int64)
    cols = np.concatenate(R.c) if R.c else np.zeros(0, dtype=np.int64)
    vals = np.concatenate(R.v) if R.v else np.zeros(0)
    order = np.lexsort((cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = V.n, R.n
    lp.a_matrix_.start_ = np.searchsorted(rows, np.arange(R.n + 1)).astype(np.int32)
    lp.a_matrix_.index_ = cols.astype(np.int32)
    lp.a_matrix_.value_ = vals
    h.passModel(lp)
    return h, lp


def solve_model(h, highspy, lp, x0, constant: float, time_limit: float, stats: ILPStats, reference=None):
    """Run HiGHS (from the warm start x0 if given, or a better one found near `reference`,
    a point that may break rows: _run) and fill stats: status, objective (the returned
    solution's own value) and gap. Returns the solution, or None when the model is
    infeasible; TimeoutError when the time limit passed before any solution."""
    x, info, status = _run(h, highspy, lp, x0, time_limit, stats, reference)
    x0 = stats.start if stats.start is not None else x0
    obj_x = float(lp.col_cost_ @ x + constant) if x is not None else np.nan
    def lower(reported: float) -> bool:
        return reported < obj_x - 1e-9 * max(1.0, abs(obj_x))
    if x is not None and x0 is not None and lower(info.objective_function_value):
        # HiGHS 1.16 can report a lower objective than the solution it returns, which is
        # then the warm start's values as given. Sometimes the start's binaries with its
        # continuous values better chosen (the LP with the binaries fixed finds them);
        # sometimes another solution, which a solve from scratch finds again: worth it
        # when the solver had finished (at a time limit it only doubled the time, the
        # demo's asynchronous planning 19 s instead of 10).
        x = _best_continuous(highspy, lp, x)
        obj_x = float(lp.col_cost_ @ x + constant)
        left = time_limit - stats.solve_seconds  # (the call's limit bounds both runs)
        if lower(info.objective_function_value) and status == highspy.HighsModelStatus.kOptimal and left > 0.1:
            h.passModel(lp)
            h.setOptionValue("time_limit", float(left))
            y, info2, status2 = _run(h, highspy, lp, None, left, stats)
            if y is not None and float(lp.col_cost_ @ y + constant) < obj_x:
                x, info, status = y, info2, status2
                obj_x = float(lp.col_cost_ @ x + constant)
    stats.status = h.modelStatusToString(status)
    timed_out = status in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt)
    if x is None and timed_out and x0 is not None and _feasible(lp, x0):
        # the limit passed before the solver took the start (presolve can take that long):
        # the start is still the best plan found
        x, obj_x = np.asarray(x0, dtype=float), float(lp.col_cost_ @ x0 + constant)
        stats.status += " (warm start returned)"
    if x is None:
        if timed_out:
            raise SolverTimeout(f"the solver found no plan within {time_limit:.0f} s; raise the time limit")
        return None
    stats.objective = obj_x
    if np.isfinite(info.mip_dual_bound):
        stats.gap = max(0.0, (obj_x - info.mip_dual_bound) / max(abs(obj_x), 1e-12))
        stats.bound = min(obj_x, float(info.mip_dual_bound))
    else:  # no bound: optimal if the solver finished, unknown (reported as 100 %) if it timed out
        stats.gap = 1.0 if timed_out else 0.0
        stats.bound = float("nan") if timed_out else obj_x
    return x


def _best_continuous(highspy, lp, x: np.ndarray) -> np.ndarray:
    """x with its continuous columns re-optimized for its integer columns (an LP), or x
    itself if that LP fails."""
    ints = np.asarray([int(v) != 0 for v in lp.integrality_], dtype=bool)
    fixed = highspy.HighsLp()
    fixed.num_col_, fixed.num_row_ = lp.num_col_, lp.num_row_
    fixed.col_cost_, fixed.offset_ = lp.col_cost_, lp.offset_
    lo, hi = np.array(lp.col_lower_, dtype=float), np.array(lp.col_upper_, dtype=float)
    lo[ints] = hi[ints] = np.round(x[ints])
    fixed.col_lower_, fixed.col_upper_ = lo, hi
    fixed.row_lower_, fixed.row_upper_ = lp.row_lower_, lp.row_upper_
    fixed.a_matrix_ = lp.a_matrix_
    h = _quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("primal_feasibility_tolerance", FEASIBILITY_TOL)
    h.passModel(fixed)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return x
    y = np.asarray(h.getSolution().col_value, dtype=float)
    y[ints] = np.round(x[ints])
    return y if float(lp.col_cost_ @ y) < float(lp.col_cost_ @ x) else x


def _feasible(lp, x: np.ndarray, tol: float = 1e-6) -> bool:
    """Does x satisfy the bounds and rows of lp (row-wise arrays) and integrality?"""
    return feasible(model_arrays(lp), x, tol)


def _run(h, highspy, lp, x0, time_limit, stats, reference=None):
    """Solve (from x0 if given); return (solution or None, info, model status).

    With a reference point (which may break rows), a share REFERENCE_SHARE of the time limit
    first searches its neighbourhood (highs_worker.improve_start), and the solver starts
    from what it finds if cheaper than x0 (stats.start: the start used).

    The solution is the best, by our own costs, of getSolution() and every improving
    solution the solver reported while it ran (its callback): at a time limit HiGHS 1.16
    can report a better objective while getSolution() still returns the start's values.
    Models of ISOLATE_MIN_INTEGERS integer columns or more run in a worker process that is
    killed at the time limit, which HiGHS alone can overrun several times (highs_worker)."""
    t = time.perf_counter()
    n_int = sum(1 for v in lp.integrality_ if int(v) != 0)
    if n_int >= ISOLATE_MIN_INTEGERS and math.isfinite(time_limit):
        try:
            return run_isolated(highspy, request(h, lp, x0, REFERENCE_SHARE if reference is not None else RINS_SHARE,
                                                 reference), time_limit + isolate_grace(time_limit),
                                verbose=bool(h.getOptionValue("output_flag")[1]))
        finally:
            stats.solve_seconds += time.perf_counter() - t
    if reference is not None:
        req = request(h, lp, x0, reference=reference)
        req["options"]["mip_allow_restart"] = False  # (in this process: as highs_model's)
        x0 = improve_start(highspy, req, REFERENCE_SHARE * time_limit)
        stats.start = x0
        h.setOptionValue("time_limit", max(0.1, time_limit - (time.perf_counter() - t)))
    if x0 is not None:
        set_start(highspy, h, x0)
    best: list = [np.inf, None]

    def improving(e) -> None:
        d = e.data_out
        if d.objective_function_value < best[0]:
            best[0], best[1] = d.objective_function_value, np.array(d.mip_solution, dtype=float)
    h.cbMipImprovingSolution.subscribe(improving)
    try:
        h.run()
    finally:
        stats.solve_seconds += time.perf_counter() - t
        h.cbMipImprovingSolution.unsubscribe(improving)
    status = h.getModelStatus()
    info = h.getInfo()
    feasible = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if status == highspy.HighsModelStatus.kInfeasible or not feasible:
        return None, info, status
    x = np.asarray(h.getSolution().col_value)
    if best[1] is not None and len(best[1]) == len(x):
        if cheaper(lp.col_cost_, best[1], x):
            x = best[1]
    return x, info, status


def isolate_grace(time_limit: float) -> float:
    """Seconds a worker process has past the time limit: its start-up (Python, numpy,
    highspy, the model passed: ~1 s for densenet264's) and HiGHS's own stop."""
    return 2.0 + 0.1 * time_limit


def _quiet_highs(highspy):
    """A Highs object, without the banner it prints on stdout when created."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


def _on(x: np.ndarray, col: int) -> bool:
    return col >= 0 and x[col] > 0.5


def _decode(graph, cost, budget, formulation, x, segs, seg_vars, start_slow) -> Plan:
    """Turn the solution into actions on the plan timeline (no solver needed here)."""
    per_tensor: dict[int, tuple[str, list[Action]]] = {}
    for ts in segs:
        initial = "slow" if _on(x, start_slow.get(ts.tensor, -1)) else "fast"
        actions: list[Action] = []
        for seg in ts.segments:
            sv = seg_vars[(ts.tensor, seg.index)]
            if seg.kind == "initial":
                if initial == "slow":
                    actions.append(_prefetch(sv, x, seg.end + 1))
                continue
            if _on(x, sv.wA):
                if seg.end >= seg.start:  # an empty final segment is the executor's carry write
                    async_c = [c for c, col in sv.wX.items() if _on(x, col)]
                    later = [e for e, col in sv.wL.items() if _on(x, col)]
                    actions.append(Action("evict", async_c[0], "async") if async_c
                                   else Action("evict", later[0] if later else seg.start, "sync"))
            elif _on(x, sv.dA):
                if seg.end >= seg.start:
                    actions.append(Action("drop", seg.start, "sync"))
            else:
                continue
            if seg.kind == "gap":
                actions.append(_prefetch(sv, x, seg.end + 1))
        per_tensor[ts.tensor] = (initial, sorted(actions, key=lambda a: a.at))
    tensors = tuple(TensorPlan(t.id, per_tensor[t.id][0], tuple(per_tensor[t.id][1])) if t.id in per_tensor
                    else TensorPlan(t.id, "fast", ()) for t in graph.tensors)
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=cost.memory_system,
                access="staged", budget_bytes=int(budget), planner=formulation, tensors=tensors, meta={})


def _prefetch(sv: _SegVars, x, use: int) -> Action:
    async_c = [c for c, col in sv.pX.items() if _on(x, col)]
    earlier = [p for p, col in sv.pE.items() if _on(x, col)]
    return (Action("prefetch", async_c[0], "async") if async_c
            else Action("prefetch", earlier[0] if earlier else use, "sync"))


def _overlap_greedily(x0: np.ndarray, lp, seg_vars, cap_iv, slack: np.ndarray, yz, T: np.ndarray, async_terms,
                      shares, share_max: float, fill, wakes: _Wakes) -> np.ndarray:
    """A better start for the asynchronous model: the start's sync moves made asynchronous,
    one at a time, wherever that keeps every row and lowers the objective (a greedy primal
    heuristic). From a synchronous start alone HiGHS found no asynchronous plan on large
    tight models within its time (densenet264 cpu 8:1: the start returned, gap 29 %).

    Per move, most expensive first, over its candidate kernels c (longest first):
      capacity: the bytes the async column adds at its kernels fit in `slack` there (per
                kernel, KiB as the capacity rows count: rhs less what x0 holds);
      order:    an async evict of the segment comes before its async prefetch;
      gain:     cost[col] - cost[sync] + (y_c after - y_c before) + (W u after - before) < 0,
                with y_c (and z_c) recomputed by set_async_overlap and the u of the two
                copies' wake kernels by _Wakes.set.
    Returns x0 itself when nothing improves or the result fails a row (never expected)."""
    y, z = yz
    cost = np.asarray(lp.col_cost_)
    span = {int(col): (int(j0), int(j1), coef / SCALE) for j0, j1, col, coef in cap_iv}
    x, slack = x0.copy(), slack.copy()
    todo = []
    for sv in seg_vars.values():
        if sv.pS >= 0 and x[sv.pS] > 0.5 and sv.pX:
            todo.append((cost[sv.pS], sv.pS, sv.pX, sv, "prefetch"))
        if sv.wS >= 0 and x[sv.wS] > 0.5 and sv.wX:
            todo.append((cost[sv.wS], sv.wS, sv.wX, sv, "evict"))
    todo.sort(key=lambda m: -m[0])

    def local(c: int, woken) -> float:  # the objective's terms at kernel c: y_c and z_c; u at `woken`
        return (cost[y[c]] * x[y[c]] + (cost[z[c]] * x[z[c]] if z[c] is not None else 0.0)
                + sum(cost[wakes.u[b]] * x[wakes.u[b]] for b in woken))
    changed = False
    for _, sync_col, options, sv, kind in todo:
        for c in sorted(options, key=lambda c: -T[c]):
            col = options[c]
            j0, j1, add = span[col]
            if np.any(slack[j0:j1 + 1] < add):
                continue
            # an async evict before an async prefetch of the same stay
            if kind == "prefetch" and any(x[w] > 0.5 and ce >= c for ce, w in sv.evicts_at()):
                continue
            if kind == "evict" and any(x[p] > 0.5 and cp <= c for cp, p in sv.prefetches_at()):
                continue
            woken = {wakes.at[k] for k in (sync_col, col) if k in wakes.at}
            before = local(c, woken)
            x[sync_col], x[col] = 0.0, 1.0
            set_async_overlap(x, y[c], z[c], async_terms[c], T[c], shares[c], share_max)
            wakes.set(x, woken)
            after = local(c, woken)
            if cost[col] - cost[sync_col] + after - before < -1e-12:
                slack[j0:j1 + 1] -= add
                changed = True
                break
            x[sync_col], x[col] = 1.0, 0.0
            set_async_overlap(x, y[c], z[c], async_terms[c], T[c], shares[c], share_max)
            wakes.set(x, woken)
    if not changed:
        return x0
    x = fill(x)
    return x if _feasible(lp, x) and cost @ x < cost @ x0 else x0


def _warm_start_vector(plan: Plan, n: int, seg_vars, start_slow, yz, T, async_terms, shares, share_max,
                       pairs: dict[int, int] | None = None):
    """A full assignment of the ILP's variables that reproduces `plan`, or None if the plan
    uses moves the formulation cannot express (then HiGHS starts cold).

    A baseline may evict an updated weight after its last use although the weight started
    the iteration fast (the executor then reads it back at the end, for the next one).
    The model has that as its steady state: the weight starts slow, prefetched before its
    first use (the same one read), and its later evicts are drops (its slow copy exists).
    The other way round, a weight that starts slow and whose update stays fast is written
    at the end (the executor's carry write): in the model, at its final segment's start.
    Likewise an input that starts fast and is evicted before its first use (lru makes room
    early) starts slow in the model (which then does not charge that write). Without these,
    the baselines' plans break steady-state rows and the asynchronous chain started from
    them finds no plan in time (benchmarks/HISTORY.md, "Notes moved from the code")."""
    pairs = pairs or {}
    x = np.zeros(n)
    by_id = {tp.id: tp for tp in plan.tensors}
    made_slow = set()  # inputs that start slow in the model, not in `plan`
    for (tid, _), sv in seg_vars.items():
        src = pairs.get(tid)
        if sv.seg.kind == "initial" and tid in start_slow and tid in by_id and by_id[tid].initial == "fast" \
                and any(a.kind in ("evict", "drop") and a.at <= sv.seg.end for a in by_id[tid].actions):
            made_slow.add(tid)  # evicted before its first use: the model's slow start
        if sv.seg.kind == "final" and src in start_slow and src in by_id and by_id[src].initial == "fast" \
                and tid in by_id and any(a.kind in ("evict", "drop") and a.at >= sv.seg.start for a in by_id[tid].actions):
            made_slow.add(src)
    for (tid, idx), sv in seg_vars.items():
        tp = by_id.get(tid)
        if tp is None:
            return None
        seg = sv.seg
        acts = [a for a in tp.actions if seg.start <= a.at <= seg.end + 1]
        if seg.kind == "initial":
            if tp.initial == "slow" or tid in made_slow:
                x[start_slow[tid]] = 1
                pf = [a for a in acts if a.kind == "prefetch"]
                if not pf:
                    if tid not in made_slow:
                        return None
                    x[sv.pS] = 1
                    continue
                col = sv.pX.get(pf[0].at) if pf[0].mode == "async" else sv.pE.get(pf[0].at, sv.pS)
                if col is None or col < 0:
                    return None
                x[col] = 1
            continue
        ev = [a for a in acts if a.kind in ("evict", "drop") and a.at <= seg.end]
        if not ev:
            src = pairs.get(tid)
            if seg.kind == "final" and src in start_slow and (by_id[src].initial == "slow" or src in made_slow):
                # the weight starts slow and its update is not evicted: the executor's carry
                # write at the end, which the model has at the final segment's start (a
                # drop where the update was written out before: one write per tensor)
                if any(seg_vars[(tid, i)].wA >= 0 and x[seg_vars[(tid, i)].wA] > 0.5 for i in range(idx)):
                    x[sv.dA] = 1
                else:
                    x[sv.wA] = x[sv.wS] = 1
            continue
        a = ev[0]
        # a sync evict or drop anywhere in the segment costs the same at its start (but for
        # its wake), where it also frees the memory soonest (lru evicts lazily): use the start
        # unless the model offers the start's own place (wL)
        if a.kind == "evict" and tid not in made_slow:
            x[sv.wA] = 1
            col = sv.wX.get(a.at) if a.mode == "async" else sv.wL.get(a.at, sv.wS)
            if col is None:
                return None
            x[col] = 1
        elif a.kind == "evict":  # made slow: a drop
            x[sv.dA] = 1
        else:
            if a.mode != "sync":
                return None
            x[sv.dA] = 1
        if seg.kind == "gap":
            pf = [b for b in acts if b.kind == "prefetch" and b.at > a.at]
            if not pf:
                return None
            col = sv.pX.get(pf[0].at) if pf[0].mode == "async" else sv.pE.get(pf[0].at, sv.pS)
            if col is None:
                return None
            x[col] = 1
    y, z = yz
    for c, col in y.items():
        set_async_overlap(x, col, z[c], async_terms[c], T[c], shares[c], share_max)
    return x
