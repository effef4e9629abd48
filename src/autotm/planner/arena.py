"""A static layout of fast memory: every fast residency of a plan at a fixed byte offset.

The ILP bounds the *sum* of the bytes resident at each step; an allocator can still
fragment, so the memory the runtime really holds can be larger than the budget (the
original AutoTM measured nGraph's pool and re-solved with a lower limit, its "defrag"
step). Here the layout is decided offline instead: each interval of fast residency the
validator reports (`ValidationReport.fast_blocks`; a tensor evicted and prefetched again
has one block per stay) gets an offset in one arena, by the greedy-by-size best-fit
heuristic of offline dynamic storage allocation (as in TensorFlow Lite's and MXNet's
memory planners):

  take the blocks largest first (then the longest-lived, then the earliest); place each
  in the smallest gap, between the already placed blocks that overlap it in time, that
  holds it; if none does, on top of them. Sizes are rounded up to `alignment` bytes.

A second pass takes equal sizes earliest first and the lowest gap that fits (first fit);
the smaller arena of the two is kept (each wins on some plans by a few per cent).

The arena is never smaller than the peak of fast bytes; the difference is fragmentation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..graph import TrainingGraph
from ..plan import Plan
from ..validate import FastBlock, validate

ALIGNMENT = 64


@dataclass(frozen=True)
class Layout:
    offsets: tuple[int, ...]  # per block, in the order given
    arena_bytes: int
    peak_bytes: int  # the most (aligned) bytes resident at one step: a lower bound on the arena


def assign_offsets(blocks: list[FastBlock] | tuple[FastBlock, ...], alignment: int = ALIGNMENT) -> Layout:
    """Offsets for `blocks` (greedy by size; the better of best fit and first fit); deterministic."""
    n = len(blocks)
    if n == 0:
        return Layout((), 0, 0)
    size = np.array([-(-b.nbytes // alignment) * alignment for b in blocks], dtype=np.int64)
    start = np.array([b.start for b in blocks], dtype=np.int64)
    end = np.array([b.end for b in blocks], dtype=np.int64)
    idx = np.arange(n)
    best = None
    for order, best_fit in ((np.lexsort((idx, start, -(end - start), -size)), True),
                            (np.lexsort((idx, -(end - start), start, -size)), False)):
        offsets = _place(order, start, end, size, best_fit)
        arena = int((offsets + size).max())
        if best is None or arena < best[1]:
            best = (offsets, arena)
    return Layout(tuple(int(o) for o in best[0]), best[1], _peak(start, end, size))


def _place(order: np.ndarray, start: np.ndarray, end: np.ndarray, size: np.ndarray, best_fit: bool) -> np.ndarray:
    """Offsets of the blocks placed one by one in `order` (module doc)."""
    n = len(order)
    # placed blocks, in placement order, as arrays for vectorized overlap tests
    p_start = np.empty(n, dtype=np.int64)
    p_end = np.empty(n, dtype=np.int64)
    p_off = np.empty(n, dtype=np.int64)
    p_top = np.empty(n, dtype=np.int64)
    offsets = np.zeros(n, dtype=np.int64)
    for m, i in enumerate(order):
        s, e, sz = start[i], end[i], size[i]
        hit = (p_start[:m] <= e) & (p_end[:m] >= s)
        best, best_gap = None, None
        if hit.any():
            offs, tops = p_off[:m][hit], p_top[:m][hit]
            o = np.argsort(offs, kind="stable")
            offs, tops = offs[o], tops[o]
            reach = np.maximum.accumulate(tops)  # highest address used below each block
            gap_lo = np.concatenate(([0], reach[:-1]))
            gaps = offs - gap_lo
            fit = np.flatnonzero(gaps >= sz)
            if len(fit):
                j = fit[np.argmin(gaps[fit])] if best_fit else fit[0]  # the smallest gap, or the lowest
                best = int(gap_lo[j])
            else:
                best = int(reach[-1])
        else:
            best = 0
        offsets[i] = best
        p_start[m], p_end[m], p_off[m], p_top[m] = s, e, best, best + sz
    return offsets


def _peak(start: np.ndarray, end: np.ndarray, size: np.ndarray) -> int:
    steps = int(end.max()) + 2
    delta = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, end + 1, -size)
    return int(np.cumsum(delta).max())


def with_arena(plan: Plan, graph: TrainingGraph, alignment: int = ALIGNMENT) -> Plan:
    """`plan` with an arena layout: offsets for every fast residency and the arena size.

    plan.meta gains arena_bytes, peak_fast_bytes (of the blocks, unaligned) and
    fragmentation = arena_bytes / peak_fast_bytes - 1.
    """
    bare = dataclasses.replace(plan, arena_bytes=None,
                               tensors=tuple(dataclasses.replace(tp, offsets=()) for tp in plan.tensors))
    blocks = validate(bare, graph).fast_blocks
    layout = assign_offsets(blocks, alignment)
    per_tensor: dict[int, list[int]] = {}
    for b, off in zip(blocks, layout.offsets):  # blocks come by tensor, then time
        per_tensor.setdefault(b.tensor, []).append(off)
    tensors = tuple(dataclasses.replace(tp, offsets=tuple(per_tensor.get(tp.id, ()))) for tp in bare.tensors)
    peak = _peak(np.array([b.start for b in blocks]), np.array([b.end for b in blocks]),
                 np.array([b.nbytes for b in blocks])) if blocks else 0
    meta = dict(plan.meta, arena_bytes=layout.arena_bytes,
                fragmentation=(layout.arena_bytes / peak - 1.0) if peak else 0.0)
    return dataclasses.replace(bare, tensors=tensors, arena_bytes=layout.arena_bytes, meta=meta)
