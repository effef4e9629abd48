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

More passes place in the lowest gap that fits (first fit), in other orders: the same;
equal sizes earliest first; blocks sharing storage first (in-place updates, carried
state: the hardest to fit), then by size; and two by time alone (earliest first, then
the longest-lived or the largest), which pack like an allocator that never frees out of
order. The smallest arena of the six is kept: at the tight budgets of 8:1 the time
orders win by up to 14 % (densenet264 cpu: 316 MiB by size, 273 by time, for a peak of
214), at loose ones size does (by up to 2 %).

The arena is never smaller than the peak of fast bytes; the difference is fragmentation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.graph import TrainingGraph
from ..ir.layout import LARGE_BLOCK_BYTES, TEMPORARY_MIN_BYTES
from ..ir.plan import Plan
from ..checks.validate import FastBlock, validate

ALIGNMENT = 64


@dataclass(frozen=True)
class Layout:
    offsets: tuple[int, ...]  # per block, in the order given
    arena_bytes: int
    peak_bytes: int  # the most (aligned) bytes resident at one step: a lower bound on the arena


def assign_offsets(blocks: list[FastBlock] | tuple[FastBlock, ...], alignment: int = ALIGNMENT,
                   same: Sequence[tuple[int, int]] = (), large_alignment: int | None = None) -> Layout:
    """Offsets for `blocks` (greedy; the best of six passes, module doc); deterministic.

    `same`: pairs of block indices that must share an offset (one storage the runtime
    reuses: an in-place update's input and output, a carried state's value at the end of an
    iteration and at the start of the next). Such a group is placed as one block over the
    union of its members' intervals; members are never tested against each other.
    `large_alignment`: blocks of LARGE_BLOCK_BYTES or more get this alignment instead (a
    page, for direct-I/O reads into them).
    """
    n = len(blocks)
    if n == 0:
        return Layout((), 0, 0)
    align = np.array([large_alignment if large_alignment and b.nbytes >= LARGE_BLOCK_BYTES else alignment
                      for b in blocks], dtype=np.int64)
    size = np.array([-(-b.nbytes // a) * a for b, a in zip(blocks, align)], dtype=np.int64)
    start = np.array([b.start for b in blocks], dtype=np.int64)
    end = np.array([b.end for b in blocks], dtype=np.int64)
    group = _union(n, same)
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(int(group[i]), []).append(i)
    heads = np.array(sorted(members), dtype=np.int64)
    g_size = np.array([size[members[h]].max() for h in heads], dtype=np.int64)
    g_align = np.array([align[members[h]].max() for h in heads], dtype=np.int64)
    g_start = np.array([start[members[h]].min() for h in heads], dtype=np.int64)
    g_span = np.array([(end[members[h]] - start[members[h]] + 1).sum() for h in heads], dtype=np.int64)
    idx = np.arange(len(heads))
    best: tuple[np.ndarray, int] | None = None
    g_shared = np.array([len(members[h]) > 1 for h in heads], dtype=np.int64)
    by_span = np.lexsort((idx, g_start, -g_span, -g_size))
    passes = ((by_span, True), (by_span, False),
              (np.lexsort((idx, -g_span, g_start, -g_size)), False),
              (np.lexsort((idx, g_start, -g_span, -g_size, -g_shared)), False),
              (np.lexsort((idx, -g_span, g_start)), False),
              (np.lexsort((idx, -g_size, g_start)), False))
    for order, best_fit in passes:
        g_off = _place([members[heads[i]] for i in order], start, end, g_size[order], g_align[order], best_fit)
        arena = int((g_off + g_size[order]).max())
        if best is None or arena < best[1]:
            offsets = np.zeros(n, dtype=np.int64)
            for j, i in enumerate(order):
                offsets[members[heads[i]]] = g_off[j]
            best = (offsets, arena)
    assert best is not None  # (six passes)
    return Layout(tuple(int(o) for o in best[0]), best[1], _peak(start, end, size))


def _union(n: int, pairs: Iterable[tuple[int, int]]) -> np.ndarray:
    """Group of each of n items under the equivalences `pairs` (union-find; the smallest index heads)."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def _place(groups: list[list[int]], start: np.ndarray, end: np.ndarray, size: np.ndarray, align: np.ndarray,
           best_fit: bool) -> np.ndarray:
    """Offsets of the groups of blocks placed one by one in the order given (module doc);
    size[j] and align[j] are group j's."""
    m_total = len(start)
    # placed intervals, kept sorted by offset (ties in the order placed), for vectorized
    # overlap tests that need no sort: sorting the overlapping ones at each step took a
    # third of densenet264's layout time
    p_start = np.empty(m_total, dtype=np.int64)
    p_end = np.empty(m_total, dtype=np.int64)
    p_off = np.empty(m_total, dtype=np.int64)
    p_top = np.empty(m_total, dtype=np.int64)
    offsets = np.zeros(len(groups), dtype=np.int64)
    m = 0
    for j, blocks in enumerate(groups):
        sz, al = size[j], align[j]
        hit = np.zeros(m, dtype=bool)
        for i in blocks:
            hit |= (p_start[:m] <= end[i]) & (p_end[:m] >= start[i])
        if hit.any():
            offs, tops = p_off[:m][hit], p_top[:m][hit]
            reach = np.maximum.accumulate(tops)  # highest address used below each block
            gap_lo = -(-np.concatenate(([0], reach[:-1])) // al) * al
            gaps = offs - gap_lo
            fit = np.flatnonzero(gaps >= sz)
            if len(fit):
                g = fit[np.argmin(gaps[fit])] if best_fit else fit[0]  # the smallest gap, or the lowest
                best = int(gap_lo[g])
            else:
                best = int(-(-reach[-1] // al) * al)
        else:
            best = 0
        offsets[j] = best
        at = int(np.searchsorted(p_off[:m], best, side="right"))
        k = len(blocks)
        for arr in (p_start, p_end, p_off, p_top):
            arr[at + k:m + k] = arr[at:m].copy()
        for q, i in enumerate(blocks):
            p_start[at + q], p_end[at + q], p_off[at + q], p_top[at + q] = start[i], end[i], best, best + sz
        m += k
    return offsets


def _peak(start: np.ndarray, end: np.ndarray, size: np.ndarray) -> int:
    steps = int(end.max()) + 2
    delta = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, end + 1, -size)
    return int(np.cumsum(delta).max())


def with_arena(plan: Plan, graph: TrainingGraph, alignment: int = ALIGNMENT,
               large_alignment: int | None = None, workspace: np.ndarray | None = None) -> Plan:
    """`plan` with an arena layout: offsets for every fast residency and the arena size.

    `workspace[k]` (per kernel, optional): bytes kernel k allocates and frees while it
    runs; those of TEMPORARY_MIN_BYTES or more get a range of their own at step 2k + 1
    (not named in the plan: it keeps room in the arena where the runtime puts a kernel's
    large temporaries).
    plan.meta gains arena_bytes, peak_fast_bytes (of the blocks, unaligned) and
    fragmentation = arena_bytes / peak_fast_bytes - 1.
    """
    bare = dataclasses.replace(plan, arena_bytes=None,
                               tensors=tuple(dataclasses.replace(tp, offsets=()) for tp in plan.tensors))
    blocks = validate(bare, graph).fast_blocks
    scratch = [] if workspace is None else [
        FastBlock(-1 - k, 2 * k + 1, 2 * k + 1, int(w)) for k, w in enumerate(workspace) if w >= TEMPORARY_MIN_BYTES]
    layout = assign_offsets(tuple(blocks) + tuple(scratch), alignment, shared_storage(blocks, graph),
                            large_alignment)
    per_tensor: dict[int, list[int]] = {}
    for b, off in zip(blocks, layout.offsets):  # blocks come by tensor, then time (scratch after)
        per_tensor.setdefault(b.tensor, []).append(off)
    tensors = tuple(dataclasses.replace(tp, offsets=tuple(per_tensor.get(tp.id, ()))) for tp in bare.tensors)
    blocks = tuple(blocks) + tuple(scratch)
    peak = _peak(np.array([b.start for b in blocks]), np.array([b.end for b in blocks]),
                 np.array([b.nbytes for b in blocks])) if blocks else 0
    meta = dataclasses.replace(plan.meta, arena_bytes=layout.arena_bytes,
                               fragmentation=(layout.arena_bytes / peak - 1.0) if peak else 0.0)
    return dataclasses.replace(bare, tensors=tensors, arena_bytes=layout.arena_bytes, meta=meta)


def shared_storage(blocks: Sequence[FastBlock], graph: TrainingGraph) -> list[tuple[int, int]]:
    """Pairs of blocks the executor keeps in one storage, so one offset (assign_offsets):

    - a pointwise kernel that writes its output into an input dying there (replay.reuse_table:
      torch.optim's in-place updates): the input's block and the output's;
    - a carried state (weights, buffers, optimizer state) kept fast from one iteration to the
      next: its value's last block and its graph input's first block, when they do not
      overlap in time (else they cannot share bytes, and the executor copies the value).
    Graphs without a captured program (loaded from JSON) have none.
    """
    p = getattr(graph, "program", None)
    if p is None or not hasattr(p, "kernel_nodes"):
        return []
    from ..interpret.replay import reuse_table

    by_tensor: dict[int, list[int]] = {}
    for i, blk in enumerate(blocks):
        by_tensor.setdefault(blk.tensor, []).append(i)

    def at(tid: int, step: int) -> int | None:
        for i in by_tensor.get(tid, ()):
            if blocks[i].start <= step <= blocks[i].end:
                return i
        return None
    pairs: list[tuple[int, int]] = []
    try:
        table = reuse_table(graph)
    except Exception:  # a graph whose nodes lack the metadata: no reuse known
        table = []
    for k, entry in enumerate(table):
        if entry is not None:
            src, dst = at(entry.tensor, 2 * k + 1), at(p.kernel_outputs[k][0][0], 2 * k + 1)
            if src is not None and dst is not None:
                pairs.append((src, dst))
    group = _union(len(blocks), pairs)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group):
        members.setdefault(int(g), []).append(i)
    last = max((blk.end for blk in blocks), default=0)
    for key, tin in p.input_keys:
        tout = p.output_keys.get(key)
        if tout is None or tout == tin:
            continue
        a = at(tin, 0)
        ends = [i for i in by_tensor.get(tout, ()) if blocks[i].end == last]
        if a is None or not ends:
            continue
        b = ends[0]
        if group[a] == group[b]:
            continue
        if blocks[a].nbytes != blocks[b].nbytes:
            continue
        ha, hb = int(group[a]), int(group[b])
        if all(blocks[x].end < blocks[y].start or blocks[y].end < blocks[x].start
               for x in members[ha] for y in members[hb]):
            pairs.append((a, b))
            # merge the groups (the smaller head stays, as _union would give)
            keep, gone = min(ha, hb), max(ha, hb)
            for i in members[gone]:
                group[i] = keep
            members[keep] += members.pop(gone)
    return pairs
