"""The `autotm` command line.

Errors the user can act on (unknown model, bad size, uncapturable op, ...) are printed as
one line and exit with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import warnings
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import InputError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="autotm: plan and run PyTorch training whose memory footprint exceeds fast memory (AutoTM, ASPLOS 2020).",
)
console = Console()
err_console = Console(stderr=True)


class _Options:
    debug = False


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _Options.debug = debug


def _workload(model: str, preset: Optional[str], batch: Optional[int], image: Optional[int]):
    from ..zoo import workload

    if preset is None and (batch is None or image is None):
        preset = "test"
    return workload(model, preset, batch=batch, image=image)


MODEL_ARG = typer.Argument(..., help="vgg19, vgg416, resnet50, resnet200, inception_v4, densenet264 or transformer.")
PRESET_OPT = typer.Option(None, "--preset", "-p", help="test, cpu, conventional, large or gpu (default: test).")
BATCH_OPT = typer.Option(None, "--batch", "-b", help="Batch size (overrides the preset's).")
IMAGE_OPT = typer.Option(None, "--image", "-i", help="Image size, or sequence length for the transformer.")


@app.command()
def graph(
    model: str = MODEL_ARG,
    preset: Optional[str] = PRESET_OPT,
    batch: Optional[int] = BATCH_OPT,
    image: Optional[int] = IMAGE_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Capture one training iteration on fake tensors and summarize its graph."""
    from ..frontend.workloads import capture_workload

    w = _workload(model, preset, batch, image)
    with console.status(f"capturing {w.name} on fake tensors ...", spinner="dots") if not as_json else _null():
        g = capture_workload(w, fake=True)
    s = g.summary()
    s.update(model=w.model, preset=w.preset, batch=w.batch, image=w.image)
    if as_json:
        print(json.dumps(s))
        return
    t = Table(title=f"{w.name}: one training iteration", show_header=False)
    t.add_row("kernels", f"{s['kernels']:,} ({s['unique_kernels']:,} unique signatures)")
    t.add_row("tensors (storages)", f"{s['tensors']:,}")
    t.add_row("parameters", f"{s['parameters']:,}")
    t.add_row("FLOPs", f"{s['flops']:.3e}")
    t.add_row("peak live bytes", f"{human_bytes(s['peak_live_bytes'])} at kernel {s['peak_kernel']} ({g.kernels[s['peak_kernel']].op})")
    for role, b in sorted(s["peak_live_bytes_by_role"].items(), key=lambda kv: -kv[1]):
        t.add_row(f"  at peak: {role}", human_bytes(b))
    if g.splittable:
        big = max(g.splittable, key=lambda k: g.tensors[g.kernels[k].outputs[0]].nbytes)
        t.add_row("may run in pieces", f"{len(g.splittable):,} elementwise kernels, the largest {g.kernels[big].op} of "
                  f"{human_bytes(g.tensors[g.kernels[big].outputs[0]].nbytes)} (where a budget needs it)")
    t.add_row("capture seconds", f"{s['capture_seconds']:.2f}")
    console.print(t)


MEMORY_OPT = typer.Option("cpu+file", "--memory", "-m", help="cpu+file (default), cpu+mmap, cpu+numa, or sim:SPEC (optane, cxl, nvme, pcie-host; optane-xeon, nvme-xeon with a server's compute peak).")
BUDGET_OPT = typer.Option(None, "--budget", "-B", help="Fast-memory budget: bytes (6GB, 512MiB), slow:fast ratio (4:1), or min (the planner's smallest feasible).")
FORMULATION_OPT = typer.Option("asynchronous", "--formulation", "-f", help="synchronous, asynchronous (ILP) or a baseline: all-fast, first-touch, lru.")
CACHE_OPT = typer.Option(None, "--cache", help="Profile cache file (SQLite); default in the user's cache directory.")


@app.command()
def profile(
    models: list[str] = typer.Argument(..., help="One or more models."),
    preset: Optional[str] = PRESET_OPT,
    batch: Optional[int] = BATCH_OPT,
    image: Optional[int] = IMAGE_OPT,
    memory: str = MEMORY_OPT,
    cache: Optional[str] = CACHE_OPT,
    recache: bool = typer.Option(False, "--recache", help="Measure everything again."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Time every unique kernel and the moves of a memory system, into the profile cache."""
    from .profile import profile_command
    from ..runtime.overhead import measure_executor_overhead

    profile_command(models, preset, batch, image, memory, cache, recache, as_json,
                    measure_overhead=measure_executor_overhead)


def _plan_options(window, time_limit, mip_gap, pin_params):
    """The planner's options, refused before any work when out of range."""
    if window < 0:
        raise InputError(f"--window must be 0 or more, not {window}")
    if not time_limit > 0:
        raise InputError(f"--time-limit must be a positive number of seconds, not {time_limit}")
    if not 0 <= mip_gap < 1:
        raise InputError(f"--mip-gap must be at least 0 and below 1, not {mip_gap}")
    return dict(window=window, time_limit=time_limit, mip_gap=mip_gap, pin_params=pin_params)


WINDOW_OPT = typer.Option(15, "--window", help="Async moves may overlap kernels this many positions away.")
TIME_OPT = typer.Option(60.0, "--time-limit",
                        help="Solver time limit in seconds for the whole plan, the arena's re-solves included.")
GAP_OPT = typer.Option(0.01, "--mip-gap", help="Relative optimality gap at which the solver stops.")
PIN_OPT = typer.Option(False, "--pin-params", help="Keep weights, optimizer state and I/O fast, outside the budget (the paper's accounting).")


def _prepare(model, preset, batch, image, memory, cache, budget=None, formulation="all-fast", pin_params=False):
    from ..planner.floor import check_before_profile
    from ..profile.workloads import profile_workload
    from ..runtime.overhead import measure_executor_overhead

    w = _workload(model, preset, batch, image)

    def check(graph) -> None:  # an infeasible budget fails after the capture, not after the profile
        if not pin_params:
            check_before_profile(graph, budget, formulation, _access(memory))

    if not memory.startswith("sim:"):
        from ..tiers import make_memory_system

        make_memory_system(memory).close()  # (it exists, its slow directory is writable: before the capture)
    with console.status(f"capturing and profiling {w.name} on {memory} ...", spinner="dots"):
        graph, cm, _ = profile_workload(w, memory, cache, before_profile=check,
                                        measure_overhead=measure_executor_overhead)
    return w, graph, cm


def _access(memory: str) -> str:
    """"staged" or "direct": how kernels of `memory` reach slow memory (before building it)."""
    if memory.startswith("sim:"):
        from ..profile import load_spec

        return load_spec(memory).access
    return "direct" if memory in ("cpu+mmap", "cpu+numa") else "staged"


def _warn(p) -> None:
    """A plan's warning (its arena, or all-fast over the budget) on stderr, also with --json."""
    if p.meta.warning:
        err_console.print(f"[yellow]warning:[/yellow] {p.meta.warning}", highlight=False, soft_wrap=True)


def _check_budget(budget: str | None, formulation: str) -> None:
    """A missing or malformed budget is an error before the capture and the profile (a
    typo in --budget cost a whole profile before)."""
    from ..ir.budget import is_minimum, parse_budget

    if budget is None and formulation != "all-fast":
        raise InputError("a budget is needed: --budget 6GB, 512MiB or a slow:fast ratio such as 4:1")
    if budget is not None and not is_minimum(budget):
        parse_budget(budget, 1)  # a ratio's bytes come later, from the graph's peak


def _plan_summary(p) -> dict:
    m = p.meta
    return {
        "status": m.status, "formulation": m.formulation, "predicted_seconds": m.predicted_seconds,
        "solve_seconds": m.solve_seconds, "gap": m.gap,
        "bound_seconds": m.bound_seconds, "bytes_to_slow": m.bytes_to_slow,
        "bytes_to_fast": m.bytes_to_fast, "moves": m.moves, "budget_bytes": m.budget_bytes,
        "peak_fast_bytes": m.peak_fast_bytes, "simulated": m.simulated, "memory_system": p.memory_system,
        "graph": p.graph_name, "pin_params": m.pin_params,
        # fragmentation: the arena a static layout of the fast tensors needs, against the budget
        "requested_budget_bytes": m.requested_budget_bytes, "arena_bytes": m.arena_bytes,
        "arena_fits": m.arena_fits, "defrag_retries": m.defrag_retries,
        "warning": m.warning, "fits_budget": m.fits_budget,
        "split": [list(kp) for kp in p.split],  # (kernel, pieces): kernels run in pieces
    }


@app.command()
def plan(
    model: str = MODEL_ARG,
    preset: Optional[str] = PRESET_OPT,
    batch: Optional[int] = BATCH_OPT,
    image: Optional[int] = IMAGE_OPT,
    memory: str = MEMORY_OPT,
    budget: Optional[str] = BUDGET_OPT,
    formulation: str = FORMULATION_OPT,
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Write the plan (JSON) here."),
    cache: Optional[str] = CACHE_OPT,
    window: int = WINDOW_OPT,
    time_limit: float = TIME_OPT,
    mip_gap: float = GAP_OPT,
    pin_params: bool = PIN_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Profile, then plan one training iteration for a fast-memory budget."""
    from ..planner import plan as make_plan

    _check_budget(budget, formulation)
    options = _plan_options(window, time_limit, mip_gap, pin_params)
    w, graph, cm = _prepare(model, preset, batch, image, memory, cache, budget, formulation, pin_params)
    with console.status(f"planning ({formulation}) ...", spinner="dots") if not as_json else _null():
        p = make_plan(graph, cm, budget, formulation, **options)
    if output:
        p.save(output)
    s = _plan_summary(p)
    if as_json:
        _warn(p)
        print(json.dumps(s))
        return
    t = Table(title=f"{w.name}: {formulation} plan on {p.memory_system}" + (" (simulated)" if s["simulated"] else ""),
              show_header=False)
    t.add_row("status", f"{s['status']} (gap {100 * s['gap']:.2f} %, solved in {s['solve_seconds']:.1f} s)")
    t.add_row("predicted iteration", f"{s['predicted_seconds']:.4f} s")
    if s["bound_seconds"] is not None:
        t.add_row("solver's bound", f"{s['bound_seconds']:.4f} s (no {formulation} plan for this budget is predicted faster)")
    t.add_row("budget", human_bytes(s["budget_bytes"] or 0))
    t.add_row("peak fast bytes", human_bytes(s["peak_fast_bytes"]))
    if s["arena_bytes"] is not None:
        t.add_row("arena (static layout)", f"{human_bytes(s['arena_bytes'])} achieved for "
                  f"{human_bytes(s['requested_budget_bytes'] or 0)} requested"
                  f" ({s['defrag_retries']} defrag re-solve{'' if s['defrag_retries'] == 1 else 's'})" + ("" if s["arena_fits"] in (None, True) else " [red]does not fit[/red]"))
    t.add_row("moves", f"{s['moves']} ({human_bytes(s['bytes_to_slow'])} to slow, {human_bytes(s['bytes_to_fast'])} to fast)")
    if p.split:
        ops = sorted({graph.kernels[k].op for k, _ in p.split})
        t.add_row("kernels in pieces", f"{len(p.split)} ({', '.join(ops)}; up to {max(n for _, n in p.split)} pieces, "
                  "inputs read from slow memory a piece at a time)")
    if s["warning"]:
        t.add_row("warning", str(s["warning"]))
    if output:
        t.add_row("written to", output)
    console.print(t)


@app.command()
def run(
    model: str = MODEL_ARG,
    preset: Optional[str] = PRESET_OPT,
    batch: Optional[int] = BATCH_OPT,
    image: Optional[int] = IMAGE_OPT,
    memory: str = MEMORY_OPT,
    budget: Optional[str] = BUDGET_OPT,
    formulation: str = FORMULATION_OPT,
    iterations: int = typer.Option(3, "--iterations", "-n", help="Training iterations to run."),
    verify: bool = typer.Option(False, "--verify", help="Compare loss, gradients and weights with eager PyTorch."),
    cache: Optional[str] = CACHE_OPT,
    window: int = WINDOW_OPT,
    time_limit: float = TIME_OPT,
    mip_gap: float = GAP_OPT,
    pin_params: bool = PIN_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Plan, then execute on the real tiers: predicted versus measured, peak fast bytes versus budget."""
    from ..api import run_workload
    from ..planner import plan as make_plan
    from ..tiers import make_memory_system

    if memory.startswith("sim:"):
        raise InputError(f"{memory} is hypothetical hardware: use `autotm plan` to simulate it; run needs a real memory system")
    _check_budget(budget, formulation)
    if iterations < 1:
        raise InputError("--iterations must be at least 1")
    options = _plan_options(window, time_limit, mip_gap, pin_params)
    w, graph, cm = _prepare(model, preset, batch, image, memory, cache, budget, formulation, pin_params)
    p = make_plan(graph, cm, budget, formulation, **options)
    _warn(p)
    with make_memory_system(memory) as ms:
        with console.status(f"running {iterations} iterations ...", spinner="dots") if not as_json else _null():
            r = run_workload(w, graph, cm, p, ms, iterations=iterations, verify=verify)
    s = _plan_summary(p)
    s.update(measured_seconds=r.report.measured_seconds, peak_fast_bytes=r.report.peak_fast_bytes,
             identical=r.identical, iteration_seconds=r.report.iteration_seconds,
             bytes_to_slow=r.report.bytes_to_slow, bytes_to_fast=r.report.bytes_to_fast)
    if as_json:
        print(json.dumps(s))
    else:
        t = Table(title=f"{w.name}: {formulation} on {memory}", show_header=False)
        err = abs(s["predicted_seconds"] - s["measured_seconds"]) / s["measured_seconds"]
        t.add_row("iteration seconds", f"measured {s['measured_seconds']:.4f}, predicted {s['predicted_seconds']:.4f} ({100 * err:.1f} % off)")
        t.add_row("peak fast bytes", f"{human_bytes(s['peak_fast_bytes'])} of a {human_bytes(s['budget_bytes'] or 0)} budget")
        t.add_row("moved", f"{human_bytes(s['bytes_to_slow'])} to slow, {human_bytes(s['bytes_to_fast'])} to fast")
        if verify:
            t.add_row("bit-identical to eager", "[green]yes[/green]" if r.identical else f"[red]NO[/red] {r.mismatches[:2]}")
        console.print(t)
    if verify and not r.identical:
        err_console.print(f"[red]error:[/red] the run is not bit-identical to eager PyTorch: {r.mismatches[:2]}",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def demo(
    model: str = typer.Option("resnet50", "--model", help="The model, at its test preset."),
    budget: str = typer.Option("4:1", "--budget", "-B", help="Fast budget (ratio or bytes)."),
    out: str = typer.Option("results", "--out", help="Folder for the figure."),
) -> None:
    """The main job on the embedded default: every formulation and baseline side by side on cpu+file, verified."""
    from ..experiments.demo import run_demo

    ok = run_demo(console, model=model, budget=budget, out=out)
    if not ok:
        err_console.print("[red]error:[/red] the demo failed: a plan's run is not bit-identical to eager PyTorch "
                          "(the table's exact column)", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


from .bench import bench_app, plot_app  # noqa: E402  (sub-apps: bench, plot)
app.add_typer(bench_app, name="bench")
app.add_typer(plot_app, name="plot")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _show_warning(message, category, filename, lineno, file=None, line=None):
    # autotm's own warnings (a rebuilt cache, a cache filled at another pace) read as
    # messages to the user; others (torch's) keep Python's form
    if category.__module__.startswith("autotm"):
        err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def _remove_dead_processes_slow_dirs() -> None:
    """Every start removes the slow directories of autotm processes that died (a SIGKILL
    leaves its directory behind), not only a start that opens the file tier: a rerun that
    finds its work done would otherwise leave them."""
    from ..tiers.base import default_slow_base_dir
    from ..tiers.slow_dirs import remove_orphaned_dirs

    try:
        remove_orphaned_dirs(default_slow_base_dir())
    except OSError:  # (a base directory that cannot be read: the tier says why when it is used)
        pass


def _import_torch_holding_ctrl_c() -> None:
    """numpy and torch cannot be interrupted while they import: a KeyboardInterrupt there
    has left numpy half-imported ("cannot load module more than once per process") and has
    aborted the process from pybind11 ("terminate called after throwing ..."). Every
    command imports torch (the slow-directory cleanup does), so import it first, holding a
    Ctrl-C until it is in (the guard the executor holds one with between kernels), then
    act on it."""
    from ..runtime.interrupts import CtrlCBetweenKernels

    with CtrlCBetweenKernels() as held:
        import torch  # noqa: F401
    if held.hit:
        raise KeyboardInterrupt


def _exit_interrupted() -> NoReturn:
    """One line, then status 130, not through sys.exit: after a Ctrl-C during capture,
    `python -m autotm.cli` printed this line and still ended by SIGINT (status -2; strace:
    the interpreter's own exit_sigint, SIG_DFL then kill itself, once main() had returned),
    as CPython does when it holds a KeyboardInterrupt as unhandled. The atexit functions
    (the tiers' cleanup) run as on a normal exit; what else the interpreter would finalize
    a Ctrl-C does not wait for."""
    err_console.print("interrupted (Ctrl-C)", highlight=False)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def main() -> None:
    from ..errors import AutotmError

    warnings.showwarning = _show_warning
    try:
        _import_torch_holding_ctrl_c()
        _remove_dead_processes_slow_dirs()
        # (without standalone mode click returns a typer.Exit's code instead of exiting)
        code = app(standalone_mode=False)
        if code == 130:  # (typer turns a Ctrl-C into this code, silently)
            _exit_interrupted()
        sys.exit(code if isinstance(code, int) else 0)
    except AutotmError as e:  # a user error: one line; anything else is a bug, with its traceback
        if _Options.debug:
            raise
        err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _exit_interrupted()
    except Exception as e:
        # usage errors of the click that typer bundles: show them the usual way
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":  # (click's form of a Ctrl-C)
            _exit_interrupted()
        raise


if __name__ == "__main__":
    main()
