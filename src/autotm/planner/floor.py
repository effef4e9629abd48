"""The smallest budget each planner finds a plan at (its floor), and what sets it.

Every budgeted planner needs, at some kernel, bytes that no move can free: its operands
(staged access), its workspace, tensors that must stay fast. How many depends on the
planner, so each has its own floor, computed here exactly (each is the peak of a plan the
planner can make, and no plan of it needs less):

- staged ILP (synchronous, asynchronous): every tensor absent from fast memory inside
  every movable segment (segments.py, all tensors movable): the peak of
  `tightest_staged_plan`, a solution of the model at that budget. An output written over
  an input that dies at its kernel (torch.optim's in-place updates) holds that input's
  bytes, counted once (`in_place_bytes`), as the executor holds them.
- lru: the operands and workspace of the busiest kernel (it evicts all else there).
- first-touch (staged): the plan in which every tensor that may be slow is, staged in
  for each run of uses (its reserve at the whole budget), with the must-fast tensors.
- static, first-touch (direct): the tensors that must stay fast, and the workspace.
- synchronous, asynchronous (direct): those, and updates whose input must stay fast
  (the steady state ends them fast: tightest_direct_plan keeps them fast for life).

Budgets here are as the user states them (plan()'s budget_bytes): with pinned tensors
(pin_params) the solvers' capacity at kernel k is the budget + `extra[k]`, and the
baselines' a flat budget + max(extra) (plan()'s validation budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import InfeasibleBudget
from ..ir.graph import Role, TrainingGraph
from ..ir.plan import Action, Plan, TensorPlan
from ..ir.split import split_of
from .segments import carried_pairs, tensor_segments
from .model import movable

NO_BUDGET = ("all-fast", "all-slow")
SPLIT_FORMULATIONS = ("synchronous", "asynchronous")  # the planners that run kernels in pieces (splitting.py)


@dataclass(frozen=True)
class Floor:
    """The smallest budget (bytes) at which one planner finds a plan; `kernel` is where it
    is needed (None: anywhere), `what` says what needs it (for InfeasibleBudget)."""
    bytes: int
    kernel: int | None
    what: str


@dataclass(frozen=True)
class Accounting:
    """How plan() counts a budget: `pinned` tensors kept fast outside it (pin_params),
    their bytes per kernel `extra` (or None), each kernel's `workspace`, and the solvers'
    capacity change per kernel `solver_extra` (extra less workspace, or None)."""
    pinned: frozenset[int]
    extra: np.ndarray | None
    workspace: np.ndarray
    solver_extra: np.ndarray | None

    @property
    def flat_extra(self) -> int:
        """What the baselines' flat budget adds to the user's (plan()'s validation budget)."""
        return int(self.extra.max()) if self.extra is not None and len(self.extra) else 0


PINNED_ROLES = (Role.WEIGHT, Role.BUFFER, Role.OPTIMIZER_STATE, Role.INPUT, Role.SCALAR, Role.CONSTANT, Role.OUTPUT)


def accounting(graph: TrainingGraph, workspace: np.ndarray, pin_params: bool = False) -> Accounting:
    pinned: frozenset[int] = frozenset()
    extra = None
    if pin_params:
        pinned = frozenset(t.id for t in graph.tensors if t.role in PINNED_ROLES)
        delta = np.zeros(len(graph.kernels) + 1, dtype=np.int64)
        for t in graph.tensors:
            if t.id in pinned:
                delta[t.live[0]] += t.nbytes
                delta[t.live[1] + 1] -= t.nbytes
        extra = np.cumsum(delta[:-1])
    workspace = np.asarray(workspace, dtype=np.int64)
    solver_extra = extra
    if workspace.any():
        solver_extra = (extra if extra is not None else 0) - workspace
    return Accounting(pinned, extra, workspace, solver_extra)


def smallest_feasible(graph: TrainingGraph, formulation: str, access: str, acc: Accounting,
                      memory_system: str = "cpu+file") -> Floor:
    """The floor of `formulation` on a memory system of `access` ("staged" or "direct")."""
    n = len(graph.kernels)
    if formulation in NO_BUDGET or n == 0:
        return Floor(0, None, "nothing")
    ws = acc.workspace
    if formulation == "lru" or (formulation == "first-touch" and access == "staged"):
        shared = in_place_bytes(graph)  # (the baselines count an output over its dying input once)
        need = operand_bytes(graph) - shared + ws
        if formulation == "first-touch":
            from ..checks.validate import validate

            p = tightest_first_touch(graph, memory_system)
            need = np.maximum(need, validate(p, graph, budget_bytes=2**62).fast_bytes + ws)
        f = _at_peak(graph, need - acc.flat_extra, ws, "first-touch placement with its staged copies at "
                     if formulation == "first-touch" else "", shared=shared)
        return Floor(f.bytes, f.kernel, f.what + whole_because(graph, f.kernel, formulation))
    if access == "staged":
        p = tightest_staged_plan(graph, acc.pinned, memory_system)
        from ..checks.validate import validate

        held = validate(p, graph, budget_bytes=2**62, in_place=not acc.pinned).fast_bytes
        f = _at_peak(graph, held - (acc.solver_extra if acc.solver_extra is not None else 0), ws, "",
                     shared=in_place_bytes(graph, acc.pinned))
        return Floor(f.bytes, f.kernel, f.what + whole_because(graph, f.kernel, formulation))
    if formulation == "first-touch":
        fixed = must_stay_fast(graph, frozenset())
        return _at_peak(graph, fixed + ws - acc.flat_extra, ws, "", direct=True)
    # (the solvers count pinned tensors in their capacity, and solver_extra gives them back)
    fixed = must_stay_fast(graph, acc.pinned) + _pinned_bytes(graph, acc.pinned)
    if formulation in ("synchronous", "asynchronous"):
        fixed = fixed + updates_kept_fast(graph, acc.pinned)
    return _at_peak(graph, fixed - (acc.solver_extra if acc.solver_extra is not None else 0), ws, "", direct=True)


def solver_infeasible(graph: TrainingGraph, formulation: str, access: str, budget: int, pinned: frozenset[int],
                      budget_extra: np.ndarray | None, memory_system: str,
                      restricted: tuple[int, str] | None = None) -> Exception:
    """What to raise when the solver finds no `formulation` plan for `budget` (the solvers'
    budget: capacity at k is budget + budget_extra[k]): InfeasibleBudget stating the
    formulation's floor when that is above the budget (or `restricted`'s (bytes, what),
    the floor of a model that keeps more tensors fast, when higher). Otherwise the floor,
    a budget some plan of the model fits, is no higher than the budget that just failed:
    the solver, not the budget, failed, and saying so beats naming a smaller budget that
    failed as the smallest feasible one."""
    n = len(graph.kernels)
    acc = Accounting(pinned, None, np.zeros(n, dtype=np.int64), budget_extra)
    floor = smallest_feasible(graph, formulation, access, acc, memory_system)
    minimum, what = floor.bytes, floor.what
    if restricted is not None and restricted[0] > minimum:
        minimum, what = restricted
    if minimum > budget:
        return InfeasibleBudget(budget, minimum, what, formulation)
    return RuntimeError(f"the solver found no {formulation} plan for a budget of {budget:,} bytes, although one "
                        f"exists from {minimum:,} bytes ({what}): a solver failure, not an infeasible budget")


def check_before_profile(graph: TrainingGraph, budget: object, formulation: str, access: str,
                         workspace: np.ndarray | None = None) -> None:
    """Raise InfeasibleBudget when no profile can make `budget` feasible for `formulation`:
    the floor of the graph alone (and of the `workspace` known so far, e.g. from the
    profile cache; zeros elsewhere) is a lower bound of the floor with every workspace.
    A size is checked against it; a ratio r:1 of a peak that a workspace W may raise,
    (peak + W) / (r + 1), against the floor, which is at least W too: no W can make it
    fit if peak < r * floor. Capturing takes seconds, profiling minutes: an infeasible
    attempt now says so before the profile (pin_params budgets are left to plan())."""
    from ..ir.budget import is_minimum, is_ratio, parse_budget, parse_ratio
    from ..errors import InfeasibleBudget

    if formulation in NO_BUDGET or budget is None or is_minimum(budget) or not len(graph.kernels):
        return
    from .splitting import split_floor

    ws = np.zeros(len(graph.kernels), dtype=np.int64) if workspace is None else np.asarray(workspace, np.int64)
    peak = int((graph.live_bytes + ws).max())
    wanted = parse_budget(budget, peak)
    r = parse_ratio(str(budget)) if is_ratio(budget) else None

    def fits(f: Floor) -> bool:
        return peak >= r * f.bytes if r is not None else wanted >= f.bytes
    floor = smallest_feasible(graph, formulation, access, accounting(graph, ws))
    if fits(floor):
        return
    if formulation in SPLIT_FORMULATIONS and access == "staged" and graph.splittable:
        # kernels may run in pieces (plan() runs them so on a memory system that reads
        # ranges): only now, as the floor with pieces costs two tightest plans
        floor = min(floor, split_floor(graph, formulation, ws, "cpu+file"), key=lambda f: f.bytes)
        if fits(floor):
            return
    raise InfeasibleBudget(wanted, floor.bytes, floor.what, formulation, exact=False)


def _at_peak(graph: TrainingGraph, need: np.ndarray, ws: np.ndarray, prefix: str, direct: bool = False,
             shared: np.ndarray | None = None) -> Floor:
    k = int(np.argmax(need))
    if direct:  # operands may be slow there: what must stay fast sets the floor
        kern = graph.kernels[k]
        where = f" in `{kern.module}`" if kern.module else ""
        what = f"kernel {k} ({kern.op}{where}) with the tensors that must stay fast (the batch, the loss, ...)"
        if ws[k]:
            what += f" and its workspace ({_mb(int(ws[k]))})"
        return Floor(max(0, int(need[k])), k, prefix + what)
    over = int(shared[k]) if shared is not None else 0
    what = kernel_needs(graph, k, int(ws[k]), over)
    held = (graph.tensors[graph.kernels[k].outputs[0]].nbytes if graph.kernels[k].pieces > 1
            else int(operand_bytes(graph)[k]) - over)  # (a split kernel's inputs may all be slow)
    rest = int(need[k]) - held - int(ws[k])
    if rest >= 2**16:  # (the batch and the loss between their uses, tensors too small to move, ...)
        what += f", and {_mb(rest)} of other tensors that stay fast there"
    return Floor(max(0, int(need[k])), k, prefix + what)


def in_place_bytes(graph: TrainingGraph, pinned: frozenset[int] = frozenset()) -> np.ndarray:
    """Per kernel k, the bytes of the input whose storage k's output takes there
    (replay.in_place_inputs): under staged access both are in fast memory at k in every
    plan, so the staged model's capacity at k gains them (its budget_extra). Zeros with
    pinned tensors (pin_params), whose capacity rows count the two apart."""
    out = np.zeros(len(graph.kernels), dtype=np.int64)
    if pinned or not hasattr(getattr(graph, "program", None), "kernel_nodes"):
        return out  # (no program, no reuse known: and no torch imported for it)
    from ..interpret.replay import in_place_inputs

    for k, tid in enumerate(in_place_inputs(graph)):
        if tid is not None:
            out[k] = graph.tensors[tid].nbytes
    return out


def operand_bytes(graph: TrainingGraph) -> np.ndarray:
    """Per kernel, the bytes of its operands (each storage once)."""
    return np.asarray([sum(graph.tensors[t].nbytes for t in dict.fromkeys(k.inputs + k.outputs))
                       for k in graph.kernels], dtype=np.int64)


def must_stay_fast(graph: TrainingGraph, pinned: frozenset[int]) -> np.ndarray:
    """Per kernel, the bytes live there of tensors no direct plan may place slow."""
    can = set(movable(graph, pinned))
    delta = np.zeros(len(graph.kernels) + 1, dtype=np.int64)
    for t in graph.tensors:
        if t.id not in can and t.id not in pinned:
            delta[t.live[0]] += t.nbytes
            delta[t.live[1] + 1] -= t.nbytes
    return np.cumsum(delta[:-1])


def _pinned_bytes(graph: TrainingGraph, pinned: frozenset[int]) -> np.ndarray:
    """Per kernel, the bytes live there of the pinned tensors."""
    delta = np.zeros(len(graph.kernels) + 1, dtype=np.int64)
    for t in graph.tensors:
        if t.id in pinned:
            delta[t.live[0]] += t.nbytes
            delta[t.live[1] + 1] -= t.nbytes
    return np.cumsum(delta[:-1])


def updates_kept_fast(graph: TrainingGraph, pinned: frozenset[int]) -> np.ndarray:
    """Per kernel, the bytes of movable updates whose input must stay fast (direct.py's
    steady state ends them fast): fast for life in tightest_direct_plan. (The model could
    produce one slow and bring it back for its last use, a little less; such updates, of
    an input no direct plan may move, are rare: none in the zoo.)"""
    can = set(movable(graph, pinned))
    delta = np.zeros(len(graph.kernels) + 1, dtype=np.int64)
    for out, inp in carried_pairs(graph).items():
        if out in can and inp not in can:
            t = graph.tensors[out]
            delta[t.live[0]] += t.nbytes
            delta[t.live[1] + 1] -= t.nbytes
    return np.cumsum(delta[:-1])


def kernel_needs(graph: TrainingGraph, k: int, workspace: int, in_place: int = 0) -> str:
    """What kernel k holds at once, naming its module, or for an optimizer update the
    parameter it updates: "the update of `fc.weight` (4.0 MiB) ...". `in_place`: bytes
    its output holds of an input it is written over (in_place_bytes), counted once."""
    kern = graph.kernels[k]
    ops = [graph.tensors[t] for t in dict.fromkeys(kern.inputs + kern.outputs)]
    total = sum(t.nbytes for t in ops) - in_place
    if kern.pieces > 1:
        where = f" in `{kern.module}`" if kern.module else ""
        out = graph.tensors[kern.outputs[0]].nbytes
        return (f"kernel {k} ({kern.op}{where}) in {kern.pieces} pieces, its inputs read from slow memory a piece "
                f"at a time: its output ({_mb(out)}) and workspace ({_mb(workspace)}, one piece of each input "
                "included)")
    # the parameter an update is for: its own state key, or its optimizer state's
    # ("opt:layer4.0.conv2.weight:momentum_buffer")
    params = sorted({p for t in ops if t.state_key and (p := _parameter_of(t.state_key)) is not None})
    if kern.phase == "optimizer" and params:
        parts = []
        for t in sorted(ops, key=lambda t: -t.nbytes):
            if t.nbytes == 0:
                continue
            if t.role == Role.WEIGHT or (t.state_key or "").startswith("param:"):
                name = "parameter"
            elif t.role == Role.OPTIMIZER_STATE and t.state_key:
                name = t.state_key.rsplit(":", 1)[1].replace("_buffer", "").replace("_", " ")
            elif t.role == Role.UPDATE:
                name = "a temporary of the update"
            else:
                name = t.role.value
            if name not in parts:
                parts.append(name)
        what = (f"kernel {k} ({kern.op}), the update of `{', '.join(params)}` "
                f"({_mb(max(t.nbytes for t in ops))}), needs {', '.join(parts)} at once ({_mb(total)})")
    else:
        where = f" in `{kern.module}`" if kern.module else ""
        what = f"kernel {k} ({kern.op}{where}) with its operands ({_mb(total)})"
    if in_place:
        what += f" (its output written over an input it consumes, {_mb(in_place)})"
    if workspace:
        what += f" and workspace ({_mb(workspace)})"
    return what


def whole_because(graph: TrainingGraph, k: int | None, formulation: str) -> str:
    """Why kernel k runs whole, for a floor it sets under staged access ("" if it does not)."""
    if k is None or graph.kernels[k].pieces > 1:
        return ""
    from ..ir.split import split_blocker

    if k in graph.splittable:
        return ("" if formulation in SPLIT_FORMULATIONS
                else f"; {formulation} runs every kernel whole (the synchronous and asynchronous planners run "
                     "such a kernel in pieces)")
    why = split_blocker(graph, k) or "its pieces did not give the same bits as the whole kernel on this machine"
    return f"; it cannot run in pieces: {why}"


def _parameter_of(state_key: str) -> str | None:
    kind, _, rest = state_key.partition(":")
    if kind == "param":
        return rest
    if kind == "opt" and ":" in rest:
        return rest.rsplit(":", 1)[0]
    return None


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def tightest_staged_plan(graph: TrainingGraph, pinned: frozenset[int] = frozenset(),
                         memory_system: str = "cpu+file", min_bytes: int = 0) -> Plan:
    """The staged plan with every tensor absent from fast memory in every segment of
    segments.py (those of tensors of `min_bytes` or more): carried inputs start slow and are
    prefetched for their first use; outputs that may be born slow are; every other segment
    begins with a sync evict (the tensor's first slow copy) or drop (later) and ends with a
    sync prefetch for the next use. A solution of ilp.py's model at the budget it peaks at (the staged ILP's floor),
    and the ILP's warm start of last resort."""
    initial: dict[int, Literal["fast", "slow"]] = {}
    actions: dict[int, list[Action]] = {}
    for ts in tensor_segments(graph, min_bytes=min_bytes, pinned=pinned, pairs=carried_pairs(graph)):
        acts: list[Action] = []
        has_copy = ts.carried_input or ts.born is not None
        if ts.born is not None:  # written to slow memory by its producer, a piece at a time
            initial[ts.tensor] = "slow"
        for seg in ts.segments:
            if seg.kind == "streamed":  # (read in pieces only: it stays slow)
                initial[ts.tensor] = "slow"
                continue
            if seg.kind == "initial":
                initial[ts.tensor] = "slow"
                acts.append(Action("prefetch", seg.end + 1, "sync"))
                continue
            if seg.end < seg.start:  # an empty final segment: the executor's carry write
                continue
            if not (seg.index == 0 and ts.born is not None):  # (born slow: never fast before)
                acts.append(Action("drop" if has_copy else "evict", seg.start, "sync"))
            has_copy = True
            if seg.kind == "gap":
                acts.append(Action("prefetch", seg.end + 1, "sync"))
        actions[ts.tensor] = acts
    tensors = tuple(TensorPlan(t.id, initial.get(t.id, "fast"), tuple(actions.get(t.id, ()))) for t in graph.tensors)
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=memory_system,
                access="staged", budget_bytes=None, planner="tightest", tensors=tensors, split=split_of(graph))


def tightest_direct_plan(graph: TrainingGraph, pinned: frozenset[int] = frozenset(),
                         memory_system: str = "cpu+file") -> Plan:
    """The direct plan with every movable tensor slow for life but the updates whose input
    must stay fast (updates_kept_fast), fast for life: a solution of direct.py's model at
    the budget it peaks at (that formulation's floor), and its warm start of last resort."""
    can = set(movable(graph, pinned))
    kept = {out for out, inp in carried_pairs(graph).items() if out in can and inp not in can}
    tensors = tuple(TensorPlan(t.id, "slow" if t.id in can and t.id not in kept else "fast", ())
                    for t in graph.tensors)
    return Plan(version=1, graph_name=graph.name, graph_fingerprint=graph.fingerprint, memory_system=memory_system,
                access="direct", budget_bytes=None, planner="tightest", tensors=tensors)


def tightest_first_touch(graph: TrainingGraph, memory_system: str = "cpu+file") -> Plan:
    """first-touch's plan with no room left at any creation: all it may place slow is,
    the plan it falls back to at its smallest budget (baselines.first_touch_plan)."""
    from .baselines import _first_touch, _uses

    return _first_touch(graph, 0, memory_system, 0, frozenset(), _uses(graph))


__all__ = ["Floor", "Accounting", "accounting", "smallest_feasible", "solver_infeasible", "check_before_profile",
           "kernel_needs", "tightest_staged_plan", "tightest_direct_plan"]
