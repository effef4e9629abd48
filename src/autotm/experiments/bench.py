"""The artifact's experiment drivers: sweeps of (workload, formulation, budget) cells.

Each driver mirrors a step of the original artifact workflow (reference §5.1):

- `conventional`: the conventional networks at the common ratios with each formulation
  (run_conventional). On a real memory system the plans are executed and timed (`cpu`
  preset on this machine); on a `sim:` spec they are planned and simulated
  (`conventional` preset, the paper's sizes).
- `case-study`: Inception v4 over the case-study ratios (inception_case_study).
- `large`: the large presets against lru, the analogue of 2LM's hardware-managed cache
  (run_large / run_2lm); simulated on a `sim:` spec here.
- `gpu`: the gpu presets on `cuda+host` against lru, PyTorch's save-on-cpu and all-fast.
- `test`: the artifact's Test Run, small enough for CI.

Every cell ends as one `Record` in OUT/<experiment>.jsonl, written as soon as it is done;
infeasible or unsupported cells are recorded too, never crash the sweep, and a sweep run
again skips the cells already stored. Timing belongs to the cells: the sweep adds nothing
between a plan and its run but the record.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Sequence

from ..ir.budget import COMMON_RATIOS, is_ratio, parse_budget
from .results import Record, ResultsStore, cell_key, environment, git_commit, now
from ..errors import InputError

CONVENTIONAL_MODELS = ("vgg19", "resnet200", "inception_v4", "densenet264")
LARGE_MODELS = ("vgg416", "inception_v4", "resnet200", "densenet264")
GPU_MODELS = ("vgg19", "resnet200", "inception_v4", "densenet264")
TEST_MODEL = "resnet50"  # VGG19 at batch 16 is weight-bound: no staged plan fits 4:1 (README)

# Formulations that take no budget: one cell per workload.
BUDGET_FREE = ("all-fast", "all-slow", "save-on-cpu")
# Formulations that only make sense with direct access (the planner says so too).
NEEDS_DIRECT = ("static", "all-slow")
LARGE_BUDGET = "185GB"  # the paper's run_large: slightly under the machine's 192 GB of DRAM
GPU_BUDGETS = ("1:1", "4:1")  # device memory at half and a fifth of the footprint


def case_study_ratios() -> tuple[str, ...]:
    """The Inception case study's slow:fast ratios (reference §3.1): from the fast fractions
    f in {1, 1/2..1/10, 1/100, 1/80, 1/60, 1/40, 1/20, 2/3, 3/4, 0}, r = (1 - f) / f."""
    fs = [Fraction(1)] + [Fraction(1, n) for n in range(2, 11)] + [Fraction(1, n) for n in (100, 80, 60, 40, 20)]
    fs += [Fraction(2, 3), Fraction(3, 4), Fraction(0)]
    out = []
    for f in sorted(set(fs), reverse=True):
        r = (1 - f) / f if f else None
        out.append("1:0" if r is None else f"{r.numerator}:{r.denominator}")
    return tuple(out)


def access_of(memory: str) -> str:
    """"staged" or "direct", without opening the memory system."""
    if memory.startswith("sim:"):
        from ..profile.roofline import load_spec

        return load_spec(memory).access
    direct = {"cpu+mmap", "cpu+numa"}
    staged = {"cpu+file", "cuda+host"}
    if memory in direct:
        return "direct"
    if memory in staged:
        return "staged"
    raise InputError(f"unknown memory system {memory!r}: cpu+file, cpu+mmap, cpu+numa, cuda+host or sim:SPEC")


def default_formulations(experiment: str, memory: str) -> tuple[str, ...]:
    """The artifact's formulation set for the experiment, adapted to what the memory system allows."""
    direct = access_of(memory) == "direct"
    if experiment == "case-study":
        return ("static", "synchronous") if direct else ("synchronous", "asynchronous")
    if experiment == "large":
        return ("static", "first-touch") if direct else ("synchronous", "asynchronous", "lru")
    if experiment == "gpu":
        return ("all-fast", "lru", "synchronous", "asynchronous") + (() if memory.startswith("sim:") else ("save-on-cpu",))
    # conventional and test
    return ("all-fast", "all-slow", "static", "synchronous", "first-touch") if direct else \
        ("all-fast", "synchronous", "asynchronous", "first-touch", "lru")


def parse_list(text: str | Sequence[str] | None) -> list[str] | None:
    """"a,b c" or ["a,b", "c"] -> ["a", "b", "c"]; None stays None."""
    if text is None:
        return None
    items = [text] if isinstance(text, str) else list(text)
    out = [x.strip() for item in items for x in item.replace(" ", ",").split(",")]
    return [x for x in out if x]


def parse_budgets(text: str | Sequence[str] | None, default: Sequence[str]) -> tuple[str, ...]:
    """Budgets of a sweep: "common", "case-study", or a list of ratios and sizes ("4:1,1:1", "185GB")."""
    items = parse_list(text)
    if not items:
        return tuple(default)
    out: list[str] = []
    for x in items:
        if x == "common":
            out += COMMON_RATIOS
        elif x == "case-study":
            out += case_study_ratios()
        else:
            parse_budget(x, 1)  # a ValueError names a malformed entry now, not mid-sweep
            out.append(x)
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Cell:
    """One run of a sweep."""

    experiment: str
    model: str
    preset: str
    batch: int
    image: int
    memory: str
    formulation: str
    budget: str | None  # None for BUDGET_FREE formulations
    pin_params: bool = False

    @property
    def workload(self):
        from ..zoo.registry import Workload

        return Workload(self.model, self.preset, self.batch, self.image)

    @property
    def key(self) -> tuple:
        return cell_key(self.experiment, self.workload.name, self.memory, self.formulation, self.budget,
                        self.pin_params)

    def label(self) -> str:
        return f"{self.model} {self.formulation}" + (f" @ {self.budget}" if self.budget else "")


def make_cells(experiment: str, models: Iterable[str], formulations: Iterable[str], budgets: Iterable[str],
               memory: str, preset: str, *, pin_params: bool = False, all_sizes: bool = False) -> list[Cell]:
    """Every (workload, formulation, budget) of a sweep; budget-free formulations once per workload.
    `all_sizes`: every size the preset lists for a model (the gpu preset has several)."""
    from ..planner import BASELINES, FORMULATIONS
    from ..zoo.registry import MODELS, preset_sizes

    formulations, budgets = list(formulations), list(budgets)
    for f in formulations:
        if f not in FORMULATIONS + BASELINES + ("save-on-cpu",):
            raise InputError(f"unknown formulation {f!r}; choose from "
                             f"{', '.join(FORMULATIONS + BASELINES + ('save-on-cpu',))}")
    cells = []
    for model in models:
        if model not in MODELS:
            raise InputError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
        sizes = preset_sizes(model, preset)
        for batch, image in sizes if all_sizes else sizes[:1]:
            for f in formulations:
                for b in [None] if f in BUDGET_FREE else budgets:
                    cells.append(Cell(experiment, model, preset, batch, image, memory, f, b, pin_params))
    return cells


@dataclass
class SweepOptions:
    iterations: int = 3  # executed runs: training iterations per cell (the median after the first is kept)
    verify: bool = False  # executed runs: compare with eager PyTorch bit for bit
    time_limit: float = 60.0  # solver seconds per plan
    mip_gap: float = 0.01
    window: int = 15
    cache: str | None = None  # profile cache file


@dataclass
class _Workload:
    """What the cells of one workload on one memory system share: captured and profiled once."""

    w: object
    memory: str
    graph: object
    cost_model: object
    reference: object = None  # eager reference for --verify, computed on first use


# --------------------------------------------------------------------------- plan statistics

def move_stats(plan, graph) -> dict[str, int]:
    """Copies of a plan split by mode and direction: counts and bytes (drops copy nothing)."""
    out = {f"{mode}_{what}_to_{d}": 0 for mode in ("sync", "async") for what in ("moves", "bytes")
           for d in ("slow", "fast")}
    for tp in plan.tensors:
        nb = graph.tensors[tp.id].nbytes
        for a in tp.actions:
            if a.kind == "drop":
                continue
            d = "fast" if a.kind == "prefetch" else "slow"
            out[f"{a.mode}_moves_to_{d}"] += 1
            out[f"{a.mode}_bytes_to_{d}"] += nb
    return out


def kernel_io(plan, graph) -> dict[str, int]:
    """Kernel operand bytes summed over kernels (the original's kernel IO residency stats):
    inputs and outputs, those in fast memory while the kernel ran (direct access: not read
    or written in place in slow memory; staged: all of them), and the input bytes that
    were kept in fast memory since their production or previous use, i.e. not brought back
    by a prefetch for this use (what a staged plan keeps resident rather than moves)."""
    from ..checks.validate import PlanReplay

    nbytes = [t.nbytes for t in graph.tensors]
    fetched: set[int] = set()  # prefetched since its last use
    ib = ob = ib_fast = ob_fast = ib_kept = 0
    for step in PlanReplay(plan, graph, budget_bytes=None):
        kern = graph.kernels[step.kernel]
        slow = set(step.slow_operands)
        fetched.update(m.tensor for m in step.sync_moves if m.action.kind == "prefetch")
        for t in kern.inputs:
            ib += nbytes[t]
            if t not in slow:
                ib_fast += nbytes[t]
                if t not in fetched:
                    ib_kept += nbytes[t]
            fetched.discard(t)
        for t in kern.outputs:
            ob += nbytes[t]
            if t not in slow:
                ob_fast += nbytes[t]
        fetched.update(m.tensor for m in step.async_moves if m.action.kind == "prefetch")
    return dict(kernel_input_bytes=ib, kernel_output_bytes=ob, kernel_input_bytes_fast=ib_fast,
                kernel_output_bytes_fast=ob_fast, kernel_input_bytes_kept=ib_kept)


# ------------------------------------------------------------------------------ one cell

def _base_record(cell: Cell, ctx: _Workload | None, opts: SweepOptions, env: dict, commit: str | None) -> Record:
    w = cell.workload
    simulated = cell.memory.startswith("sim:")
    rec = Record(experiment=cell.experiment, workload=w.name, model=cell.model, preset=cell.preset, batch=cell.batch,
                 image=cell.image, memory_system=cell.memory, access=access_of(cell.memory), simulated=simulated,
                 formulation=cell.formulation, budget=cell.budget,
                 ratio=cell.budget if cell.budget and is_ratio(cell.budget) else None, budget_bytes=None,
                 pin_params=cell.pin_params, window=opts.window if cell.formulation == "asynchronous" else None,
                 time_limit=opts.time_limit if cell.formulation in ("static", "synchronous", "asynchronous") else None,
                 environment=env, commit=commit, timestamp=now())
    if ctx is not None:
        rec.num_kernels = len(ctx.graph.kernels)
        rec.peak_live_bytes = int(ctx.graph.peak_live_bytes)
        rec.oracle_seconds = float(ctx.cost_model.total_kernel_seconds)
    return rec


def _fill_from_plan(rec: Record, p, graph) -> None:
    m = p.meta
    rec.budget_bytes = m.budget_bytes
    rec.predicted_seconds = float(m.predicted_seconds)
    rec.solve_seconds = float(m.solve_seconds)
    rec.plan_seconds = float(m.plan_seconds)
    rec.gap = float(m.gap)
    rec.solver_status = m.status
    rec.peak_fast_bytes = int(m.peak_fast_bytes)
    rec.arena_bytes = getattr(p, "arena_bytes", None)
    rec.plan_warning = m.warning or ""
    rec.bytes_to_slow, rec.bytes_to_fast, rec.moves = int(m.bytes_to_slow), int(m.bytes_to_fast), int(m.moves)
    for k, v in move_stats(p, graph).items():
        setattr(rec, k, v)
    for k, v in kernel_io(p, graph).items():
        setattr(rec, k, v)


def run_cell(cell: Cell, ctx: _Workload, memory_system, opts: SweepOptions, env: dict,
             commit: str | None) -> Record:
    """Plan the cell and, on a real memory system, execute it; failures become the record's status."""
    from ..planner import InfeasibleBudget
    from ..planner import plan as make_plan

    rec = _base_record(cell, ctx, opts, env, commit)
    access = rec.access
    if cell.formulation in NEEDS_DIRECT and access != "direct":
        rec.status, rec.message = "unsupported", f"{cell.formulation} needs a direct-access memory system"
        return rec
    try:
        if cell.formulation == "save-on-cpu":
            return _run_save_on_cpu(rec, ctx, opts)
        # all-slow takes no budget, but the planner parses one: nothing fast is 1:0
        budget = "1:0" if cell.formulation == "all-slow" else cell.budget
        p = make_plan(ctx.graph, ctx.cost_model, budget, cell.formulation, window=opts.window,
                      time_limit=opts.time_limit, mip_gap=opts.mip_gap, pin_params=cell.pin_params)
        _fill_from_plan(rec, p, ctx.graph)
        if memory_system is not None:
            _execute(rec, ctx, p, memory_system, opts)
    except InfeasibleBudget as e:
        rec.status, rec.message = "infeasible", str(e)
        rec.budget_bytes, rec.min_budget_bytes = int(e.budget), int(e.minimum)
    except NotImplementedError as e:
        rec.status, rec.message = "unsupported", str(e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # a failed cell is recorded (and retried next time); the sweep goes on
        rec.status, rec.message = "error", f"{type(e).__name__}: {e}"
    return rec


def _execute(rec: Record, ctx: _Workload, p, memory_system, opts: SweepOptions) -> None:
    import torch

    from ..api import run_workload
    from ..runtime.verify import eager_reference

    device = memory_system.fast_device
    if opts.verify and ctx.reference is None:
        # on a GPU, eager PyTorch on the same GPU (deterministic flags) is the reference
        ctx.reference = eager_reference(ctx.w, opts.iterations, device=device)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # each run's reserved peak is its own
    r = run_workload(ctx.w, ctx.graph, ctx.cost_model, p, memory_system, iterations=opts.iterations,
                     verify=opts.verify, reference=ctx.reference)
    rep = r.report
    rec.measured_seconds = float(rep.measured_seconds)
    rec.iteration_seconds = [float(x) for x in rep.iteration_seconds]
    rec.peak_fast_bytes = int(rep.peak_fast_bytes)
    rec.bytes_to_slow, rec.bytes_to_fast = int(rep.bytes_to_slow), int(rep.bytes_to_fast)
    rec.peak_rss_bytes = int(rep.peak_rss_bytes) or None
    rec.identical = r.identical
    for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
        if rep.meta.get(k) is not None:
            setattr(rec, k, int(rep.meta[k]))
    # a GPU run may match within verify's stated tolerance where a kernel is not deterministic
    matched = rep.meta.get("matched", r.identical)
    if opts.verify and not matched:
        rec.status = "error"
        rec.message = f"results differ from eager PyTorch: {r.mismatches[:3]}"


def _run_save_on_cpu(rec: Record, ctx: _Workload, opts: SweepOptions) -> Record:
    """PyTorch's own offloading (torch.autograd.graph.save_on_cpu), the GPU figure's extra baseline."""
    if rec.simulated:
        rec.status, rec.message = "unsupported", "save-on-cpu is a measured baseline; it cannot be simulated"
        return rec
    from ..runtime.gpu_baselines import run_save_on_cpu

    d = run_save_on_cpu(ctx.w, opts.iterations, opts.verify)
    rec.measured_seconds = float(d["measured_seconds"])
    rec.iteration_seconds = [float(x) for x in d.get("iteration_seconds", [])]
    rec.peak_allocated_bytes = d.get("peak_allocated_bytes")
    rec.peak_reserved_bytes = d.get("peak_reserved_bytes")
    rec.peak_fast_bytes = d.get("peak_allocated_bytes")
    rec.identical = d.get("identical")
    return rec


# ------------------------------------------------------------------------------ the sweep

def _group(cells: Iterable[Cell]) -> dict[tuple, list[Cell]]:
    out: dict[tuple, list[Cell]] = {}
    for c in cells:
        out.setdefault((c.workload, c.memory), []).append(c)
    return out


def _outcome(rec: Record) -> str:
    if rec.status != "ok":
        return f"{rec.status}: {rec.message[:120]}"
    if rec.measured_seconds is not None:
        return f"measured {rec.measured_seconds:.3f} s (predicted {rec.predicted_seconds:.3f} s)" if \
            rec.predicted_seconds is not None else f"measured {rec.measured_seconds:.3f} s"
    return f"simulated {rec.predicted_seconds:.3f} s"


def run_cells(cells: Sequence[Cell], store: ResultsStore, opts: SweepOptions, *, console=None,
              on_record: Callable[[Record], None] | None = None) -> list[Record]:
    """Run the cells not yet in `store`, appending one record per cell as it finishes.

    Cells are grouped by workload and memory system, so each workload is captured and
    profiled once. A progress bar shows cells done / total and an ETA. `on_record` is
    called after each record is stored (an exception it raises stops the sweep, with
    every finished cell stored). Returns the records written by this call.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from ..profile.workloads import profile_workload
    from ..runtime.overhead import measure_executor_overhead

    console = console or Console(stderr=True)
    done = store.done_keys()
    todo = [c for c in cells if c.key not in done]
    written: list[Record] = []
    if not todo:
        console.print(f"{store.path}: all {len(cells)} cells already done")
        return written
    env, commit = environment(), git_commit()
    groups = _group(todo)
    real = sorted({c.memory for c in todo if not c.memory.startswith("sim:") and c.formulation != "save-on-cpu"})
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with contextlib.ExitStack() as stack, Progress(*columns, console=console) as bar:
        systems = _open_memory_systems(real, stack)
        task = bar.add_task(cells[0].experiment, total=len(cells), completed=len(cells) - len(todo))
        for (w, memory), group in groups.items():
            bar.update(task, description=f"{w.name} on {memory}: capturing and profiling")
            t0 = time.perf_counter()
            try:
                graph, cm, _ = profile_workload(w, memory, opts.cache, measure_overhead=measure_executor_overhead)
                ctx = _Workload(w, memory, graph, cm)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # every cell of the workload fails the same way
                ctx = None
                why = f"{type(e).__name__} while capturing/profiling: {e}"
            if ctx is not None:
                bar.console.print(f"[dim]{w.name} on {memory}: {len(graph.kernels):,} kernels, peak "
                                  f"{graph.peak_live_bytes / 2**30:.2f} GiB, profiled in {time.perf_counter() - t0:.0f} s")
            for cell in group:
                bar.update(task, description=f"{cell.label()} on {memory}")
                if ctx is None:
                    rec = _base_record(cell, None, opts, env, commit)
                    rec.status, rec.message = "error", why
                else:
                    rec = run_cell(cell, ctx, systems.get(memory), opts, env, commit)
                store.append(rec)
                written.append(rec)
                bar.advance(task)
                bar.console.print(f"{cell.label()} on {memory}: {_outcome(rec)}", highlight=False)
                if on_record is not None:
                    on_record(rec)
            del ctx
    return written


def _open_memory_systems(names: Sequence[str], stack: contextlib.ExitStack) -> dict:
    from ..tiers import make_memory_system

    out = {}
    for name in names:
        if name == "cuda+host":
            _require_cuda()
        out[name] = stack.enter_context(make_memory_system(name))
    return out


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise InputError("cuda+host needs a CUDA GPU (torch.cuda.is_available() is False on this machine); "
                         "use a sim: spec such as sim:pcie-host to plan and simulate the GPU workloads")


# ------------------------------------------------------------------------------ drivers

@dataclass
class Sweep:
    """A driver's cells and where their records go."""

    experiment: str
    cells: list[Cell]
    store: ResultsStore
    notes: list[str] = field(default_factory=list)


def conventional(out: str, *, models=None, formulations=None, ratios=None, memory: str = "cpu+file",
                 preset: str | None = None, pin_params: bool = False, experiment: str = "conventional") -> Sweep:
    """run_conventional: executed on real tiers at the `cpu` preset, simulated on sim: specs at `conventional`."""
    from .results import store_for

    preset = preset or ("conventional" if memory.startswith("sim:") else "cpu")
    models = parse_list(models) or list(CONVENTIONAL_MODELS)
    forms = parse_list(formulations) or list(default_formulations(experiment, memory))
    cells = make_cells(experiment, models, _all_fast_first(forms), parse_budgets(ratios, COMMON_RATIOS), memory,
                       preset, pin_params=pin_params)
    return Sweep(experiment, cells, store_for(out, experiment))


def case_study(out: str, *, models=None, formulations=None, ratios=None, memory: str = "sim:optane",
               preset: str | None = None, pin_params: bool = False) -> Sweep:
    """inception_case_study: Inception v4 over the case-study ratios, plus all-fast for the slowdowns."""
    from .results import store_for

    preset = preset or ("conventional" if memory.startswith("sim:") else "cpu")
    models = parse_list(models) or ["inception_v4"]
    forms = parse_list(formulations) or list(default_formulations("case-study", memory))
    cells = make_cells("case-study", models, _all_fast_first(["all-fast"] + forms),
                       parse_budgets(ratios, case_study_ratios()), memory, preset, pin_params=pin_params)
    return Sweep("case-study", cells, store_for(out, "case-study"))


def large(out: str, *, models=None, formulations=None, ratios=None, memory: str = "sim:nvme",
          preset: str = "large", pin_params: bool = False) -> Sweep:
    """run_large against lru (2LM's analogue) at the paper's 185 GB fast budget; simulated on sim: specs."""
    from .results import store_for

    models = parse_list(models) or list(LARGE_MODELS)
    forms = parse_list(formulations) or list(default_formulations("large", memory))
    cells = make_cells("large", models, forms, parse_budgets(ratios, (LARGE_BUDGET,)), memory, preset or "large",
                       pin_params=pin_params)
    return Sweep("large", cells, store_for(out, "large"))


def gpu(out: str, *, models=None, formulations=None, ratios=None, memory: str = "cuda+host",
        preset: str = "gpu", pin_params: bool = False) -> Sweep:
    """run_gpu: every gpu-preset size against lru, save-on-cpu and all-fast (the oracle is recorded too)."""
    from .results import store_for

    if not memory.startswith("sim:"):
        _require_cuda()
    models = parse_list(models) or list(GPU_MODELS)
    forms = parse_list(formulations) or list(default_formulations("gpu", memory))
    cells = make_cells("gpu", models, _all_fast_first(forms), parse_budgets(ratios, GPU_BUDGETS), memory,
                       preset or "gpu", pin_params=pin_params, all_sizes=True)
    return Sweep("gpu", cells, store_for(out, "gpu"))


def artifact_test(out: str, *, models=None, formulations=None, ratios=None, memory: str = "cpu+file",
             preset: str = "test", pin_params: bool = False) -> Sweep:
    """The artifact's Test Run: the test workload at the common ratios with every formulation the memory allows."""
    return conventional(out, models=models or [TEST_MODEL], formulations=formulations, ratios=ratios, memory=memory,
                        preset=preset or "test", pin_params=pin_params, experiment="test")


DRIVERS = {"conventional": conventional, "case-study": case_study, "large": large, "gpu": gpu, "test": artifact_test}


def _all_fast_first(forms: list[str]) -> list[str]:
    forms = list(dict.fromkeys(forms))
    return sorted(forms, key=lambda f: f != "all-fast")
