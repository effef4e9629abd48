"""HiGHS in a worker process (planner/highs_worker.py): the same plans as in-process, and
a time limit that holds even where HiGHS itself would not stop."""

import time

import highspy
import numpy as np
import pytest

from autotm.planner import highs_driver, plan
from autotm.planner.highs_worker import improve_start, request, rins, run_isolated
from autotm.checks.simulate import simulate
from autotm.checks.validate import validate
from test_planner import chain_with_one_big_activation, cost_model


def knapsack(n=40, seed=0):
    """max value s.t. weight <= capacity, as a minimization: a MIP HiGHS branches on."""
    rng = np.random.default_rng(seed)
    w, v = rng.integers(10, 100, n).astype(float), rng.integers(10, 100, n).astype(float)
    h = highs_driver.quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("time_limit", 30.0)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, 1
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = -v, np.zeros(n), np.ones(n)
    lp.row_lower_, lp.row_upper_ = np.array([-np.inf]), np.array([w.sum() / 3])
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, 1
    lp.a_matrix_.start_ = np.array([0, n], dtype=np.int32)
    lp.a_matrix_.index_ = np.arange(n, dtype=np.int32)
    lp.a_matrix_.value_ = w
    h.passModel(lp)
    return h, lp


def test_the_worker_finds_what_highs_finds_in_process():
    h, lp = knapsack()
    x, info, status = run_isolated(highspy, request(h, lp, None), deadline=60)
    assert status == highspy.HighsModelStatus.kOptimal and info.primal_solution_status == 2
    h.run()
    assert float(lp.col_cost_ @ x) == pytest.approx(h.getInfo().objective_function_value, abs=1e-9)
    assert info.mip_dual_bound == pytest.approx(h.getInfo().mip_dual_bound, abs=1e-6)
    assert float(np.asarray(lp.a_matrix_.value_) @ x) <= lp.row_upper_[0] + 1e-9


def test_a_worker_past_its_deadline_is_killed_and_reports_a_time_limit():
    h, lp = knapsack()
    x0 = np.zeros(lp.num_col_)  # feasible: nothing packed
    x, info, status = run_isolated(highspy, request(h, lp, x0), deadline=0.01)  # before it has started
    assert status == highspy.HighsModelStatus.kTimeLimit
    assert x is None and info.primal_solution_status == 0


@pytest.mark.timing
def test_a_worker_past_its_deadline_is_killed_at_once():
    h, lp = knapsack()
    t = time.perf_counter()
    run_isolated(highspy, request(h, lp, np.zeros(lp.num_col_)), deadline=0.01)
    assert time.perf_counter() - t < 5


def test_a_worker_that_fails_is_an_error_not_a_time_limit():
    h, lp = knapsack()
    req = request(h, lp, None)
    req["index"] = req["index"][:-1]  # a matrix HiGHS rejects
    with pytest.raises(RuntimeError, match="worker process failed.*rejected the model"):
        run_isolated(highspy, req, deadline=60)


def test_plans_solved_in_a_worker_are_the_plans_solved_in_process(monkeypatch):
    g = chain_with_one_big_activation()
    cm = cost_model(g, [1.0] * 6)
    inproc = {f: plan(g, cm, 102, f, arena=False, mip_gap=1e-6) for f in ("synchronous", "asynchronous")}
    monkeypatch.setattr(highs_driver, "ISOLATE_MIN_INTEGERS", 0)  # every model to the worker
    for f, q in inproc.items():
        p = plan(g, cm, 102, f, arena=False, mip_gap=1e-6)
        assert validate(p, g).peak_fast_bytes <= 102
        assert simulate(p, g, cm).predicted_seconds == pytest.approx(q.meta.predicted_seconds, rel=1e-9)
        assert p.meta.bound_seconds == pytest.approx(q.meta.bound_seconds, rel=1e-6)
        assert p.meta.status == "Optimal"


@pytest.mark.parametrize("seed", range(4))
def test_rins_improves_a_poor_start_to_a_feasible_solution_no_better_than_the_optimum(seed):
    h, lp = knapsack(seed=seed)
    x0 = np.zeros(lp.num_col_)  # feasible and poor: nothing packed
    x = rins(highspy, request(h, lp, x0), x0, time_limit=30)
    assert x is not None
    w = np.asarray(lp.a_matrix_.value_)
    assert np.all(np.abs(x - np.round(x)) <= 1e-6) and float(w @ np.round(x)) <= lp.row_upper_[0] + 1e-9
    h.run()
    optimum = h.getInfo().objective_function_value
    assert optimum - 1e-9 <= float(lp.col_cost_ @ x) < 0.0  # packs something, never beats the optimum
    # from the optimum there is nothing to improve
    best = np.asarray(h.getSolution().col_value)
    assert rins(highspy, request(h, lp, best), best, time_limit=30) is None


def test_the_worker_with_rins_first_ends_at_the_same_optimum():
    h, lp = knapsack(seed=1)
    x0 = np.zeros(lp.num_col_)
    plain = run_isolated(highspy, request(h, lp, x0, rins_share=0.0), deadline=60)
    searched = run_isolated(highspy, request(h, lp, x0, rins_share=0.4), deadline=60)
    for _, _, status in (plain, searched):
        assert status == highspy.HighsModelStatus.kOptimal
    assert float(lp.col_cost_ @ searched[0]) == pytest.approx(float(lp.col_cost_ @ plain[0]), abs=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_rins_from_a_point_over_the_capacity_returns_a_solution_that_fits(seed):
    """The arena's re-solve searches near the plan that broke the lower budget: rins()
    from a point that breaks a row returns a feasible solution, never below the optimum,
    and improve_start takes it over a poorer feasible start."""
    h, lp = knapsack(seed=seed)
    over = np.ones(lp.num_col_)  # everything packed: three times the capacity
    w = np.asarray(lp.a_matrix_.value_)
    assert float(w @ over) > lp.row_upper_[0]
    x = rins(highspy, request(h, lp, None), over, time_limit=30)
    assert x is not None
    assert np.all(np.abs(x - np.round(x)) <= 1e-6) and float(w @ np.round(x)) <= lp.row_upper_[0] + 1e-9
    h.run()
    optimum = h.getInfo().objective_function_value
    assert optimum - 1e-9 <= float(lp.col_cost_ @ x) < 0.0
    poor = np.zeros(lp.num_col_)
    y = improve_start(highspy, request(h, lp, poor, reference=over), time_limit=30)
    assert float(w @ y) <= lp.row_upper_[0] + 1e-9 and float(lp.col_cost_ @ y) < 0.0
    # without a reference, the search starts from the start itself
    z = improve_start(highspy, request(h, lp, poor), time_limit=30)
    assert float(lp.col_cost_ @ z) < 0.0
