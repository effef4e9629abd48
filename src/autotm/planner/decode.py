"""Solutions to plans: which move columns are on, as actions on the plan timeline."""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..ir.costmodel import CostModel
from ..ir.graph import TrainingGraph
from ..ir.plan import Action, Plan, TensorPlan
from ..ir.split import split_of
from .model import DirectTensor, SegVars, StagedLayout
from .segments import STARTS_SLOW


def on(x: np.ndarray, col: int) -> bool:
    """Is binary column `col` (-1: absent) set in x?"""
    return col >= 0 and x[col] > 0.5


def _plan(graph: TrainingGraph, cost: CostModel, budget: int, formulation: str, access: Literal["staged", "direct"],
          tensors: tuple[TensorPlan, ...]) -> Plan:
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=cost.memory_system,
                access=access, budget_bytes=int(budget), planner=formulation, tensors=tensors, split=split_of(graph))


def decode_staged(graph: TrainingGraph, cost: CostModel, budget: int, formulation: str, x: np.ndarray,
                  layout: StagedLayout) -> Plan:
    """The staged plan of solution x (staged.py's model)."""
    initial: dict[int, Literal["fast", "slow"]] = {}
    actions: dict[int, list[Action]] = {}
    for (tid, _), sv in layout.seg_vars.items():
        if tid not in initial:
            initial[tid] = "slow" if on(x, layout.start_slow.get(tid, -1)) else "fast"
            actions[tid] = []
        seg, acts = sv.seg, actions[tid]
        if seg.kind in STARTS_SLOW:
            if initial[tid] == "slow" and seg.kind == "initial":
                acts.append(_prefetch(sv, x, seg.end + 1))
            continue
        if on(x, sv.wA):
            if not sv.empty:  # an empty final segment is the executor's carry write
                async_c = [c for c, col in sv.wX.items() if on(x, col)]
                later = [e for e, col in sv.wL.items() if on(x, col)]
                acts.append(Action("evict", async_c[0], "async") if async_c
                            else Action("evict", later[0] if later else seg.start, "sync"))
        elif on(x, sv.dA):
            born = seg.index == 0 and tid in layout.born and initial[tid] == "slow"
            if not (sv.empty or born):  # (born slow: nothing to drop, it was never fast)
                acts.append(Action("drop", seg.start, "sync"))
        else:
            continue
        if seg.kind == "gap":
            acts.append(_prefetch(sv, x, seg.end + 1))
    tensors = tuple(TensorPlan(t.id, initial[t.id], tuple(sorted(actions[t.id], key=lambda a: a.at)))
                    if t.id in initial else TensorPlan(t.id, "fast", ()) for t in graph.tensors)
    return _plan(graph, cost, budget, formulation, "staged", tensors)


def _prefetch(sv: SegVars, x: np.ndarray, use: int) -> Action:
    async_c = [c for c, col in sv.pX.items() if on(x, col)]
    earlier = [p for p, col in sv.pE.items() if on(x, col)]
    return (Action("prefetch", async_c[0], "async") if async_c
            else Action("prefetch", earlier[0] if earlier else use, "sync"))


def decode_direct(graph: TrainingGraph, cost: CostModel, budget: int, formulation: str, x: np.ndarray,
                  tv: dict[int, DirectTensor]) -> Plan:
    """The direct plan of solution x (direct.py's model)."""
    tensors = []
    for t in graph.tensors:
        v = tv.get(t.id)
        if v is None:
            tensors.append(TensorPlan(t.id, "fast", ()))
            continue
        if v.z >= 0:
            tensors.append(TensorPlan(t.id, "slow" if on(x, v.z) else "fast", ()))
            continue
        initial: Literal["fast", "slow"] = "slow" if on(x, v.start if t.producer is None else v.slow[0]) else "fast"
        actions: list[Action] = []
        for g in v.gaps:
            carry = g.kind == "final" and g.empty  # (an empty final gap: the executor's carry write)
            if on(x, g.wA):
                if not carry:
                    at = [c for c, col in g.wX.items() if on(x, col)]
                    actions.append(Action("evict", at[0], "async") if at else Action("evict", g.lo, "sync"))
            elif on(x, g.dA) and not carry:
                actions.append(Action("drop", g.lo, "sync"))
            if on(x, g.pS):
                actions.append(Action("prefetch", g.hi + 1, "sync"))
            else:
                at = [c for c, col in g.pX.items() if on(x, col)]
                if at:
                    actions.append(Action("prefetch", at[0], "async"))
        tensors.append(TensorPlan(t.id, initial, tuple(sorted(actions, key=lambda a: a.at))))
    return _plan(graph, cost, budget, formulation, "direct", tuple(tensors))
