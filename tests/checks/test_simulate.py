"""simulate(): exact arithmetic on hand-built graphs, plans and cost models; CostModel JSON."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from autotm.ir.costmodel import CostModel, MoveCost, operand_tensors
from autotm.ir.graph import Role, TrainingGraph
from autotm.ir.plan import PLAN_VERSION, Action, Plan, PlanError, TensorPlan, all_fast_plan
from autotm.checks.simulate import simulate
from graphs import make_graph


def g5(program=None) -> TrainingGraph:
    """w(0) -> k0 -> a1(1) -> k1 -> a2(2) -> k2 -> a3(3) -> k3 -> loss(4); k4 reads a1, loss, w -> grad(5).

    Bytes: w 100, a1 1000, a2 10, a3 10, loss 4, grad 100.
    """
    return make_graph([100, 1000, 10, 10, 4, 100],
                      [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4, 0], [5])],
                      roles={0: Role.WEIGHT, 4: Role.OUTPUT, 5: Role.GRADIENT}, outputs=(4, 5), program=program)


# moves: to_slow sync 0.5 + n/1000 ; to_fast sync 0.25 + n/2000 ; async: n/100 and n/200
MOVES = {("to_slow", "sync"): MoveCost(0.5, 1000.0), ("to_fast", "sync"): MoveCost(0.25, 2000.0),
         ("to_slow", "async"): MoveCost(0.0, 100.0), ("to_fast", "async"): MoveCost(0.0, 200.0)}
KSEC = (1.0, 2.0, 3.0, 4.0, 5.0)


def cost_model(g, *, access="staged", placement_seconds=None) -> CostModel:
    return CostModel(graph_fingerprint=g.fingerprint, memory_system="hand", access=access, kernel_seconds=KSEC,
                     placement_seconds=placement_seconds or {}, moves=MOVES, simulated=False, environment={})


def plan_with(g, actions: dict, *, access="staged", initial=None) -> Plan:
    initial = initial or {}
    tps = tuple(TensorPlan(t.id, initial.get(t.id, "fast"), tuple(actions.get(t.id, ()))) for t in g.tensors)
    return Plan(version=PLAN_VERSION, graph_name=g.name, graph_fingerprint=g.fingerprint, memory_system="hand",
                access=access, budget_bytes=None, planner="hand", tensors=tps)


def test_all_fast_is_the_sum_of_kernel_times():
    g = g5()
    sim = simulate(all_fast_plan(g), g, cost_model(g))
    assert sim.predicted_seconds == pytest.approx(15.0)
    assert sim.sync_move_seconds == 0.0
    np.testing.assert_allclose(sim.kernel_seconds, KSEC)
    assert sim.peak_fast_bytes == 100 + 1000 + 4 + 100  # at k4: w, a1, loss, grad
    assert not sim.simulated


def test_sync_moves_serialize_with_compute():
    g = g5()
    # a1: evict sync at k2 (write 1000 B: 0.5 + 1.0), prefetch sync at k4 (0.25 + 0.5)
    plan = plan_with(g, {1: [Action("evict", 2, "sync"), Action("prefetch", 4, "sync")]})
    sim = simulate(plan, g, cost_model(g))
    assert sim.sync_move_seconds == pytest.approx(1.5 + 0.75)
    assert sim.predicted_seconds == pytest.approx(15.0 + 2.25)
    np.testing.assert_allclose(sim.kernel_seconds, KSEC)
    assert sim.fast_bytes[2] == 100 + 10 + 10 and sim.fast_bytes[3] == 100 + 10 + 4


def test_drop_costs_nothing():
    g = g5()
    plan = plan_with(g, {1: [Action("evict", 2, "sync", keep_fast=True), Action("drop", 3, "sync"),
                             Action("prefetch", 4, "sync")]})
    sim = simulate(plan, g, cost_model(g))
    assert sim.predicted_seconds == pytest.approx(15.0 + 1.5 + 0.75)


def test_async_moves_overlap_their_kernel_and_queue_on_one_worker():
    g = g5()
    # async evict of a1 at k2: 1000/100 = 10 s > kernel 3 s -> k2 costs 10
    # async prefetch at k3: 1000/200 = 5 s > kernel 4 s -> k3 costs 5
    plan = plan_with(g, {1: [Action("evict", 2, "async"), Action("prefetch", 3, "async")]})
    sim = simulate(plan, g, cost_model(g))
    np.testing.assert_allclose(sim.kernel_seconds, [1.0, 2.0, 10.0, 5.0, 5.0])
    assert sim.predicted_seconds == pytest.approx(23.0)
    assert sim.sync_move_seconds == 0.0
    assert sim.async_move_seconds == pytest.approx(15.0)


def test_async_copy_shorter_than_its_kernel_is_hidden():
    g = make_graph([100, 40, 10, 4], [([0], [1]), ([1], [2]), ([2], [3]), ([1, 3], [])], outputs=(3,))
    # t1 (40 B) used at k1 and k3: evict async at k2 (40/100 = 0.4 < 3), prefetch sync at k3 (0.25 + 0.02)
    plan = plan_with(g, {1: [Action("evict", 2, "async"), Action("prefetch", 3, "sync")]})
    cm = CostModel(g.fingerprint, "hand", "staged", (1.0, 2.0, 3.0, 4.0), {}, MOVES, False, {})
    sim = simulate(plan, g, cm)
    np.testing.assert_allclose(sim.kernel_seconds, [1.0, 2.0, 3.0, 4.0])
    assert sim.predicted_seconds == pytest.approx(10.0 + 0.27)


def test_two_async_copies_at_one_kernel_add_up():
    # t1 and t2 both live across k3 unused there: both evicted async at k3
    g = make_graph([8, 400, 200, 4, 4, 4],
                   [([0], [1]), ([0], [2]), ([0], [3]), ([3], [4]), ([1, 2, 4], [5])], outputs=(5,))
    plan = plan_with(g, {1: [Action("evict", 3, "async"), Action("prefetch", 4, "sync")],
                         2: [Action("evict", 3, "async"), Action("prefetch", 4, "sync")]})
    sim = simulate(plan, g, cost_model(g))
    # k3: max(4, 400/100 + 200/100 = 6) = 6 ; k4 sync prefetches: (0.25 + 0.2) + (0.25 + 0.1)
    np.testing.assert_allclose(sim.kernel_seconds, [1.0, 2.0, 3.0, 6.0, 5.0])
    assert sim.predicted_seconds == pytest.approx(17.0 + 0.8)


def test_copies_at_one_kernel_overlap_as_far_as_a_measured_pair_did():
    # t1 (400 B: 4 s alone) and t2 (200 B: 2 s) evicted async together at k3 (4 s)
    g = make_graph([8, 400, 200, 4, 4, 4],
                   [([0], [1]), ([0], [2]), ([0], [3]), ([3], [4]), ([1, 2, 4], [5])], outputs=(5,))
    plan = plan_with(g, {1: [Action("evict", 3, "async"), Action("prefetch", 4, "sync")],
                         2: [Action("evict", 3, "async"), Action("prefetch", 4, "sync")]})

    def with_pair(points):
        moves = dict(MOVES)
        if points is not None:
            moves[("to_slow", "pair")] = MoveCost(0.0, 100.0, points)
        return CostModel(g.fingerprint, "hand", "staged", KSEC, {}, moves, False, {}, async_overlap=True)

    # two copies of 200 B took 3 s, of 400 B 5 s: a second copy adds 1 s at either size, so
    # A = 1 + 1 + max(4 - 1, 2 - 1) = 5
    cm = with_pair(((200, 3.0), (400, 5.0)))
    assert cm.async_marginal_seconds(400, "to_slow") == pytest.approx(1.0)
    assert cm.async_seconds([(400, "to_slow"), (200, "to_slow")]) == pytest.approx(5.0)
    assert simulate(plan, g, cm).kernel_seconds[3] == pytest.approx(5.0)
    assert CostModel.from_json(cm.to_json()) == cm
    # a pair slower than two copies one after another (1 MiB AIO writes here): each in full
    assert simulate(plan, g, with_pair(((200, 9.0), (400, 20.0)))).kernel_seconds[3] == pytest.approx(6.0)
    # a pair as fast as one copy: the second adds nothing, A = the longer copy
    assert simulate(plan, g, with_pair(((200, 1.0), (400, 3.0)))).kernel_seconds[3] == pytest.approx(4.0)
    # no pair measured: the bytes at the fitted bandwidth (here the whole copy: no latency)
    assert simulate(plan, g, with_pair(None)).kernel_seconds[3] == pytest.approx(6.0)


def test_a_copy_in_flight_slows_its_kernel():
    # slowdown 1.0 while writing (g = 1/2 of the copy's time), 0.25 while reading (g = 1/5)
    g = make_graph([100, 40, 10, 4], [([0], [1]), ([1], [2]), ([2], [3]), ([1, 3], [])], outputs=(3,))
    cm = CostModel(g.fingerprint, "hand", "staged", (1.0, 2.0, 3.0, 4.0), {}, MOVES, False, {},
                   copy_interference={"to_slow": 1.0, "to_fast": 0.25})
    # evict of t1 (40 B / 100 = 0.4 s) over k2 (3 s): k2 loses 0.2 s
    sim = simulate(plan_with(g, {1: [Action("evict", 2, "async"), Action("prefetch", 3, "sync")]}), g, cm)
    assert sim.kernel_seconds[2] == pytest.approx(3.2)
    # a prefetch (40 / 200 = 0.2 s) over k3 (4 s) of a 5-kernel chain: 0.04 s
    g6 = make_graph([100, 40, 10, 10, 4], [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4], [])],
                    outputs=(4,))
    cm6 = CostModel(g6.fingerprint, "hand", "staged", (1.0, 2.0, 3.0, 4.0, 5.0), {}, MOVES, False, {},
                    copy_interference={"to_slow": 1.0, "to_fast": 0.25})
    sim = simulate(plan_with(g6, {1: [Action("evict", 2, "sync"), Action("prefetch", 3, "async")]}), g6, cm6)
    assert sim.kernel_seconds[3] == pytest.approx(4.04)
    # a copy much longer than its kernel: the kernel ends inside it, the copy's time counts
    g5_ = g5()
    cm5 = CostModel(g5_.fingerprint, "hand", "staged", KSEC, {}, MOVES, False, {}, copy_interference={"to_slow": 1.0})
    sim = simulate(plan_with(g5_, {1: [Action("evict", 2, "async"), Action("prefetch", 4, "sync")]}), g5_, cm5)
    assert sim.kernel_seconds[2] == pytest.approx(10.0)  # max(3, 10, 3 + 5)
    assert cm5.interference_share() == pytest.approx(0.5) and cm5.interference_share("to_fast") == 0.0
    assert CostModel.from_json(cm5.to_json()) == cm5


def test_async_moves_host_time_is_serial():
    # the issuing thread's own part of an async copy (host: 0.5 + n/1000 to slow, 0.25 to
    # fast) adds to the iteration; no kernel hides it, and the copy itself still overlaps
    g = g5()
    moves = dict(MOVES)
    moves[("to_slow", "host")] = MoveCost(0.5, 1000.0)
    moves[("to_fast", "host")] = MoveCost(0.25, 1e18)
    cm = CostModel(g.fingerprint, "hand", "staged", KSEC, {}, moves, False, {})
    plan = plan_with(g, {1: [Action("evict", 2, "async"), Action("prefetch", 3, "async")]})
    sim = simulate(plan, g, cm)
    np.testing.assert_allclose(sim.kernel_seconds, [1.0, 2.0, 10.0, 5.0, 5.0])
    assert sim.async_host_seconds == pytest.approx(1.5 + 0.25)
    assert sim.predicted_seconds == pytest.approx(23.0 + 1.75)
    assert cm.async_host_seconds(0, "to_slow") == 0.0
    assert cost_model(g).async_host_seconds(1000, "to_slow") == 0.0  # not profiled: nothing
    assert CostModel.from_json(cm.to_json()) == cm


def test_direct_access_uses_the_placement_of_each_kernel():
    g = g5()
    # w (input) starts slow: k0 reads it in slow memory, k4 too (operands: a1, loss, w, grad)
    ps = {0: {("slow", "fast"): 1.5}, 4: {("fast", "fast", "slow", "fast"): 7.0}}
    plan = plan_with(g, {}, access="direct", initial={0: "slow"})
    sim = simulate(plan, g, cost_model(g, access="direct", placement_seconds=ps))
    np.testing.assert_allclose(sim.kernel_seconds, [1.5, 2.0, 3.0, 4.0, 7.0])
    assert sim.predicted_seconds == pytest.approx(17.5)


def test_direct_output_written_to_slow_is_a_slow_operand():
    g = g5()
    ps = {0: {("fast", "slow"): 1.25}, 1: {("slow", "fast"): 2.5},
          4: {("slow", "fast", "fast", "fast"): 6.0}}
    plan = plan_with(g, {}, access="direct", initial={1: "slow"})
    sim = simulate(plan, g, cost_model(g, access="direct", placement_seconds=ps))
    np.testing.assert_allclose(sim.kernel_seconds, [1.25, 2.5, 3.0, 4.0, 6.0])


def test_carry_and_input_moves():
    # w (tensor 0) is a weight whose updated value is grad (tensor 5): "param:w" in and out;
    # a batch input (tensor 6) starts slow and is not carried.
    prog = SimpleNamespace(input_keys=[("param:w", 0), ("batch:0", 6)], output_keys={"param:w": 5, "loss": 4})
    g = make_graph([100, 1000, 10, 10, 4, 100, 40],
                   [([0, 6], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4, 0], [5])],
                   roles={0: Role.WEIGHT, 4: Role.OUTPUT, 5: Role.WEIGHT}, outputs=(4, 5), program=prog)
    cm = cost_model(g, access="direct", placement_seconds={0: {("slow", "slow", "fast"): 1.0},
                                                            4: {("fast", "fast", "slow", "fast"): 5.0}})
    plan = plan_with(g, {}, access="direct", initial={0: "slow", 6: "slow"})
    sim = simulate(plan, g, cm)
    # T_in: batch 40 B to slow: 0.5 + 0.04 ; T_out: new w (100 B, fast at the end) carried: 0.5 + 0.1
    assert sim.sync_move_seconds == pytest.approx(0.54 + 0.6)
    assert sim.predicted_seconds == pytest.approx(15.0 + 1.14)
    # nothing starts slow: no input or carry moves
    assert simulate(plan_with(g, {}, access="direct"), g, cm).sync_move_seconds == 0.0


def test_staged_output_evicted_at_the_end_is_read_back():
    prog = SimpleNamespace(input_keys=[("param:w", 0)], output_keys={"param:w": 5, "loss": 4})
    g = make_graph([100, 1000, 10, 10, 4, 100, 8],
                   [([0], [1]), ([1], [2]), ([2], [3]), ([3], [4]), ([1, 4, 0], [5]), ([5], [6])],
                   roles={0: Role.WEIGHT, 4: Role.OUTPUT, 5: Role.WEIGHT}, outputs=(4, 5), program=prog)
    cm = CostModel(g.fingerprint, "hand", "staged", KSEC + (1.0,), {}, MOVES, False, {})
    # loss (4 B) evicted sync at k5 and never prefetched: returned with to_fast (0.25 + 0.002)
    plan = plan_with(g, {4: [Action("evict", 5, "sync")]})
    sim = simulate(plan, g, cm)
    assert sim.sync_move_seconds == pytest.approx((0.5 + 0.004) + (0.25 + 0.002))


def test_cost_model_mismatch_is_rejected():
    g = g5()
    cm = CostModel("other", "hand", "staged", KSEC, {}, MOVES, False, {})
    with pytest.raises(PlanError, match="fingerprint"):
        simulate(all_fast_plan(g), g, cm)


def test_kernel_time_and_json_round_trip():
    g = g5()
    ps = {4: {("slow", "fast", "fast", "fast"): 6.0, ("fast", "slow", "fast", "fast"): 5.5,
              ("fast", "fast", "slow", "fast"): 5.25, ("fast", "fast", "fast", "slow"): 5.0,
              ("slow",) * 4: 6.5}}
    cm = cost_model(g, access="direct", placement_seconds=ps)
    assert cm.kernel_time(4) == 5.0 and cm.kernel_time(4, ("fast",) * 4) == 5.0
    assert cm.kernel_time(4, ("slow", "fast", "fast", "fast")) == 6.0
    # not profiled: additive slowdowns (1.0 + 0.5), capped at the all-slow time
    assert cm.kernel_time(4, ("slow", "slow", "fast", "fast")) == pytest.approx(6.5)
    assert cm.kernel_time(4, ("fast", "slow", "slow", "fast")) == pytest.approx(5.75)
    assert cm.move_seconds(1000, "to_slow", "sync") == pytest.approx(1.5)
    assert cm.move_seconds(0, "to_slow", "sync") == 0.0
    back = CostModel.from_json(cm.to_json())
    assert back == cm
    assert operand_tensors((3, 1), (1, 2)) == (3, 1, 2)


def test_kernels_after_an_idle_wait_pay_their_wake_time():
    # W_k: what kernels k and k + 1 lose when the thread waited idle on the slow tier before k
    g = g5()
    W = (0.01, 0.02, 0.04, 0.08, 0.16)
    cm = CostModel(g.fingerprint, "hand", "staged", KSEC, {}, MOVES, False, {}, wake_seconds=W)
    plain = cost_model(g)

    def extra(actions):
        p = plan_with(g, actions)
        sim, base = simulate(p, g, cm), simulate(p, g, plain)
        assert sim.predicted_seconds == pytest.approx(base.predicted_seconds + sim.wake_seconds)
        return sim.wake_seconds

    # sync copies before k2 and k4
    assert extra({1: [Action("evict", 2, "sync"), Action("prefetch", 4, "sync")]}) == pytest.approx(0.04 + 0.16)
    # two sync prefetches before k4 wake it once; a1's async write over k3 (1000 B / 100 B/s
    # = 10 s > 4 s) also ends in a wait before k4; w's sync write wakes k1
    assert extra({1: [Action("evict", 3, "async"), Action("prefetch", 4, "sync")],
                  0: [Action("evict", 1, "sync"), Action("prefetch", 4, "sync")]}) == pytest.approx(0.02 + 0.16)
    # an async copy longer than its kernel wakes the next one: a1 over k2 (10 s > 3 s)
    assert extra({1: [Action("evict", 2, "async"), Action("prefetch", 4, "sync")]}) == pytest.approx(0.08 + 0.16)
    # copies shorter than their kernels leave nothing to wake from
    # (w: 100 B written over k1 in 1 s < 2 s, read over k3 in 0.5 s < 4 s)
    assert extra({0: [Action("evict", 1, "async"), Action("prefetch", 3, "async")]}) == 0.0
    assert extra({}) == 0.0
    assert CostModel.from_json(cm.to_json()) == cm
    assert plain.wake(5).tolist() == [0.0] * 5 and cm.wake(5).tolist() == list(W)
