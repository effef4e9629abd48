"""HiGHS in a worker process (planner/highs_worker.py): the same plans as in-process, and
a time limit that holds even where HiGHS itself would not stop."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import highspy
import numpy as np
import pytest

import autotm
from autotm.planner import highs_driver, highs_worker, plan
from autotm.planner.highs_worker import ORPHANED, improve_start, request, rins, run_isolated
from autotm.checks.simulate import simulate
from autotm.checks.validate import validate
from children import stop
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


# A multi-dimensional knapsack HiGHS works on for minutes (300 binaries, 30 rows: rins()
# from nothing packed ran its sub-MIP to a 60 s limit on 2 cores), with its log on: "B&B
# Tree" says a tree search has begun.
LONG_SOLVE = textwrap.dedent("""
    import os, sys
    import highspy
    import numpy as np
    from autotm.planner.highs_worker import request, run_isolated, watch_parent

    def long_model():
        n, m = 300, 30
        rng = np.random.default_rng(0)
        w = rng.integers(10, 100, (m, n)).astype(float)
        h = highspy.Highs()
        h.setOptionValue("output_flag", True)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("time_limit", 120.0)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, m
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = -rng.integers(10, 100, n).astype(float), np.zeros(n), np.ones(n)
        lp.row_lower_, lp.row_upper_ = np.full(m, -np.inf), w.sum(axis=1) / 3
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
        lp.a_matrix_.start_ = np.arange(0, n * m + 1, n, dtype=np.int32)
        lp.a_matrix_.index_ = np.tile(np.arange(n, dtype=np.int32), m)
        lp.a_matrix_.value_ = w.ravel()
        h.passModel(lp)
        return h, lp
""")
# the planner: the long model solved in a worker process (its log on this process's
# stderr), which first runs rins() for most of the time limit. rins() reports nothing until
# it ends, as HiGHS's central rounding (the module's docstring): a worker killed there would
# not learn from a message it failed to send that its planner is gone.
PLANNER = LONG_SOLVE + textwrap.dedent("""
    h, lp = long_model()
    run_isolated(highspy, request(h, lp, np.zeros(lp.num_col_), rins_share=0.9), deadline=300, verbose=True)
""")
# a process that starts `argv[1]` (python code), prints its pid and waits for it
MIDDLE = textwrap.dedent("""
    import subprocess, sys
    p = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    print(p.pid, flush=True)
    p.wait()
""")
# the long model solved in this process, which only watch_parent ends if its parent dies
WATCHED = LONG_SOLVE + textwrap.dedent("""
    watch_parent(os.getppid())
    h, lp = long_model()
    h.run()
""")


def _env():
    """The environment for a child process that imports this checkout's autotm."""
    src = str(Path(autotm.__file__).parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}


def _read_until(stream, text, timeout=90):
    """What `stream` gave until `text` appeared in it (a generous timeout: a loaded machine)."""
    got, end = b"", time.monotonic() + timeout
    while text.encode() not in got:
        left = end - time.monotonic()
        assert left > 0, f"no {text!r} within {timeout} s:\n{got.decode(errors='replace')[-2000:]}"
        if select.select([stream], [], [], min(left, 0.5))[0]:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"the stream ended before {text!r}:\n{got.decode(errors='replace')[-2000:]}"
            got += chunk
    return got.decode(errors="replace")


def _stat(pid):
    """(state, parent pid, start time) of a process, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1]), fields[19]


def _children(pid):
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and (_stat(d) or ("", 0))[1] == pid]


def _alive(pid, start):
    """Is the process `pid` that started at `start` still running (a zombie is not)?"""
    st = _stat(pid)
    return st is not None and st[0] not in "ZX" and st[2] == start


def _killed_then_gone(parent, child, timeout=15):
    """SIGKILL `parent` while `child` runs; whether `child` has ended within `timeout` s."""
    start = _stat(child)[2]
    assert parent.poll() is None and _alive(child, start)  # (mid-solve, both)
    parent.kill()
    parent.wait()
    end = time.monotonic() + timeout
    while _alive(child, start) and time.monotonic() < end:
        time.sleep(0.05)
    gone = not _alive(child, start)
    if not gone:
        os.kill(child, signal.SIGKILL)  # (left running, it would burn a CPU for minutes)
    return gone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes in /proc")
def test_a_worker_dies_with_its_planner_process_killed_mid_solve():
    planner = subprocess.Popen([sys.executable, "-c", PLANNER], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=_env())
    try:
        _read_until(planner.stderr, "B&B Tree")  # the worker's HiGHS is in its tree search
        workers = _children(planner.pid)
        assert len(workers) == 1, workers
        assert _killed_then_gone(planner, workers[0]), "the worker outlived its planner"
    finally:
        stop(planner)
        planner.stderr.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes in /proc")
def test_watch_parent_ends_a_process_inside_highs_when_its_parent_is_killed():
    """The watchdog alone (other platforms than Linux have only it): it runs while the main
    thread is inside HiGHS's run()."""
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, WATCHED], stdout=subprocess.PIPE, env=_env())
    try:
        solver = int(_read_until(middle.stdout, "B&B Tree").split()[0])  # (its pid, then its HiGHS log)
        assert _killed_then_gone(middle, solver), "the solver outlived its parent"
    finally:
        stop(middle)
        middle.stdout.close()


def test_a_worker_whose_planner_died_before_it_started_exits_at_once():
    """The planner died before the worker could ask to die with it: the worker's parent is
    then another process than the one named, and it exits without waiting for a request."""
    r, w = os.pipe()
    worker = subprocess.Popen([sys.executable, highs_worker.__file__, str(w), str(os.getppid())],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(w,))
    os.close(w)
    try:
        assert worker.wait(timeout=60) == ORPHANED  # (its stdin open: a worker going on would wait)
    finally:
        stop(worker)
        worker.stdin.close()
        os.close(r)
