"""Peak RSS of training on cpu+file versus the fast-memory budget.

Each case runs in a fresh subprocess:

1. import torch and autotm, build the model, capture the iteration, open the cpu+file
   memory system, delete the model and optimizer: the process's RSS now is the
   **baseline** (interpreter, torch, the captured graph; no tensor of the iteration);
2. build the model again, start an ExecutorSession with the plan (default: evict every
   activation, sync) and a budget equal to the plan's validated peak fast bytes, then
   delete the model and optimizer (the session trains its own copies);
3. train a few iterations while a thread samples the RSS every 2 ms: **peak RSS**.

overhead = peak RSS - budget: the DRAM the process holds beyond what the plan accounts
for. The claim checked by tests/runtime/test_rss.py is

    peak RSS <= budget + baseline RSS + SLACK_BYTES

i.e. the overhead is the baseline plus a fixed constant (allocator slack, page rounding
of the file tier's read buffers, oneDNN scratch space, the batch the caller holds).

    python benchmarks/rss_overhead.py [CASE ...] [--iterations 3]

CASE is model:preset:plan or model:BATCHxIMAGE:plan, plan one of evict-sync,
evict-async, all-fast, each optionally with "+arena" (the planner's static layout, which
the executor then follows: tiers/cpu_arena.py; the budget is then the arena's size) or
"+arena-over" (the same layout moved SLACK_BYTES up in a larger arena, the budget at the
plan's peak: a layout larger than the budget by more than the slack, which the executor
follows, giving the arena's free huge pages back when RSS nears the bound);
default: every zoo model at test, and resnet50, transformer at cpu, with evict-sync.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (_child, also when tests/runtime/test_rss.py loads this file)
from _child import emit, run_child  # noqa: E402

SLACK_BYTES = 160 << 20
"""The stated constant: peak RSS <= budget + baseline + SLACK_BYTES (see the module docstring)."""

DEFAULT_CASES = [f"{m}:test:evict-sync" for m in ("vgg19", "vgg416", "resnet50", "resnet200", "inception_v4",
                                                   "densenet264", "transformer")] + [
    "resnet50:16x128:evict-sync", "resnet50:cpu:evict-sync", "resnet50:cpu:evict-async", "transformer:cpu:evict-sync"]


def parse_case(case: str):
    from autotm.zoo import Workload, workload

    model, size, plan = case.split(":")
    if "x" in size:
        b, i = size.split("x")
        return Workload(model, None, int(b), int(i)), plan
    return workload(model, size), plan


def measure(case: str, iterations: int = 3) -> dict:
    """Run one case in this process (call it in a fresh one)."""
    import torch  # noqa: F401

    from autotm.frontend.capture import capture
    from autotm.runtime.host_memory import rss_bytes
    from autotm.runtime.session import ExecutorSession
    from autotm.tiers.host_heap import trim_heap
    from autotm.ir.plan import all_fast_plan, evict_all_activations_plan
    from autotm.planner import large_block_alignment
    from autotm.planner.arena import with_arena
    from autotm.tiers import make_memory_system
    from autotm.checks.validate import validate

    w, plan_name = parse_case(case)
    model = w.build_model(seed=0)
    opt = w.make_optimizer(model.parameters())
    batch = w.make_batch(seed=0)
    graph = capture(model, w.loss_fn(), opt, batch, name=w.name)
    del model, opt
    with make_memory_system("cpu+file") as memory:
        gc.collect()
        trim_heap()
        baseline = rss_bytes()
        # "+arena": the planner's layout, budget at least its size; "+arena-over": the layout
        # with the budget at the plan's peak, under the layout's size (followed, trimmed)
        over = plan_name.endswith("+arena-over")
        base_name = plan_name.removesuffix("+arena-over").removesuffix("+arena")
        arena = over or plan_name.endswith("+arena")
        plan = {"all-fast": lambda: all_fast_plan(graph),
                "evict-sync": lambda: evict_all_activations_plan(graph, "sync"),
                "evict-async": lambda: evict_all_activations_plan(graph, "async")}[base_name]()
        budget = validate(plan, graph).peak_fast_bytes
        if arena:  # the planner's static layout, followed by the executor (tiers/cpu_arena.py)
            plan = with_arena(plan, graph, large_alignment=large_block_alignment("cpu+file"))
            if not over:
                budget = max(budget, plan.arena_bytes)
            else:  # the same layout SLACK_BYTES higher: its bottom is free pages (temporaries)
                plan = dataclasses.replace(plan, arena_bytes=plan.arena_bytes + SLACK_BYTES, tensors=tuple(
                    dataclasses.replace(tp, offsets=tuple(o + SLACK_BYTES for o in tp.offsets)) for tp in plan.tensors))
        all_fast_peak = validate(all_fast_plan(graph), graph).peak_fast_bytes
        model = w.build_model(seed=0)
        opt = w.make_optimizer(model.parameters())
        session = ExecutorSession(graph, plan, memory, model, opt, budget_bytes=budget, trim_memory=True,
                                  sample_rss=True)
        del model, opt
        gc.collect()
        try:
            for _ in range(iterations):
                session.step(batch)
            rep = session.report()
        finally:
            session.close()
    peak = rep.peak_rss_bytes
    return {"case": case, "model": w.model, "batch": w.batch, "image": w.image, "plan": plan_name,
            "budget": budget, "all_fast_peak": all_fast_peak, "peak_fast_bytes": rep.peak_fast_bytes,
            "peak_rss": peak, "baseline_rss": baseline, "overhead": peak - budget,
            "overhead_minus_baseline": peak - budget - baseline, "slack": SLACK_BYTES,
            "within_bound": peak <= budget + baseline + SLACK_BYTES,
            "iteration_seconds": rep.iteration_seconds, "bytes_to_slow": rep.bytes_to_slow,
            "arena": rep.meta.get("arena")}


def run_case(case: str, iterations: int = 3, timeout: float = 900) -> dict:
    """Run one case in a fresh subprocess; returns its measurements (ChildFailed if it fails)."""
    return run_child(__file__, ["--one", case, "--iterations", str(iterations)], timeout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        emit(measure(a.one, a.iterations))
        return
    mib = 1 << 20
    print(f"cpu+file, budget = the plan's validated peak; {a.iterations} iterations; MiB; "
          f"bound: peak RSS <= budget + baseline + {SLACK_BYTES // mib}")
    head = (f"{'case':<32} {'all-fast':>8} {'budget':>7} {'peak RSS':>8} {'baseline':>8} "
            f"{'overhead':>8} {'ovh-base':>8} {'ok':>3} {'s/iter':>6}")
    print(head)
    print("-" * len(head))
    for case in a.cases:
        try:
            d = run_case(case, a.iterations)
        except Exception as e:  # one failing case does not hide the others
            print(f"{case:<32} {str(e).splitlines()[0]}", flush=True)
            continue
        print(f"{case:<32} {d['all_fast_peak'] / mib:>8.0f} {d['budget'] / mib:>7.0f} {d['peak_rss'] / mib:>8.0f} "
              f"{d['baseline_rss'] / mib:>8.0f} {d['overhead'] / mib:>8.0f} {d['overhead_minus_baseline'] / mib:>8.0f} "
              f"{'yes' if d['within_bound'] else 'NO':>3} {min(d['iteration_seconds']):>6.2f}", flush=True)


if __name__ == "__main__":
    main()
