"""`autotm bench ...` and `autotm plot ...`: the artifact workflow on the command line.

bench EXPERIMENT runs a sweep into OUT/<experiment>.jsonl (cells already there are
skipped); plot FIGURE reads those records and writes PNG + SVG figures into OUT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import InputError

bench_app = typer.Typer(no_args_is_help=True, help="Run the paper's experiments; one JSON Lines record per run.")
plot_app = typer.Typer(no_args_is_help=True, help="Figures 7-12 and memory timelines from the bench records.")
console = Console()
err_console = Console(stderr=True)

MODELS_OPT = typer.Option(None, "--models", help="Comma-separated models (default: the experiment's).")
FORMS_OPT = typer.Option(None, "--formulations", "-f",
                         help="Comma-separated: static, synchronous, asynchronous, first-touch, lru, all-fast, "
                              "all-slow, save-on-cpu (default: what the experiment and memory system allow).")
RATIOS_OPT = typer.Option(None, "--ratios", "-r",
                          help="'common' (1:0,8:1,4:1,1:1,0:1), 'case-study', or a comma-separated list of "
                               "slow:fast ratios and sizes (4:1,185GB).")
PRESET_OPT = typer.Option(None, "--preset", "-p", help="Workload sizes (default: the experiment's).")
ITER_OPT = typer.Option(3, "--iterations", "-n", help="Training iterations per executed run.")
VERIFY_OPT = typer.Option(False, "--verify", help="Check every executed run against eager PyTorch bit for bit.")
OUT_OPT = typer.Option("results", "--out", "-o", help="Folder for records (<experiment>.jsonl) and figures.")
TIME_OPT = typer.Option(60.0, "--time-limit", help="Solver seconds per plan.")
GAP_OPT = typer.Option(0.01, "--mip-gap", help="Relative optimality gap at which the solver stops.")
WINDOW_OPT = typer.Option(15, "--window", help="Async moves may overlap kernels this many positions away.")
PIN_OPT = typer.Option(False, "--pin-params", help="Keep weights, optimizer state and I/O fast, outside the budget.")
CACHE_OPT = typer.Option(None, "--cache", help="Profile cache file (SQLite).")


def _sweep(experiment: str, out: str, memory: Optional[str], models, formulations, ratios, preset, iterations,
           verify, time_limit, mip_gap, window, pin_params, cache):
    from ..experiments import bench

    if iterations < 1:
        raise InputError("--iterations must be at least 1")
    kw = dict(models=models, formulations=formulations, ratios=ratios, preset=preset, pin_params=pin_params)
    if memory is not None:
        kw["memory"] = memory
    sweep = bench.DRIVERS[experiment](out, **kw)
    opts = bench.SweepOptions(iterations=iterations, verify=verify, time_limit=time_limit, mip_gap=mip_gap,
                              window=window, cache=cache)
    bench.run_cells(sweep.cells, sweep.store, opts, console=err_console)
    _summary(sweep)
    return sweep


def _summary(sweep) -> None:
    keys = {c.key for c in sweep.cells}
    recs = [r for r in sweep.store.latest() if r.key in keys]
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.status] = counts.get(r.status, 0) + 1
    t = Table(title=f"{sweep.experiment}: {len(recs)} of {len(keys)} cells recorded", show_header=False)
    for status, n in sorted(counts.items()):
        t.add_row(status, str(n))
    t.add_row("records", str(sweep.store.path))
    console.print(t)
    for r in recs:
        if r.status == "error":
            console.print(f"[red]error[/red] {r.model} {r.formulation} {r.budget or ''} on {r.memory_system}: "
                          f"{r.message[:200]}", highlight=False)


def _bench_command(experiment: str, default_memory: str, doc: str):
    def command(
        models: Optional[str] = MODELS_OPT,
        formulations: Optional[str] = FORMS_OPT,
        ratios: Optional[str] = RATIOS_OPT,
        memory: str = typer.Option(default_memory, "--memory", "-m", help="Memory system (cpu+file, cpu+mmap, "
                                   "cpu+numa, cuda+host, or sim:SPEC to plan and simulate)."),
        preset: Optional[str] = PRESET_OPT,
        iterations: int = ITER_OPT,
        verify: bool = VERIFY_OPT,
        out: str = OUT_OPT,
        time_limit: float = TIME_OPT,
        mip_gap: float = GAP_OPT,
        window: int = WINDOW_OPT,
        pin_params: bool = PIN_OPT,
        cache: Optional[str] = CACHE_OPT,
    ) -> None:
        _sweep(experiment, out, memory, models, formulations, ratios, preset, iterations, verify, time_limit,
               mip_gap, window, pin_params, cache)
        if experiment == "test":
            from ..experiments import plots

            paths = plots.plot_experiment("test", out)
            console.print("figures: " + ", ".join(str(p) for p in paths if str(p).endswith(".png")))

    command.__doc__ = doc
    return command


bench_app.command("conventional")(_bench_command(
    "conventional", "cpu+file",
    "The conventional networks at the common ratios (run_conventional): executed at the cpu preset on real "
    "tiers, planned and simulated at the conventional preset on sim: specs."))
bench_app.command("case-study")(_bench_command(
    "case-study", "sim:optane",
    "Inception v4 over the case-study ratios (Figure 10): simulated on sim:optane by default."))
bench_app.command("large")(_bench_command(
    "large", "sim:nvme",
    "The large presets at a 185 GB fast budget against lru, 2LM's analogue (Figure 8): simulated by default."))
bench_app.command("gpu")(_bench_command(
    "gpu", "cuda+host",
    "The gpu presets on cuda+host against lru, save-on-cpu and all-fast (Figure 12); needs a CUDA GPU."))
bench_app.command("test")(_bench_command(
    "test", "cpu+file",
    "The artifact's Test Run: resnet50 at the test preset, profiled, run at the common ratios, then plotted."))


# ------------------------------------------------------------------------------ plot

PLOT_OUT_OPT = typer.Option("results", "--out", "-o", help="Folder with the records; figures are written there.")
RESULTS_OPT = typer.Option(None, "--results", help="Read these record files instead (comma-separated).")


def _records(out: str, experiment: str, results: Optional[str]):
    from ..experiments.bench import parse_list
    from ..experiments.results import load_records, store_for

    paths = parse_list(results) or [store_for(out, experiment).path]
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"no records at {p}: run `autotm bench {experiment} --out {out}` first")
    return load_records(paths)


def _plot_command(figure: str, default_experiment: str, doc: str):
    def command(
        out: str = PLOT_OUT_OPT,
        experiment: str = typer.Option(default_experiment, "--experiment", "-e",
                                       help="Whose records to plot (conventional, case-study, large, gpu, test)."),
        results: Optional[str] = RESULTS_OPT,
    ) -> None:
        from ..experiments import plots

        paths = plots.FIGURES[figure](_records(out, experiment, results), out, tag=experiment)
        for p in paths:
            console.print(str(p), highlight=False)

    command.__doc__ = doc
    return command


plot_app.command("speedup")(_plot_command(
    "speedup", "conventional", "Figure 7: speedup over all-slow (direct) or first-touch (staged) per ratio and model."))
plot_app.command("large")(_plot_command("large", "large", "Figure 8: speedup over lru for the large presets."))
plot_app.command("costs")(_plot_command(
    "costs", "conventional", "Figure 9: performance relative to all-fast next to relative memory cost."))
plot_app.command("case-study")(_plot_command(
    "case-study", "case-study",
    "Figure 10a-c: slowdown, kernel IO bytes in fast memory and bytes moved versus the fast budget."))
plot_app.command("error")(_plot_command(
    "error", "conventional", "Figure 11: prediction error in percent (measured records only)."))
plot_app.command("gpu")(_plot_command(
    "gpu", "gpu", "Figure 12: GPU speedup over lru, with the all-fast and oracle bars."))


@plot_app.command("timeline")
def timeline(
    model: str = typer.Argument(..., help="The model."),
    budget: str = typer.Option(..., "--budget", "-B", help="Fast budget: bytes or slow:fast ratio."),
    formulation: str = typer.Option("asynchronous", "--formulation", "-f", help="Planner or baseline."),
    memory: str = typer.Option("cpu+file", "--memory", "-m", help="Memory system (sim:SPEC: simulated)."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Workload sizes (default: test)."),
    batch: Optional[int] = typer.Option(None, "--batch", "-b"),
    image: Optional[int] = typer.Option(None, "--image", "-i"),
    out: str = PLOT_OUT_OPT,
    time_limit: float = TIME_OPT,
    window: int = WINDOW_OPT,
    pin_params: bool = PIN_OPT,
    cache: Optional[str] = CACHE_OPT,
) -> None:
    """A memory timeline of one plan: fast-tier bytes over the kernels by tensor role, the budget, the moves."""
    from ..experiments import plots
    from ..planner import plan as make_plan
    from ..profile.workloads import profile_workload
    from ..runtime.overhead import measure_executor_overhead
    from ..zoo import workload

    if preset is None and (batch is None or image is None):
        preset = "test"
    w = workload(model, preset, batch=batch, image=image)
    with err_console.status(f"capturing, profiling and planning {w.name} on {memory} ...", spinner="dots"):
        graph, cm, _ = profile_workload(w, memory, cache, measure_overhead=measure_executor_overhead)
        p = make_plan(graph, cm, None if formulation == "all-fast" else budget, formulation,
                      time_limit=time_limit, window=window, pin_params=pin_params)
    for path in plots.timeline(p, graph, out, budget_label=budget):
        console.print(str(path), highlight=False)
