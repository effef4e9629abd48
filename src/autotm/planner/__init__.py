"""plan(): a Plan for a TrainingGraph under a fast-memory budget, by ILP or baseline.

Every plan returned has passed the validator and carries its predicted time (from
autotm.simulate, the one definition of predicted time) in `plan.meta`.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..budget import parse_budget
from ..costmodel import CostModel
from ..graph import Role, TrainingGraph
from ..plan import Plan
from ..simulate import simulate
from ..validate import validate
from .baselines import all_fast, first_touch_plan, lru_plan
from .ilp import InfeasibleBudget, solve_staged

FORMULATIONS = ("static", "synchronous", "asynchronous")
BASELINES = ("all-fast", "first-touch", "lru", "all-slow")
PINNED_ROLES = (Role.WEIGHT, Role.BUFFER, Role.OPTIMIZER_STATE, Role.INPUT, Role.SCALAR, Role.CONSTANT, Role.OUTPUT)

__all__ = ["plan", "FORMULATIONS", "BASELINES", "InfeasibleBudget"]


def plan(graph: TrainingGraph, cost_model: CostModel, budget, formulation: str = "asynchronous", *,
         window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, pin_params: bool = False,
         warm_start: bool = True, threads: int | None = None, verbose: bool = False) -> Plan:
    """Plan `graph` for `budget` (bytes, "6GB", or a slow:fast ratio like "4:1").

    Args:
        formulation: "synchronous" or "asynchronous" (the ILP; "static" needs a
            direct-access memory system), or a baseline: "all-fast", "first-touch", "lru".
        window: async moves may overlap kernels up to this many positions from the use.
        time_limit, mip_gap: solver limits; on a time limit the best plan found is
            returned with its gap in plan.meta["gap"].
        pin_params: keep weights, optimizer state, buffers, the batch and the loss in
            fast memory outside the budget (the original AutoTM's accounting).
    """
    if cost_model.graph_fingerprint and cost_model.graph_fingerprint != graph.fingerprint:
        raise ValueError("the cost model was profiled for another graph; profile this one first")
    if formulation not in FORMULATIONS + BASELINES:
        raise ValueError(f"unknown formulation {formulation!r}; choose one of {', '.join(FORMULATIONS + BASELINES)}")
    ms = cost_model.memory_system
    t0 = time.perf_counter()
    meta: dict = {"formulation": formulation, "pin_params": pin_params}
    direct = cost_model.access == "direct"
    if direct and formulation in ("synchronous", "asynchronous", "lru"):
        raise NotImplementedError(
            f"the {formulation} plan for direct-access memory systems ({ms}) is not implemented yet; "
            "use static, first-touch or all-slow there, or a staged system (cpu+file, sim:nvme, sim:pcie-host)")
    if not direct and formulation in ("static", "all-slow"):
        raise ValueError(f"{formulation} needs a direct-access memory system (cpu+mmap, cpu+numa, sim:optane, sim:cxl)")

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
    # a ratio is of the bytes the plan decides on: with pinned tensors, the paper's U
    base = int((graph.live_bytes - extra).max()) if extra is not None else graph.peak_live_bytes
    budget_bytes = base if (budget is None and formulation == "all-fast") else parse_budget(budget, base)
    meta["requested_budget_bytes"] = budget_bytes
    validation_budget = budget_bytes + (int(extra.max()) if extra is not None else 0)

    if formulation == "all-fast":
        p = dataclasses.replace(all_fast(graph, ms), access=cost_model.access)
    elif direct:
        from .static import all_slow_plan, first_touch_direct_plan, solve_static

        if formulation == "all-slow":
            p = all_slow_plan(graph, cost_model)
        elif formulation == "first-touch":
            p = first_touch_direct_plan(graph, cost_model, validation_budget)
        else:
            p, stats = solve_static(graph, cost_model, budget_bytes, time_limit=time_limit, mip_gap=mip_gap,
                                    pinned=pinned, pinned_budget_extra=extra, threads=threads, verbose=verbose)
            meta.update(solve_seconds=stats.solve_seconds, build_seconds=stats.build_seconds, gap=stats.gap,
                        status=stats.status, objective_seconds=stats.objective, variables=stats.variables,
                        binaries=stats.binaries, rows=stats.rows, nonzeros=stats.nonzeros)
    elif formulation == "first-touch":
        p = first_touch_plan(graph, validation_budget, ms)
    elif formulation == "lru":
        p = lru_plan(graph, validation_budget, ms)
    else:
        start = _best_baseline(graph, cost_model, validation_budget) if warm_start and not pin_params else None
        if formulation == "asynchronous" and warm_start:
            # every synchronous plan is an asynchronous plan: solve the small model first
            sync_plan, _ = solve_staged(graph, cost_model, budget_bytes, formulation="synchronous",
                                        time_limit=time_limit / 4, mip_gap=mip_gap, pinned=pinned,
                                        pinned_budget_extra=extra, threads=threads,
                                        warm_start=start[0] if start else None)
            start = (sync_plan, "synchronous")
        p, stats = solve_staged(graph, cost_model, budget_bytes, formulation=formulation, window=window,
                                time_limit=time_limit, mip_gap=mip_gap, pinned=pinned, pinned_budget_extra=extra,
                                threads=threads, warm_start=start[0] if start else None, verbose=verbose)
        meta.update(solve_seconds=stats.solve_seconds, build_seconds=stats.build_seconds, gap=stats.gap,
                    status=stats.status, objective_seconds=stats.objective, variables=stats.variables,
                    binaries=stats.binaries, rows=stats.rows, nonzeros=stats.nonzeros,
                    capacity_rows_dropped=stats.rows_dropped, window=window,
                    warm_start=start[1] if start else None)
    if formulation not in ("synchronous", "asynchronous", "static"):
        meta.update(solve_seconds=0.0, gap=0.0, status="baseline")
    budget_for_plan = None if formulation in ("all-fast", "all-slow") else validation_budget
    p = dataclasses.replace(p, budget_bytes=budget_for_plan, memory_system=ms)
    report = validate(p, graph)
    sim = simulate(p, graph, cost_model)
    meta.update(predicted_seconds=sim.predicted_seconds, peak_fast_bytes=report.peak_fast_bytes,
                bytes_to_slow=report.bytes_to_slow, bytes_to_fast=report.bytes_to_fast, moves=report.moves,
                simulated=bool(cost_model.simulated), plan_seconds=time.perf_counter() - t0,
                budget_bytes=budget_bytes)
    return dataclasses.replace(p, meta=meta)


def _best_baseline(graph, cost_model, budget):
    """The fastest feasible baseline plan, as a warm start for the ILP."""
    best = None
    for name, make in (("lru", lru_plan), ("first-touch", first_touch_plan)):
        try:
            p = make(graph, budget, cost_model.memory_system)
            validate(p, graph)
            t = simulate(p, graph, cost_model).predicted_seconds
        except Exception:
            continue
        if best is None or t < best[2]:
            best = (p, name, t)
    return (best[0], best[1]) if best else None
