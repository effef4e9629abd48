"""The HiGHS driver: the model passed as row-wise arrays, the solve from a warm start (or
from a better one found near a reference point), and the workarounds HiGHS 1.16 needs
(a worker process for large models, whose time limit HiGHS alone can overrun; the
solution its callback reported when getSolution() returns the start; the continuous
columns re-optimised when its reported objective is lower than its solution's)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SolverTimeout
from ..ir.plan_meta import SolverStats
from .highs_worker import REFERENCE_SHARE, RINS_SHARE, cheaper, feasible, improve_start, model_arrays, request, \
    run_isolated, set_start
from .model import FEASIBILITY_TOL, Rows, Vars

# HiGHS runs in a worker process, killed at the time limit, for models with this many
# integer columns or more (highs_worker: HiGHS overran its limit by several times on
# densenet264's models, and by 60 s on a 7,188-binary model: a 2-layer LSTM unrolled over
# 16 steps, synchronous at 4:1, 79 s for a 15 s limit in-process, 34 s for 30 s in the
# worker, whose neighbourhood search also found a plan 2.1x faster); smaller models solve
# in-process, without the process's start-up (the 6-layer MLP's 942)
ISOLATE_MIN_INTEGERS = 2_000


@dataclass
class Solve:
    """What solve_model found, filled as it runs: the solver's seconds (over every run),
    status, the returned solution's objective, its gap and the solver's bound (nan: none),
    and the start used when one was found near a reference (_run)."""
    solve_seconds: float = 0.0
    status: str = ""
    gap: float = 0.0
    objective: float = 0.0
    bound: float = float("nan")
    start: np.ndarray | None = None


def solver_stats(V: Vars, R: Rows, nonzeros: int, build_seconds: float, s: Solve) -> SolverStats:
    """The frozen record of one model and its solve."""
    return SolverStats(variables=V.n, binaries=V.binaries(), rows=R.n, nonzeros=nonzeros,
                       build_seconds=build_seconds, solve_seconds=s.solve_seconds, status=s.status, gap=s.gap,
                       objective=s.objective, bound=s.bound if math.isfinite(s.bound) else None,
                       families=R.families())


def highs_model(highspy: Any, V: Vars, R: Rows, offset: float, *, time_limit: float, mip_gap: float,
                threads: int | None, verbose: bool) -> tuple[Any, Any]:
    """A Highs object holding the model, passed in one call as row-wise arrays."""
    h = quiet_highs(highspy)
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("primal_feasibility_tolerance", FEASIBILITY_TOL)
    h.setOptionValue("mip_feasibility_tolerance", FEASIBILITY_TOL)
    # no restart of the tree search (a second presolve): HiGHS 1.16's, in
    # HPresolve::strengthenInequalities, ran 20 minutes past a 20 s limit on a 231-binary
    # model of a property test without reading its clock. (A model solved in the worker
    # process, ISOLATE_MIN_INTEGERS, keeps restarts: a hang there is killed at the limit.)
    h.setOptionValue("mip_allow_restart", False)
    if threads:
        h.setOptionValue("threads", int(threads))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = V.n, R.n
    lp.col_cost_ = V.cost_vector()
    lp.col_lower_ = np.concatenate(V.lower)
    lp.col_upper_ = np.concatenate(V.upper)
    rows, cols, vals, lo, hi = R.coo()
    lp.row_lower_ = lo
    lp.row_upper_ = hi
    lp.offset_ = offset
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in np.concatenate(V.integer)]
    order = np.lexsort((cols, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = V.n, R.n
    lp.a_matrix_.start_ = np.searchsorted(rows, np.arange(R.n + 1)).astype(np.int32)
    lp.a_matrix_.index_ = cols.astype(np.int32)
    lp.a_matrix_.value_ = vals
    h.passModel(lp)
    return h, lp


def solve_model(h: Any, highspy: Any, lp: Any, x0: np.ndarray | None, constant: float, time_limit: float,
                stats: Solve, reference: np.ndarray | None = None) -> np.ndarray | None:
    """Run HiGHS (from the warm start x0 if given, or a better one found near `reference`,
    a point that may break rows: _run) and fill stats: status, objective (the returned
    solution's own value) and gap. Returns the solution, or None when the model is
    infeasible; TimeoutError when the time limit passed before any solution."""
    x, info, status = _run(h, highspy, lp, x0, time_limit, stats, reference)
    x0 = stats.start if stats.start is not None else x0
    obj_x = float(lp.col_cost_ @ x + constant) if x is not None else np.nan
    def lower(reported: float) -> bool:
        return reported < obj_x - 1e-9 * max(1.0, abs(obj_x))
    if x is not None and x0 is not None and lower(info.objective_function_value):
        # HiGHS 1.16 can report a lower objective than the solution it returns, which is
        # then the warm start's values as given. Sometimes the start's binaries with its
        # continuous values better chosen (the LP with the binaries fixed finds them);
        # sometimes another solution, which a solve from scratch finds again: worth it
        # when the solver had finished (at a time limit it only doubled the time, the
        # demo's asynchronous planning 19 s instead of 10).
        x = _best_continuous(highspy, lp, x)
        obj_x = float(lp.col_cost_ @ x + constant)
        left = time_limit - stats.solve_seconds  # (the call's limit bounds both runs)
        if lower(info.objective_function_value) and status == highspy.HighsModelStatus.kOptimal and left > 0.1:
            h.passModel(lp)
            h.setOptionValue("time_limit", float(left))
            y, info2, status2 = _run(h, highspy, lp, None, left, stats)
            if y is not None and float(lp.col_cost_ @ y + constant) < obj_x:
                x, info, status = y, info2, status2
                obj_x = float(lp.col_cost_ @ x + constant)
    stats.status = h.modelStatusToString(status)
    timed_out = status in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt)
    if x is None and timed_out and x0 is not None and is_feasible(lp, x0):
        # the limit passed before the solver took the start (presolve can take that long):
        # the start is still the best plan found
        x, obj_x = np.asarray(x0, dtype=float), float(lp.col_cost_ @ x0 + constant)
        stats.status += " (warm start returned)"
    if x is None:
        if timed_out:
            raise SolverTimeout(f"the solver found no plan within {time_limit:.0f} s; raise the time limit")
        return None
    stats.objective = obj_x
    if np.isfinite(info.mip_dual_bound):
        stats.gap = max(0.0, (obj_x - info.mip_dual_bound) / max(abs(obj_x), 1e-12))
        stats.bound = min(obj_x, float(info.mip_dual_bound))
    else:  # no bound: optimal if the solver finished, unknown (reported as 100 %) if it timed out
        stats.gap = 1.0 if timed_out else 0.0
        stats.bound = float("nan") if timed_out else obj_x
    return x


def _best_continuous(highspy: Any, lp: Any, x: np.ndarray) -> np.ndarray:
    """x with its continuous columns re-optimized for its integer columns (an LP), or x
    itself if that LP fails."""
    ints = np.asarray([int(v) != 0 for v in lp.integrality_], dtype=bool)
    fixed = highspy.HighsLp()
    fixed.num_col_, fixed.num_row_ = lp.num_col_, lp.num_row_
    fixed.col_cost_, fixed.offset_ = lp.col_cost_, lp.offset_
    lo, hi = np.array(lp.col_lower_, dtype=float), np.array(lp.col_upper_, dtype=float)
    lo[ints] = hi[ints] = np.round(x[ints])
    fixed.col_lower_, fixed.col_upper_ = lo, hi
    fixed.row_lower_, fixed.row_upper_ = lp.row_lower_, lp.row_upper_
    fixed.a_matrix_ = lp.a_matrix_
    h = quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("primal_feasibility_tolerance", FEASIBILITY_TOL)
    h.passModel(fixed)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return x
    y = np.asarray(h.getSolution().col_value, dtype=float)
    y[ints] = np.round(x[ints])
    return y if float(lp.col_cost_ @ y) < float(lp.col_cost_ @ x) else x


def is_feasible(lp: Any, x: np.ndarray, tol: float = 1e-6) -> bool:
    """Does x satisfy the bounds and rows of lp (row-wise arrays) and integrality?"""
    return feasible(model_arrays(lp), x, tol)


def _run(h: Any, highspy: Any, lp: Any, x0: np.ndarray | None, time_limit: float, stats: Solve,
         reference: np.ndarray | None = None) -> tuple[np.ndarray | None, Any, Any]:
    """Solve (from x0 if given); return (solution or None, info, model status).

    With a reference point (which may break rows), a share REFERENCE_SHARE of the time limit
    first searches its neighbourhood (highs_worker.improve_start), and the solver starts
    from what it finds if cheaper than x0 (stats.start: the start used).

    The solution is the best, by our own costs, of getSolution() and every improving
    solution the solver reported while it ran (its callback): at a time limit HiGHS 1.16
    can report a better objective while getSolution() still returns the start's values.
    Models of ISOLATE_MIN_INTEGERS integer columns or more run in a worker process that is
    killed at the time limit, which HiGHS alone can overrun several times (highs_worker)."""
    t = time.perf_counter()
    n_int = sum(1 for v in lp.integrality_ if int(v) != 0)
    if n_int >= ISOLATE_MIN_INTEGERS and math.isfinite(time_limit):
        try:
            x, info, status = run_isolated(
                highspy, request(h, lp, x0, REFERENCE_SHARE if reference is not None else RINS_SHARE, reference),
                time_limit + isolate_grace(time_limit), verbose=bool(h.getOptionValue("output_flag")[1]))
            return x, info, status
        finally:
            stats.solve_seconds += time.perf_counter() - t
    if reference is not None:
        req = request(h, lp, x0, reference=reference)
        req["options"]["mip_allow_restart"] = False  # (in this process: as highs_model's)
        x0 = improve_start(highspy, req, REFERENCE_SHARE * time_limit)
        stats.start = x0
        h.setOptionValue("time_limit", max(0.1, time_limit - (time.perf_counter() - t)))
    if x0 is not None:
        set_start(highspy, h, x0)
    best: list[Any] = [np.inf, None]

    def improving(e: Any) -> None:
        d = e.data_out
        if d.objective_function_value < best[0]:
            best[0], best[1] = d.objective_function_value, np.array(d.mip_solution, dtype=float)
    h.cbMipImprovingSolution.subscribe(improving)
    try:
        h.run()
    finally:
        stats.solve_seconds += time.perf_counter() - t
        h.cbMipImprovingSolution.unsubscribe(improving)
    status = h.getModelStatus()
    info = h.getInfo()
    found = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if status == highspy.HighsModelStatus.kInfeasible or not found:
        return None, info, status
    x = np.asarray(h.getSolution().col_value)
    if best[1] is not None and len(best[1]) == len(x):
        if cheaper(lp.col_cost_, best[1], x):
            x = best[1]
    return x, info, status


def isolate_grace(time_limit: float) -> float:
    """Seconds a worker process has past the time limit: its start-up (Python, numpy,
    highspy, the model passed: ~1 s for densenet264's) and HiGHS's own stop."""
    return 2.0 + 0.1 * time_limit


def quiet_highs(highspy: Any) -> Any:
    """A Highs object, without the banner it prints on stdout when created."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


