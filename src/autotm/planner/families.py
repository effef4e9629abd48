"""The ILPs' constraint families, one function each, each returning its rows as a sparse
Block (model.py). Notation as in staged.py: a segment g of a tensor t of size s_t, its
move columns wA, dA, wS, wL, wX, pS, pE, pX (SegVars; the direct formulation's gaps have
the same, without wL and pE), st[t] the carried input's slow start.

The staged and direct formulations share evict choice, drop needs a copy, one write,
evict before prefetch, capacity and async overlap; prefetch choice, steady state and
wake are the staged model's (the direct model's flow rows, direct.py, play their part).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..ir.costmodel import CostModel
from .model import FEASIBILITY_TOL, SCALE, Block, RowKey, RowList, StagedLayout, Vars
from .segments import NO_PREFETCH, STARTS_SLOW

# (column, seconds of the whole copy, its marginal seconds beside others, interference share)
AsyncTerm = tuple[int, float, float, float]
# variable `col` adds `coef` bytes at kernels j0..j1 (capacity)
Interval = tuple[int, int, int, float]


class Moves(Protocol):
    """The move columns of one segment (staged SegVars, direct gaps)."""
    wA: int
    dA: int
    wS: int
    pS: int
    wX: dict[int, int]
    pX: dict[int, int]
    wL: dict[int, int]
    pE: dict[int, int]

    def evicts_at(self) -> list[tuple[int, int]]: ...

    def row_key(self, family: str) -> RowKey: ...

    def prefetches_at(self) -> list[tuple[int, int]]: ...


def evict_choice(segments: Iterable[Moves]) -> Block:
    """Evict choice, per segment g that t may be written out in:
        wS[g] + sum_e wL[g,e] + sum_c wX[g,c] - wA[g] = 0
    (a write is sync at the segment's start, sync later, or async over one kernel)."""
    r = RowList("evict choice")
    for g in segments:
        r.ones([g.wS, *g.wL.values(), *g.wX.values()], 0.0, 0.0, minus=[g.wA], key=g.row_key(r.family))
    return r.block()


def prefetch_choice(layout: StagedLayout) -> Block:
    """Prefetch choice, per segment g that ends in a use (not a final or tail segment):
        pS[g] + sum_p pE[g,p] + sum_c pX[g,c] - a[g] = 0,  a[g] = wA[g] + dA[g]   (gaps)
        pS[g] + sum_p pE[g,p] + sum_c pX[g,c] - st[t] = 0                         (initial)
    (t absent in g comes back once, before the use after g)."""
    r = RowList("prefetch choice")
    for (tid, _), sv in layout.seg_vars.items():
        if sv.seg.kind in NO_PREFETCH:
            continue
        absent = [layout.start_slow[tid]] if sv.seg.kind == "initial" else [sv.wA, sv.dA]
        r.ones([sv.pS, *sv.pE.values(), *sv.pX.values()], 0.0, 0.0, minus=absent, key=sv.row_key(r.family))
    return r.block()


def drop_needs_copy(tensors: Iterable[tuple[int, Sequence[Moves]]]) -> Block:
    """Drop needs a copy, per tensor (its first copy's column f, -1 if none, and its
    segments g that t may leave fast memory in, in order):
        dA[g] - f - sum_{g' < g} wA[g'] <= 0
    (a drop only releases a fast copy whose slow copy exists)."""
    r = RowList("drop needs a slow copy")
    for first, segs in tensors:
        prior: list[int] = [first] if first >= 0 else []
        for g in segs:
            r.ones([g.dA], -np.inf, 0.0, minus=prior, key=g.row_key(r.family))
            prior = prior + [g.wA]
    return r.block()


def one_write(tensors: Iterable[tuple[int, Sequence[Moves]]]) -> Block:
    """One write, per tensor (as drop_needs_copy's):  f + sum_g wA[g] <= 1
    (t is written to slow memory at most once; never if it starts there)."""
    r = RowList("one write")
    for first, segs in tensors:
        cols = [g.wA for g in segs] + ([first] if first >= 0 else [])
        if len(cols) > 1:
            r.ones(cols, -np.inf, 1.0, key=segs[-1].row_key(r.family))
    return r.block()


def born_slow(layout: StagedLayout) -> Block:
    """Born slow, per output t that its producer k may write to slow memory (st[t], its
    first segment g0 starting at k + 1; segments.py):
        st[t] - dA[g0] <= 0
    (born there, t is absent from g0 as a dropped tensor is: the prefetch ending g0, the
    steady state and the piece reads see it through dA; one write and drop needs a copy
    count st[t] as its slow copy. The capacity at k counts b_t bytes of it, not s_t.)"""
    r = RowList("born slow")
    for tid in layout.born:
        g0 = layout.seg_vars[(tid, 0)]
        r.ones([layout.start_slow[tid]], -np.inf, 0.0, minus=[g0.dA], key=g0.row_key(r.family))
    return r.block()


def steady_state(layout: StagedLayout) -> Block:
    """Steady state, per final segment g of an updated carried tensor t' that replaces t:
        wA[g] + dA[g] - st[t] = 0      (st[t] = 0 when t cannot start slow)
    (the iteration ends with t' where the next one starts t)."""
    r = RowList("steady state")
    for (tid, _), sv in layout.seg_vars.items():
        if sv.seg.kind != "final":
            continue
        src = layout.carried_output_of.get(tid)
        src_st = layout.start_slow.get(src, -1) if src is not None else -1
        r.ones([sv.wA, sv.dA], 0.0, 0.0, minus=[src_st] if src_st >= 0 else [], key=sv.row_key(r.family))
    return r.block()


def evict_before_prefetch(segments: Iterable[Moves]) -> Block:
    """Evict before prefetch, per gap g and each kernel j of a prefetch column that some
    evict column's kernel is at or after:
        sum_{E >= j} (wX, wL)[g,E] + sum_{F <= j} (pX, pE)[g,F] <= 1
    (the write's kernel E comes before the prefetch's F; a row at each prefetch kernel
    covers every pair)."""
    r = RowList("evict before prefetch")
    for g in segments:
        ev, pf = g.evicts_at(), g.prefetches_at()
        if not (ev and pf):
            continue
        last_e = max(E for E, _ in ev)
        for j in sorted({F for F, _ in pf if F <= last_e}):
            cols = [col for E, col in ev if E >= j] + [col for F, col in pf if F <= j]
            if len(cols) > 1:
                r.ones(cols, -np.inf, 1.0, key=g.row_key(r.family))
    return r.block()


def staged_intervals(layout: StagedLayout) -> list[Interval]:
    """The residency R[t,j] of staged.py as capacity intervals: each column's bytes
    (negative: absent) at the kernels it covers; live_bytes counts t everywhere else. An
    output born slow at k is absent there but for the piece k holds: -(s_t - b_t) st[t]."""
    iv: list[Interval] = []

    def add(j0: int, j1: int, col: int, coef: float) -> None:
        if j1 >= j0:
            iv.append((j0, j1, col, coef))
    for tid, (k, held) in layout.born.items():  # born slow: its producer holds `held` bytes of it
        add(k, k, layout.start_slow[tid], -(layout.seg_vars[(tid, 0)].nbytes - held))
    for (tid, _), sv in layout.seg_vars.items():
        s, lo, hi = sv.nbytes, sv.seg.start, sv.seg.end
        if sv.seg.kind in STARTS_SLOW:
            add(lo, hi, layout.start_slow[tid], -s)
        else:
            for e, col in sv.wL.items():
                add(lo, e - 1, col, s)
            for c, col in sv.wX.items():
                add(lo, c, col, s)
            if not sv.empty:
                add(lo, hi, sv.wA, -s)
                add(lo, hi, sv.dA, -s)
        for p, col in sv.pE.items():
            add(p, hi, col, s)
        for c, col in sv.pX.items():
            add(c, hi, col, s)
    return iv


def piece_reads(V: Vars, layout: StagedLayout, reads: dict[int, frozenset[int]],
                read_seconds: Callable[[int, int], float]) -> None:
    """Piece reads (no rows: costs), at each kernel k that runs in pieces (ir/split.py) and
    each input t of it that may be absent there, inside a segment g of t:
        + r(k, t) * (1 - R[t,k])
    with r(k, t) = m(s, to_fast, sync), or for a matmul's strided blocks one such read per
    stored row of each block (ir.split.piece_read_seconds),
    with R[t,k] as in staged_intervals (1 - R = a[g] - the copies that have t in fast
    memory at k; st[t] - ... in an initial segment): k reads t piece by piece from its
    slow copy where t is absent (simulate's R_k). No async copy of t overlaps k
    (staged_columns): the kernel cannot read a tensor in flight."""
    for (tid, _), sv in layout.seg_vars.items():
        lo, hi = sv.seg.start, sv.seg.end
        for k in (k for k, ts in reads.items() if lo <= k <= hi and tid in ts):
            r = read_seconds(k, tid)
            if sv.seg.kind in STARTS_SLOW:
                V.add_cost(layout.start_slow[tid], r)
            else:
                V.add_cost(sv.wA, r)
                V.add_cost(sv.dA, r)
                for c, col in sv.wX.items():
                    if c >= k:
                        V.add_cost(col, -r)
                for e, col in sv.wL.items():
                    if e > k:
                        V.add_cost(col, -r)
            for p, col in sv.pE.items():
                if p <= k:
                    V.add_cost(col, -r)
            for c, col in sv.pX.items():
                if c <= k:
                    V.add_cost(col, -r)


@dataclass
class Capacity:
    """The capacity family's result: its rows, the running-sum columns L (None without
    any interval) and fill(x), which sets them for a full assignment of the others."""
    block: Block
    load: np.ndarray | None
    fill: Callable[[np.ndarray], np.ndarray] = field(repr=False)


def capacity(V: Vars, intervals: list[Interval], rhs: np.ndarray, n: int) -> Capacity:
    """Capacity, at every kernel j:  sum_t s_t R[t,j] <= B - fixed bytes (rhs[j], KiB),
    in running-sum form: a continuous L[j] (the bytes the variables add at j), L[j] <= rhs[j]
    as its bound, and
        L[j] - L[j-1] - sum_{intervals starting at j} coef + sum_{ending at j-1} coef = 0,
    so an interval of a column is 2 nonzeros instead of one per kernel it covers (much
    sparser where many tensors live long), with the same relaxation. The rows' tolerances
    add up along the chain: L[j] is within (n + 1) * FEASIBILITY_TOL KiB of the true sum,
    well under half a byte, so whole bytes that pass L[j] <= rhs[j] + half a byte pass the
    validator's exact check. Adds the L columns."""
    if not intervals:
        return Capacity(RowList("capacity").block(), None, lambda x: x)
    iv = np.asarray(intervals, dtype=np.float64)
    j0, j1, col = iv[:, 0].astype(np.int64), iv[:, 1].astype(np.int64), iv[:, 2].astype(np.int64)
    coef = iv[:, 3] / SCALE
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
    block = Block("capacity", rows[keep], cols[keep], vals[keep], np.zeros(n), np.zeros(n))

    def fill(x: np.ndarray) -> np.ndarray:
        delta = np.zeros(n + 1)
        np.add.at(delta, j0, coef * x[col])
        np.add.at(delta, j1 + 1, -coef * x[col])
        x[L] = np.cumsum(delta)[:n]
        return x
    return Capacity(block, L, fill)


def staged_async_terms(layout: StagedLayout, cost: CostModel) -> dict[int, list[AsyncTerm]]:
    """kernel c -> the async copy columns over it (wX, pX) with their costs."""
    terms: dict[int, list[AsyncTerm]] = {}
    g_read, g_write = cost.interference_share("to_fast"), cost.interference_share("to_slow")
    for sv in layout.seg_vars.values():
        s = sv.nbytes
        for cols, d, g in ((sv.wX, "to_slow", g_write), (sv.pX, "to_fast", g_read)):
            if cols:
                full, marginal = cost.move_seconds(s, d, "async"), cost.async_marginal_seconds(s, d)
                for c, col in cols.items():
                    terms.setdefault(c, []).append((col, full, marginal, g))
    return terms


@dataclass
class Overlap:
    """Per kernel c with async copies: its y[c] column and its z[c] (None: no fixed cost)."""
    y: int
    z: int | None
    terms: list[AsyncTerm]


def async_overlap_at(V: Vars, r: RowList, terms: list[AsyncTerm], share_max: float, *, y_lower: float,
                     kernel_const: float, kernel_terms: Sequence[tuple[int, float]] = (),
                     kernel_row: bool = False, key: RowKey | None = None) -> Overlap:
    """Async overlap at one kernel c (adds y[c] >= 0 with cost 1, and z[c] if needed):
        y >= sum_m a_m x_m + z,   z >= (m_m - a_m) x_m  for each copy m with m_m > a_m
        y >= K + sum_m g_m a_m x_m + g* z        (only if some copy slows the kernel)
        y >= K                                   (kernel_row: direct access, K not constant)
    over the copies m at c (x_m its column, m_m its whole time, a_m its marginal,
    CostModel.async_marginal_seconds; g_m its interference share, g* = share_max): one
    copy's fixed cost shows, each other adds its marginal (the plain sum when copies do
    not overlap); the kernel computes slower while copies are in flight. K = kernel_const
    + sum coef x over kernel_terms (the operands' placement, direct access). `key`: the
    rows' place in the model (Rows.coo)."""
    y = V.one(1.0, lower=y_lower, upper=np.inf, integer=False)
    cols = [t for t, _, _, _ in terms] + [y]
    vals = [a for _, _, a, _ in terms] + [-1.0]
    extra = [(t, full - a) for t, full, a, _ in terms if full - a > 0.0]
    z = None
    if extra:
        z = V.one(0.0, lower=0.0, upper=np.inf, integer=False)
        cols.append(z)
        vals.append(1.0)
        for t, e in extra:
            r.add([t, z], [e, -1.0], -np.inf, 0.0, key)
    r.add(cols, vals, -np.inf, 0.0, key)
    if kernel_row:
        r.add([c for c, _ in kernel_terms] + [y], [v for _, v in kernel_terms] + [-1.0], -np.inf, -kernel_const, key)
    shares = [g for _, _, _, g in terms]
    if any(shares) or (z is not None and share_max):
        cols = [c for c, _ in kernel_terms] + [t for t, _, _, _ in terms] + [y]
        vals = [v for _, v in kernel_terms] + [g * a for _, _, a, g in terms] + [-1.0]
        if z is not None:
            cols.append(z)
            vals.append(share_max)
        r.add(cols, vals, -np.inf, -kernel_const, key)
    return Overlap(y, z, terms)


def async_overlap(V: Vars, terms: dict[int, list[AsyncTerm]], T: np.ndarray,
                  share_max: float) -> tuple[Block, dict[int, Overlap]]:
    """async_overlap_at for every kernel c with async copies, in kernel order, with
    y[c] >= T_c as its bound (staged access: the kernel's time is a constant)."""
    r = RowList("async overlap")
    at = {c: async_overlap_at(V, r, ts, share_max, y_lower=float(T[c]), kernel_const=float(T[c]))
          for c, ts in sorted(terms.items())}
    return r.block(), at


def staged_idle_links(layout: StagedLayout, cost: CostModel, T: np.ndarray, n: int) -> list[tuple[int, int]]:
    """(copy column x, kernel b) for every copy that leaves the compute thread idle right
    before kernel b: wS[g] (b = start(g), not for an empty final segment's carry write),
    pS[g] (b = the use after g), wL[g,e] (b = e), pE[g,p] (b = p), and wX[g,c], pX[g,c]
    whose async time exceeds T_c (b = c + 1)."""
    links: list[tuple[int, int]] = []

    def after(cols: dict[int, int], seconds: float) -> None:
        for c, col in cols.items():
            if seconds > T[c] and c + 1 < n:
                links.append((col, c + 1))
    for sv in layout.seg_vars.values():
        s, lo, hi = sv.nbytes, sv.seg.start, sv.seg.end
        r_async = cost.move_seconds(s, "to_fast", "async")
        if sv.seg.kind not in STARTS_SLOW:
            if not sv.empty:
                links.append((sv.wS, lo))
            links += [(col, e) for e, col in sv.wL.items()]
            after(sv.wX, cost.move_seconds(s, "to_slow", "async"))
        if sv.seg.kind not in NO_PREFETCH:
            links.append((sv.pS, hi + 1))
            links += [(col, p) for p, col in sv.pE.items()]
            after(sv.pX, r_async)
    return links


@dataclass
class Wakes:
    """The wake rows' bookkeeping: u[b] >= x for each copy column x in links[b]."""
    u: dict[int, int] = field(default_factory=dict)  # kernel b -> u column
    links: dict[int, list[int]] = field(default_factory=dict)  # kernel b -> copy columns
    at: dict[int, int] = field(default_factory=dict)  # copy column -> kernel b

    def set(self, x: np.ndarray, kernels: Iterable[int] | None = None) -> np.ndarray:
        """Warm starts: u[b] = max of its copy columns (at `kernels`, default all)."""
        for b in self.u if kernels is None else kernels:
            if b in self.u:
                x[self.u[b]] = max((x[c] for c in self.links[b]), default=0.0)
        return x


def wake(V: Vars, links: list[tuple[int, int]], W: np.ndarray) -> tuple[Block, Wakes]:
    """Wake, for each (x, b) in `links` with W_b > 0 (adds u[b] in [0, 1], cost W_b):
        x - u[b] <= 0
    (continuous u: the minimum makes it max_x x, which is 0 or 1: the thread sleeps before
    b, and the kernel pays its wake-up, once however many copies left it idle)."""
    wk = Wakes()
    links = [(col, b) for col, b in links if W[b] > 0.0]
    for col, b in links:
        wk.links.setdefault(b, []).append(col)
        wk.at[col] = b
    for b in sorted(wk.links):
        wk.u[b] = V.one(float(W[b]), integer=False)
    r = RowList("wake")
    for col, b in links:
        r.add([col, wk.u[b]], [1.0, -1.0], -np.inf, 0.0)
    return r.block(), wk
