"""The fast-memory arena: offsets for every fast residency, checked by the validator."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotm.ir.graph import Role
from autotm.ir.plan import Plan, PlanError, evict_all_activations_plan
from autotm.planner import defrag_cut, plan
from autotm.planner.arena import ALIGNMENT, assign_offsets, with_arena
from autotm.planner.baselines import lru_plan
from autotm.checks.validate import FastBlock, validate
from graphs import make_graph
from test_planner import chain_with_one_big_activation, cost_model


def collide(blocks, offsets, sizes):
    for i in range(len(blocks)):
        for j in range(i):
            a, b = blocks[i], blocks[j]
            if a.start <= b.end and b.start <= a.end:
                if offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]:
                    return (i, j)
    return None


def test_blocks_that_never_meet_share_addresses():
    blocks = [FastBlock(0, 0, 3, 640), FastBlock(1, 4, 7, 640), FastBlock(2, 2, 5, 64)]
    layout = assign_offsets(blocks)
    assert layout.offsets[0] == layout.offsets[1] == 0  # the two big ones reuse the same bytes
    assert layout.offsets[2] == 640
    assert layout.arena_bytes == layout.peak_bytes == 704


def test_best_fit_takes_the_smallest_gap():
    # largest first: A, C, B, E, G; the short C and E leave holes of 192 and 64 bytes from step 2
    A, C, B, E, G = (FastBlock(0, 0, 9, 256), FastBlock(1, 0, 1, 192), FastBlock(2, 0, 9, 128),
                     FastBlock(3, 0, 1, 64), FastBlock(4, 0, 9, 32))
    F = FastBlock(5, 5, 6, 32)
    layout = assign_offsets([A, C, B, E, G, F], alignment=1)
    assert layout.offsets == (0, 256, 448, 576, 640, 576)  # F takes E's 64-byte hole, not C's
    assert layout.arena_bytes == layout.peak_bytes == 672


def test_a_layout_by_time_wins_where_largest_first_fragments():
    # largest first: C at 0, B above it (they meet at step 6), D at 0 (it never meets C);
    # A then meets D [0, 320) and B [384, 704): the 64-byte hole between is too small, so A
    # goes on top (832). Earliest first packs D, A, B from 0 up and C at 0 after D dies: the peak.
    A, B, C, D = (FastBlock(0, 2, 5, 128), FastBlock(1, 3, 6, 320), FastBlock(2, 6, 7, 384),
                  FastBlock(3, 1, 4, 320))
    layout = assign_offsets([A, B, C, D])
    assert layout.arena_bytes == layout.peak_bytes == 768
    assert layout.offsets == (320, 448, 0, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**9), st.integers(0, 50), st.floats(0.0, 0.8), st.floats(0.001, 3.0),
       st.integers(1, 10**6))
def test_the_defrag_cut_fits_a_plan_that_fragments_alike_and_always_progresses(budget, cut_pct, fill, frag, pinned):
    limit = budget + pinned  # pinned bytes count in the limit, not in the budget
    cut = budget * cut_pct // 100
    peak = max(1, int((limit - cut) * (1 - fill)))  # the plan solved for limit - cut
    arena = max(limit + 1, int(peak * (1 + frag)))  # it did not fit
    new = defrag_cut(cut, limit, arena, peak, budget)
    assert new >= cut + budget // 100  # progress: at least 1 % of the budget each time
    # a plan that fills the new budget and fragments in the same proportion fits
    assert (limit - new) * arena / peak <= limit * (1 + 1e-9)
    # and the cut is never more than the bytes lost (the earlier rule) when the plan filled its budget
    if fill == 0.0 and cut_pct == 0:
        assert new <= max(cut + budget // 100, arena - peak + budget // 100)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(1, 5000)), min_size=1, max_size=40))
def test_offsets_never_collide_and_the_arena_holds_the_peak(raw):
    blocks = [FastBlock(i, s, s + d, nb) for i, (s, d, nb) in enumerate(raw)]
    layout = assign_offsets(blocks)
    sizes = [-(-b.nbytes // ALIGNMENT) * ALIGNMENT for b in blocks]
    assert collide(blocks, layout.offsets, sizes) is None
    assert all(o % ALIGNMENT == 0 for o in layout.offsets)
    assert layout.arena_bytes >= layout.peak_bytes
    assert max(o + s for o, s in zip(layout.offsets, sizes)) == layout.arena_bytes
    # the aligned peak, by brute force
    peak = max(sum(s for b, s in zip(blocks, sizes) if b.start <= t <= b.end) for t in range(42))
    assert layout.peak_bytes == peak


def test_a_tensor_evicted_and_prefetched_has_two_blocks():
    g = chain_with_one_big_activation()
    p = with_arena(evict_all_activations_plan(g, "sync"), g)
    blocks = validate(p, g).fast_blocks
    big = [b for b in blocks if b.tensor == 0]
    # made while k0 runs (step 1), evicted before k1 (ends at step 1); back for k5 (steps 10..11)
    assert [(b.start, b.end) for b in big] == [(1, 1), (10, 11)]
    assert len(next(tp for tp in p.tensors if tp.id == 0).offsets) == 2
    # the blocks add up to the validator's fast bytes at every kernel
    fast = validate(p, g).fast_bytes
    for k in range(len(g.kernels)):
        assert sum(b.nbytes for b in blocks if b.start <= 2 * k + 1 <= b.end) == fast[k]
    assert p.arena_bytes >= validate(p, g).peak_fast_bytes


def test_the_validator_rejects_bad_offsets():
    g = chain_with_one_big_activation()
    p = with_arena(evict_all_activations_plan(g, "sync"), g)
    validate(p, g)
    by_id = {tp.id: tp for tp in p.tensors}
    # tensor 3 (tmp, 100 B) and tensor 2 (s1) are both fast while k2 runs: give them one address
    clash = dataclasses.replace(p, tensors=tuple(
        dataclasses.replace(tp, offsets=by_id[3].offsets) if tp.id == 2 else tp for tp in p.tensors))
    with pytest.raises(PlanError, match="arena collision"):
        validate(clash, g)
    outside = dataclasses.replace(p, arena_bytes=64)
    with pytest.raises(PlanError, match="outside the arena"):
        validate(outside, g)
    missing = dataclasses.replace(p, tensors=tuple(
        dataclasses.replace(tp, offsets=tp.offsets[:1]) if tp.id == 0 else tp for tp in p.tensors))
    with pytest.raises(PlanError, match="2 fast residencies but 1 arena offsets"):
        validate(missing, g)


def test_json_keeps_the_layout_and_reads_plans_without_one():
    g = chain_with_one_big_activation()
    p = with_arena(evict_all_activations_plan(g, "async"), g)
    q = Plan.from_json(p.to_json())
    assert q.arena_bytes == p.arena_bytes and q.tensors == p.tensors
    validate(q, g)
    d = p.to_dict()
    del d["arena_bytes"]
    for t in d["tensors"]:
        t.pop("offsets", None)
    old = Plan.from_dict(d)
    assert old.arena_bytes is None and all(tp.offsets == () for tp in old.tensors)


@st.composite
def graph_and_plan(draw):
    n = draw(st.integers(3, 14))
    sizes, kernels, live = [], [], []
    for _ in range(n):
        reads = draw(st.lists(st.sampled_from(live), max_size=3, unique=True)) if live else []
        sizes.append(draw(st.integers(1, 5000)))
        kernels.append((reads, [len(sizes) - 1]))
        live.append(len(sizes) - 1)
    g = make_graph(sizes, kernels, outputs=(len(sizes) - 1,), roles={len(sizes) - 1: Role.OUTPUT})
    kind = draw(st.sampled_from(["sync", "async", "lru"]))
    if kind == "lru":
        need = max(sum(sizes[t] for t in set(ins) | set(outs)) for ins, outs in kernels)
        return g, lru_plan(g, draw(st.integers(need, max(need, g.peak_live_bytes))))
    return g, evict_all_activations_plan(g, kind)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_and_plan())
def test_every_plan_gets_a_layout_the_validator_accepts(case):
    g, p = case
    q = with_arena(p, g)
    report = validate(q, g)  # checks every offset
    assert q.arena_bytes >= report.peak_fast_bytes
    assert q.meta.fragmentation >= 0
    steps = 2 * len(g.kernels)
    held = np.zeros(steps, dtype=np.int64)
    for b in report.fast_blocks:
        held[b.start:b.end + 1] += b.nbytes
    assert held.max() == report.peak_fast_bytes


def test_plan_re_solves_for_less_when_the_arena_does_not_fit():
    # a graph (found by search) whose optimal plan at this budget packs into 20480 bytes
    sizes = [3072, 8192, 8192, 1024, 8192, 1024, 5120, 7168, 6144]
    kernels = [([], [0]), ([], [1]), ([], [2]), ([2], [3]), ([0], [4]), ([0, 3], [5]), ([], [6]), ([2, 5], [7]),
               ([3], [8])]
    g = make_graph(sizes, kernels, outputs=(8,), roles={8: Role.OUTPUT})
    cm = cost_model(g, [1e-3] * 9, bw=5e6, latency=1e-5)
    budget = 20186
    p = plan(g, cm, budget, "synchronous", mip_gap=1e-6)
    history = p.meta.defrag_history  # (budget solved for, arena, fragmentation, predicted)
    # (and after the first plan that fits, one more solve from it for the same budget)
    assert history[0][1] > budget and p.meta.defrag_retries == len({h[0] for h in history}) - 1 >= 1
    assert p.meta.arena_fits and p.arena_bytes == p.meta.arena_bytes <= budget
    assert p.meta.solver_budget_bytes < p.meta.requested_budget_bytes == budget
    assert p.meta.predicted_seconds >= history[0][3]  # a lower budget costs time
    validate(p, g)
    assert validate(p, g).peak_fast_bytes <= p.meta.solver_budget_bytes
    # without re-solving, the first plan comes back with a warning
    q = plan(g, cm, budget, "synchronous", mip_gap=1e-6, defrag_retries=0)
    assert not q.meta.arena_fits and q.arena_bytes > budget and "exceeds the budget" in q.meta.warning
    assert plan(g, cm, budget, "synchronous", mip_gap=1e-6, arena=False).arena_bytes is None


def test_a_re_solve_starts_near_the_plan_that_did_not_fit_within_the_same_time_limit(monkeypatch):
    """The re-solve is given the plan that fragmented as its reference point and what is
    left of the call's time limit (at least RESOLVE_SHARE of it), not a fresh limit; the
    first solve leaves that share; a plan that fits at the gap asked for is not solved
    again (one that fits short of it gets what is left, from it, for the same budget)."""
    import autotm.planner as planner

    sizes = [3072, 8192, 8192, 1024, 8192, 1024, 5120, 7168, 6144]
    kernels = [([], [0]), ([], [1]), ([], [2]), ([2], [3]), ([0], [4]), ([0, 3], [5]), ([], [6]), ([2, 5], [7]),
               ([3], [8])]
    g = make_graph(sizes, kernels, outputs=(8,), roles={8: Role.OUTPUT})
    cm = cost_model(g, [1e-3] * 9, bw=5e6, latency=1e-5)
    calls = []
    solve = planner._solve

    def spied(*args, **kwargs):
        calls.append((kwargs["time_limit"], kwargs["previous"]))
        return solve(*args, **kwargs)
    monkeypatch.setattr(planner, "_solve", spied)
    limit = 20.0
    p = plan(g, cm, 20186, "synchronous", mip_gap=1e-6, time_limit=limit)
    history = p.meta.defrag_history
    assert len(calls) == len(history) >= 2
    assert calls[0] == (pytest.approx((1 - planner.RESOLVE_SHARE) * limit), None)
    for (t, previous), before in zip(calls[1:], history):
        assert planner.RESOLVE_SHARE * limit <= t < limit
        assert previous is not None and previous.meta.solver_budget_bytes == before[0]
    assert p.meta.status == "Optimal" and not p.meta.polish  # (its gap: to the bound at the budget asked)
    assert history[-1][1] <= 20186 < min(h[1] for h in history[:-1])
    assert "previous attempt" in p.meta.searched_near
    assert p.meta.arena_fits and validate(p, g).peak_fast_bytes <= p.meta.solver_budget_bytes


def _overlap(a, b):
    return a.start <= b.end and b.start <= a.end


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(1, 200_000)), min_size=2, max_size=30),
       st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=10))
def test_shared_blocks_get_one_offset_and_nothing_else_collides(raw, pairs):
    blocks = [FastBlock(i, s, s + d, nb) for i, (s, d, nb) in enumerate(raw)]
    n = len(blocks)
    # pair only blocks that never meet and have one size (what shared_storage asks for)
    same = []
    group = list(range(n))
    for a, b in pairs:
        a, b = a % n, b % n
        ga = [i for i in range(n) if group[i] == group[a]]
        gb = [i for i in range(n) if group[i] == group[b]]
        if group[a] != group[b] and blocks[a].nbytes == blocks[b].nbytes and not any(
                _overlap(blocks[x], blocks[y]) for x in ga for y in gb):
            same.append((a, b))
            old = group[b]
            group = [group[a] if g == old else g for g in group]
    layout = assign_offsets(blocks, same=same, large_alignment=4096)
    for a, b in same:
        assert layout.offsets[a] == layout.offsets[b]
    for i, b in enumerate(blocks):
        assert layout.offsets[i] % (4096 if b.nbytes >= 64 << 10 else ALIGNMENT) == 0
    sizes = [-(-b.nbytes // (4096 if b.nbytes >= 64 << 10 else ALIGNMENT)) * (4096 if b.nbytes >= 64 << 10 else ALIGNMENT)
             for b in blocks]
    for i in range(n):
        for j in range(i):
            if group[i] != group[j] and _overlap(blocks[i], blocks[j]):
                assert not (layout.offsets[i] < layout.offsets[j] + sizes[j]
                            and layout.offsets[j] < layout.offsets[i] + sizes[i]), (i, j)
    assert max(o + s for o, s in zip(layout.offsets, sizes)) == layout.arena_bytes


def test_an_output_may_be_written_over_an_input_that_dies_at_its_kernel():
    from autotm.ir.plan import all_fast_plan

    # k1 reads t0 for the last time and makes t1 of the same size (an in-place update)
    g = make_graph([4096, 4096, 64], [([], [0]), ([0], [1]), ([1], [2])], outputs=(2,), roles={2: Role.OUTPUT})
    p = with_arena(all_fast_plan(g), g)
    by_hand = {0: (0,), 1: (0,), 2: (4096,)}
    over = dataclasses.replace(p, arena_bytes=4160, tensors=tuple(
        dataclasses.replace(tp, offsets=by_hand[tp.id]) for tp in p.tensors))
    validate(over, g)
    # t0 read again by k2: it does not die at k1, so t1 may not take its bytes
    g2 = make_graph([4096, 4096, 64], [([], [0]), ([0], [1]), ([0, 1], [2])], outputs=(2,), roles={2: Role.OUTPUT})
    p2 = with_arena(all_fast_plan(g2), g2)
    clash = dataclasses.replace(p2, arena_bytes=4160, tensors=tuple(
        dataclasses.replace(tp, offsets=by_hand[tp.id]) for tp in p2.tensors))
    with pytest.raises(PlanError, match="arena collision"):
        validate(clash, g2)


def test_no_re_solve_goes_under_the_smallest_feasible_budget(monkeypatch):
    """At the smallest feasible budget no re-solve can follow, so the first solve has the
    whole time limit; and a defrag cut that would go under it stops there instead (the
    re-solve then has the most room for a layout that any plan can have)."""
    import autotm.planner as planner
    from autotm.planner.staged import smallest_budget

    sizes = [3072, 8192, 8192, 1024, 8192, 1024, 5120, 7168, 6144]
    kernels = [([], [0]), ([], [1]), ([], [2]), ([2], [3]), ([0], [4]), ([0, 3], [5]), ([], [6]), ([2, 5], [7]),
               ([3], [8])]
    g = make_graph(sizes, kernels, outputs=(8,), roles={8: Role.OUTPUT})
    cm = cost_model(g, [1e-3] * 9, bw=5e6, latency=1e-5)
    floor = smallest_budget(g)
    assert 0 < floor < 20186
    with pytest.raises(planner.InfeasibleBudget):
        plan(g, cm, floor - 1, "synchronous")
    calls = []
    solve = planner._solve

    def spied(*args, **kwargs):
        calls.append((args[3], kwargs["time_limit"]))  # (budget solved for, its time limit)
        return solve(*args, **kwargs)
    monkeypatch.setattr(planner, "_solve", spied)
    p = plan(g, cm, floor, "synchronous", mip_gap=1e-6, time_limit=20.0)
    # (the whole limit, less what the call spent before the solve: it bounds the call)
    assert [b for b, _ in calls] == [floor] and 19.0 < calls[0][1] <= 20.0 and len(p.meta.defrag_history) == 1
    # a cut past the floor (as a plan fragmenting by a third would ask) is cut back to it
    calls.clear()
    monkeypatch.setattr(planner, "defrag_cut", lambda cut, limit, *a: limit)
    p = plan(g, cm, 20186, "synchronous", mip_gap=1e-6, time_limit=20.0)
    assert [b for b, _ in calls] == [20186, floor]
    assert p.meta.arena_fits and p.meta.solver_budget_bytes == floor
    validate(p, g)
