"""Plan: where every tensor lives and when it moves, as plain frozen data and JSON.

A plan gives, for every tensor of a TrainingGraph, its initial tier and an ordered list
of actions. It is data, not code: it can be saved, inspected, validated
(`autotm.validate`), simulated and executed later without re-solving.

Actions
-------
``Action(kind, at, mode, keep_fast=False)`` moves one tensor at kernel ``at``.

- ``prefetch``: copy slow -> fast. The slow copy stays valid: tensors are immutable once
  produced (the graph is functional), so a slow copy never goes stale.
- ``evict``: write the tensor to slow memory, then release the fast copy unless
  ``keep_fast=True``. A tensor is written to slow memory at most once (its first move to
  slow); afterwards it is brought back with prefetch and released with drop.
- ``drop``: release the fast copy of a tensor that already has a valid slow copy (no write).

- mode ``sync`` "at k": happens just before kernel k runs, blocking compute.
- mode ``async`` "at k": overlaps exactly kernel k: it starts when kernel k starts and
  completes when kernel k ends. Kernel k must not read or write the tensor.

A tensor has at most one action per kernel; its actions are listed in increasing ``at``.

The timeline (the one used by the validator, the simulator and the executor)
---------------------------------------------------------------------------
Graph inputs are allocated in their initial tier before the first step of kernel
``live[0]`` (kernel 0 for captured graphs). Then, for every kernel k:

1. sync actions at k, evicts and drops first, then prefetches;
2. async actions at k start: an async prefetch allocates its fast destination now; an
   async evict keeps holding its fast copy (an async drop also holds it until step 4);
3. kernel k runs: its outputs are allocated in their initial tier (``TensorPlan.initial``);
4. async actions at k complete: an async evict with keep_fast=False and an async drop
   release the fast copy; an async evict's slow copy becomes valid; an async prefetch's
   data is resident and usable from kernel k+1;
5. tensors whose live range ends at k are freed in both tiers.

The fast-tier budget is checked after step 1 and at step 3 of every kernel. Copies in
flight count at both ends: an async prefetch holds its fast destination from step 2, an
async evict holds its fast source until step 4. Since steps 2 and 3 only allocate, the
step-3 value is the peak of the kernel; ``ValidationReport.fast_bytes`` records it.

A graph input's ``initial`` tier is where it starts; a produced tensor's is where its
producer writes it ("slow" is possible under direct access, and under staged access for
the one output of a kernel that runs in pieces, ir.split.born_slow_piece: it writes the
output piece by piece, holding one piece in fast memory while it runs). A tensor written to
slow by its producer, or starting in slow, already has its slow copy: evicting it is a
second write and is rejected; use drop after a prefetch instead.

Arena layout (optional)
-----------------------
A planner may also give a static layout of fast memory: ``Plan.arena_bytes`` and, per
tensor, ``TensorPlan.offsets``, one byte offset for each interval of fast residency in
time order (a tensor evicted and prefetched again has one interval per stay). Residency
is counted on the half-step clock of ``autotm.validate.FastBlock`` (2k: kernel k after its
sync moves; 2k + 1: while kernel k runs). The validator checks that blocks resident at the
same step never overlap and all lie inside the arena. Plans without a layout omit both
keys in JSON; older readers ignore them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, NoReturn

from ..errors import GraphError
from ..errors import PlanError as PlanError  # (re-exported: it was defined here)
from .graph import Role, TrainingGraph
from .split import with_pieces
from .plan_meta import PlanMeta

PLAN_VERSION = 1

KINDS = ("prefetch", "evict", "drop")
MODES = ("sync", "async")
TIERS = ("fast", "slow")
ACCESS = ("staged", "direct")
Access = Literal["staged", "direct"]


@dataclass(frozen=True)
class Action:
    """Move one tensor at kernel `at`; see the module docstring for the semantics."""

    kind: Literal["prefetch", "evict", "drop"]
    at: int
    mode: Literal["sync", "async"]
    keep_fast: bool = False  # evict only: keep the fast copy after writing the slow one


@dataclass(frozen=True)
class TensorPlan:
    """One tensor's initial tier and its actions, in increasing `at`."""

    id: int
    initial: Literal["fast", "slow"]
    actions: tuple[Action, ...] = ()
    # byte offset in the fast arena of each of the tensor's fast residencies, in time
    # order (see Plan.arena_bytes); empty when the plan has no arena
    offsets: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Initial tier and actions for every tensor of one graph, on one memory system."""

    version: int
    graph_name: str
    graph_fingerprint: str
    memory_system: str  # "cpu+file", "cuda+host", "sim:<spec>", ...
    access: Literal["staged", "direct"]
    budget_bytes: int | None  # fast-tier budget the plan was made for; None: unlimited
    planner: str  # "all-fast", "ilp-synchronous", ...
    tensors: tuple[TensorPlan, ...]
    # planner details (predicted time, peaks, the solver's stats); a dict (a plan file's
    # meta object, or {} from hand-written code) is read as PlanMeta
    meta: PlanMeta = field(default_factory=PlanMeta)
    # size of one fast-memory arena holding every fast residency at its offset
    # (TensorPlan.offsets); None: no static layout (the runtime allocates)
    arena_bytes: int | None = None
    # (kernel, pieces) of the kernels that run in pieces (ir/split.py), in kernel order
    split: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.meta, dict):  # (plan files and hand-written plans of older versions)
            object.__setattr__(self, "meta", PlanMeta.from_json(self.meta))

    # ---- checks against a graph -------------------------------------------------------
    def for_graph(self, graph: TrainingGraph) -> Plan:
        """Return self if the plan was made for `graph` by this plan version; else PlanError."""
        check_plan_matches(self, graph)
        return self

    # ---- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "graph_name": self.graph_name,
            "graph_fingerprint": self.graph_fingerprint,
            "memory_system": self.memory_system,
            "access": self.access,
            "budget_bytes": self.budget_bytes,
            "planner": self.planner,
            "meta": self.meta.to_json(),
            **({"arena_bytes": self.arena_bytes} if self.arena_bytes is not None else {}),
            **({"split": [list(kp) for kp in self.split]} if self.split else {}),
            "tensors": [_tensor_plan_to_dict(tp) for tp in self.tensors],
        }

    def to_json(self) -> str:
        """JSON text: header fields indented, then one line per tensor."""
        d = self.to_dict()
        tensors = d.pop("tensors")
        head = json.dumps(d, indent=2, sort_keys=False)
        lines = ",\n".join("    " + json.dumps(t, separators=(", ", ": ")) for t in tensors)
        body = '  "tensors": [\n' + lines + "\n  ]" if tensors else '  "tensors": []'
        return head[:-2] + ",\n" + body + "\n}\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_json(cls, text: str, *, source: str = "plan JSON") -> Plan:
        """Parse a plan; PlanError names the field that is missing or malformed."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"{source} is not valid JSON: {e}") from None
        return cls.from_dict(d, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise PlanError(f"cannot read plan file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise PlanError(f"plan file {path} is not UTF-8 text (byte {e.start}): not a plan") from None
        return cls.from_json(text, source=f"plan file {path}")

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "plan JSON") -> Plan:
        r = _Reader(source)
        r.expect(isinstance(d, dict), "", "must be a JSON object")
        version = r.integer(d, "version")
        if version != PLAN_VERSION:
            raise PlanError(_version_message(version))
        access = r.choice(d, "access", ACCESS)
        budget = r.get(d, "budget_bytes")
        r.expect(budget is None or (_is_int(budget) and budget >= 0), "budget_bytes",
                 "must be a non-negative integer or null")
        meta = r.get(d, "meta")
        r.expect(isinstance(meta, dict), "meta", "must be an object")
        arena = d.get("arena_bytes")  # optional: plans without an arena layout omit it
        r.expect(arena is None or (_is_int(arena) and arena >= 0), "arena_bytes",
                 "must be a non-negative integer or null")
        split = d.get("split", [])  # optional: plans that split no kernel omit it
        r.expect(isinstance(split, list) and all(isinstance(kp, list) and len(kp) == 2 and all(
            _is_int(x) and x >= 0 for x in kp) for kp in split), "split", "must be a list of [kernel, pieces] pairs")
        raw_tensors = r.get(d, "tensors")
        r.expect(isinstance(raw_tensors, list), "tensors", "must be a list")
        tensors = []
        for i, t in enumerate(raw_tensors):
            where = f"tensors[{i}]"
            r.expect(isinstance(t, dict), where, "must be an object")
            actions = r.get(t, "actions", where)
            r.expect(isinstance(actions, list), f"{where}.actions", "must be a list")
            acts = []
            for j, a in enumerate(actions):
                aw = f"{where}.actions[{j}]"
                r.expect(isinstance(a, dict), aw, "must be an object")
                keep = a.get("keep_fast", False)
                r.expect(isinstance(keep, bool), f"{aw}.keep_fast", "must be true or false")
                acts.append(Action(kind=r.choice(a, "kind", KINDS, aw), at=r.integer(a, "at", aw),
                                   mode=r.choice(a, "mode", MODES, aw), keep_fast=keep))
            offsets = t.get("offsets", [])
            r.expect(isinstance(offsets, list) and all(_is_int(o) and o >= 0 for o in offsets),
                     f"{where}.offsets", "must be a list of non-negative integers")
            tensors.append(TensorPlan(id=r.integer(t, "id", where), initial=r.choice(t, "initial", TIERS, where),
                                      actions=tuple(acts), offsets=tuple(offsets)))
        return cls(version=version, graph_name=r.string(d, "graph_name"),
                   graph_fingerprint=r.string(d, "graph_fingerprint"), memory_system=r.string(d, "memory_system"),
                   access=access, budget_bytes=budget, planner=r.string(d, "planner"),
                   tensors=tuple(tensors), meta=PlanMeta.from_json(meta), arena_bytes=arena,
                   split=tuple((int(k), int(n)) for k, n in split))


def _tensor_plan_to_dict(tp: TensorPlan) -> dict[str, Any]:
    acts = []
    for a in tp.actions:
        ad: dict[str, Any] = {"kind": a.kind, "at": a.at, "mode": a.mode}
        if a.keep_fast:
            ad["keep_fast"] = True
        acts.append(ad)
    d: dict[str, Any] = {"id": tp.id, "initial": tp.initial, "actions": acts}
    if tp.offsets:
        d["offsets"] = list(tp.offsets)
    return d


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Reader:
    """Field access for from_dict, with errors that name the field."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, what: str) -> NoReturn:
        field_ = f"field '{where}' " if where else ""
        raise PlanError(f"{self.source}: {field_}{what}")

    def expect(self, ok: bool, where: str, what: str) -> None:
        if not ok:
            self.fail(where, what)

    def get(self, d: dict[str, Any], key: str, where: str = "") -> Any:
        name = f"{where}.{key}" if where else key
        if key not in d:
            raise PlanError(f"{self.source}: missing field '{name}'")
        return d[key]

    def integer(self, d: dict[str, Any], key: str, where: str = "") -> int:
        v = self.get(d, key, where)
        self.expect(_is_int(v), f"{where}.{key}" if where else key, f"must be an integer, got {v!r}")
        return int(v)

    def string(self, d: dict[str, Any], key: str, where: str = "") -> str:
        v = self.get(d, key, where)
        self.expect(isinstance(v, str), f"{where}.{key}" if where else key, f"must be a string, got {v!r}")
        return str(v)

    def choice(self, d: dict[str, Any], key: str, options: tuple[str, ...], where: str = "") -> Any:
        v = self.get(d, key, where)
        self.expect(v in options, f"{where}.{key}" if where else key,
                    f"must be one of {', '.join(options)}, got {v!r}")
        return v


def _version_message(version: Any) -> str:
    return f"plan version {version} is not supported by this autotm (expects {PLAN_VERSION})"


def check_plan_matches(plan: Plan, graph: TrainingGraph) -> None:
    """Raise PlanError unless `plan` has this autotm's version and was made for `graph`.

    The graph is identified by its fingerprint (kernels, operands, tensor sizes, live
    ranges, roles); the graph name is only reported.
    """
    if plan.version != PLAN_VERSION:
        raise PlanError(_version_message(plan.version))
    if plan.graph_fingerprint != graph.fingerprint:  # (the same split or not)
        raise PlanError(
            f"plan was made for graph {plan.graph_name} (fingerprint {plan.graph_fingerprint}), "
            f"not for {graph.name} (fingerprint {graph.fingerprint})"
        )
    plan_graph(plan, graph)  # (a split the graph cannot run is a PlanError here)


def plan_graph(plan: Plan, graph: TrainingGraph) -> TrainingGraph:
    """`graph` with the plan's kernels split as it records (ir/split.py); PlanError for a
    split of a kernel that cannot run in pieces, or of a kernel the graph lacks. (A plan
    that records no split takes the graph as it is: the planner's own, split, graphs.)"""
    if not plan.split:
        return graph
    n = len(graph.kernels)
    for k, pieces in plan.split:
        if not 0 <= k < n or pieces < 2:
            raise PlanError(f"plan splits kernel {k} into {pieces} pieces: the graph has kernels 0..{n - 1}, "
                            "and a split kernel runs in 2 pieces or more")
    want = dict(plan.split)
    try:
        return with_pieces(graph, {kn.index: want.get(kn.index, 1) for kn in graph.kernels})
    except GraphError as e:
        raise PlanError(f"the plan's split is malformed: {e}") from None


# ---- hand-written plans ---------------------------------------------------------------

def _plan(graph: TrainingGraph, tensors: Iterable[TensorPlan], *, memory_system: str, access: Access,
          budget_bytes: int | None, planner: str, meta: PlanMeta | None = None) -> Plan:
    return Plan(version=PLAN_VERSION, graph_name=graph.name, graph_fingerprint=graph.fingerprint,
                memory_system=memory_system, access=access, budget_bytes=budget_bytes, planner=planner,
                tensors=tuple(tensors), meta=meta or PlanMeta())


def all_fast_plan(graph: TrainingGraph, memory_system: str = "cpu+file", access: Access = "staged") -> Plan:
    """Every tensor in fast memory for its whole life; no actions, no budget."""
    return _plan(graph, (TensorPlan(t.id, "fast", ()) for t in graph.tensors), memory_system=memory_system,
                 access=access, budget_bytes=None, planner="all-fast")


def evict_all_activations_plan(graph: TrainingGraph, mode: str = "sync", memory_system: str = "cpu+file",
                               access: Access = "staged", budget_bytes: int | None = None) -> Plan:
    """Evict every activation after it is produced and prefetch it before each later use.

    An activation is moved when it has a use after the first kernel e > producer that does
    not read it (uses in a run right after the producer are served from fast memory).
    Its later uses form runs of consecutive kernels [a_i, b_i]. Each gap between fast
    residencies is [g0, a_i - 1], where g0 = e before the first run and g0 = b_{i-1} + 1
    after run i-1: no kernel in a gap reads or writes the tensor.

    - mode="sync": evict (i == 1) or drop (i > 1) sync at g0, prefetch sync at a_i.
    - mode="async": evict or drop async at g0 (the nearest later kernel that does not
      touch the tensor); prefetch async at a_i - 1 (the nearest earlier one) when that
      kernel is after g0, else (a one-kernel gap) prefetch sync at a_i.

    Every action lies inside the tensor's live range, so the plan never holds more in
    fast memory than the all-fast plan does.
    """
    if mode not in MODES:
        raise PlanError(f"mode must be 'sync' or 'async', got {mode!r}")
    out = []
    for t in graph.tensors:
        actions: list[Action] = []
        if t.role == Role.ACTIVATION and t.producer is not None:
            actions = _evict_all_actions(t.producer, t.users, mode)
        out.append(TensorPlan(t.id, "fast", tuple(actions)))
    return _plan(graph, out, memory_system=memory_system, access=access, budget_bytes=budget_bytes,
                 planner=f"evict-all-activations-{mode}")


def _evict_all_actions(producer: int, users: tuple[int, ...], mode: str) -> list[Action]:
    used = set(users)
    e = producer + 1
    while e in used:
        e += 1
    later = [u for u in users if u > e]
    if not later:
        return []
    runs: list[list[int]] = []  # [a, b] of consecutive uses
    for u in later:
        if runs and u == runs[-1][1] + 1:
            runs[-1][1] = u
        else:
            runs.append([u, u])
    actions = []
    g0 = e
    for i, (a, b) in enumerate(runs):
        release: Literal["evict", "drop"] = "evict" if i == 0 else "drop"
        if mode == "sync":
            actions.append(Action(release, g0, "sync"))
            actions.append(Action("prefetch", a, "sync"))
        else:
            actions.append(Action(release, g0, "async"))
            if a - 1 > g0:
                actions.append(Action("prefetch", a - 1, "async"))
            else:
                actions.append(Action("prefetch", a, "sync"))
        g0 = b + 1
    return actions
