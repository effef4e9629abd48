"""`autotm demo`: every formulation and baseline side by side on the real cpu+file tier.

Capture and profile the test workload, plan it at a budget with each planner, execute
every plan for three iterations on cpu+file, check each against eager PyTorch bit for
bit, and print a table and save a figure.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

PLANNERS = ("all-fast", "first-touch", "lru", "synchronous", "asynchronous")


def _mib(n) -> str:
    return f"{n / 2**20:,.1f} MiB"


def run_demo(console: Console, *, model: str = "resnet50", budget: str = "4:1", out: str = "results",
             iterations: int = 3, time_limit: float = 8.0, profile: Callable[..., Any] | None = None) -> bool:
    """Run the demo and print it to `console`; True when every plan's run was bit-identical
    to eager PyTorch. `profile`: what profiles the graph, with autotm.profile.profile's
    signature (None: that one; a test passes another machine's)."""
    from ..api import run_workload
    from ..planner import plan as make_plan
    from ..profile import capture_real
    from ..profile import profile as real_profile
    from ..runtime.overhead import measure_executor_overhead
    from ..tiers import cpu_arena, make_memory_system
    from ..runtime.verify import eager_reference
    from ..zoo import workload

    profile = real_profile if profile is None else profile
    t_start = time.perf_counter()
    # the executor follows the planned layouts with a C++ allocator built on first use
    # (~30 s here, then cached; `make install` builds it): build it while capturing and
    # computing the reference, never while profiling or running (the compiler would take a
    # core from the measurements: the demo's profile took 28-32 s instead of 8, and timed
    # its kernels on a busy machine)
    builder = threading.Thread(target=cpu_arena.load, daemon=True)
    builder.start()
    w = workload(model, "test")
    console.print(f"[bold]autotm demo[/bold]: {w.name} on cpu+file (DRAM + direct-I/O files) at a {budget} "
                  f"slow:fast budget; every byte counted (weights and optimizer state too)")
    with console.status("capturing ...", spinner="dots"):
        graph, _model, _opt, _batch, inputs = capture_real(w)
        del _model, _opt, _batch
    with console.status("eager PyTorch reference ...", spinner="dots"):
        ref = eager_reference(w, iterations)
    if builder.is_alive():
        with console.status("building the CPU arena allocator (first run only) ...", spinner="dots"):
            builder.join()
    with console.status("profiling ...", spinner="dots"):
        cm, stats = profile(graph, "cpu+file", None, inputs=inputs, return_stats=True,
                            measure_overhead=measure_executor_overhead)
        del inputs
    console.print(f"captured {len(graph.kernels):,} kernels ({graph.unique_signatures} unique), peak "
                  f"{_mib(graph.peak_live_bytes)}; profile: {stats.message()}")
    budget_bytes, note = demo_budget(graph, cm, budget, PLANNERS)
    if note:
        console.print(note, highlight=False)
    rows = []
    with make_memory_system("cpu+file") as ms:
        for name in PLANNERS:
            with console.status(f"{name}: planning ...", spinner="dots"):
                p = make_plan(graph, cm, None if name == "all-fast" else budget_bytes, name, time_limit=time_limit)
            with console.status(f"{name}: running {iterations} iterations ...", spinner="dots"):
                r = run_workload(w, graph, cm, p, ms, iterations=iterations, verify=True, reference=ref)
            rows.append((name, p, r))
    base = next(r.report.measured_seconds for n, _, r in rows if n == "all-fast")
    from rich import box

    # no vertical rules: the eight columns fit an 80-column terminal with full headers
    shown = budget if note is None else "(fallback)"
    t = Table(title=f"{w.name}, cpu+file, budget {shown} = {_mib(rows[1][1].meta.budget_bytes)}",
              box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, pad_edge=False)
    for col in ("planner", "pred s", "meas s", "x fast", "peak MiB", "moved MiB", "solve s", "exact"):
        t.add_column(col, justify="left" if col == "planner" else "right", no_wrap=True, min_width=len(col))
    ok = True
    for name, p, r in rows:
        rep = r.report
        ok &= bool(r.identical)
        t.add_row(name, f"{p.meta.predicted_seconds:.3f}", f"{rep.measured_seconds:.3f}",
                  f"{rep.measured_seconds / base:.2f}", f"{rep.peak_fast_bytes / 2**20:,.1f}",
                  f"{(rep.bytes_to_slow + rep.bytes_to_fast) / 2**20:,.0f}", f"{p.meta.solve_seconds:.1f}",
                  "[green]yes[/green]" if r.identical else "[red]NO[/red]")
    console.print(t)
    console.print("pred/meas s: predicted and measured seconds per iteration; x fast: measured time over all-fast's; "
                  "exact: loss, gradients, weights and optimizer state bit-identical to eager PyTorch")
    path = _figure(rows, w.name, budget if note is None else _mib(budget_bytes), out)
    console.print(f"figure: {path}  (total {time.perf_counter() - t_start:.0f} s)")
    return ok


def demo_budget(graph, cost_model, budget, planners=PLANNERS) -> tuple[int, str | None]:
    """The budget (bytes) every planner of the demo plans at: `budget`, or, where that is
    infeasible on this machine (its kernels' workspaces, which depend on the algorithms
    oneDNN picks for this CPU, can need more fast memory than another's), the smallest
    budget at which all of them find a plan; with a one-line note saying so (None when
    `budget` is kept)."""
    from ..ir.budget import is_minimum, parse_budget
    from ..planner import smallest_feasible_budget

    floors = {name: smallest_feasible_budget(graph, cost_model, name) for name in planners if name != "all-fast"}
    name, floor = max(floors.items(), key=lambda kv: kv[1].bytes)
    if is_minimum(budget):
        return floor.bytes, None
    base = smallest_feasible_budget(graph, cost_model, "all-fast").bytes  # what a ratio is of
    wanted = parse_budget(budget, base)
    if wanted >= floor.bytes:
        return wanted, None
    return floor.bytes, (f"note: {budget} ({_mib(wanted)}) is infeasible on this machine: {name} needs at least "
                         f"{_mib(floor.bytes)} ({floor.what}); running every planner at that budget instead")


def _figure(rows, name: str, budget: str, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    labels = [n for n, _, _ in rows]
    measured = [r.report.measured_seconds for _, _, r in rows]
    predicted = [p.meta.predicted_seconds for _, p, _ in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], measured, width=0.4, label="measured", color="#3b6ea5")
    ax.bar([i + 0.2 for i in x], predicted, width=0.4, label="predicted", color="#b0c4de")
    ax.axhline(measured[0], color="k", lw=0.8, ls="--", label="all-fast (measured)")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("seconds per training iteration")
    ax.set_title(f"{name}: measured on cpu+file at budget {budget}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "demo.png")
    fig.savefig(path, dpi=130)
    fig.savefig(os.path.join(out, "demo.svg"))
    plt.close(fig)
    return path
