"""The plan format: dataclasses, JSON, graph matching, and the hand-written plans."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from autotm.errors import AutotmError
from autotm.ir.graph import Kernel, Role, Tensor, TrainingGraph, check
from autotm.ir.plan_meta import FamilyStats, PlanMeta, SolverStats
from autotm.ir.plan import (
    PLAN_VERSION,
    Action,
    Plan,
    PlanError,
    TensorPlan,
    all_fast_plan,
    check_plan_matches,
    evict_all_activations_plan,
)
from autotm.checks.validate import validate
from autotm.planner.floor import in_place_bytes


def graph_with_users(users: tuple[int, ...], n: int, name: str = "users") -> TrainingGraph:
    """Activation `a` (tensor 1) is made by kernel 0 and read by the kernels in `users`.

    Tensor 0 is the input x; kernel k >= 1 reads the previous chain value (x for k = 1)
    and `a` when k is in `users`, and writes chain value c_k (tensor k + 1). The last
    chain value is the loss (a graph output).
    """
    ids = list(range(n + 1))
    reads = {0: [0], 1: [0]} | {k: [k] for k in range(2, n)}
    for u in users:
        reads[u] = sorted(set(reads[u]) | {1})
    tensors = []
    for t in ids:
        p = None if t == 0 else t - 1
        us = tuple(k for k in range(n) if t in reads[k])
        last = n - 1 if t == n else max((p or 0,) + us)
        role = Role.INPUT if t == 0 else (Role.OUTPUT if t == n else Role.ACTIVATION)
        tensors.append(Tensor(id=t, name="x" if t == 0 else ("a" if t == 1 else f"c{t - 1}"), nbytes=4 * (t + 1),
                              dtype="float32", shape=(t + 1,), stride=(1,), role=role, producer=p, users=us,
                              live=(p or 0, last), is_graph_output=t == n))
    kernels = tuple(Kernel(index=k, op=f"op{k}", inputs=tuple(reads[k]), outputs=(k + 1,), signature=f"op{k}",
                           flops=0, bytes_touched=0, module="", phase="forward") for k in range(n))
    g = TrainingGraph(name=name, kernels=kernels, tensors=tuple(tensors), parameters=0, program=None)
    check(g)
    return g


def E(at, mode="sync"):
    return Action("evict", at, mode)


def P(at, mode="sync"):
    return Action("prefetch", at, mode)


def D(at, mode="sync"):
    return Action("drop", at, mode)


@pytest.fixture(scope="module")
def captured():
    import torch
    from torch import nn

    from autotm.frontend.capture import capture

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    return capture(m, nn.CrossEntropyLoss(), torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                   (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))))


# ---- dataclasses ---------------------------------------------------------------------------

def test_plan_data_is_frozen_and_errors_are_autotm_errors():
    g = graph_with_users((2,), 3)
    plan = all_fast_plan(g)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.access = "direct"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tensors[0].initial = "slow"
    assert Action("evict", 1, "sync") == Action("evict", 1, "sync", keep_fast=False)
    assert issubclass(PlanError, AutotmError)


def test_all_fast_plan():
    g = graph_with_users((2,), 3)
    plan = all_fast_plan(g, memory_system="cuda+host")
    assert (plan.version, plan.graph_name, plan.graph_fingerprint) == (PLAN_VERSION, "users", g.fingerprint)
    assert (plan.memory_system, plan.access, plan.budget_bytes, plan.planner) == ("cuda+host", "staged", None, "all-fast")
    assert plan.tensors == tuple(TensorPlan(t.id, "fast", ()) for t in g.tensors)


# ---- evict_all_activations_plan ---------------------------------------------------------------

@pytest.mark.parametrize("users, n, sync, asyn", [
    # runs [2,3], [6], [9]: evict at the first free kernel, drop after each run, prefetch before the next
    ((2, 3, 6, 9), 10, [E(1), P(2), D(4), P(6), D(7), P(9)],
     [E(1, "async"), P(2), D(4, "async"), P(5, "async"), D(7, "async"), P(8, "async")]),
    # used right after the producer and later: evicted after the first run
    ((1, 2, 5), 6, [E(3), P(5)], [E(3, "async"), P(4, "async")]),
    # a one-kernel gap: the async prefetch falls back to sync
    ((2,), 3, [E(1), P(2)], [E(1, "async"), P(2)]),
    # only used right after the producer (in a run): nothing to move
    ((1,), 4, [], []),
    ((1, 2, 3), 5, [], []),
])
def test_evict_all_activations_actions(users, n, sync, asyn):
    g = graph_with_users(users, n)
    for mode, expected in (("sync", sync), ("async", asyn)):
        plan = evict_all_activations_plan(g, mode, budget_bytes=10**6)
        assert plan.planner == f"evict-all-activations-{mode}" and plan.budget_bytes == 10**6
        assert list(plan.tensors[1].actions) == expected
        assert all(not tp.actions for tp in plan.tensors if tp.id != 1)  # chain values: used right after
        for access in ("staged", "direct"):
            validate(dataclasses.replace(plan, access=access), g)


def test_evict_all_activations_leaves_other_roles_alone():
    g = graph_with_users((2, 3, 6, 9), 10)
    tensors = list(g.tensors)
    tensors[1] = dataclasses.replace(tensors[1], role=Role.GRADIENT)
    g2 = dataclasses.replace(g, tensors=tuple(tensors))
    assert all(not tp.actions for tp in evict_all_activations_plan(g2, "sync").tensors)


def test_evict_all_activations_rejects_unknown_mode():
    with pytest.raises(PlanError, match="mode must be 'sync' or 'async', got 'lazy'"):
        evict_all_activations_plan(graph_with_users((2,), 3), "lazy")


# ---- JSON ---------------------------------------------------------------------------------------

def test_json_round_trip(tmp_path):
    g = graph_with_users((2, 3, 6, 9), 10)
    plan = dataclasses.replace(evict_all_activations_plan(g, "async", budget_bytes=123),
                               meta=PlanMeta(solve_seconds=1.5, gap=0.01, defrag_history=((123, 200, 0.5, 1.0),),
                                             solver=SolverStats(rows=7, bound=None, families=(
                                                 FamilyStats("capacity", 3, 9, 0.01),))))
    tps = list(plan.tensors)
    tps[0] = TensorPlan(0, "slow", (P(0), Action("drop", 2, "async")))
    tps[1] = TensorPlan(1, "fast", (Action("evict", 1, "sync", keep_fast=True), D(4, "async")))
    plan = dataclasses.replace(plan, tensors=tuple(tps))
    text = plan.to_json()
    assert Plan.from_json(text) == plan
    d = json.loads(text)
    assert d["version"] == 1 and d["budget_bytes"] == 123 and len(d["tensors"]) == len(g.tensors)
    assert d["tensors"][1]["actions"][0] == {"kind": "evict", "at": 1, "mode": "sync", "keep_fast": True}
    assert '{"id": 1, "initial": "fast", "actions": [' in text  # one line per tensor
    path = plan.save(tmp_path / "sub" / "plan.json")
    assert Plan.load(path) == plan
    assert Plan.load(str(path)).for_graph(g) == plan


def test_a_plan_file_of_an_older_version_keeps_its_meta():
    # meta was a free-form object: the keys PlanMeta knows are read, others are ignored
    g = graph_with_users((2, 3), 10)
    d = json.loads(all_fast_plan(g).to_json())
    d["meta"] = {"predicted_seconds": 2.5, "gap": 0.0, "rows": 12, "variables": 40, "defrag_history": [[1, 2, 0.1, 2.5]]}
    p = Plan.from_dict(d)
    assert p.meta == PlanMeta(predicted_seconds=2.5, defrag_history=((1, 2, 0.1, 2.5),))
    assert Plan.from_json(p.to_json()) == p


def test_json_round_trip_of_empty_plan():
    g = graph_with_users((2,), 3)
    plan = dataclasses.replace(all_fast_plan(g), tensors=())
    assert Plan.from_json(plan.to_json()) == plan


def _plan_dict(g):
    return json.loads(evict_all_activations_plan(g, "sync").to_json())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("tensors"), "plan JSON: missing field 'tensors'"),
    (lambda d: d.pop("graph_fingerprint"), "plan JSON: missing field 'graph_fingerprint'"),
    (lambda d: d.pop("version"), "plan JSON: missing field 'version'"),
    (lambda d: d["tensors"][1].pop("initial"), "plan JSON: missing field 'tensors[1].initial'"),
    (lambda d: d["tensors"][1]["actions"][0].pop("at"), "plan JSON: missing field 'tensors[1].actions[0].at'"),
    (lambda d: d["tensors"][1]["actions"][0].update(at="2"),
     "plan JSON: field 'tensors[1].actions[0].at' must be an integer, got '2'"),
    (lambda d: d["tensors"][1]["actions"][0].update(kind="move"),
     "plan JSON: field 'tensors[1].actions[0].kind' must be one of prefetch, evict, drop, got 'move'"),
    (lambda d: d["tensors"][1]["actions"][0].update(keep_fast=1),
     "plan JSON: field 'tensors[1].actions[0].keep_fast' must be true or false"),
    (lambda d: d.update(access="paged"), "plan JSON: field 'access' must be one of staged, direct, got 'paged'"),
    (lambda d: d.update(budget_bytes=-1), "plan JSON: field 'budget_bytes' must be a non-negative integer or null"),
    (lambda d: d.update(tensors={}), "plan JSON: field 'tensors' must be a list"),
    (lambda d: d.update(meta=[]), "plan JSON: field 'meta' must be an object"),
    (lambda d: d.update(version=True), "plan JSON: field 'version' must be an integer, got True"),
    (lambda d: d.update(version=2), "plan version 2 is not supported by this autotm (expects 1)"),
])
def test_malformed_json_names_the_field(edit, message):
    d = _plan_dict(graph_with_users((2,), 3))
    edit(d)
    with pytest.raises(PlanError) as e:
        Plan.from_json(json.dumps(d))
    assert str(e.value) == message


def test_unreadable_plan_files(tmp_path):
    with pytest.raises(PlanError, match="plan JSON is not valid JSON: "):
        Plan.from_json("{not json")
    with pytest.raises(PlanError, match="plan JSON: must be a JSON object"):
        Plan.from_json("[]")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1}')
    with pytest.raises(PlanError, match=re.escape(f"plan file {bad}: missing field 'access'")):
        Plan.load(bad)
    with pytest.raises(PlanError, match="cannot read plan file"):
        Plan.load(tmp_path / "missing.json")


# ---- matching a plan to its graph ---------------------------------------------------------------

def test_version_mismatch():
    g = graph_with_users((2,), 3)
    plan = dataclasses.replace(all_fast_plan(g), version=2)
    with pytest.raises(PlanError) as e:
        plan.for_graph(g)
    assert str(e.value) == "plan version 2 is not supported by this autotm (expects 1)"


def test_fingerprint_mismatch():
    g = graph_with_users((2,), 3, name="small")
    other = graph_with_users((2,), 4, name="big")
    plan = all_fast_plan(g)
    assert plan.for_graph(g) is plan
    with pytest.raises(PlanError) as e:
        check_plan_matches(plan, other)
    assert str(e.value) == (f"plan was made for graph small (fingerprint {g.fingerprint}), "
                            f"not for big (fingerprint {other.fingerprint})")
    # the fingerprint decides, not the name
    renamed = graph_with_users((2,), 3, name="renamed")
    assert plan.for_graph(renamed) is plan


# ---- a real captured graph -----------------------------------------------------------------------

def test_hand_written_plans_on_captured_graph(captured, tmp_path):
    g = captured
    fast = validate(all_fast_plan(g), g)
    # every live tensor, an update written over the input it consumes counted once
    apart = validate(all_fast_plan(g), g, in_place=False)
    assert apart.fast_bytes.tolist() == g.live_bytes.tolist()
    assert apart.peak_fast_bytes == g.peak_live_bytes
    assert fast.fast_bytes.tolist() == (g.live_bytes - in_place_bytes(g)).tolist()
    assert in_place_bytes(g).any()  # (SGD with momentum: its updates are written over their inputs)
    for mode in ("sync", "async"):
        plan = evict_all_activations_plan(g, mode)
        moved = [tp for tp in plan.tensors if tp.actions]
        assert moved and all(g.tensors[tp.id].role == Role.ACTIVATION for tp in moved)
        r = validate(plan, g)
        assert r.peak_fast_bytes <= fast.peak_fast_bytes
        assert (r.fast_bytes <= fast.fast_bytes).all()
        assert r.bytes_to_slow == sum(g.tensors[tp.id].nbytes for tp in moved)
        loaded = Plan.load(plan.save(tmp_path / f"{mode}.json")).for_graph(g)
        assert loaded == plan
        assert validate(loaded, g, budget_bytes=r.peak_fast_bytes).peak_fast_bytes == r.peak_fast_bytes
        with pytest.raises(PlanError, match="over budget"):
            validate(loaded, g, budget_bytes=r.peak_fast_bytes - 1)
    # the sync plan needs less fast memory than all-fast on this graph
    assert validate(evict_all_activations_plan(g, "sync"), g).peak_fast_bytes < g.peak_live_bytes
