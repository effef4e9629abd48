"""The ILPs' scaffolding: columns (Vars), rows as sparse blocks per constraint family
(Block, Rows), the staged formulation's per-segment columns (SegVars), and the choices of
where a copy may go (async candidates, cheap wakes) that the formulations share.

Bytes are scaled to KiB inside the models only (SCALE).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..ir.graph import Role, TrainingGraph
from ..ir.plan import Plan
from ..ir.plan_meta import FamilyStats
from .segments import Segment

# Capacity in KiB, as a running sum along the kernels (families.capacity): the solver's
# feasibility tolerance (FEASIBILITY_TOL, per row) adds up along the chain and stays far
# under a byte, so integer byte counts that pass the solver pass the validator's exact check.
SCALE = float(2**10)
MARGIN_BYTES = 0.0
FEASIBILITY_TOL = 1e-9  # HiGHS's primal and MIP feasibility tolerances (families.capacity)

RowKey = tuple[int, int, int, int]  # (phase, tensor or kernel, segment, slot): Rows.coo

# tensors that stay in fast memory under direct access (the batch, the loss, scalars, constants)
FIXED_FAST = (Role.INPUT, Role.SCALAR, Role.CONSTANT, Role.OUTPUT)


def movable(graph: TrainingGraph, pinned: frozenset[int] = frozenset()) -> list[int]:
    """The tensors a direct-access plan may place in slow memory."""
    return [t.id for t in graph.tensors if t.role not in FIXED_FAST and t.id not in pinned and t.nbytes > 0]


class Vars:
    """Column bookkeeping: families of variables with bounds, costs, integrality."""

    def __init__(self) -> None:
        self.n = 0
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.cost: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.extra_cost: dict[int, float] = {}  # added to a column's cost after it was made

    def add(self, count: int, *, cost: float | np.ndarray = 0.0, lower: float | np.ndarray = 0.0,
            upper: float | np.ndarray = 1.0, integer: bool = True) -> np.ndarray:
        idx = np.arange(self.n, self.n + count)
        self.n += count
        self.lower.append(np.broadcast_to(np.asarray(lower, float), (count,)).copy())
        self.upper.append(np.broadcast_to(np.asarray(upper, float), (count,)).copy())
        self.cost.append(np.broadcast_to(np.asarray(cost, float), (count,)).copy())
        self.integer.append(np.full(count, 1 if integer else 0, dtype=np.int8))
        return idx

    def one(self, cost: float = 0.0, *, lower: float = 0.0, upper: float = 1.0, integer: bool = True) -> int:
        """One column; its index."""
        return int(self.add(1, cost=cost, lower=lower, upper=upper, integer=integer)[0])

    def add_cost(self, col: int, delta: float) -> None:
        self.extra_cost[col] = self.extra_cost.get(col, 0.0) + delta

    def cost_vector(self) -> np.ndarray:
        c = np.concatenate(self.cost) if self.cost else np.zeros(0)
        for col, d in self.extra_cost.items():
            c[col] += d
        return c

    def binaries(self) -> int:
        return int(np.concatenate(self.integer).sum()) if self.integer else 0


@dataclass(frozen=True)
class Block:
    """The rows of one constraint family as COO triples: `rows` count from 0 within the
    block; lo <= A x <= hi per row. `keys` (one 4-tuple per row, or None): where each row
    goes in the model passed to the solver (Rows.coo)."""
    family: str
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    keys: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.lo)

    def dense(self, ncols: int) -> np.ndarray:
        """The block as a dense matrix (tests, small models)."""
        a = np.zeros((self.count, ncols))
        np.add.at(a, (self.rows, self.cols), self.vals)
        return a


class RowList:
    """Rows of one family gathered one at a time, then made a Block."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.keys: list[RowKey] = []

    def add(self, cols: Sequence[int], vals: Sequence[float], lo: float, hi: float, key: RowKey | None = None) -> None:
        assert not self.lo or (key is None) == (not self.keys), "keys for every row or for none"
        if key is not None:
            self.keys.append(key)
        self.r.extend([len(self.lo)] * len(cols))
        self.c.extend(int(c) for c in cols)
        self.v.extend(float(v) for v in vals)
        self.lo.append(lo)
        self.hi.append(hi)

    def ones(self, cols: Sequence[int], lo: float, hi: float, minus: Sequence[int] = (),
             key: RowKey | None = None) -> None:
        """sum cols - sum minus in [lo, hi]."""
        self.add(list(cols) + list(minus), [1.0] * len(cols) + [-1.0] * len(minus), lo, hi, key)

    def block(self) -> Block:
        return Block(self.family, np.asarray(self.r, dtype=np.int64), np.asarray(self.c, dtype=np.int64),
                     np.asarray(self.v, dtype=float), np.asarray(self.lo, dtype=float),
                     np.asarray(self.hi, dtype=float),
                     np.asarray(self.keys, dtype=np.int64).reshape(-1, 4) if self.keys else None)


def concat(family: str, blocks: Iterable[Block]) -> Block:
    """Blocks one after the other, as one."""
    rows, cols, vals, lo, hi = [], [], [], [], []
    n = 0
    for b in blocks:
        rows.append(b.rows + n)
        cols.append(b.cols)
        vals.append(b.vals)
        lo.append(b.lo)
        hi.append(b.hi)
        n += b.count
    if not lo:
        return RowList(family).block()
    return Block(family, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), np.concatenate(lo),
                 np.concatenate(hi))


class Rows:
    """The model's rows: family blocks in the order added, with each family's rows,
    nonzeros and the seconds its function took (SolverStats.families)."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.n = 0
        self._stats: dict[str, list[float]] = {}

    def add(self, block: Block, seconds: float = 0.0) -> Block:
        self.blocks.append(block)
        self.n += block.count
        s = self._stats.setdefault(block.family, [0, 0, 0.0])
        s[0] += block.count
        s[1] += len(block.vals)
        s[2] += seconds
        return block

    def timed(self, make: Callable[[], Block]) -> Block:
        """Add the block `make` returns, timed."""
        t = time.perf_counter()
        b = make()
        return self.add(b, time.perf_counter() - t)

    def families(self) -> tuple[FamilyStats, ...]:
        return tuple(FamilyStats(name, int(r), int(nz), float(s)) for name, (r, nz, s) in self._stats.items())

    def coo(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, vals, lo, hi) of every block, rows numbered across blocks: first the
        rows with keys, in key order (ties in the order added), then the others in the
        order added. The keys give the rows the order the formulations always had (tensor
        by tensor, segment by segment): the solver's path, and so the plan it returns at a
        gap or a time limit, depends on it."""
        b = concat("all", self.blocks)
        keyed = np.concatenate([np.full(x.count, x.keys is not None) for x in self.blocks]) if self.blocks \
            else np.zeros(0, dtype=bool)
        keys = np.concatenate([x.keys for x in self.blocks if x.keys is not None]) if keyed.any() \
            else np.zeros((0, 4), dtype=np.int64)
        pos = np.flatnonzero(keyed)
        order = np.concatenate([pos[np.lexsort((pos, keys[:, 3], keys[:, 2], keys[:, 1], keys[:, 0]))],
                                np.flatnonzero(~keyed)])
        new = np.empty(len(order), dtype=np.int64)
        new[order] = np.arange(len(order))
        return new[b.rows], b.cols, b.vals, b.lo[order], b.hi[order]


@dataclass
class SegVars:
    """The staged model's columns for one segment of one tensor (staged.py's notation);
    -1 where absent. SLOTS: where a family's row of the segment goes among the segment's
    rows (row_key)."""
    seg: Segment
    nbytes: int
    wA: int = -1
    dA: int = -1
    wS: int = -1
    pS: int = -1
    wX: dict[int, int] = field(default_factory=dict)  # kernel -> column
    pX: dict[int, int] = field(default_factory=dict)
    wL: dict[int, int] = field(default_factory=dict)  # kernel -> column: a later sync write (before that kernel)
    pE: dict[int, int] = field(default_factory=dict)  # kernel -> column: an earlier sync prefetch

    SLOTS: ClassVar[dict[str, int]] = {"drop needs a slow copy": 0, "evict choice": 1, "prefetch choice": 2,
                                       "steady state": 2, "evict before prefetch": 3, "born slow": 4, "one write": 9}

    @property
    def empty(self) -> bool:
        return self.seg.end < self.seg.start

    def row_key(self, family: str) -> RowKey:
        return (0, self.seg.tensor, self.seg.index, self.SLOTS[family])

    def evicts_at(self) -> list[tuple[int, int]]:
        """(kernel of the action, column) of the evicts that can meet a prefetch of the
        same stay: wX (async over c) and wL (sync before e); wS, at the start, meets none."""
        return list(self.wX.items()) + list(self.wL.items())

    def prefetches_at(self) -> list[tuple[int, int]]:
        """(first kernel the tensor is back, column) of the prefetches: pX and pE."""
        return list(self.pX.items()) + list(self.pE.items())


@dataclass
class StagedLayout:
    """The staged model's move columns: per (tensor, segment index) its SegVars (tensor by
    tensor, segments in order), per carried input its st column, and per updated carried
    tensor the input whose tier it must end in; per output that may be born slow its
    producer and the bytes that holds of it (its st column is then the birth in slow memory)."""
    seg_vars: dict[tuple[int, int], SegVars]
    start_slow: dict[int, int]
    carried_output_of: dict[int, int]  # tensor -> the input whose tier it ends in
    born: dict[int, tuple[int, int]] = field(default_factory=dict)  # tensor -> (producer, bytes held there)


def async_candidates(kernels: Sequence[int], T: np.ndarray, copy_seconds: float, limit: int) -> list[int]:
    """Kernels of a window worth overlapping a copy with: the `limit` longest ones, and only
    those at least a quarter as long as the copy (a copy over a shorter kernel mostly adds
    its own time, which a sync move costs too). Fewer candidates, much faster solves."""
    ks = list(kernels)
    if not ks:
        return []
    ks.sort(key=lambda c: -T[c])
    good = [c for c in ks[:limit] if T[c] >= 0.25 * copy_seconds]
    return sorted(good or ks[:1])


def add_async_copies(V: Vars, kernels: Sequence[int], T: np.ndarray, copy_seconds: float, host_seconds: float,
                     limit: int) -> dict[int, int]:
    """One column per async candidate kernel in `kernels` (async_candidates), costing the
    issuing thread's own `host_seconds`: kernel -> column."""
    return {c: V.one(host_seconds) for c in async_candidates(kernels, T, copy_seconds, limit)}


def cheap_wakes(kernels: range, W: np.ndarray, natural: int, limit: int, window: int,
                keep: Iterable[int] = ()) -> list[int]:
    """Places in `kernels` for a sync copy other than its natural kernel: of those within
    `window` of it (further, the tensor holds fast memory longer), the `limit` that wake
    cheapest, only if cheaper than `natural` (nearest first on ties); and the kernels in
    `keep` (the warm start's places)."""
    cheaper = [k for k in kernels if abs(k - natural) < window and W[k] < W[natural]]
    cheaper.sort(key=lambda k: (W[k], abs(k - natural)))
    return sorted(set(cheaper[:limit]) | {k for k in keep if k in kernels})


def sync_positions(plan: Plan | None) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """tensor -> kernels of its sync evicts, and of its sync prefetches, in `plan`."""
    evicts: dict[int, set[int]] = {}
    prefetches: dict[int, set[int]] = {}
    for tp in plan.tensors if plan is not None else ():
        for a in tp.actions:
            if a.mode == "sync" and a.kind in ("evict", "prefetch"):
                (evicts if a.kind == "evict" else prefetches).setdefault(tp.id, set()).add(a.at)
    return evicts, prefetches


@dataclass
class DirectGap:
    """The direct model's columns for one gap of one tensor (direct.py's notation): its
    interior lo..hi (hi < lo: empty), its state columns before and after, its moves."""
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
    wX: dict[int, int] = field(default_factory=dict)  # kernel -> column
    pX: dict[int, int] = field(default_factory=dict)
    wL: dict[int, int] = field(default_factory=dict)  # (none under direct access: families.Moves)
    pE: dict[int, int] = field(default_factory=dict)
    tensor: int = -1
    index: int = -1  # position among the tensor's gaps
    SLOTS: ClassVar[dict[str, int]] = {"evict choice": 0, "leave from fast": 1, "drop needs a slow copy": 2, "flow": 3,
                                       "same kernel": 4, "evict before prefetch": 5, "one write": 9}

    @property
    def empty(self) -> bool:
        return self.hi < self.lo

    def row_key(self, family: str) -> RowKey:
        return (0, self.tensor, self.index, self.SLOTS[family])

    def evicts_at(self) -> list[tuple[int, int]]:
        return list(self.wX.items())

    def prefetches_at(self) -> list[tuple[int, int]]:
        return list(self.pX.items())


@dataclass
class DirectTensor:
    """The direct model's columns for one tensor: its slow state per use, st (graph
    inputs), z (one tier for life: the column that says slow, else -1), its gaps."""
    tid: int
    uses: list[int]
    slow: list[int]  # column per use
    start: int = -1  # st column (graph inputs)
    z: int = -1
    gaps: list[DirectGap] = field(default_factory=list)

    @property
    def first_copy(self) -> int:
        """The column that says t has a slow copy before its first move."""
        return self.start if self.start >= 0 else self.slow[0]
