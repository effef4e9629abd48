"""What following the planner's arena layout costs: the all-fast plan on glibc's heap versus in the arena.

Every budgeted plan on cpu+file runs in the arena (tiers/cpu_arena.py), with the
executor holding the process's RSS under budget + baseline + a slack by trimming glibc's
heap (executor.py, module doc). The all-fast plan moves nothing, so running it both
ways shows what the arena and that bound cost by themselves, which the cost model does
not know (it times kernels on the heap).

For each `cpu` preset model, three sessions, each in a fresh subprocess that does what
`autotm run` does (capture on real tensors, profile (cached), run: a warm-up iteration and
then `--iterations` timed ones), one after another:

1. all-fast on the heap, no budget;
2. all-fast laid out in the arena (planner.laid_out), its budget the arena's size (as
   benchmarks/prediction_error.py runs its evict plans);
3. all-fast on the heap again (how far the machine drifted meanwhile).

(One process per session: a session on the heap leaves glibc's heap as large as its
iteration's tensors, and a later session in the same process would run over that.)

Prints the median seconds of each, arena / heap, the minor page faults per timed
iteration of each, and glibc's heap before the arena session (its size and free bytes:
what capture and profiling left in the process). Goal: arena / heap <= 1.05.

    python benchmarks/arena_overhead.py [--models densenet264,resnet50] [--iterations 5] [--cache FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import resource
import statistics
import tempfile
from pathlib import Path

from _child import ChildFailed, emit, run_child

MODELS = ("densenet264", "inception_v4", "resnet50")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def glibc_heap() -> dict | None:
    """glibc's heap: bytes it spans (not mmapped blocks), in use, free; None off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        mi = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return {"span": mi.arena, "in_use": mi.uordblks, "free": mi.fordblks}


def one(model: str, session: str, preset: str, iterations: int, cache: str) -> dict:
    from autotm.runtime.session import ExecutorSession
    from autotm.ir.plan import all_fast_plan
    from autotm.planner import laid_out
    from autotm.profile.workloads import profile_workload
    from autotm.runtime.overhead import measure_executor_overhead
    from autotm.tiers import make_memory_system
    from autotm.checks.validate import validate
    from autotm.zoo import workload

    w = workload(model, preset)
    with make_memory_system("cpu+file") as memory:
        graph, cm, _ = profile_workload(w, "cpu+file", cache, measure_overhead=measure_executor_overhead)
        heap_before = glibc_heap()
        plan = all_fast_plan(graph)
        if session == "arena":
            fast = plan
            plan = laid_out(fast, graph, cm)
            # (the validator's peak can exceed the layout's by a few bytes)
            plan = dataclasses.replace(plan, budget_bytes=max(plan.arena_bytes, validate(fast, graph).peak_fast_bytes))
        m = w.build_model()
        opt = w.make_optimizer(m.parameters())
        s = ExecutorSession(graph, plan, memory, m, opt)
        del m, opt
        faults = []
        try:
            for i in range(iterations + 1):
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                s.step(w.make_batch(seed=i))
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            rep = s.report()
        finally:
            s.close()
    return {"seconds": rep.measured_seconds, "iterations": rep.iteration_seconds,
            "faults": statistics.median(faults[1:]), "heap_before": heap_before,
            "arena": (rep.meta.get("arena") or {}).get("arena_bytes")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--cache", default=None, help="profile cache (default: a fresh one for this run)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per session")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        emit(one(*a.one, a.preset, a.iterations, a.cache))
        return
    if a.cache is None:
        a.cache = str(Path(tempfile.mkdtemp()) / "profile.sqlite")
    print(f"all-fast through the executor on cpu+file, {a.preset} preset: glibc's heap versus the arena layout "
          f"(median of {a.iterations} iterations after a warm-up; faults: minor page faults per iteration)")
    head = (f"{'model':<13} {'heap s':>7} {'arena s':>8} {'arena/heap':>10} {'heap again s':>12} {'faults heap':>11} "
            f"{'faults arena':>12} {'arena MiB':>9}  glibc heap before the arena session (span / free MiB)")
    print(head)
    print("-" * len(head))
    ratios = []
    for model in a.models.split(","):
        d = {}
        for session in ("heap", "arena", "heap again"):
            try:
                d[session] = run_child(__file__, ["--one", model, session.split()[0], "--preset", a.preset,
                                                  "--iterations", str(a.iterations), "--cache", a.cache], a.timeout)
            except ChildFailed as e:
                print(f"{model:<13} {session}: {e}", flush=True)
                break
        if len(d) < 3:
            continue
        h, ar, h2 = (d[k] for k in ("heap", "arena", "heap again"))
        ratio = ar["seconds"] / h["seconds"]
        ratios.append(ratio)
        hb = ar["heap_before"]
        heap = f"{hb['span'] / 2**20:.0f} / {hb['free'] / 2**20:.0f}" if hb else "(not glibc)"
        arena_mib = f"{ar['arena'] / 2**20:.0f}" if ar["arena"] else "unused"
        print(f"{model:<13} {h['seconds']:>7.3f} {ar['seconds']:>8.3f} {ratio:>10.3f} {h2['seconds']:>12.3f} "
              f"{h['faults']:>11.0f} {ar['faults']:>12.0f} {arena_mib:>9}  {heap}", flush=True)
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"\narena / heap, geometric mean over {len(ratios)} models: {gm:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
