"""Warm starts: a plan as a full assignment of a model's columns (so that HiGHS starts
from it), and a better start for the asynchronous staged model, its sync copies made
asynchronous where that keeps every row (overlap_greedily)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.plan import Action, Plan
from .families import Interval, Overlap, Wakes
from .highs_driver import is_feasible
from .model import SCALE, DirectGap, DirectTensor, SegVars
from .segments import STARTS_SLOW

# kernel k: (its operands, constant seconds, (column, seconds) terms, whether the columns are placements)
KernelTime = tuple[tuple[int, ...], float, list[tuple[int, float]], bool]


def set_async_overlap(x: np.ndarray, ov: Overlap, floor: float, share_max: float) -> None:
    """The y (at least `floor`, the kernel's time) and z values the async overlap rows
    (families.async_overlap_at) need for the move choices already in x."""
    terms = ov.terms
    extra = max([(full - a) * x[t] for t, full, a, _ in terms], default=0.0)
    if ov.z is not None:
        x[ov.z] = extra
    copies = sum(a * x[t] for t, _, a, _ in terms)
    slowed = sum(g * a * x[t] for t, _, a, g in terms) + share_max * extra
    x[ov.y] = max(floor, copies + extra, floor + slowed)


def overlap_greedily(x0: np.ndarray, lp: Any, seg_vars: dict[tuple[int, int], SegVars], cap_iv: list[Interval],
                     slack: np.ndarray, overlaps: dict[int, Overlap], T: np.ndarray, share_max: float,
                     fill: Callable[[np.ndarray], np.ndarray], wakes: Wakes) -> np.ndarray:
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
    cost = np.asarray(lp.col_cost_)
    span = {int(col): (int(j0), int(j1), coef / SCALE) for j0, j1, col, coef in cap_iv}
    x, slack = x0.copy(), slack.copy()
    todo: list[tuple[float, int, dict[int, int], SegVars, str]] = []
    for sv in seg_vars.values():
        if sv.pS >= 0 and x[sv.pS] > 0.5 and sv.pX:
            todo.append((cost[sv.pS], sv.pS, sv.pX, sv, "prefetch"))
        if sv.wS >= 0 and x[sv.wS] > 0.5 and sv.wX:
            todo.append((cost[sv.wS], sv.wS, sv.wX, sv, "evict"))
    todo.sort(key=lambda m: -m[0])

    def local(c: int, woken: set[int]) -> float:  # the objective's terms at kernel c: y_c and z_c; u at `woken`
        y, z = overlaps[c].y, overlaps[c].z
        return float(cost[y] * x[y] + (cost[z] * x[z] if z is not None else 0.0)
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
            set_async_overlap(x, overlaps[c], T[c], share_max)
            wakes.set(x, woken)
            after = local(c, woken)
            if cost[col] - cost[sync_col] + after - before < -1e-12:
                slack[j0:j1 + 1] -= add
                changed = True
                break
            x[sync_col], x[col] = 1.0, 0.0
            set_async_overlap(x, overlaps[c], T[c], share_max)
            wakes.set(x, woken)
    if not changed:
        return x0
    x = fill(x)
    return x if is_feasible(lp, x) and cost @ x < cost @ x0 else x0


def staged_start(plan: Plan, n: int, seg_vars: dict[tuple[int, int], SegVars], start_slow: dict[int, int],
                 overlaps: dict[int, Overlap], T: np.ndarray, share_max: float,
                 pairs: dict[int, int] | None = None) -> np.ndarray | None:
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
        if seg.kind == "streamed":  # (read in pieces only: slow for good, or fast for good)
            x[start_slow[tid]] = 1 if tp.initial == "slow" else 0
            continue
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
        if idx == 0 and tid in start_slow and seg.kind not in STARTS_SLOW and tp.initial == "slow":
            x[start_slow[tid]] = 1  # born slow: absent from its first segment as if dropped at its start
            if ev:
                return None
            ev = [Action("drop", seg.start, "sync")]
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
    for c, ov in overlaps.items():
        set_async_overlap(x, ov, T[c], share_max)
    return x


def direct_start(plan: Plan, nvars: int, tv: dict[int, DirectTensor], configs: dict[int, KernelTime],
                 overlaps: dict[int, Overlap], share_max: float) -> np.ndarray | None:
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
    for k, ov in overlaps.items():
        _, const, terms, _ = configs[k]
        set_async_overlap(x, ov, const + sum(c * x[t] for t, c in terms), share_max)
    return x


def _has_copy(v: DirectTensor, g: DirectGap, x: np.ndarray) -> bool:
    first = v.start if v.start >= 0 else v.slow[0]
    return x[first] > 0.5 or any(x[h.wA] > 0.5 for h in v.gaps if h is not g and h.wA >= 0)


def _set_config(x: np.ndarray, terms: list[tuple[int, float]], k: int, ops: tuple[int, ...],
                tv: dict[int, DirectTensor]) -> None:
    """Set the v[k,c] that matches the operands' tiers."""
    slow = {t: x[tv[t].slow[tv[t].uses.index(k)]] > 0.5 for t in ops if t in tv}
    free = [t for t in ops if t in tv]
    # the v columns come in itertools.product order over the free operands, fast first
    idx = 0
    for t in free:
        idx = idx * 2 + (1 if slow[t] else 0)
    x[terms[idx][0]] = 1
