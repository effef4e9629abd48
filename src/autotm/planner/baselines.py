"""Baseline plans, executed on the same tiers as the ILP's: all-fast, first-touch, lru.

- all-fast: no budget; the lower bound when it fits.
- first-touch: a tensor lives in fast memory if there is room when it is created
  (OS first-touch placement), otherwise in slow memory for life; under staged access a
  slow tensor is written out after it is produced and staged in for each use (prefetch
  before a run of uses, drop after it).
- lru: demand paging at tensor granularity: before each kernel, fetch the operands that
  are not in fast memory, evicting the least recently used tensors to make room (the
  behaviour of a DRAM cache, CUDA unified memory or OS swapping).

Both count an output written over an input that dies at its kernel once
(floor.in_place_bytes), as the executor holds them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import numpy as np

from ..ir.graph import Role, TrainingGraph
from ..ir.plan import Action, Plan, TensorPlan, all_fast_plan
from ..errors import InfeasibleBudget


def _plan(graph: TrainingGraph, memory_system: str, budget: int | None, planner: str,
          initial: dict[int, Literal["fast", "slow"]], actions: dict[int, list[Action]]) -> Plan:
    tensors = tuple(TensorPlan(t.id, initial.get(t.id, "fast"), tuple(actions.get(t.id, ())))
                    for t in graph.tensors)
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=memory_system,
                access="staged", budget_bytes=int(budget) if budget is not None else None, planner=planner,
                tensors=tensors)


def _uses(graph: TrainingGraph) -> list[list[int]]:
    return [sorted(set(t.users) | ({t.producer} if t.producer is not None else set())) for t in graph.tensors]


def _operands(graph: TrainingGraph) -> list[list[int]]:
    return [list(dict.fromkeys(k.inputs + k.outputs)) for k in graph.kernels]


def _reserve(graph: TrainingGraph, reserve: np.ndarray | None) -> np.ndarray:
    """Per kernel, the bytes of the budget its workspace takes (CostModel.workspace)."""
    n = len(graph.kernels)
    return np.zeros(n, dtype=np.int64) if reserve is None else np.asarray(reserve, dtype=np.int64)


def _operand_need(graph: TrainingGraph, reserve: np.ndarray) -> list[int]:
    """Per kernel, its operands (an output written over a dying input once) and workspace."""
    from .floor import in_place_bytes

    shared = in_place_bytes(graph)
    return [sum(graph.tensors[t].nbytes for t in ops) + int(w) - int(s)
            for ops, w, s in zip(_operands(graph), reserve, shared)]


def _minimum(graph: TrainingGraph, budget: int, reserve: np.ndarray) -> None:
    need = _operand_need(graph, reserve)
    k = int(np.argmax(need))
    if need[k] > budget:
        raise InfeasibleBudget(budget, need[k], f"kernel {k} ({graph.kernels[k].op}) with its operands and workspace")


def first_touch_plan(graph: TrainingGraph, budget: int, memory_system: str = "cpu+file", *,
                     keep_fast: frozenset[int] = frozenset(), workspace: np.ndarray | None = None) -> Plan:
    """Fast while there is room at creation, else slow for life (staged in for each use).

    Room is kept for staging: at first the largest set of operands (and workspace) of one
    kernel; when the staged copies of several slow tensors still overlap beyond the
    budget, the reserve grows by the excess and the placement is made again.
    `workspace[k]`: bytes kernel k needs beyond the tensors (CostModel.workspace)."""
    from ..checks.validate import validate

    ws = _reserve(graph, workspace)
    _minimum(graph, budget, ws)
    reserve = max(_operand_need(graph, ws))
    uses = _uses(graph)
    while True:
        p = _first_touch(graph, budget, memory_system, reserve, keep_fast, uses)
        over = int((validate(p, graph, budget_bytes=2**62).fast_bytes + ws).max()) - budget
        if over <= 0:
            return p
        if reserve >= budget:
            raise InfeasibleBudget(budget, budget + over, "first-touch placement with its staged copies")
        reserve = min(budget, reserve + over)


def _first_touch(graph: TrainingGraph, budget: int, memory_system: str, reserve: int, keep_fast: frozenset[int],
                 uses: list[list[int]]) -> Plan:
    n = len(graph.kernels)
    home_fast_bytes = np.zeros(n + 1, dtype=np.int64)  # bytes of fast-homed tensors live at each kernel
    initial: dict[int, Literal["fast", "slow"]] = {}
    actions: dict[int, list[Action]] = {}
    order = sorted(graph.tensors, key=lambda t: (t.live[0], t.id))
    for t in order:
        a, b = t.live
        fits = home_fast_bytes[a] + t.nbytes + reserve <= budget
        must_fast = (t.role in (Role.INPUT, Role.SCALAR, Role.CONSTANT, Role.OUTPUT) or not uses[t.id]
                     or t.id in keep_fast)
        if fits or must_fast:
            home_fast_bytes[a:b + 1] += t.nbytes
            continue
        # slow home: inputs start slow; produced tensors are written out right after
        acts: list[Action] = []
        u = uses[t.id]
        runs = _runs(u)
        if t.producer is None:
            initial[t.id] = "slow"
        first = True
        for lo, hi in runs:
            if first and t.producer is not None:
                # produced in fast at lo; write it out after the run
                if hi + 1 <= b and hi + 1 < n:
                    acts.append(Action("evict", hi + 1, "sync"))
                first = False
                continue
            first = False
            acts.append(Action("prefetch", lo, "sync"))
            if hi + 1 <= b and hi + 1 < n and (hi < u[-1] or t.is_graph_output):
                acts.append(Action("drop", hi + 1, "sync"))
        actions[t.id] = acts
    return _plan(graph, memory_system, budget, "first-touch", initial, actions)


def _runs(uses: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive kernels among the uses."""
    runs: list[tuple[int, int]] = []
    for u in uses:
        if runs and u == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], u)
        else:
            runs.append((u, u))
    return runs


def lru_plan(graph: TrainingGraph, budget: int, memory_system: str = "cpu+file", *,
             keep_fast: frozenset[int] = frozenset(), workspace: np.ndarray | None = None) -> Plan:
    """Demand paging: fetch operands on use, evict the least recently used to make room.

    `keep_fast`: tensors never evicted (the ILP's warm start: those it does not move);
    `workspace[k]`: bytes kernel k needs beyond the tensors, room made for it too."""
    from .floor import in_place_bytes

    ws = _reserve(graph, workspace)
    _minimum(graph, budget, ws)
    n = len(graph.kernels)
    ops = _operands(graph)
    shared = in_place_bytes(graph)  # an output written over its dying input needs no room of its own
    nbytes = [t.nbytes for t in graph.tensors]
    initial: dict[int, Literal["fast", "slow"]] = {}
    actions: dict[int, list[Action]] = {}
    resident: OrderedDict[int, None] = OrderedDict()  # least recently used first
    written: set[int] = set()
    used = 0
    inputs = [t for t in graph.tensors if t.producer is None]
    first_use = {t.id: (t.users[0] if t.users else 0) for t in inputs}
    for ti in sorted(inputs, key=lambda ti: first_use[ti.id]):
        if used + ti.nbytes <= budget or ti.id in keep_fast:
            resident[ti.id] = None
            used += ti.nbytes
        else:
            initial[ti.id] = "slow"
            written.add(ti.id)
    dies: list[list[int]] = [[] for _ in range(n)]
    for tt in graph.tensors:
        dies[tt.live[1]].append(tt.id)
    for k in range(n):
        need = [t for t in ops[k] if t not in resident and graph.tensors[t].producer != k]
        new = [t for t in ops[k] if graph.tensors[t].producer == k]
        room = sum(nbytes[t] for t in need) + sum(nbytes[t] for t in new) + int(ws[k]) - int(shared[k])
        for t in ops[k]:
            if t in resident:
                resident.move_to_end(t)
        victims = []
        for t in list(resident):
            if used + room <= budget:
                break
            if t in ops[k] or t in keep_fast:
                continue
            victims.append(t)
            del resident[t]
            used -= nbytes[t]
        if used + room > budget:
            raise InfeasibleBudget(budget, used + room, f"kernel {k} ({graph.kernels[k].op})")
        for t in victims:
            kind: Literal["drop", "evict"] = "drop" if t in written else "evict"
            written.add(t)
            actions.setdefault(t, []).append(Action(kind, k, "sync"))
        for t in need:
            actions.setdefault(t, []).append(Action("prefetch", k, "sync"))
            resident[t] = None
            used += nbytes[t]
        for t in new:
            resident[t] = None
            used += nbytes[t]
        for t in dies[k]:
            if t in resident:
                del resident[t]
                used -= nbytes[t]
    return _plan(graph, memory_system, budget, "lru", initial, actions)


def all_fast(graph: TrainingGraph, memory_system: str = "cpu+file") -> Plan:
    return all_fast_plan(graph, memory_system=memory_system, access="staged")
