"""The user-facing pipeline: compile() for training loops, and run_workload() for the CLI.

compile() captures the iteration, profiles it on the memory system, plans it for the
budget and returns a step function that trains with the plan, iteration after iteration.
The model's parameters and the optimizer's state are kept current: tensors in fast memory
are shared with the model (no copies), and anything the plan keeps in slow memory is
written back before `model.state_dict()` or `step.sync()`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import torch

from .capture import capture
from .executor import ExecutorSession, RunReport
from .planner import plan as make_plan
from .replay import TrainingState
from .tiers.base import MemorySystem, SlowHandle, make_memory_system


# progress(stage, done, total, what): stage is "capture", "profile", "plan" or "session";
# done/total count the profile's measurements (0, 0 elsewhere)
CompileProgress = Callable[[str, int, int, str], None]

# the default solver time limit of compile (seconds, the whole plan call): small, as a
# training script waits for it; the CLI's plan/run keep 60 s (--time-limit)
COMPILE_TIME_LIMIT = 10.0


class _StderrProgress:
    """compile(progress=True): one line on stderr per stage, rewritten at most every 0.5 s."""

    def __init__(self):
        self.stage, self.t_stage, self.t_line = None, 0.0, 0.0

    def __call__(self, stage: str, done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if stage != self.stage:
            if self.stage is not None:
                sys.stderr.write(f"\rautotm: {self.stage} done in {now - self.t_stage:.1f} s\033[K\n")
            self.stage, self.t_stage, self.t_line = stage, now, 0.0
        if now - self.t_line < 0.5 and stage != "done":
            return
        self.t_line = now
        if stage == "done":
            return
        count = f" {done}/{total}" if total else ""
        sys.stderr.write(f"\rautotm: {stage}{count} {what} ({now - self.t_stage:.0f} s)\033[K")
        sys.stderr.flush()


class CompiledStep:
    """`loss = step(x, y)`: one training iteration following the plan.

    `stage_seconds`: wall seconds of "capture", "profile", "plan" and "session" (the
    executor's set-up); `profile_stats`: the profile's ProfileStats."""

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer, example_batch, *,
                 memory: str | MemorySystem = "cpu+file", budget: Any = None, formulation: str = "asynchronous",
                 cache=None, slow_dir: str | None = None, progress: bool | CompileProgress | None = None,
                 **plan_options):
        from .profile import profile

        report = _StderrProgress() if progress is True else (progress or None)
        self.stage_seconds: dict[str, float] = {}
        self.profile_stats = None
        t = [time.perf_counter()]

        def stage(name: str, what: str = "") -> None:
            if report is not None:
                report(name, 0, 0, what)

        def finished(name: str) -> None:
            now = time.perf_counter()
            self.stage_seconds[name] = now - t[0]
            t[0] = now

        self.model, self.optimizer = model, optimizer
        self.memory = None
        # the profile draws random operands and calibrates with a fixed seed: the caller's
        # RNG stream goes on after compile as if compile had not run
        with torch.random.fork_rng(devices=[]):
            stage("capture", type(model).__name__)
            self.graph = capture(model, loss_fn, optimizer, tuple(example_batch), name=type(model).__name__)
            finished("capture")
            self._owned = isinstance(memory, str)
            self.memory = make_memory_system(memory, slow_dir=slow_dir) if isinstance(memory, str) else memory
            plan_options.setdefault("time_limit", COMPILE_TIME_LIMIT)
            try:
                if not plan_options.get("pin_params"):
                    # an infeasible budget fails now, before the minutes of the profile
                    from .planner.floor import check_before_profile

                    check_before_profile(self.graph, budget, formulation, self.memory.access)
                inputs = TrainingState(self.graph, model, optimizer).inputs(tuple(example_batch))
                stage("profile", f"{len(self.graph.kernels)} kernels on {self.memory.name}")
                self.cost_model, self.profile_stats = profile(
                    self.graph, self.memory, cache, inputs=inputs, return_stats=True,
                    progress=None if report is None else lambda d, n, w: report("profile", d, n, w))
                del inputs
                finished("profile")
                stage("plan", f"{formulation}, time limit {plan_options['time_limit']:g} s")
                self.plan = make_plan(self.graph, self.cost_model, budget, formulation, **plan_options)
                finished("plan")
                stage("session")
                self.session = ExecutorSession(self.graph, self.plan, self.memory, model, optimizer)
                finished("session")
                stage("done")
            except BaseException:
                self.close()
                raise
        self._hook = model.register_state_dict_pre_hook(lambda *a, **k: self.sync())
        self._publish()

    @property
    def predicted_seconds(self) -> float:
        return float(self.plan.meta["predicted_seconds"])

    def __call__(self, *batch) -> torch.Tensor:
        r = self.session.step(tuple(batch))
        self._publish()
        return r.loss

    def _named(self):
        named = dict(self.model.named_parameters())
        named.update(dict(self.model.named_buffers()))
        return named

    def _assign(self, named: dict, key: str, value: torch.Tensor) -> None:
        """Make `value` the model's tensor or the optimizer's state named by a state key."""
        kind, rest = key.split(":", 1)
        if kind in ("param", "buffer"):
            named[rest].data = value
        elif kind == "opt":
            name, slot = rest.rsplit(":", 1)
            self.optimizer.state[named[name]][slot] = value

    def _publish(self) -> None:
        """Point the model's tensors and the optimizer's state at the carried fast values."""
        named = self._named()
        for key, v in self.session.carried.items():
            if isinstance(v, torch.Tensor):
                self._assign(named, key, v)

    def sync(self) -> None:
        """Copy values the plan keeps in slow memory into the model and optimizer."""
        named = self._named()
        for key, v in self.session.carried.items():
            if isinstance(v, SlowHandle):
                self._assign(named, key, self.memory.to_fast(v))

    def report(self) -> RunReport:
        return self.session.report()

    def close(self) -> None:
        """Bring everything back to the model and release the slow tier."""
        if getattr(self, "session", None) is not None:
            self.sync()
            ex = self.session.executor
            named = self._named()
            for key, v in self.session.carried.items():
                if isinstance(v, torch.Tensor) and ex.in_arena(v):
                    # (a copy: the model outlives the executor's arena, which goes with its last tensor)
                    self._assign(named, key, v.clone())
            self.session.close()
            self.session = None
        if getattr(self, "_hook", None) is not None:
            self._hook.remove()
            self._hook = None
        if self._owned and self.memory is not None:
            self.memory.close()
            self.memory = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def compile(model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer, example_batch, *,
            memory: str | MemorySystem = "cpu+file", budget: Any = None, formulation: str = "asynchronous",
            cache=None, progress: bool | CompileProgress | None = None, **plan_options) -> CompiledStep:
    """Plan `model`'s training iteration for `memory` and `budget`; return the step function.

    `progress`: True prints each stage (capture, profile, plan) on stderr as it goes; a
    callable gets progress(stage, done, total, what); quiet by default. `plan_options` go
    to autotm.planner.plan; `time_limit` defaults to COMPILE_TIME_LIMIT (10 s) here.
    `budget`: bytes ("6GB"), a slow:fast ratio ("4:1"), or "min", the smallest budget at
    which `formulation` finds a plan. A budget under that raises autotm.InfeasibleBudget,
    which states it (before the profile where the graph alone shows it).

    Example:
        >>> step = autotm.compile(model, nn.CrossEntropyLoss(), opt, (x, y), budget="4:1")
        >>> for x, y in loader:
        ...     loss = step(x, y)
        >>> model.state_dict()  # current weights
    """
    return CompiledStep(model, loss_fn, optimizer, example_batch, memory=memory, budget=budget,
                        formulation=formulation, cache=cache, progress=progress, **plan_options)


@dataclasses.dataclass
class WorkloadRun:
    plan: Any
    report: RunReport
    identical: bool | None
    mismatches: list


def run_workload(w, graph, cost_model, plan_obj, memory: MemorySystem, *, iterations: int = 3,
                 verify: bool = False, reference=None, trim_memory: bool | None = None,
                 use_arena: bool = True) -> WorkloadRun:
    """Execute `plan_obj` for `iterations` on `memory`; with verify, compare with eager bit for bit.
    `trim_memory`, `use_arena`: as ExecutorSession (default: hold RSS near the budget when
    there is one, following the plan's arena layout)."""
    from .verify import verify_replay

    sessions: list[ExecutorSession] = []

    def factory(g, model, opt):
        s = ExecutorSession(g, plan_obj, memory, model, opt, trim_memory=trim_memory, use_arena=use_arena)
        sessions.append(s)
        return s

    if verify:
        # on a GPU, eager PyTorch runs there too, and the comparison says what needed a tolerance
        v = verify_replay(w, iterations, session_factory=factory, graph=graph, reference=reference,
                          device=getattr(memory, "fast_device", None))
        report = sessions[0].report()
        if v.device != "cpu":
            report.meta.update(v.meta())
        return WorkloadRun(plan_obj, report, v.identical, v.mismatches)
    model = w.build_model()
    opt = w.make_optimizer(model.parameters())
    s = factory(graph, model, opt)
    del model, opt
    try:
        for i in range(iterations):
            s.step(w.make_batch(seed=i))
        return WorkloadRun(plan_obj, s.report(), None, [])
    finally:
        s.close()
