"""profile(): measure a graph's kernels and a memory system's moves into a CostModel.

The orchestrator: it reads what the cache holds for this environment (`environment`),
and measures the rest in order: the move rounds in three phases (`moves`), each followed
by a window of in-situ iterations timing the kernels where they run (`insitu`, by the
rules of `timing`), the kernels after a blocking move between the second and third
(`wake`), then the executor's own overheads once per environment (`calibrate`). Every
measurement goes to the SQLite cache (`cache`) as it completes, keyed by signature +
placement + environment; `recache=True` measures everything again. Processes sharing
a cache measure one at a time; one that finds everything cached waits for nobody.

Hypothetical hardware: ``profile(graph, "sim:optane")`` builds a roofline cost model
from a tier spec (`roofline`); it needs no real tensors (fake-captured graphs work) and
is labelled ``simulated=True``.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Mapping

import torch

from ..errors import InputError
from ..ir.costmodel import CostModel, ExecutorOverhead, operand_tensors
from ..ir.graph import TrainingGraph
from ..tiers import cpu_arena
from ..tiers.host_heap import keep_freed_memory
from .cache import ProfileCache, open_cache
from .calibrate import MeasureOverhead, cached_overhead, put_overhead, with_overhead
from .environment import environment
from .insitu import ProfilingReplay, synthetic_inputs
from .moves import MOVE_PHASES, MOVE_REPEATS, MOVE_SIZES, measure_moves, move_rounds, moves_missing
from .pace import probe_pace, settle_pace
from .roofline import profile_sim
from .stats import ProfileStats, Progress
from .timing import MAX_ITERATIONS, MAX_SAMPLES, arg_pattern, insitu_done, insitu_estimate, placement_key, \
    placements
from .wake import WAKE_ROUNDS, cached_wake_samples, measure_wakes, wake_from_excess

log = logging.getLogger("autotm.profile")


def profile(graph: TrainingGraph, memory_system, cache: ProfileCache | str | os.PathLike | None = None, *,
            inputs: Mapping[int, torch.Tensor] | None = None, recache: bool = False,
            progress: Progress | None = None, return_stats: bool = False,
            move_sizes: tuple[int, ...] = MOVE_SIZES, move_repeats: int = MOVE_REPEATS,
            wake_rounds: int = WAKE_ROUNDS, executor_overhead: bool = True,
            measure_overhead: MeasureOverhead | None = None):
    """Profile `graph` on `memory_system` and return its CostModel.

    Args:
        graph: a TrainingGraph captured on real tensors (fake-captured graphs only work
            with ``sim:<spec>`` memory systems).
        memory_system: a MemorySystem, or a name: ``"cpu+file"`` etc. (built and closed
            here), or ``"sim:<spec>"`` (a tier spec name or a path to a TOML file).
        cache: a ProfileCache, a path to its SQLite file, or None for the default file.
        inputs: graph input values by tensor id (e.g. ``TrainingState(graph, model,
            opt).inputs(batch)``); default: synthetic values of the right layout.
        recache: measure everything again (replacing this environment's cached values).
        progress: called as progress(done, total, what) after each measurement.
        return_stats: return (CostModel, ProfileStats) instead of the CostModel.
        move_sizes, move_repeats: the sizes (bytes) and repeats of the move measurements.
        wake_rounds: replay iterations per phase timing the kernels after a blocking move
            (memory systems with idle_sync_moves; 0: none, CostModel.wake_seconds empty).
        executor_overhead: add the executor's own seconds per kernel and per sync move
            (autotm.runtime.overhead: measured once per environment on a calibration graph and
            cached; host-timed memory systems only). False: the kernels' and moves' calls alone.
        measure_overhead: runs that calibration where the cache has no overheads for this
            environment (autotm.runtime.overhead.measure_executor_overhead: it runs the
            executor, a later stage, so the caller passes it); None: uncached overheads
            are left out.
    """
    if isinstance(memory_system, str) and memory_system.startswith("sim:"):
        cm, stats = profile_sim(graph, memory_system, cache, recache=recache)
        return (cm, stats) if return_stats else cm
    owned = None
    if isinstance(memory_system, str):
        from ..tiers import make_memory_system

        memory_system = owned = make_memory_system(memory_system)
    db, owned_db = open_cache(cache)
    try:
        opts = dict(inputs=inputs, recache=recache, progress=progress, move_sizes=tuple(move_sizes),
                    move_repeats=move_repeats, wake_rounds=wake_rounds, executor_overhead=executor_overhead,
                    measure_overhead=measure_overhead)
        try:  # everything in the cache: nothing to wait for
            cm, stats = _profile_real(graph, memory_system, db, measure=False, **opts)
            must_measure = False
        except _MustMeasure:
            must_measure = True
        if must_measure:
            # one process measures at a time (ProfileCache.measuring); one that waited finds
            # what the other measured, and times only what is still missing
            t_wait = time.perf_counter()

            def waiting(pid: int | None) -> None:
                what = f"waiting for autotm process {pid or '?'}, measuring into {db.path}"
                log.info(what)
                if progress is not None:
                    progress(0, 0, what)

            with db.measuring(waiting):
                waited = time.perf_counter() - t_wait
                cm, stats = _profile_real(graph, memory_system, db, **opts)
            stats.waited_seconds = waited
            stats.add_seconds("wait", waited)
    finally:
        if owned_db:
            db.close()
        if owned is not None:
            owned.close()
    log.info("profile %s on %s: %s", graph.name, cm.memory_system, stats.message())
    return (cm, stats) if return_stats else cm


class _MustMeasure(Exception):
    """_profile_real(measure=False) found something the cache does not hold."""


def _profile_real(graph, memory, cache, *, inputs, recache, progress, move_sizes, move_repeats, wake_rounds,
                  executor_overhead=True, measure_overhead=None, recache_moves=None, measure=True):
    if graph.fake:
        raise InputError(f"graph {graph.name} was captured on fake tensors: it cannot be timed on "
                         f"{memory.name}; capture it on real tensors, or profile on a sim:<spec> system")
    # the executor's allocator policy, so kernels are timed as it runs them: their outputs
    # land in reused heap memory, not in fresh pages that fault in on every call
    keep_freed_memory()
    t_start = time.perf_counter()
    db, owned = open_cache(cache)
    try:
        stats = ProfileStats(total_kernels=len(graph.kernels), cache_path=str(db.path),
                             cache_rebuilt=db.rebuilt_reason, unique_kernels=graph.unique_signatures)
        device = memory.fast_device
        envd = environment(memory.name, device, memory.capabilities.async_engine)
        env = db.environment(envd)
        have = {} if recache else db.kernel_times(env)  # recache: measure again, replace the rows
        pending = {} if recache else db.pending(env)
        direct = memory.access == "direct"
        program = graph.program

        # in situ: every signature without a final all-fast time
        need = {k.signature for k in graph.kernels if (k.signature, "fast") not in have}
        stats.cache_hits += graph.unique_signatures - len(need)
        # direct access: repeated timings of each placement, and of all-fast for the ratio
        needs: list[list[tuple]] = []
        batch_jobs: dict[int, list[tuple]] = {}
        planned: set[tuple[str, str]] = set()
        for k, kern in enumerate(graph.kernels):
            jobs = []
            if direct:
                pattern = arg_pattern(program, k)
                n = len(operand_tensors(kern.inputs, kern.outputs))
                jobs = [(None, "batch:fast")] + [(p, "batch:" + placement_key(p, pattern)) for p in placements(n)]
            needs.append(jobs)
            for p, key in jobs:
                ck = (kern.signature, key)
                if ck in planned:
                    continue
                planned.add(ck)
                if ck in have:
                    stats.cache_hits += 1
                else:
                    batch_jobs.setdefault(k, []).append((p, key))
        rounds = move_rounds(move_sizes, move_repeats)
        n_move = len(rounds)
        wake_on = memory.idle_sync_moves and wake_rounds > 0
        # a kernel's wake excess is its signature's: a graph whose signatures are all known
        # (from any graph profiled in this environment) runs no wake iterations
        wake_known = {} if recache or not wake_on else db.wake_excess(env)
        wake_on = wake_on and not all(k.signature in wake_known for k in graph.kernels)
        wake_samples, wake_done = cached_wake_samples(graph, db, env, recache) if wake_on else ({}, 0)
        n_wake = max(0, 3 * wake_rounds - wake_done) if wake_on else 0
        # the executor's own time (autotm.runtime.overhead): host-timed systems, where it is serial with kernels
        overhead_on = executor_overhead and not memory.capabilities.device_timed_moves and device.type == "cpu"
        overhead = None if recache or not overhead_on else cached_overhead(db, env)
        measure_on = overhead_on and overhead is None and measure_overhead is not None
        if not measure:
            pos_cached = None if recache else db.position_samples(env, graph.fingerprint)
            if (recache or need or batch_jobs or wake_on or measure_on
                    or pos_cached is None or len(pos_cached) != len(graph.kernels) or not all(pos_cached)
                    or moves_missing(memory, db, env, move_sizes, move_repeats)):
                raise _MustMeasure
        # the machine's pace now against when the cached timings were taken (autotm.pace);
        # a GPU's kernels do not slow with the host's load this probe sees
        t_part = time.perf_counter()
        pace = None if device.type == "cuda" else probe_pace(db, env, recache=recache)
        stats.add_seconds("pace", time.perf_counter() - t_part)
        total = (len(need) + sum(len(v) for v in batch_jobs.values()) + n_move + n_wake
                 + int(measure_on))
        done = [0]

        def tick(what: str) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], total, what)

        def record(k: int, key: str, seconds: float, samples: int) -> None:
            sig = graph.kernels[k].signature
            db.put_kernel(env, sig, key, seconds, samples)
            have[(sig, key)] = seconds
            stats.measured += 1
            tick(graph.kernels[k].op)

        def move_phase(phase: int):
            """The move rounds of one phase (MOVE_PHASES); the fit once all are in."""
            before = done[0]
            t_part = time.perf_counter()
            got = measure_moves(memory, db, env, sizes=move_sizes, repeats=move_repeats,
                                recache=recache if recache_moves is None else recache_moves,
                                stats=stats, progress=tick, phases=(phase,))
            stats.add_seconds("moves", time.perf_counter() - t_part)
            # the rounds found in the cache count as done too
            done[0] = before + sum(1 for _, r in rounds if r % MOVE_PHASES == phase)
            if progress is not None:
                progress(done[0], total, "moves")
            return got

        move_phase(0)

        workspace = {} if recache else db.workspaces(env)
        pos = None if recache else db.position_samples(env, graph.fingerprint)
        pos_missing = pos is None or len(pos) != len(graph.kernels) or not all(pos)
        interp = None
        if need or batch_jobs or pos_missing:
            if inputs is None:
                inputs = synthetic_inputs(graph)
            if device.type != "cpu":  # kernels run where the fast tier is
                inputs = {tid: v.to(device) for tid, v in inputs.items()}
            samples = {sig: list(pending[sig][0]) for sig in need if sig in pending}
            iters = {sig: pending[sig][1] for sig in need if sig in pending}
            def record_workspace(sig: str, nbytes: int) -> None:
                db.put_workspace(env, sig, nbytes)
                workspace[sig] = nbytes

            on_cpu = device.type == "cpu"
            interp = ProfilingReplay(graph, memory, batch_jobs, record, need, samples,
                                     record_workspace if on_cpu and cpu_arena.load() is not None else None)
            if not pos_missing:
                interp.position_samples = [list(x) for x in pos]
            op_of = {k.signature: k.op for k in graph.kernels}

        def insitu_window(window: int) -> None:
            """In-situ iterations of one window (the one after move phase `window`). Before the
            last, until every signature still needed has a sample in this window; in the last,
            until each one's estimate is final (insitu_done), each sample kept as its iteration ends."""
            t_part = time.perf_counter()
            try:
                _insitu_window(window)
            finally:
                stats.add_seconds("kernels", time.perf_counter() - t_part)

        def _insitu_window(window: int) -> None:
            nonlocal pos, pos_missing
            final = window == MOVE_PHASES - 1
            start = {sig: len(samples.get(sig, ())) for sig in need}
            it = 0
            while need or interp.batch_jobs or pos_missing:
                interp.full = pos_missing
                before = {sig: len(samples.get(sig, ())) for sig in need}
                with torch.no_grad():
                    interp.run(dict(inputs))
                unfinished = []
                for sig in sorted(need):
                    xs = samples.get(sig, [])
                    n_it = iters.get(sig, 0)
                    if final and insitu_done(xs, before[sig], n_it):
                        t = insitu_estimate(xs)
                        db.put_final(env, sig, "fast", t, sum(len(g) for g in xs))
                        have[(sig, "fast")] = t
                        need.discard(sig)
                        stats.measured += 1
                        tick(op_of[sig])
                    else:
                        iters[sig] = n_it + 1
                        unfinished.append((env, sig, xs, n_it + 1))
                db.put_pending(unfinished)
                pos = interp.position_samples = [x[-MAX_SAMPLES:] for x in interp.position_samples]
                pos_missing = not all(pos)
                stats.iterations += 1
                db.put_position_samples(env, graph.fingerprint, pos)
                it += 1
                if progress is not None:  # (an iteration, not a measurement done: the count stays)
                    progress(done[0], total, f"kernels in situ, window {window}")
                if not final and not interp.batch_jobs and not pos_missing and (it >= 2 or all(
                        any(samples.get(sig, [])[start[sig]:]) for sig in need)):
                    return
                if it > MAX_ITERATIONS + 2:  # cannot happen while insitu_done caps iterations
                    raise RuntimeError(f"profiling {graph.name}: kernels still unmeasured after {it} iterations: "
                                       f"{sorted(need)[:3]}")

        # the kernels are timed in a window after each move phase, so that a slow spell of
        # the machine holds one window's samples, not every sample
        if interp is not None:
            insitu_window(0)
        move_phase(1)
        if interp is not None:
            insitu_window(1)
        wake: tuple[float, ...] = wake_from_excess(graph, wake_known) if wake_known and not wake_on else ()
        if wake_on:
            if n_wake and inputs is None:
                inputs = synthetic_inputs(graph)
            t_part = time.perf_counter()
            wake = measure_wakes(graph, memory, db, env, inputs, wake_samples, wake_done, rounds=wake_rounds,
                                 stats=stats, progress=tick, replace=recache)
            stats.add_seconds("wake", time.perf_counter() - t_part)
        moves, slowdown = move_phase(2)
        if interp is not None:
            insitu_window(2)
            del interp
        if measure_on:
            def calibration_model(g, g_inputs):
                # this cache and environment; with recache, its kernels timed again, not the moves
                g_cm = _profile_real(g, memory, db, inputs=g_inputs, recache=recache, progress=None,
                                     move_sizes=move_sizes, move_repeats=move_repeats, wake_rounds=wake_rounds,
                                     executor_overhead=False, recache_moves=False)[0]
                return g_cm, [statistics.median(x) for x in db.position_samples(env, g.fingerprint)]
            t_part = time.perf_counter()
            overhead = measure_overhead(memory, calibration_model)
            put_overhead(db, env, overhead)
            stats.add_seconds("overhead", time.perf_counter() - t_part)
            stats.overhead_measured = True
            tick("executor overhead")
        o = overhead or ExecutorOverhead()
        after = [statistics.median(x) for x in pos]
        kernel_seconds = tuple(have[(k.signature, "fast")] + after[i] + o.kernel_s
                               for i, k in enumerate(graph.kernels))
        placement_seconds: dict[int, dict[tuple[str, ...], float]] = {}
        if direct:
            # the in-situ all-fast time, scaled by the slowdown the repeated timings measured
            for k, kern in enumerate(graph.kernels):
                base = have[(kern.signature, "batch:fast")]
                call = have[(kern.signature, "fast")]
                placement_seconds[k] = {p: call * have[(kern.signature, key)] / base + after[k] + o.kernel_s
                                        for p, key in needs[k] if p is not None}
        moves = with_overhead(moves, o)
        stats.seconds = time.perf_counter() - t_start
        if pace is not None:
            stats.pace = pace
            settle_pace(db, env, pace, measured_new=not stats.nothing_new)
        cm = CostModel(graph_fingerprint=graph.fingerprint, memory_system=memory.name, access=memory.access,
                       kernel_seconds=kernel_seconds, placement_seconds=placement_seconds, moves=moves,
                       simulated=False, environment=envd,
                       # Linux AIO keeps a kernel's copies in flight together
                       async_overlap=memory.capabilities.async_engine == "aio",
                       workspace_bytes=tuple(workspace.get(k.signature, 0) for k in graph.kernels)
                       if workspace else (),
                       copy_interference=slowdown, wake_seconds=wake,
                       executor_overhead=o.as_dict() if overhead is not None else {})
        return cm, stats
    finally:
        if owned:
            db.close()

