"""plan(): a Plan for a TrainingGraph under a fast-memory budget, by ILP or baseline.

Every plan returned has passed the validator and carries its predicted time (from
autotm.simulate, the one definition of predicted time) in `plan.meta`.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import numpy as np
from typing import Any

from ..ir.budget import is_minimum, parse_budget
from ..ir.costmodel import CostModel
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan, plan_graph
from ..ir.split import split_of
from ..checks.simulate import simulate
from ..checks.validate import validate
from ..ir.layout import PAGE
from .arena import with_arena
from .baselines import all_fast, first_touch_plan, lru_plan
from .direct import solve_direct
from .floor import Floor, accounting, smallest_feasible, tightest_staged_plan
from .staged import default_min_tensor_bytes, min_tensor_bytes_for, solve_staged, staged_extra
from .splitting import bounce, helpful_splits, may_split, split_floor, split_for_budget, with_bounce
from .static import all_slow_plan, first_touch_direct_plan, solve_static
from ..errors import InfeasibleBudget, InputError
from ..ir.plan_meta import PlanMeta, SolverStats

FORMULATIONS = ("static", "synchronous", "asynchronous")
BASELINES = ("all-fast", "first-touch", "lru", "all-slow")

RESOLVE_SHARE = 0.5  # the share of time_limit the first solve leaves for an arena re-solve
MIN_SOLVE_SHARE = 0.05  # no re-solve starts with less of time_limit left
POLISH_SHARE = 0.2  # the least share left after a plan that fits for one more solve from it

__all__ = ["plan", "laid_out", "smallest_feasible_budget", "FORMULATIONS", "BASELINES", "InfeasibleBudget"]


def smallest_feasible_budget(graph: TrainingGraph, cost_model: CostModel, formulation: str, *,
                             pin_params: bool = False) -> Floor:
    """The smallest budget (bytes, as plan() takes it) at which `formulation` finds a plan
    for `graph` on `cost_model`'s memory system, and what needs it there (floor.py):
    plan(..., budget="min") plans at it, and InfeasibleBudget states it."""
    acc = accounting(graph, cost_model.workspace(len(graph.kernels)), pin_params)
    if formulation == "all-fast":
        held = graph.live_bytes - acc.extra if acc.extra is not None else graph.live_bytes
        return Floor(int((held + acc.workspace).max()) if len(held) else 0, None, "all-fast's peak")
    floor = smallest_feasible(graph, formulation, cost_model.access, acc, cost_model.memory_system)
    if may_split(graph, formulation, cost_model.access, cost_model.memory_system, acc):
        floor = min(floor, split_floor(graph, formulation, acc.workspace, cost_model.memory_system),
                    key=lambda f: f.bytes)
    return floor


def plan(graph: TrainingGraph, cost_model: CostModel, budget: object, formulation: str = "asynchronous", *,
         window: int = 15, time_limit: float = 60.0, mip_gap: float = 0.01, pin_params: bool = False,
         warm_start: bool = True, threads: int | None = None, verbose: bool = False, arena: bool = True,
         defrag_retries: int = 6) -> Plan:
    """Plan `graph` for `budget` (bytes, "6GB", or a slow:fast ratio like "4:1" of the
    all-fast footprint: the most bytes live at one kernel, plus its workspace if profiled).

    Args:
        formulation: "synchronous" or "asynchronous" (the ILP), "static" (direct-access
            memory systems only), or a baseline: "all-fast", "first-touch", "lru",
            "all-slow" (direct access only).
        window: async moves may overlap kernels up to this many positions from the use.
        time_limit, mip_gap: solver limits; on a time limit the best plan found is
            returned with its gap in plan.meta.gap. The limit bounds the whole call:
            the arena's re-solves (below) have what is left of it, none starts with
            less than MIN_SOLVE_SHARE (5 %) left. meta.solve_seconds is the solver's
            time over all of them.
        pin_params: keep weights, optimizer state, buffers, the batch and the loss in
            fast memory outside the budget (the original AutoTM's accounting).
        arena: give every fast residency a static offset in one arena (planner/arena.py)
            and report its size in plan.meta.arena_bytes; when the arena exceeds the
            budget, plan again with a budget lower in the proportion of the bytes lost
            to fragmentation (the worst seen; and 1 % of the budget more; the original
            cut by the overshoot: defrag_cut), up to `defrag_retries` times (the
            original's defrag step); each re-solve starts its search near the plan that
            did not fit, no lower than the smallest feasible budget. The ILP's first
            solve has half of time_limit (all of it when even a budget 1 % lower is
            infeasible: no re-solve can follow); once a plan fits
            short of the gap, what is left (if 20 % or more) goes to one more solve from
            it for the same budget, kept if it fits and is faster (meta.polish). If
            no plan fits, the one with the smallest arena is returned with meta.arena_fits
            False and a warning in meta.warning: the plan itself is valid for the
            budget, only its static layout is larger (the executor follows it, giving the
            arena's free huge pages back when the process's RSS nears budget + baseline +
            slack, as it trims the heap). meta.defrag_history lists the attempts.

    The ILP formulations also give meta.bound_seconds: the solver's lower bound for the
    requested budget, under which no plan of the formulation is predicted to run.
    """
    if cost_model.graph_fingerprint and cost_model.graph_fingerprint != graph.fingerprint:
        raise InputError("the cost model was profiled for another graph; profile this one first")
    if formulation not in FORMULATIONS + BASELINES:
        raise InputError(f"unknown formulation {formulation!r}; choose one of {', '.join(FORMULATIONS + BASELINES)}")
    ms = cost_model.memory_system
    t0 = time.perf_counter()
    direct = cost_model.access == "direct"
    if not direct and formulation in ("static", "all-slow"):
        raise InputError(f"{formulation} needs a direct-access memory system (cpu+mmap, cpu+numa, sim:optane, sim:cxl)")

    # each kernel's workspace (profiled) takes its share of the budget while it runs: the
    # solvers' capacity at k is budget + pinned bytes - workspace (floor.accounting)
    acc = accounting(graph, cost_model.workspace(len(graph.kernels)), pin_params)
    pinned, extra, workspace, solver_extra = acc.pinned, acc.extra, acc.workspace, acc.solver_extra
    # a ratio is of the bytes the plan decides on, what an all-fast iteration holds at its
    # busiest kernel (workspace included, so 1:0 needs no move): with pinned tensors, the paper's U
    held = graph.live_bytes - extra if extra is not None else graph.live_bytes
    base = int((held + workspace).max()) if len(held) else 0
    # the smallest budget this planner finds a plan at: "min" plans there, and a budget
    # under it fails here, before any solve, naming what needs it
    floor = (Floor(base, None, "") if formulation == "all-fast"
             else smallest_feasible(graph, formulation, cost_model.access, acc, ms))
    wanted = None if budget is None or is_minimum(budget) else parse_budget(budget, base)
    whole_floor = floor.bytes
    splits = None
    if may_split(graph, formulation, cost_model.access, ms, acc) and (wanted is None or wanted < floor.bytes):
        # kernels that run in pieces (ir/split.py) lower the floor where they hold the most
        splits = helpful_splits(graph, workspace, ms)
        floor = min(floor, split_floor(graph, formulation, workspace, ms, splits), key=lambda f: f.bytes)
    if budget is None and formulation == "all-fast" or is_minimum(budget):
        budget_bytes = floor.bytes
    else:
        budget_bytes = parse_budget(budget, base)
    if budget_bytes < floor.bytes and formulation != "all-fast":
        raise InfeasibleBudget(budget_bytes, floor.bytes, floor.what, formulation)
    if splits is not None and budget_bytes < whole_floor:
        graph = split_for_budget(graph, formulation, workspace, ms, budget_bytes, splits)
        acc = with_bounce(graph, workspace)
        pinned, extra, workspace, solver_extra = acc.pinned, acc.extra, acc.workspace, acc.solver_extra
    validation_budget = budget_bytes + acc.flat_extra
    limit = None if formulation in ("all-fast", "all-slow") else validation_budget
    opts: dict[str, Any] = dict(window=window, time_limit=time_limit, mip_gap=mip_gap, pinned=pinned, extra=solver_extra,
                workspace=workspace if workspace.any() else None,
                warm_start=warm_start and not pin_params, threads=threads, verbose=verbose)

    def described(p: Plan, meta: PlanMeta, cut: int, retry: int, polish: bool) -> Plan:
        p = dataclasses.replace(p, budget_bytes=limit, memory_system=ms, split=split_of(graph))
        report = validate(p, graph, reserved_bytes=workspace if limit is not None and workspace.any() else None)
        sim = simulate(p, graph, cost_model)
        meta = dataclasses.replace(
            meta, formulation=formulation, pin_params=pin_params, requested_budget_bytes=budget_bytes,
            solver_budget_bytes=budget_bytes - cut, defrag_retries=retry,
            predicted_seconds=sim.predicted_seconds, peak_fast_bytes=report.peak_fast_bytes,
            bytes_to_slow=report.bytes_to_slow, bytes_to_fast=report.bytes_to_fast, moves=report.moves,
            simulated=bool(cost_model.simulated), budget_bytes=budget_bytes,
            peak_workspace_bytes=int(workspace.max(initial=0)),
            peak_fast_with_workspace_bytes=int((report.fast_bytes + workspace).max(initial=0)), polish=polish)
        p = dataclasses.replace(p, meta=meta)
        if arena:
            p = laid_out(p, graph, cost_model)
            p = _meta(p, arena_fits=limit is None or p.arena_bytes is None or p.arena_bytes <= limit)
        return p

    attempts: list[Plan] = []
    cut = 0  # bytes taken off the budget so that the arena fits
    worst = (0, 1)  # (arena bytes, peak bytes) of the most fragmented layout seen
    # the staged ILP re-solves for less when its arena does not fit, never under the
    # smallest feasible budget: at it (inception_v4 cpu 8:1) no re-solve for less exists,
    # and the half of the limit kept for one went unused (asynchronous predicted 4.64 s,
    # 31 % fragmentation; 4.00 s, 14 % with it all)
    staged = formulation in ("synchronous", "asynchronous") and not direct and arena and limit is not None
    # it can resume from a plan (the reference of _solve): its first solve leaves time for
    # a re-solve, or, when the arena fits, for one more from that plan; not where even a
    # budget 1 % lower is infeasible (nor a polish there: the first solve has all of the limit)
    resumable = staged and opts["warm_start"] and budget_bytes - max(1, budget_bytes // 100) >= floor.bytes
    polished = False
    resolves = 0
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if attempts:
            # the re-solves share the call's time limit: what is left of it (re-solving
            # with the full limit each time made densenet264 cpu 8:1's 30 s plan take
            # 189 s; with at least half of it each, a 2:1 BERT plan took 153 s of a 60 s
            # limit): the limit bounds the whole call
            if formulation in FORMULATIONS and left < MIN_SOLVE_SHARE * time_limit:
                attempts[-1] = _meta(attempts[-1], warning="the time limit left no time for another re-solve")
                break
            opts["time_limit"] = left
        elif resumable:
            opts["time_limit"] = min(time_limit * (1 - RESOLVE_SHARE), left)
        else:
            opts["time_limit"] = max(left, MIN_SOLVE_SHARE * time_limit)
        try:
            p, meta = _solve(graph, cost_model, formulation, budget_bytes - cut, validation_budget - cut, **opts,
                             previous=attempts[-1] if attempts else None)
        except InfeasibleBudget:
            if not attempts:
                raise
            attempts[-1] = _meta(attempts[-1], warning=f"a budget {cut:,} bytes lower, to fit the arena, is infeasible")
            break
        p = described(p, meta, cut, resolves, polished)
        attempts.append(p)
        if polished:  # (the plan it started from fits)
            break
        if p.meta.arena_fits is not False:  # (always without a budget: all-fast, all-slow)
            if (resumable and p.meta.gap > mip_gap
                    and time_limit - (time.perf_counter() - t0) >= POLISH_SHARE * time_limit):
                polished = True  # what is left of the limit: from this plan, for the same budget
                continue
            break
        if resolves >= defrag_retries:
            break
        # the arena does not fit: plan again for less, as if the next plan fragments like
        # the worst seen (fragmentation varies by several per cent from plan to plan and
        # grows as the budget falls: the demo's asynchronous plans 4.5 % then 10.8 %,
        # densenet264 cpu 8:1's 12 %, 18 %, 19 %; each miss costs a solve)
        assert limit is not None and p.arena_bytes is not None  # (a budget, and an arena that did not fit it)
        worst = max(worst, (p.arena_bytes, p.meta.peak_fast_with_workspace_bytes), key=lambda w: w[0] / w[1])
        next_cut = defrag_cut(cut, limit, *worst, budget_bytes)
        if staged:  # no lower than the smallest feasible budget: the most room for a layout there
            next_cut = min(next_cut, budget_bytes - floor.bytes)
        if next_cut >= budget_bytes or next_cut < cut + budget_bytes // 100:
            break  # (a re-solve for less than 1 % less lays out much the same)
        cut = next_cut
        resolves += 1
    fitting = [a for a in attempts if a.meta.arena_fits is not False]
    p = (min(fitting, key=lambda a: a.meta.predicted_seconds) if fitting
         else min(attempts, key=lambda a: a.arena_bytes or 0))
    first = p is attempts[0]
    p = _meta(p, solve_seconds=sum(a.meta.solve_seconds for a in attempts))  # the solver's time over all attempts
    if arena:  # each attempt: (budget solved for, arena bytes, fragmentation, predicted seconds)
        p = _meta(p, defrag_history=tuple((a.meta.solver_budget_bytes or 0, a.arena_bytes or 0,
                                           a.meta.fragmentation or 0.0, a.meta.predicted_seconds)
                                          for a in attempts))
    bounds = [a.meta.bound_seconds for a in attempts
              if a.meta.solver_budget_bytes == budget_bytes and a.meta.bound_seconds is not None]
    if bounds:
        # the solver's bound at the requested budget (a re-solve's, for less, is no bound here)
        bound = max(bounds)
        p = _meta(p, bound_seconds=bound)
        if not first:
            # the gap, too, is to that bound: what fitting the arena cost included
            t = p.meta.predicted_seconds
            p = _meta(p, gap=max(0.0, (t - bound) / t))
    if formulation == "all-fast" and budget is not None:
        # all-fast ignores the budget: it must not claim to fit one it exceeds
        held = p.meta.peak_fast_with_workspace_bytes
        fits = held <= budget_bytes and (p.arena_bytes or 0) <= budget_bytes
        p = _meta(p, fits_budget=fits, arena_fits=p.arena_bytes is None or p.arena_bytes <= budget_bytes)
        if not fits:
            p = _meta(p, warning=(f"all-fast ignores the budget: it holds {held:,} bytes at its busiest kernel"
                                  + (f" ({p.arena_bytes:,} in its arena)" if p.arena_bytes else "")
                                  + f", {max(held, p.arena_bytes or 0) / max(budget_bytes, 1):.2f}x the budget of "
                                  f"{budget_bytes:,} bytes"))
    else:
        p = _meta(p, fits_budget=limit is None or p.meta.arena_fits is not False)
    if not fitting:
        p = _meta(p, fits_budget=False,
                  warning=(f"the arena ({p.arena_bytes:,} bytes) exceeds the budget ({limit:,} bytes) after "
                           f"{len(attempts) - 1} re-solves with a lower budget"
                           + (f"; {p.meta.warning}" if p.meta.warning is not None else "")))
    return _meta(p, plan_seconds=time.perf_counter() - t0)


def _meta(p: Plan, **changes: Any) -> Plan:
    """`p` with these fields of its meta changed."""
    return dataclasses.replace(p, meta=dataclasses.replace(p.meta, **changes))


def defrag_cut(cut: int, limit: int, arena_bytes: int, peak_bytes: int, budget_bytes: int) -> int:
    """The bytes to take off the budget for the next re-solve, after a plan solved with
    `cut` bytes off laid out in `arena_bytes` > `limit` for `peak_bytes` of fast tensors.

    As if the next plan fragments in the same proportion as this one: its peak
    P' <= limit - cut' and its arena A' ~ P' A / P <= limit give
      cut' = limit (A - P) / A + 1 % of the budget,
    and at least 1 % of the budget more than `cut`. Fragmentation varies by a per cent or
    two from plan to plan, hence the 1 %: without it the demo's cuts missed by 0.1-0.3 MiB
    and cost a third solve. The original's rule, cut by the overshoot A - limit, and a cut
    by the bytes lost, A - P, assume the bytes lost stay the same as the budget shrinks,
    which at a tight budget they do not, and cut A / limit times more.
    """
    step = budget_bytes // 100
    return max(cut + step, limit - limit * peak_bytes // arena_bytes + step)


def laid_out(plan: Plan, graph: TrainingGraph, cost_model: CostModel) -> Plan:
    """`plan` with its arena layout (arena.with_arena) as the executor follows it on
    `cost_model`'s memory system: large blocks page-aligned on cpu+file, each kernel's
    profiled workspace kept free."""
    graph = plan_graph(plan, graph)
    workspace = cost_model.workspace(len(graph.kernels)) + bounce(graph)
    return with_arena(plan, graph, large_alignment=large_block_alignment(cost_model.memory_system),
                      workspace=workspace if workspace.any() else None)


def large_block_alignment(memory_system: str) -> int | None:
    """Large blocks of the arena start on a page on cpu+file, whose direct-I/O reads land
    straight in a prefetched tensor's slot (tiers/cpu_arena.py)."""
    return PAGE if memory_system == "cpu+file" else None


def _solve(graph: TrainingGraph, cost_model: CostModel, formulation: str, budget_bytes: int, validation_budget: int,
           *, window: int, time_limit: float, mip_gap: float, pinned: frozenset[int], extra: np.ndarray | None,
           workspace: np.ndarray | None, warm_start: bool, threads: int | None, verbose: bool,
           previous: Plan | None = None) -> tuple[Plan, PlanMeta]:
    """One plan for one budget, without meta on time or bytes (plan() adds those).

    previous: the plan of the attempt before (plan(): for a higher budget, whose arena did
    not fit; or for this budget, which fitted short of the gap). The staged ILP searches
    its neighbourhood first (staged.solve_staged's reference): the plan that fits is mostly
    the same plan with a few more moves, and from the baseline alone, with the re-solve's
    share of the time, the demo's asynchronous re-solve came back at 0.438 s instead of
    0.340 s."""
    ms = cost_model.memory_system
    direct = cost_model.access == "direct"
    meta: dict[str, Any] = {}  # PlanMeta's fields
    chain_seconds = 0.0
    ilp: dict[str, Any] = dict(time_limit=time_limit, mip_gap=mip_gap, pinned=pinned, budget_extra=extra, threads=threads)
    if formulation == "all-fast":
        p = dataclasses.replace(all_fast(graph, ms), access="direct" if direct else "staged")
    elif formulation == "lru":
        p = lru_plan(graph, validation_budget, ms, workspace=workspace)
        p = dataclasses.replace(p, access="direct" if direct else "staged")  # demand paging: valid under either access
    elif direct and formulation in ("all-slow", "first-touch", "static"):
        if formulation == "all-slow":
            p = all_slow_plan(graph, cost_model)
        elif formulation == "first-touch":
            p = first_touch_direct_plan(graph, cost_model, validation_budget)
        else:
            p, stats = solve_static(graph, cost_model, budget_bytes, verbose=verbose, **ilp)
            meta.update(_stats_meta(stats))
    elif formulation == "first-touch":
        p = first_touch_plan(graph, validation_budget, ms, workspace=workspace)
    else:
        solve = solve_direct if direct else solve_staged
        start = None
        if warm_start:
            start = (_best_direct_start(graph, cost_model, budget_bytes, validation_budget, ilp, workspace) if direct
                     else _best_baseline(graph, cost_model, validation_budget, workspace,
                                         min_tensor_bytes_for(graph, budget_bytes,
                                                              staged_extra(graph, extra, pinned), pinned),
                                         # (a re-solve starts near the previous plan: lru, the
                                         # quick one, is only the start should that fail;
                                         # first-touch took 6 s of densenet264 cpu 8:1's re-solve)
                                         ("lru",) if previous is not None else ("lru", "first-touch"), pinned))
        sync_start = start  # the best start a synchronous model can take (for the fallback)
        fixed = 0.0  # the seconds the chain's last stage spent outside its solver's limit
        last: SolverStats | None = None  # that stage's
        reference = previous if (warm_start and not direct) else None
        if reference is not None:
            ilp = dict(ilp, reference=reference)
        if formulation == "asynchronous" and warm_start:
            # the chain shares time_limit: each stage has its share of what the ones before
            # left (the synchronous model often finishes early; when it needs its half, its
            # plan is the start that matters: resnet50 test 4:1 needs 3 s for it, and from
            # the baseline the 2 s it had at a quarter of 8 s left the chain at 0.64 s, the
            # synchronous plan being 0.57)
            t_chain = time.perf_counter()

            def left(share: float) -> float:
                return float(max(0.05 * time_limit, share * (time_limit - (time.perf_counter() - t_chain))))
            # every synchronous plan is an asynchronous plan: solve the small model first
            # (not on a re-solve: the previous asynchronous plan is the better place to start)
            try:
                if reference is None:
                    t_stage, limit = time.perf_counter(), left(1 / 2)
                    sync_plan, st = solve(graph, cost_model, budget_bytes, formulation="synchronous",
                                         **dict(ilp, time_limit=limit), warm_start=start[0] if start else None)
                    start = sync_start = (sync_plan, "synchronous")
                    chain_seconds += st.solve_seconds
                    fixed, last = fixed_seconds(time.perf_counter() - t_stage, limit, st), st
            except TimeoutError:  # no synchronous plan in time: start from the baseline
                pass
            if cost_model.async_overlap:
                # Copies that share one fixed cost (z in families.async_overlap_at) weaken the
                # relaxation: HiGHS then rarely leaves its start (resnet50 test, 4:1: stuck at
                # the synchronous plan, gap 29 % at 20 s). The model that charges every copy
                # in full solves well and its plans are feasible here, and cheaper: start there.
                try:
                    plain = dataclasses.replace(cost_model, async_overlap=False)
                    t_stage, limit = time.perf_counter(), left(2 / 3 if reference is None else 3 / 4)
                    full_plan, st = solve(graph, plain, budget_bytes, formulation="asynchronous", window=window,
                                         **dict(ilp, time_limit=limit), warm_start=start[0] if start else None)
                    start = (full_plan, "asynchronous, copies charged in full")
                    chain_seconds += st.solve_seconds
                    fixed, last = fixed_seconds(time.perf_counter() - t_stage, limit, st), st
                    ilp.pop("reference", None)  # (searched: its neighbourhood is in the start)
                except TimeoutError:
                    pass
            # the chain as a whole stays within time_limit; from this start the final model
            # mostly proves, it rarely finds better
            ilp = dict(ilp, time_limit=left(1))
        try:
            if (formulation == "asynchronous" and start is not None and last is not None
                    and ilp["time_limit"] < fixed):
                # less time than a stage spends building its model and starting its solver:
                # the final model could only hand its start back, seconds later (an unrolled
                # LSTM, 1:1 at 10 s: 0.25 s left took 2.2 s). The start, an asynchronous plan
                # too, is the plan; no bound of this model comes with it
                p = dataclasses.replace(start[0], planner=formulation)
                stats = dataclasses.replace(last, solve_seconds=0.0, bound=None, gap=1.0, status="Time limit reached",
                                            objective=simulate(p, graph, cost_model).predicted_seconds)
                meta["warning"] = (f"{ilp['time_limit']:.2f} s of the time limit was left for the asynchronous model, "
                                   f"less than the {fixed:.2f} s a stage spent outside its solver: its start is the plan")
            else:
                p, stats = solve(graph, cost_model, budget_bytes, formulation=formulation, window=window,
                                 warm_start=start[0] if start else None, verbose=verbose, **ilp)
        except TimeoutError:
            if formulation != "asynchronous":
                raise
            # the chain's share of the time found nothing (inception_v4 cpu 8:1, where the
            # small tensors move too): a synchronous plan, which is an asynchronous one, with
            # the whole limit, from the synchronous plan or baseline (so that there is one)
            # (with what the chain left, not the whole limit again: its start, a plan, is
            # returned at the limit)
            p, stats = solve(graph, cost_model, budget_bytes, formulation="synchronous",
                             **dict({k: v for k, v in ilp.items() if k != "reference"},
                                    time_limit=left(1) if sync_start else time_limit),
                             verbose=verbose, warm_start=sync_start[0] if sync_start else None)
            p = dataclasses.replace(p, planner=formulation)
            stats = dataclasses.replace(stats, bound=None)  # (the synchronous model's bound is none for asynchronous plans)
            meta["fallback"] = "synchronous (no asynchronous plan found within the time limit)"
        # (the whole chain's: what the user waited for)
        stats = dataclasses.replace(stats, solve_seconds=stats.solve_seconds + chain_seconds)
        meta.update(_stats_meta(stats), window=window,
                    warm_start=start[1] if start else None)
        if reference is not None:
            meta["searched_near"] = "the previous attempt's plan"
        if start is not None:
            # the solver keeps a feasible warm start as its incumbent; should it ever return
            # something slower (a start it could not use, then a time limit), keep the start
            mine = simulate(p, graph, cost_model).predicted_seconds
            theirs = simulate(start[0], graph, cost_model).predicted_seconds
            if theirs < mine * (1 - 1e-9):
                p = dataclasses.replace(start[0], planner=formulation)
                meta.update(objective_seconds=theirs, warm_start_kept=True)
    if formulation not in ("synchronous", "asynchronous", "static"):
        meta.update(solve_seconds=0.0, gap=0.0, status="baseline")
    return p, PlanMeta(**meta)


def fixed_seconds(wall: float, limit: float, stats: SolverStats) -> float:
    """The seconds a solve spent outside its time limit: building its model, starting a
    worker, the solver's own overrun (wall less the limit, or less the solve when it
    finished early)."""
    return max(0.0, wall - min(limit, stats.solve_seconds))


def _stats_meta(stats: SolverStats) -> dict[str, Any]:
    """PlanMeta's fields from one solve."""
    return dict(solve_seconds=stats.solve_seconds, gap=stats.gap, status=stats.status,
                objective_seconds=stats.objective, bound_seconds=stats.bound, solver=stats)


def _best_direct_start(graph: TrainingGraph, cost_model: CostModel, budget_bytes: int, validation_budget: int,
                       ilp: dict[str, Any], workspace: np.ndarray | None) -> tuple[Plan, str] | None:
    """The fastest of the static ILP's plan and the direct baselines, as a warm start."""
    small = frozenset(t.id for t in graph.tensors if t.nbytes < default_min_tensor_bytes(graph))
    cands: list[tuple[Plan, str]] = []
    try:
        cands.append((solve_static(graph, cost_model, budget_bytes, **dict(ilp, time_limit=ilp["time_limit"] / 4))[0],
                      "static"))
    except (InfeasibleBudget, TimeoutError):
        pass
    def lru() -> Plan:
        return dataclasses.replace(lru_plan(graph, validation_budget, cost_model.memory_system, keep_fast=small,
                                            workspace=workspace), access="direct")
    for name, make in (("first-touch", partial(first_touch_direct_plan, graph, cost_model, validation_budget)),
                       ("lru", lru)):
        try:
            cands.append((make(), name))
        except InfeasibleBudget:
            pass
    best: tuple[Plan, str, float] | None = None
    for p, name in cands:
        try:
            validate(p, graph, budget_bytes=validation_budget, reserved_bytes=workspace)
        except Exception:
            continue
        t = simulate(p, graph, cost_model).predicted_seconds
        if best is None or t < best[2]:
            best = (p, name, t)
    return (best[0], best[1]) if best else None


def _best_baseline(graph: TrainingGraph, cost_model: CostModel, budget: int, workspace: np.ndarray | None,
                   min_tensor_bytes: int, kinds: tuple[str, ...] = ("lru", "first-touch"),
                   pinned: frozenset[int] = frozenset()) -> tuple[Plan, str] | None:
    """The fastest feasible baseline plan, as a warm start for the ILP. The baselines keep
    the tensors the ILP does not move (those under `min_tensor_bytes`, staged.min_tensor_bytes_for)
    in fast memory, so that the start is a solution of the model."""
    best: tuple[Plan, str, float] | None = None
    small = frozenset(t.id for t in graph.tensors if t.nbytes < min_tensor_bytes)

    def tightest(graph: TrainingGraph, budget: int, ms: str, keep_fast: frozenset[int],
                 workspace: np.ndarray | None) -> Plan:
        return dataclasses.replace(tightest_staged_plan(graph, pinned, ms, min_bytes=min_tensor_bytes),
                                   budget_bytes=budget)
    # the tightest plan (every segment out of fast memory) is a solution of the model at
    # every budget from its floor: the start of last resort, where lru's plans break a row
    for name, make in (("lru", lru_plan), ("first-touch", first_touch_plan), ("tightest", tightest)):
        if name not in kinds and not (name == "tightest" and best is None):
            continue
        try:
            p = make(graph, budget, cost_model.memory_system, keep_fast=small, workspace=workspace)
            validate(p, graph, reserved_bytes=workspace)
            t = simulate(p, graph, cost_model).predicted_seconds
        except Exception:
            continue
        if best is None or t < best[2]:
            best = (p, name, t)
    return (best[0], best[1]) if best else None
