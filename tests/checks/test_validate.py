"""validate(): hand-solvable timelines, one test per rejection rule, and property tests
against a brute-force reference simulator written independently below."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotm.ir.graph import INPUT_ROLES, Role, Tensor, TrainingGraph
from autotm.ir.plan import (
    PLAN_VERSION,
    Action,
    Plan,
    PlanError,
    TensorPlan,
    all_fast_plan,
    evict_all_activations_plan,
)
from autotm.checks.validate import PlanReplay, validate
from graphs import make_graph


# ---- graphs from lists ------------------------------------------------------------------

def g5() -> TrainingGraph:
    """Five kernels; activation a1 is used right after it is made and again at the end.

        tensor  bytes  live     users        all-fast bytes per kernel:
        0 w       8    0..4     0, 4         k0: w+a1           = 108
        1 a1    100    0..4     1, 4         k1: w+a1+a2        = 118
        2 a2     10    1..2     2            k2: w+a1+a2+a3     = 128  (peak)
        3 a3     10    2..3     3            k3: w+a1+a3+loss   = 119
        4 loss    1    3..4     4            k4: w+a1+loss+grad = 117
        5 grad    8    4..4     (output)
    """
    return make_graph(
        [8, 100, 10, 10, 1, 8],
        [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4, 0], [5])],
        names=["w", "a1", "a2", "a3", "loss", "grad"], ops=["f1", "f2", "f3", "f4", "b1"],
        roles={0: Role.WEIGHT, 4: Role.OUTPUT, 5: Role.GRADIENT}, outputs=(4, 5), name="g5")


def with_actions(graph, changes: dict, *, access="staged", budget=None, initial=None) -> Plan:
    """The all-fast plan with `changes[tid] = [Action, ...]` and `initial[tid]` overridden."""
    base = all_fast_plan(graph, access=access)
    initial = initial or {}
    tps = tuple(TensorPlan(tp.id, initial.get(tp.id, tp.initial), tuple(changes.get(tp.id, ())))
                for tp in base.tensors)
    return dataclasses.replace(base, tensors=tps, budget_bytes=budget, planner="test")


def E(at, mode="sync", keep_fast=False):
    return Action("evict", at, mode, keep_fast)


def P(at, mode="sync"):
    return Action("prefetch", at, mode)


def D(at, mode="sync"):
    return Action("drop", at, mode)


def rejects(plan, graph, message, **kw):
    with pytest.raises(PlanError) as e:
        validate(plan, graph, **kw)
    assert str(e.value) == message


# ---- hand-solvable timelines --------------------------------------------------------------

def test_all_fast_bytes_are_the_live_bytes():
    g = g5()
    r = validate(all_fast_plan(g), g)
    assert r.fast_bytes.tolist() == [108, 118, 128, 119, 117]
    assert r.peak_fast_bytes == 128 == g.peak_live_bytes
    assert (r.bytes_to_slow, r.bytes_to_fast, r.moves) == (0, 0, 0)


def test_sync_evict_and_prefetch_exact_bytes():
    # a1 leaves before k2 and comes back before k4: k2 = w+a2+a3, k4 = w+a1+loss+grad
    g = g5()
    plan = with_actions(g, {1: [E(2), P(4)]})
    r = validate(plan, g)
    assert r.fast_bytes.tolist() == [108, 118, 28, 19, 117]
    assert r.peak_fast_bytes == 118
    assert (r.bytes_to_slow, r.bytes_to_fast, r.moves) == (100, 100, 2)
    steps = list(PlanReplay(plan, g))
    assert [s.fast_after_sync for s in steps] == [8, 108, 18, 18, 109]


def test_async_moves_hold_fast_memory_at_both_ends():
    # async evict over k2 holds a1 during k2; async prefetch over k3 holds its destination during k3
    g = g5()
    r = validate(with_actions(g, {1: [E(2, "async"), P(3, "async")]}), g)
    assert r.fast_bytes.tolist() == [108, 118, 128, 119, 117]
    # async evict over k2, sync prefetch before k4: a1 is gone during k3
    r = validate(with_actions(g, {1: [E(2, "async"), P(4)]}), g)
    assert r.fast_bytes.tolist() == [108, 118, 128, 19, 117]


def test_keep_fast_evict_then_drop():
    g = g5()
    r = validate(with_actions(g, {1: [E(1, keep_fast=True), D(2, "async"), P(4)]}), g)
    assert r.fast_bytes.tolist() == [108, 118, 128, 19, 117]
    assert (r.bytes_to_slow, r.bytes_to_fast, r.moves) == (100, 100, 2)


def test_graph_input_starting_slow():
    g = g5()
    r = validate(with_actions(g, {0: [P(0), D(1), P(4)]}, initial={0: "slow"}), g)
    assert r.fast_bytes.tolist() == [108, 110, 120, 111, 117]
    assert (r.bytes_to_slow, r.bytes_to_fast, r.moves) == (0, 16, 2)


def test_evict_all_activations_exact_on_g5():
    g = g5()
    sync = evict_all_activations_plan(g, "sync")
    assert sync.tensors[1].actions == (E(2), P(4))
    assert all(not tp.actions for tp in sync.tensors if tp.id != 1)
    assert validate(sync, g).fast_bytes.tolist() == [108, 118, 28, 19, 117]
    asyn = evict_all_activations_plan(g, "async")
    assert asyn.tensors[1].actions == (E(2, "async"), P(3, "async"))
    assert validate(asyn, g).fast_bytes.tolist() == [108, 118, 128, 119, 117]


def test_direct_access_reads_slow_memory_in_place():
    g = g5()
    plan = with_actions(g, {1: [E(2)]}, access="direct")
    r = validate(plan, g)
    assert r.fast_bytes.tolist() == [108, 118, 28, 19, 17]
    assert [s.slow_operands for s in PlanReplay(plan, g)] == [(), (), (), (), (1,)]
    # a produced tensor may be written to slow memory by its producer
    plan = with_actions(g, {1: [P(3, "async"), D(4)]}, access="direct", initial={1: "slow"})
    steps = list(PlanReplay(plan, g))
    assert [s.fast_bytes for s in steps] == [8, 18, 28, 119, 17]
    assert [s.slow_operands for s in steps] == [(1,), (1,), (), (), (1,)]


def test_budget_from_plan_and_override():
    g = g5()
    plan = with_actions(g, {1: [E(2), P(4)]}, budget=118)
    assert validate(plan, g).peak_fast_bytes == 118
    assert validate(plan, g, budget_bytes=1000).peak_fast_bytes == 118
    with pytest.raises(PlanError):
        validate(plan, g, budget_bytes=117)


# ---- one test per rejection rule -------------------------------------------------------------

def test_rejects_over_budget_while_kernel_runs():
    g = g5()
    rejects(with_actions(g, {1: [E(2), P(4)]}, budget=117), g,
            "fast memory over budget at kernel 1 (f2): 118 bytes resident > budget 117 bytes; largest resident: "
            "tensor 1 (a1): 100 bytes, tensor 2 (a2): 10 bytes, tensor 0 (w): 8 bytes")


def test_rejects_a_kernel_whose_workspace_does_not_fit_besides():
    g = g5()
    plan = with_actions(g, {1: [E(2), P(4)]}, budget=120)
    reserved = [0] * len(g.kernels)
    reserved[1] = 2  # 118 resident + 2 of workspace: fits exactly
    assert validate(plan, g, reserved_bytes=reserved).peak_fast_bytes == 118
    reserved[1] = 3
    with pytest.raises(PlanError, match=r"at kernel 1 \(f2\), which needs 3 bytes of workspace besides: "
                                        r"118 bytes resident > budget 120 bytes"):
        validate(plan, g, reserved_bytes=reserved)
    with pytest.raises(PlanError, match="reserved bytes for 2 kernels"):
        validate(plan, g, reserved_bytes=[0, 0])


def test_rejects_over_budget_after_sync_moves():
    g = g5()
    rejects(all_fast_plan(g), g, "fast memory over budget before kernel 0 (f1) (after its sync moves): 8 bytes "
            "resident > budget 7 bytes; largest resident: tensor 0 (w): 8 bytes", budget_bytes=7)
    # a sync prefetch before k4 goes over before the kernel allocates anything (k0..k3 stay under)
    plan = with_actions(g, {1: [P(4)]}, access="direct", initial={1: "slow"})
    assert [s.fast_after_sync for s in PlanReplay(plan, g)] == [8, 8, 18, 18, 109]
    rejects(plan, g, "fast memory over budget before kernel 4 (b1) (after its sync moves): 109 bytes resident > "
            "budget 108 bytes; largest resident: tensor 1 (a1): 100 bytes, tensor 0 (w): 8 bytes, tensor 4 (loss): "
            "1 bytes", budget_bytes=108)


def test_over_budget_counts_async_prefetch_destination():
    g = g5()
    plan = with_actions(g, {1: [E(2), P(3, "async")]})
    assert validate(plan, g).fast_bytes.tolist() == [108, 118, 28, 119, 117]
    rejects(plan, g, "fast memory over budget at kernel 3 (f4): 119 bytes resident > budget 118 bytes; largest "
            "resident: tensor 1 (a1): 100 bytes, tensor 3 (a3): 10 bytes, tensor 0 (w): 8 bytes", budget_bytes=118)


def test_rejects_staged_operand_in_slow_memory():
    g = g5()
    rejects(with_actions(g, {1: [E(2)]}), g,
            "kernel 4 (b1) reads tensor 1 (a1), which is not resident in fast memory (it is in slow memory; "
            "staged access needs every operand in fast memory)")


def test_rejects_move_before_tensor_exists():
    g = g5()
    rejects(with_actions(g, {1: [E(0, keep_fast=True)]}), g,
            "tensor 1 (a1): sync evict at kernel 0 (f1) happens before the tensor exists (produced by kernel 0 (f1); "
            "its first move can be at kernel 1)")
    rejects(with_actions(g, {0: [E(-1, keep_fast=True)]}), g,
            "tensor 0 (w): sync evict at kernel -1 (no such kernel) happens before the tensor exists "
            "(a graph input, live from kernel 0)")
    # a sync move right after the producer is fine
    assert validate(with_actions(g, {1: [E(1, keep_fast=True)]}), g).bytes_to_slow == 100


def test_rejects_move_after_tensor_dies():
    g = g5()
    rejects(with_actions(g, {2: [E(2, keep_fast=True), D(3)]}), g,
            "tensor 2 (a2): sync drop at kernel 3 (f4) happens after the tensor dies (its live range ends at "
            "kernel 2 (f3))")
    rejects(with_actions(g, {5: [E(7, "async")]}), g,
            "tensor 5 (grad): async evict at kernel 7 (no such kernel) happens after the tensor dies (its live "
            "range ends at kernel 4 (b1))")


def test_rejects_async_move_overlapping_a_reader():
    g = g5()
    rejects(with_actions(g, {1: [E(1, "async"), P(4)]}), g,
            "tensor 1 (a1): async evict at kernel 1 (f2) overlaps a kernel that reads the tensor")
    # the same move as sync (before kernel 1) is fine under direct access
    validate(with_actions(g, {1: [E(1), P(4)]}, access="direct"), g)


def test_rejects_prefetch_without_slow_copy():
    g = g5()
    rejects(with_actions(g, {1: [P(2)]}), g,
            "tensor 1 (a1): prefetch at kernel 2 (f3) without a valid slow copy (evict it to slow memory first)")


def test_rejects_prefetch_of_tensor_already_in_fast():
    g = g5()
    rejects(with_actions(g, {1: [E(2, keep_fast=True), P(3)]}), g,
            "tensor 1 (a1): prefetch at kernel 3 (f4), but the tensor is already in fast memory")


def test_rejects_evict_of_tensor_not_in_fast():
    g = g5()
    rejects(with_actions(g, {1: [E(2), E(3)]}), g,
            "tensor 1 (a1): evict at kernel 3 (f4), but the tensor is not in fast memory")


def test_rejects_second_evict():
    g = g5()
    rejects(with_actions(g, {1: [E(2, keep_fast=True), E(3)]}), g,
            "tensor 1 (a1): second evict at kernel 3 (f4): the tensor already has a slow copy (it was written there "
            "at kernel 2 (f3)); a tensor is written to slow memory once, use drop")
    rejects(with_actions(g, {1: [E(2), P(3), E(4, keep_fast=True)]}, access="direct"), g,
            "tensor 1 (a1): second evict at kernel 4 (b1): the tensor already has a slow copy (it was written there "
            "at kernel 2 (f3)); a tensor is written to slow memory once, use drop")
    rejects(with_actions(g, {0: [P(0), E(1)]}, initial={0: "slow"}), g,
            "tensor 0 (w): second evict at kernel 1 (f2): the tensor already has a slow copy (it started in slow "
            "memory); a tensor is written to slow memory once, use drop")
    rejects(with_actions(g, {1: [P(1), E(2, "async")]}, initial={1: "slow"}, access="direct"), g,
            "tensor 1 (a1): second evict at kernel 2 (f3): the tensor already has a slow copy (its producer kernel 0 "
            "(f1) wrote it there); a tensor is written to slow memory once, use drop")


def test_rejects_drop_without_slow_copy():
    g = g5()
    rejects(with_actions(g, {1: [D(2)]}), g,
            "tensor 1 (a1): drop at kernel 2 (f3) without a slow copy: the fast copy is its only copy (evict it instead)")


def test_rejects_drop_of_tensor_not_in_fast():
    g = g5()
    rejects(with_actions(g, {1: [E(2), D(3, "async")]}), g,
            "tensor 1 (a1): drop at kernel 3 (f4), but the tensor is not in fast memory")


def test_rejects_actions_out_of_order():
    g = g5()
    rejects(with_actions(g, {1: [E(3), P(2)]}), g,
            "tensor 1 (a1): actions are not in increasing `at` order: action 1 (prefetch at kernel 2) follows action 0 "
            "(evict at kernel 3); a tensor has at most one action per kernel")
    rejects(with_actions(g, {1: [E(2), P(2, "async")]}), g,
            "tensor 1 (a1): actions are not in increasing `at` order: action 1 (prefetch at kernel 2) follows action 0 "
            "(evict at kernel 2); a tensor has at most one action per kernel")


def test_rejects_unknown_duplicate_and_missing_tensors():
    g = g5()
    base = all_fast_plan(g)
    rejects(dataclasses.replace(base, tensors=base.tensors + (TensorPlan(9, "fast"),)), g,
            "plan lists tensor id 9, but graph g5 has tensors 0..5")
    rejects(dataclasses.replace(base, tensors=base.tensors + (TensorPlan(1, "fast"),)), g,
            "plan lists tensor 1 (a1) more than once")
    rejects(dataclasses.replace(base, tensors=base.tensors[:5]), g,
            "plan does not list tensor 5 (grad): every tensor must be listed exactly once")
    rejects(dataclasses.replace(base, tensors=base.tensors[2:]), g,
            "plan does not list tensor 0 (w) and 1 more: every tensor must be listed exactly once")


def test_rejects_initial_slow_for_produced_tensor_under_staged_access():
    g = g5()
    rejects(with_actions(g, {1: [P(1)]}, initial={1: "slow"}), g,
            "tensor 1 (a1): initial 'slow' is not allowed for a tensor produced by kernel 0 (f1) under staged access: "
            "kernels write their outputs to fast memory (only a kernel that runs in pieces writes its one output to "
            "slow memory, a piece at a time)")
    # graph inputs may start slow under staged access
    validate(with_actions(g, {0: [P(0)]}, initial={0: "slow"}), g)


def test_rejects_malformed_actions_and_access():
    g = g5()
    rejects(with_actions(g, {1: [Action("move", 2, "sync")]}), g,
            "tensor 1 (a1): action 0 has unknown kind 'move' (expected prefetch, evict or drop)")
    rejects(with_actions(g, {1: [Action("evict", 2, "later")]}), g,
            "tensor 1 (a1): action 0 (evict) has unknown mode 'later' (expected sync or async)")
    rejects(with_actions(g, {1: [E(2), Action("prefetch", 4, "sync", keep_fast=True)]}), g,
            "tensor 1 (a1): action 1 is a prefetch with keep_fast=True; keep_fast applies to evict only")
    rejects(with_actions(g, {1: [Action("evict", 2.0, "sync")]}), g,
            "tensor 1 (a1): action 0 (evict) has a non-integer kernel index 2.0")
    rejects(with_actions(g, {}, initial={1: "warm"}), g,
            "tensor 1 (a1): initial tier must be 'fast' or 'slow', got 'warm'")
    rejects(dataclasses.replace(all_fast_plan(g), access="paged"), g,
            "plan access must be 'staged' or 'direct', got 'paged'")


def test_rejects_plan_for_another_graph_or_version():
    g = g5()
    other = make_graph([8, 100], [([0], [1])], name="other")
    rejects(all_fast_plan(other), g,
            f"plan was made for graph other (fingerprint {other.fingerprint}), not for g5 (fingerprint {g.fingerprint})")
    rejects(dataclasses.replace(all_fast_plan(g), version=PLAN_VERSION + 1), g,
            "plan version 2 is not supported by this autotm (expects 1)")


# ---- a brute-force reference simulator -------------------------------------------------------

def reference(plan: Plan, graph: TrainingGraph, budget):
    """Replays each tensor on its own over every kernel and (sub)step; O(tensors * kernels).

    Returns (problems, after_sync[k], at_kernel[k], to_slow, to_fast, moves); the plan is
    acceptable iff `problems` is empty.
    """
    K, T = len(graph.kernels), len(graph.tensors)
    problems = []
    if plan.version != PLAN_VERSION or plan.graph_fingerprint != graph.fingerprint:
        problems.append("other graph/version")
    if plan.access not in ("staged", "direct"):
        problems.append("access")
    if sorted(tp.id for tp in plan.tensors) != list(range(T)):
        problems.append("tensor list")
    staged = plan.access == "staged"
    after_sync = [0] * K
    at_kernel = [0] * K
    to_slow = to_fast = moves = 0
    for tp in plan.tensors:
        if not (0 <= tp.id < T):
            continue
        t = graph.tensors[tp.id]
        acts = list(tp.actions)
        if tp.initial not in ("fast", "slow") or (tp.initial == "slow" and staged and t.producer is not None):
            problems.append("initial")
        for i, a in enumerate(acts):
            if a.kind not in ("prefetch", "evict", "drop") or a.mode not in ("sync", "async"):
                problems.append("kind/mode")
            if a.keep_fast and a.kind != "evict":
                problems.append("keep_fast")
            if i and a.at <= acts[i - 1].at:
                problems.append("order")
            born = t.live[0] if t.producer is None else t.producer + 1
            if not (born <= a.at <= t.live[1]):
                problems.append("range")
            elif a.mode == "async" and t.id in graph.kernels[a.at].inputs:
                problems.append("overlap")
        fast = slow = "no"
        for k in range(K):
            here = [a for a in acts if a.at == k]
            if k == t.live[0] and t.producer is None:
                fast, slow = ("yes", "no") if tp.initial == "fast" else ("no", "yes")
            for phase in ("sync-release", "sync-prefetch", "async-start"):
                for a in here:
                    if phase == "sync-release" and not (a.mode == "sync" and a.kind != "prefetch"):
                        continue
                    if phase == "sync-prefetch" and not (a.mode == "sync" and a.kind == "prefetch"):
                        continue
                    if phase == "async-start" and a.mode != "async":
                        continue
                    if a.kind == "prefetch":
                        if slow != "yes" or fast != "no":
                            problems.append("prefetch")
                        fast = "yes" if a.mode == "sync" else "flight"
                        to_fast += t.nbytes
                        moves += 1
                    elif a.kind == "evict":
                        if fast != "yes" or slow != "no":
                            problems.append("evict")
                        slow = "yes" if a.mode == "sync" else "flight"
                        if a.mode == "sync" and not a.keep_fast:
                            fast = "no"
                        to_slow += t.nbytes
                        moves += 1
                    else:
                        if fast != "yes" or slow != "yes":
                            problems.append("drop")
                        if a.mode == "sync":
                            fast = "no"
                if phase == "sync-prefetch" and t.live[0] <= k <= t.live[1]:
                    after_sync[k] += t.nbytes * (fast != "no")
            if k == t.producer:
                fast, slow = ("yes", "no") if tp.initial == "fast" else ("no", "yes")
            if t.live[0] <= k <= t.live[1]:
                at_kernel[k] += t.nbytes * (fast != "no")
            if k in t.users or k == t.producer:
                if fast != "yes" and (staged or slow != "yes"):
                    problems.append("operand")
            for a in here:
                if a.mode == "async":
                    if a.kind == "prefetch":
                        fast = "yes"
                    elif a.kind == "evict":
                        slow = "yes"
                        fast = "yes" if a.keep_fast else "no"
                    else:
                        fast = "no"
            if k == t.live[1]:
                fast = slow = "no"
    if budget is not None and any(max(a, b) > budget for a, b in zip(after_sync, at_kernel)):
        problems.append("budget")
    return problems, after_sync, at_kernel, to_slow, to_fast, moves


def resident_in_fast(tp: TensorPlan, t: Tensor, k: int) -> bool:
    """Whether tensor t is usable in fast memory when kernel k runs, from its actions alone."""
    fast = tp.initial == "fast"
    for a in tp.actions:
        if a.at < k or (a.at == k and a.mode == "sync"):
            fast = a.kind == "prefetch" or (a.kind == "evict" and a.keep_fast)
    return fast


# ---- random graphs and plans ---------------------------------------------------------------

@st.composite
def graphs(draw, max_kernels=8):
    n_in = draw(st.integers(0, 3))
    sizes = [draw(st.integers(0, 64)) for _ in range(n_in)]
    roles = {t: draw(st.sampled_from([Role.INPUT, Role.WEIGHT, Role.OPTIMIZER_STATE])) for t in range(n_in)}
    kernels = []
    n_k = draw(st.integers(1, max_kernels))
    for _ in range(n_k):
        ins = draw(st.lists(st.integers(0, len(sizes) - 1), max_size=3, unique=True)) if sizes else []
        outs = []
        for _ in range(draw(st.integers(0, 2))):
            outs.append(len(sizes))
            roles[len(sizes)] = draw(st.sampled_from([Role.ACTIVATION, Role.ACTIVATION, Role.GRADIENT]))
            sizes.append(draw(st.integers(0, 64)))
        kernels.append((sorted(ins), outs))
    outputs = draw(st.lists(st.integers(0, len(sizes) - 1), max_size=2, unique=True)) if sizes else []
    outputs = tuple(t for t in outputs if roles[t] not in INPUT_ROLES)
    return make_graph(sizes, kernels, roles=roles, outputs=outputs)


@st.composite
def plans(draw, graph):
    """Mostly sensible plans (a shadow state picks the kind), sometimes corrupted."""
    access = draw(st.sampled_from(["staged", "direct"]))
    tps = []
    for t in graph.tensors:
        first = t.live[0] if t.producer is None else t.producer + 1
        slow_ok = t.producer is None or access == "direct"
        initial = "slow" if slow_ok and draw(st.integers(0, 3)) == 0 else "fast"
        fast, has_slow = initial == "fast", initial == "slow"
        chosen = set(draw(st.lists(st.integers(first, t.live[1]), max_size=4))) if first <= t.live[1] else set()
        actions = []
        for k in range(first, t.live[1] + 1):
            if k in chosen:
                mode = "async" if k not in t.users and draw(st.booleans()) else "sync"
                if fast:
                    kind = "drop" if has_slow else "evict"
                    keep = kind == "evict" and draw(st.integers(0, 3)) == 0
                    actions.append(Action(kind, k, mode, keep))
                    fast, has_slow = keep, True
                else:
                    actions.append(Action("prefetch", k, mode))
                    fast = True
            elif access == "staged" and k in t.users and not fast and draw(st.integers(0, 4)):
                actions.append(Action("prefetch", k, "sync"))
                fast = True
        tps.append(TensorPlan(t.id, initial, tuple(actions)))
    if tps and draw(st.integers(0, 3)) == 0:  # corrupt one tensor's plan
        i = draw(st.integers(0, len(tps) - 1))
        tp = tps[i]
        how = draw(st.sampled_from(["kind", "mode", "shift", "initial", "remove", "keep"]))
        acts = list(tp.actions)
        if acts and how in ("kind", "mode", "shift", "remove", "keep"):
            j = draw(st.integers(0, len(acts) - 1))
            a = acts[j]
            if how == "kind":
                acts[j] = dataclasses.replace(a, kind=draw(st.sampled_from(["prefetch", "evict", "drop"])),
                                              keep_fast=False)
            elif how == "mode":
                acts[j] = dataclasses.replace(a, mode="async" if a.mode == "sync" else "sync")
            elif how == "shift":
                acts[j] = dataclasses.replace(a, at=a.at + draw(st.sampled_from([-1, 1])))
            elif how == "keep" and a.kind == "evict":
                acts[j] = dataclasses.replace(a, keep_fast=not a.keep_fast)
            else:
                del acts[j]
        elif how == "initial":
            tp = dataclasses.replace(tp, initial="slow" if tp.initial == "fast" else "fast")
        tps[i] = dataclasses.replace(tp, actions=tuple(acts))
    budget = draw(st.none() | st.integers(0, graph.peak_live_bytes + 8))
    base = all_fast_plan(graph, access=access)
    return dataclasses.replace(base, tensors=tuple(tps), budget_bytes=budget, planner="random")


@st.composite
def graph_and_plan(draw):
    g = draw(graphs())
    return g, draw(plans(g))


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(graph_and_plan())
def test_validator_agrees_with_brute_force_reference(gp):
    g, plan = gp
    problems, after_sync, at_kernel, to_slow, to_fast, moves = reference(plan, g, plan.budget_bytes)
    try:
        r = validate(plan, g)
    except PlanError as e:
        assert problems, f"validator rejected a plan the reference accepts: {e}"
        return
    assert not problems, f"validator accepted a plan the reference rejects: {problems}"
    assert r.fast_bytes.tolist() == at_kernel
    assert r.peak_fast_bytes == max(at_kernel + after_sync)
    assert [s.fast_after_sync for s in PlanReplay(plan, g)] == after_sync
    assert (r.bytes_to_slow, r.bytes_to_fast, r.moves) == (to_slow, to_fast, moves)


@PROPERTY
@given(graph_and_plan())
def test_accepted_staged_plans_have_every_operand_in_fast_memory(gp):
    g, plan = gp
    try:
        validate(plan, g)
    except PlanError:
        return
    by_id = {tp.id: tp for tp in plan.tensors}
    for kern in g.kernels:
        for tid in kern.inputs + kern.outputs:
            resident = resident_in_fast(by_id[tid], g.tensors[tid], kern.index)
            assert resident or plan.access == "direct", (kern.index, tid)


@settings(max_examples=150, deadline=None)
@given(graphs(max_kernels=12), st.sampled_from(["staged", "direct"]))
def test_hand_written_plans_always_validate(g, access):
    fast = validate(all_fast_plan(g, access=access), g)
    assert fast.fast_bytes.tolist() == g.live_bytes.tolist()
    assert fast.peak_fast_bytes == g.peak_live_bytes
    for mode in ("sync", "async"):
        r = validate(evict_all_activations_plan(g, mode, access=access), g)
        assert r.peak_fast_bytes <= fast.peak_fast_bytes
        assert (r.fast_bytes <= fast.fast_bytes).all()
        assert r.bytes_to_fast >= r.bytes_to_slow


# ---- scale ------------------------------------------------------------------------------------

def synthetic_graph(n_kernels=20_000, seed=0) -> TrainingGraph:
    """A random training-shaped graph: 1-2 outputs per kernel, local reads and long skips."""
    rng = np.random.default_rng(seed)
    n_in = 500
    sizes = [int(x) for x in rng.integers(1, 1 << 20, n_in)]
    roles = {t: Role.WEIGHT for t in range(n_in)}
    kernels = []
    recent = list(range(n_in))
    for k in range(n_kernels):
        ins = {recent[-1], recent[-1 - int(rng.integers(0, min(50, len(recent))))]}
        if rng.random() < 0.2:
            ins.add(int(rng.integers(0, len(sizes))))
        outs = list(range(len(sizes), len(sizes) + int(rng.integers(1, 3))))
        for t in outs:
            sizes.append(int(rng.integers(1, 1 << 20)))
            roles[t] = Role.ACTIVATION if k < n_kernels // 2 else Role.GRADIENT
        recent.extend(outs)
        kernels.append((sorted(ins), outs))
    return make_graph(sizes, kernels, roles=roles, outputs=(len(sizes) - 1,), name="synthetic")


def test_twenty_thousand_kernels_validate():
    g = synthetic_graph()
    assert len(g.kernels) == 20_000 and len(g.tensors) > 30_000
    r = validate(evict_all_activations_plan(g, "async"), g)
    assert r.moves > 1000
    assert r.peak_fast_bytes <= g.peak_live_bytes


@pytest.mark.timing
def test_twenty_thousand_kernels_validate_in_seconds():
    g = synthetic_graph()
    plan = evict_all_activations_plan(g, "async")
    t0 = time.perf_counter()
    validate(plan, g)
    seconds = time.perf_counter() - t0
    assert seconds < 5, f"validate took {seconds:.2f} s"
