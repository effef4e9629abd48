"""ExecutorSession: training through an Executor, iteration after iteration (see the class)."""

from __future__ import annotations

import time

import numpy as np
import torch

from ..errors import SessionFailed, StateChanged
from ..frontend.optim_lowering import GroupHyper, derived
from ..interpret.replay import StepResult, TrainingState, check_batch
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan
from ..tiers.base import MemorySystem, SlowHandle
from .executor import Executor
from .host_memory import RssSampler, rss_bytes
from .interrupts import CtrlCBetweenKernels
from .report import RunReport


class ExecutorSession:
    """Training through an Executor, iteration after iteration, carrying the state between
    iterations in the tiers the plan gives the graph inputs.

    A failed or interrupted iteration (any exception, Ctrl-C included) leaves no slow
    memory behind: the executor frees what the iteration made, and the session frees the
    carried state and refuses to go on (in-place updates may have half-written it):
    `step`, `write_back` and `report` then raise SessionFailed. No RunReport is ever made
    for a run that did not complete.

    The caller's model and optimizer are only read here (the session works on copies), so
    a caller that does not need them afterwards should drop them: they are DRAM outside
    the budget. `sample_rss=True` records the process's peak RSS during the iterations in
    the report (a sampling thread, every 2 ms).
    """

    def __init__(self, graph: TrainingGraph, plan: Plan, memory: MemorySystem, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, budget_bytes: int | None = None,
                 trim_memory: bool | None = None, sample_rss: bool = False, use_arena: bool = True,
                 keep_state_on_failure: bool = False):
        self.graph = graph
        self.memory = memory
        self.carried: dict[str, torch.Tensor | SlowHandle] = {}
        self.failed: BaseException | None = None
        # keep_state_on_failure: a step that fails before it overwrote any carried value
        # keeps the carried state (`intact`: the caller reads it, then closes the session),
        # and a Ctrl-C after that point lets the iteration finish (`interrupted` then says
        # so: the caller raises KeyboardInterrupt once it has taken the new state)
        self.keep_state_on_failure = keep_state_on_failure
        self._bound_hypers: tuple[GroupHyper, ...] | None = None  # what set_hyperparameters last bound
        self.intact = False
        self.interrupted = False
        self.closed = False
        self.sample_rss = sample_rss
        self.baseline_rss_bytes = rss_bytes()
        self.peak_rss_bytes = 0
        self.iteration_seconds: list[float] = []
        self.kernel_seconds: list[np.ndarray] = []  # per iteration: each kernel's call
        self.operand_seconds: list[np.ndarray] = []  # per iteration: building each kernel's operands
        self.losses: list[float] = []
        self.peak_fast_bytes = 0
        self.executor = Executor(graph, plan, memory, budget_bytes=budget_bytes, trim_memory=trim_memory,
                                 use_arena=use_arena)
        self.state = TrainingState(graph, model, optimizer)
        p = graph.program
        # values of inputs that start slow live only in slow memory between iterations
        try:
            for key, tid in p.input_keys:
                if key in self.state.values:
                    v = self.state.values.pop(key)
                    self.carried[key] = memory.to_slow(tid, v) if self.executor.initial[tid] == "slow" else v
        except BaseException:
            self.close()
            raise
        memory.reset_device_peaks()  # the report's device peaks are this session's

    def _check_usable(self) -> None:
        if self.failed is not None:
            raise SessionFailed(f"this session's iteration {len(self.iteration_seconds) + 1} failed "
                                f"({type(self.failed).__name__}: {self.failed}); its state was released "
                                "and it reports nothing") from self.failed
        if self.closed:
            raise SessionFailed("this session is closed")

    def step(self, batch, *, keep_gradients: bool = False) -> StepResult:
        self._check_usable()
        if not self.keep_state_on_failure:
            return self._step(batch, keep_gradients, None)
        self.interrupted = False
        with CtrlCBetweenKernels(finish_from=self.executor.first_overwrite) as ctrl_c:
            r = self._step(batch, keep_gradients, ctrl_c)
        self.interrupted = ctrl_c.hit
        return r

    def _step(self, batch, keep_gradients: bool, ctrl_c) -> StepResult:
        self.executor.at_kernel = -1
        batch = check_batch(self.graph, batch)
        p = self.graph.program
        inputs = self.state.inputs(batch, values=self.carried)
        if self.executor.follows_layout:
            # the executor holds the carried tensors now (and may copy them to their planned
            # place, freeing these); a failed iteration ends the session in any case
            self.carried = {k: v for k, v in self.carried.items() if not isinstance(v, torch.Tensor)}
        keep = set(p.gradient_of.values()) if keep_gradients else set()
        try:
            t0 = time.perf_counter()
            if self.sample_rss:
                with RssSampler() as rs:
                    out = self.executor.run_iteration(inputs, keep=keep, ctrl_c=ctrl_c)
                self.peak_rss_bytes = max(self.peak_rss_bytes, rs.peak)
            else:
                out = self.executor.run_iteration(inputs, keep=keep, ctrl_c=ctrl_c)
            self.memory.synchronize()  # a GPU runs kernels asynchronously: stop the clock when done
            seconds = time.perf_counter() - t0 - self.executor.inspection_seconds
            del inputs
            grads = {}
            if keep_gradients:
                for n, tid in p.gradient_of.items():
                    shape, stride, offset = p.gradient_view[n]
                    grads[n] = out[tid].as_strided(shape, stride, offset)
            loss = out[p.output_keys["loss"]]
            loss_value = float(loss)
            carried = dict(self.carried)
            for key, tid in p.output_keys.items():
                if key != "loss":
                    carried[key] = out[tid]
            # (one assignment: the carried state is the last iteration's or this one's)
            old, self.carried = self.carried, carried
            self.executor.at_kernel = len(self.graph.kernels)  # done: the old state is gone
            for gi in self.state.steps:
                self.state.steps[gi] += 1
            for v in old.values():
                if isinstance(v, SlowHandle) and all(v is not w for w in carried.values()):
                    self.memory.free_slow(v)
        except BaseException as e:
            self.failed = e
            # the iteration's slow outputs not yet carried are ours to give back, either way
            carried_ids = {id(v) for v in self.carried.values()}
            for v in (locals().get("out") or {}).values():
                if isinstance(v, SlowHandle) and id(v) not in carried_ids:
                    try:
                        self.memory.free_slow(v)
                    except Exception:
                        pass
            if self.keep_state_on_failure and self.executor.at_kernel < self.executor.first_overwrite:
                self.intact = True  # nothing carried was overwritten: the state is the last iteration's
                raise
            self.close()
            raise
        self.iteration_seconds.append(seconds)
        self.kernel_seconds.append(self.executor.kernel_times.copy())
        self.operand_seconds.append(self.executor.operand_times.copy())
        self.peak_fast_bytes = max(self.peak_fast_bytes, self.executor.peak_fast)
        self.losses.append(loss_value)
        return StepResult(loss=loss, gradients=grads)

    def set_hyperparameters(self, hypers: tuple[GroupHyper, ...]) -> None:
        """Train the next iterations with these hyperparameters (optim_lowering.live_groups:
        the same graph, other numbers): the kernel arguments derived from them are rebound,
        and Adam's per-step scalars follow."""
        self._check_usable()
        if hypers == self._bound_hypers:
            return
        p = self.graph.program
        values = [derived(h) for h in hypers]
        changed = set()
        for k, where, gi, nm in p.hyper_args:
            node, v = p.kernel_nodes[k], values[gi][nm]
            now = node.args[where] if isinstance(where, int) else node.kwargs[where]
            if repr(now) != repr(v):  # (-0.0 is not 0.0 here)
                if isinstance(where, int):
                    node.update_arg(where, v)
                else:
                    node.update_kwarg(where, v)
                changed.add(k)
        self.executor.rebuild_operands(changed)
        self.state.hypers = self._bound_hypers = tuple(hypers)

    def refresh_steps(self) -> None:
        """Read each group's step count from the carried state again (Adam's `step` was
        replaced between steps: optimizer.load_state_dict)."""
        p = self.graph.program
        for gi in self.state.steps:
            steps = set()
            for n in p.param_names:
                v = self.carried.get(f"opt:{n}:step")
                if p.param_groups[n] == gi and v is not None:
                    steps.add(float(self.memory.to_fast(v) if isinstance(v, SlowHandle) else v))
            if len(steps) > 1:
                raise StateChanged(f"parameters of optimizer group {gi} are at different step counts {sorted(steps)}")
            if steps:
                self.state.steps[gi] = steps.pop()

    def write_back(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._check_usable()
        ex = self.executor
        # (copies of arena tensors: the model outlives the executor, and its arena)
        values = {k: (self.memory.to_fast(v) if isinstance(v, SlowHandle)
                      else v.clone() if ex.in_arena(v) else v) for k, v in self.carried.items()}
        self.state.values = values
        self.state.write_back(model, optimizer)
        self.state.values = {}

    def close(self) -> None:
        """Free the carried state's slow memory. Idempotent; the memory system stays open."""
        carried, self.carried = self.carried, {}
        self.closed = True
        self.executor.close()
        for v in carried.values():
            if isinstance(v, SlowHandle):
                try:
                    self.memory.free_slow(v)
                except Exception:
                    pass

    def report(self) -> RunReport:
        if self.failed is not None:
            self._check_usable()
        ex = self.executor
        return RunReport(
            graph_name=self.graph.name, planner=ex.plan.planner, memory_system=self.memory.name,
            budget_bytes=ex.budget, iterations=len(self.iteration_seconds),
            iteration_seconds=list(self.iteration_seconds),
            kernel_seconds=np.median(np.stack(self.kernel_seconds), axis=0) if self.kernel_seconds else np.zeros(0),
            moves=list(ex.moves), peak_fast_bytes=self.peak_fast_bytes, bytes_to_slow=ex.to_slow_bytes,
            bytes_to_fast=ex.to_fast_bytes, losses=list(self.losses),
            peak_rss_bytes=self.peak_rss_bytes, baseline_rss_bytes=self.baseline_rss_bytes,
            meta=dict(self.memory.run_meta(), **ex.arena_meta()))
