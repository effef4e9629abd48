"""The user-facing pipeline: compile() for training loops, and run_workload() for the CLI.

compile() captures the iteration, profiles it on the memory system, plans it for the
budget and returns a step function that trains with the plan, iteration after iteration.
The model's parameters and the optimizer's state are kept current: tensors in fast memory
are shared with the model (no copies), and anything the plan keeps in slow memory is
written back before `model.state_dict()` or `step.sync()`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .capture import capture
from .executor import ExecutorSession, RunReport
from .planner import plan as make_plan
from .replay import TrainingState
from .tiers.base import MemorySystem, SlowHandle, make_memory_system


class CompiledStep:
    """`loss = step(x, y)`: one training iteration following the plan."""

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer, example_batch, *,
                 memory: str | MemorySystem = "cpu+file", budget: Any = None, formulation: str = "asynchronous",
                 cache=None, slow_dir: str | None = None, **plan_options):
        from .profile import profile

        self.model, self.optimizer = model, optimizer
        self.memory = None
        self._owned = isinstance(memory, str)
        # the profile draws random operands and calibrates with a fixed seed: the caller's
        # RNG stream goes on after compile as if compile had not run
        with torch.random.fork_rng(devices=[]):
            self.graph = capture(model, loss_fn, optimizer, tuple(example_batch), name=type(model).__name__)
            self.memory = make_memory_system(memory, slow_dir=slow_dir) if isinstance(memory, str) else memory
            try:
                inputs = TrainingState(self.graph, model, optimizer).inputs(tuple(example_batch))
                self.cost_model = profile(self.graph, self.memory, cache, inputs=inputs)
                del inputs
                self.plan = make_plan(self.graph, self.cost_model, budget, formulation, **plan_options)
                self.session = ExecutorSession(self.graph, self.plan, self.memory, model, optimizer)
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
            cache=None, **plan_options) -> CompiledStep:
    """Plan `model`'s training iteration for `memory` and `budget`; return the step function.

    Example:
        >>> step = autotm.compile(model, nn.CrossEntropyLoss(), opt, (x, y), budget="4:1")
        >>> for x, y in loader:
        ...     loss = step(x, y)
        >>> model.state_dict()  # current weights
    """
    return CompiledStep(model, loss_fn, optimizer, example_batch, memory=memory, budget=budget,
                        formulation=formulation, cache=cache, **plan_options)


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
