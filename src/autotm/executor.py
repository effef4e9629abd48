"""Execute a plan: run training iterations of a TrainingGraph on real memory tiers.

The executor is the replay interpreter plus the plan's moves, performed on the timeline
that `autotm.plan` defines (the same one the validator and simulator replay). It keeps its
own account of fast-tier bytes (every storage it holds in fast memory, moves in flight at
both ends) and raises BudgetExceeded the moment that account passes the budget: the
budget is enforced by the runtime, not promised by the planner.

Between iterations, the weights, buffers and optimizer state are carried in the tier
their graph input starts in: an updated value whose input starts slow is written to slow
memory after the last kernel (a "carry" move, timed as part of the iteration).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import torch

from .errors import AutotmError, ReplayError
from .graph import TrainingGraph
from .plan import Action, Plan, check_plan_matches
from .replay import Replay, StepResult, TrainingState, check_batch
from .tiers.base import MemorySystem, SlowHandle
from .validate import validate


class BudgetExceeded(AutotmError):
    """The runtime held more fast-tier bytes than the budget allows."""


@dataclass(frozen=True)
class MoveRecord:
    tensor: int
    kind: str  # prefetch, evict, drop, carry
    mode: str  # sync or async
    at: int  # kernel index (len(kernels) for carry moves)
    nbytes: int
    seconds: float  # sync: the copy; async: start to completion


@dataclass
class RunReport:
    """What one executed run measured. Bytes are integers, times float seconds."""

    graph_name: str
    planner: str
    memory_system: str
    budget_bytes: int | None
    iterations: int
    iteration_seconds: list[float]
    kernel_seconds: np.ndarray  # per kernel, median over iterations
    moves: list[MoveRecord]  # of the last iteration
    peak_fast_bytes: int
    bytes_to_slow: int  # per iteration
    bytes_to_fast: int  # per iteration
    losses: list[float]
    peak_rss_bytes: int = 0
    baseline_rss_bytes: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def measured_seconds(self) -> float:
        """Median iteration time (the first iteration included only when it is the only one)."""
        xs = self.iteration_seconds[1:] if len(self.iteration_seconds) > 1 else self.iteration_seconds
        return float(np.median(xs))

    def summary(self) -> dict:
        return {
            "graph": self.graph_name,
            "planner": self.planner,
            "memory_system": self.memory_system,
            "budget_bytes": self.budget_bytes,
            "iterations": self.iterations,
            "measured_seconds": self.measured_seconds,
            "iteration_seconds": self.iteration_seconds,
            "peak_fast_bytes": self.peak_fast_bytes,
            "bytes_to_slow": self.bytes_to_slow,
            "bytes_to_fast": self.bytes_to_fast,
            "moves": len([m for m in self.moves if m.kind != "drop"]),
            "kernel_seconds_total": float(self.kernel_seconds.sum()),
            "move_seconds_sync": float(sum(m.seconds for m in self.moves if m.mode == "sync")),
            "peak_rss_bytes": self.peak_rss_bytes,
            "baseline_rss_bytes": self.baseline_rss_bytes,
            "losses": self.losses,
        }


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Samples the process's resident set size in a thread; `peak` is the largest seen."""

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotm-rss", daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def _release_freed_memory_to_os() -> None:
    """Make glibc return freed large blocks to the OS at once, so RSS follows the bytes held.

    With its default dynamic mmap threshold, glibc serves blocks of up to 32 MiB from the
    heap after the first large free, and a fragmented heap is not trimmed: RSS would then
    overstate what the executor holds. A fixed 256 KiB threshold keeps large tensors in
    their own mappings, which free() unmaps.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 256 * 1024)
        libc.mallopt(M_TRIM_THRESHOLD, 1024 * 1024)
    except OSError:  # not glibc
        pass


class Executor(Replay):
    """Runs iterations of `graph` following `plan` on `memory`.

    The plan is validated first; a plan the validator rejects never runs.
    """

    def __init__(self, graph: TrainingGraph, plan: Plan, memory: MemorySystem, *, budget_bytes: int | None = None):
        super().__init__(graph)
        check_plan_matches(plan, graph)
        if plan.access != memory.access:
            raise AutotmError(f"plan is for {plan.access} access but {memory.name} is {memory.access}")
        self.plan = plan
        self.memory = memory
        self.budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
        self.validation = validate(plan, graph, budget_bytes=self.budget)
        _release_freed_memory_to_os()
        n = len(graph.kernels)
        self.initial = {tp.id: tp.initial for tp in plan.tensors}
        # per kernel: sync (evicts and drops first, then prefetches), and async actions
        self.sync_at: list[list[tuple[int, Action]]] = [[] for _ in range(n)]
        self.async_at: list[list[tuple[int, Action]]] = [[] for _ in range(n)]
        for tp in plan.tensors:
            for a in tp.actions:
                (self.sync_at if a.mode == "sync" else self.async_at)[a.at].append((tp.id, a))
        for lst in self.sync_at:
            lst.sort(key=lambda x: x[1].kind == "prefetch")
        self.nbytes = [t.nbytes for t in graph.tensors]
        self._reset_iteration()

    # ---- accounting -------------------------------------------------------------------
    def _reset_iteration(self):
        self.fast: set[int] = set()  # tensors whose fast copy the executor holds
        self.slow: dict[int, SlowHandle] = {}
        self.fast_bytes = 0
        self.peak_fast = 0
        self.to_slow_bytes = 0
        self.to_fast_bytes = 0
        self.moves: list[MoveRecord] = []
        self.kernel_times = np.zeros(len(self.graph.kernels))
        self._pending: list[tuple[int, Action, object, float]] = []

    def _hold_fast(self, tid: int, value: torch.Tensor, k: int) -> None:
        self.env[tid] = value
        if tid not in self.fast:
            self.fast.add(tid)
            self.fast_bytes += self.nbytes[tid]
            self._check_budget(k)

    def _release_fast(self, tid: int) -> None:
        if tid in self.fast:
            self.fast.remove(tid)
            self.fast_bytes -= self.nbytes[tid]
        self.env.pop(tid, None)

    def _check_budget(self, k: int) -> None:
        self.peak_fast = max(self.peak_fast, self.fast_bytes)
        if self.budget is not None and self.fast_bytes > self.budget:
            big = sorted(self.fast, key=lambda t: -self.nbytes[t])[:3]
            names = ", ".join(f"{self.graph.tensors[t].name} ({self.nbytes[t]} B)" for t in big)
            kern = self.graph.kernels[min(k, len(self.graph.kernels) - 1)]
            raise BudgetExceeded(f"at kernel {k} ({kern.op}) the runtime holds {self.fast_bytes} fast bytes, "
                                 f"over the budget of {self.budget}; largest: {names}")

    # ---- operands ---------------------------------------------------------------------
    def storage_value(self, tid: int) -> torch.Tensor:
        if tid in self.env:
            return self.env[tid]
        if tid in self.slow:
            view = self.memory.slow_view(self.slow[tid])
            if view is not None:  # direct access: kernels read slow memory in place
                return view
        t = self.graph.tensors[tid]
        raise ReplayError(f"tensor {tid} ({t.name}) is not resident in fast memory and the plan did not prefetch it")

    # ---- the timeline -----------------------------------------------------------------
    def before_kernel(self, k: int) -> None:
        for tid, a in self.sync_at[k]:  # step 1
            t0 = time.perf_counter()
            if a.kind == "evict":
                self.slow[tid] = self.memory.to_slow(tid, self.env[tid])
                self.to_slow_bytes += self.nbytes[tid]
                if not a.keep_fast:
                    self._release_fast(tid)
            elif a.kind == "drop":
                self._release_fast(tid)
            else:
                self._hold_fast(tid, self.memory.to_fast(self.slow[tid]), k)
                self.to_fast_bytes += self.nbytes[tid]
            self.moves.append(MoveRecord(tid, a.kind, "sync", k, self.nbytes[tid], time.perf_counter() - t0))
        for tid, a in self.async_at[k]:  # step 2
            t0 = time.perf_counter()
            if a.kind == "prefetch":
                pending = self.memory.start_to_fast(self.slow[tid])
                self.fast.add(tid)  # the destination is held from the start
                self.fast_bytes += self.nbytes[tid]
                self._check_budget(k)
            elif a.kind == "evict":
                pending = self.memory.start_to_slow(tid, self.env[tid])
            else:
                pending = None
            self._pending.append((tid, a, pending, t0))

    def run_kernel(self, k: int) -> None:
        t0 = time.perf_counter()
        super().run_kernel(k)  # step 3
        self.kernel_times[k] = time.perf_counter() - t0
        for tid, _ in self.program.kernel_outputs[k]:
            if self.initial[tid] == "slow":  # direct access: the output goes to slow memory
                self.slow[tid] = self.memory.to_slow(tid, self.env.pop(tid))
            else:
                self.fast.add(tid)
                self.fast_bytes += self.nbytes[tid]
        self._check_budget(k)

    def after_kernel(self, k: int) -> None:
        for tid, a, pending, t0 in self._pending:  # step 4
            if a.kind == "prefetch":
                self.env[tid] = pending.wait()
                self.to_fast_bytes += self.nbytes[tid]
            elif a.kind == "evict":
                self.slow[tid] = pending.wait()
                self.to_slow_bytes += self.nbytes[tid]
                if not a.keep_fast:
                    self._release_fast(tid)
            else:
                self._release_fast(tid)
            self.moves.append(MoveRecord(tid, a.kind, "async", k, self.nbytes[tid], time.perf_counter() - t0))
        self._pending = []

    def free(self, tid: int) -> None:  # step 5
        self._release_fast(tid)
        h = self.slow.pop(tid, None)
        if h is not None:
            self.memory.free_slow(h)

    # ---- iterations -------------------------------------------------------------------
    def place_inputs(self, inputs: Mapping[int, torch.Tensor | SlowHandle]) -> None:
        """Put graph inputs in their initial tier (fast tensors or slow handles)."""
        for tid, v in inputs.items():
            if isinstance(v, SlowHandle):
                self.slow[tid] = v
            elif self.initial.get(tid, "fast") == "slow":
                self.slow[tid] = self.memory.to_slow(tid, v)
            else:
                self._hold_fast(tid, v, 0)

    def run_iteration(self, inputs: Mapping[int, torch.Tensor | SlowHandle], keep: Iterable[int] = ()) -> dict:
        """One iteration. Returns the graph outputs: fast tensors, or SlowHandles for those
        whose matching input starts slow (carried there after the last kernel)."""
        self._reset_iteration()
        self.env = {}
        self.place_inputs(inputs)
        keep = set(keep)
        self.keep = keep
        p = self.program
        n = len(p.kernel_nodes)
        try:
            for k in range(n):
                self.before_kernel(k)
                try:
                    self.run_kernel(k)
                except (ReplayError, BudgetExceeded):
                    raise
                except AutotmError:
                    raise
                except Exception as e:
                    kern = self.graph.kernels[k]
                    raise ReplayError(f"while executing kernel {k} {kern.op} ({kern.module or 'no module'}): {e}") from e
                self.after_kernel(k)
                for tid in p.free_after[k]:
                    if tid not in keep:
                        self.free(tid)
                    elif tid in self.fast:
                        # kept only so the caller can inspect it (verification): outside the
                        # plan, so outside the budget account from its planned death on
                        self.fast.remove(tid)
                        self.fast_bytes -= self.nbytes[tid]
            out: dict[int, torch.Tensor | SlowHandle] = {}
            slow_inputs = {key for key, tid in p.input_keys if self.initial.get(tid) == "slow"}
            for key, tid in p.output_keys.items():
                if key in slow_inputs:  # carry: the next iteration reads it from slow memory
                    if tid in self.slow:
                        out[tid] = self.slow.pop(tid)
                    else:
                        t0 = time.perf_counter()
                        out[tid] = self.memory.to_slow(tid, self.env[tid])
                        self.to_slow_bytes += self.nbytes[tid]
                        self.moves.append(MoveRecord(tid, "carry", "sync", n, self.nbytes[tid], time.perf_counter() - t0))
                        self._release_fast(tid)
                else:
                    out[tid] = self.storage_value(tid) if tid in self.env else self.memory.to_fast(self.slow[tid])
            for tid in keep:
                if tid in self.env:
                    out[tid] = self.env[tid]
            return out
        finally:
            for _, _, pending, _ in self._pending:
                if pending is not None:
                    try:
                        pending.wait()
                    except Exception:
                        pass
            self._pending = []
            for h in self.slow.values():
                try:
                    self.memory.free_slow(h)
                except Exception:
                    pass
            self.slow = {}
            self.env = {}
            self.fast = set()


class ExecutorSession:
    """Training through an Executor, iteration after iteration, carrying the state between
    iterations in the tiers the plan gives the graph inputs."""

    def __init__(self, graph: TrainingGraph, plan: Plan, memory: MemorySystem, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, budget_bytes: int | None = None):
        self.graph = graph
        self.executor = Executor(graph, plan, memory, budget_bytes=budget_bytes)
        self.state = TrainingState(graph, model, optimizer)
        self.memory = memory
        p = graph.program
        # values of inputs that start slow live only in slow memory between iterations
        self.carried: dict[str, torch.Tensor | SlowHandle] = {}
        for key, tid in p.input_keys:
            if key in self.state.values:
                v = self.state.values.pop(key)
                self.carried[key] = memory.to_slow(tid, v) if self.executor.initial[tid] == "slow" else v
        self.iteration_seconds: list[float] = []
        self.kernel_seconds: list[np.ndarray] = []
        self.losses: list[float] = []
        self.peak_fast_bytes = 0

    def step(self, batch, *, keep_gradients: bool = False) -> StepResult:
        batch = check_batch(self.graph, batch)
        p = self.graph.program
        inputs = self.state.inputs(batch, values=self.carried)
        keep = set(p.gradient_of.values()) if keep_gradients else set()
        t0 = time.perf_counter()
        out = self.executor.run_iteration(inputs, keep=keep)
        self.iteration_seconds.append(time.perf_counter() - t0)
        self.kernel_seconds.append(self.executor.kernel_times.copy())
        self.peak_fast_bytes = max(self.peak_fast_bytes, self.executor.peak_fast)
        grads = {}
        if keep_gradients:
            for n, tid in p.gradient_of.items():
                shape, stride, offset = p.gradient_view[n]
                grads[n] = out[tid].as_strided(shape, stride, offset)
        for key, tid in p.output_keys.items():
            if key != "loss":
                old = self.carried.get(key)
                if isinstance(old, SlowHandle):
                    self.memory.free_slow(old)
                self.carried[key] = out[tid]
        for gi in self.state.steps:
            self.state.steps[gi] += 1
        loss = out[p.output_keys["loss"]]
        self.losses.append(float(loss))
        return StepResult(loss=loss, gradients=grads)

    def write_back(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        values = {k: (self.memory.to_fast(v) if isinstance(v, SlowHandle) else v) for k, v in self.carried.items()}
        self.state.values = values
        self.state.write_back(model, optimizer)
        self.state.values = {}

    def close(self) -> None:
        for v in self.carried.values():
            if isinstance(v, SlowHandle):
                try:
                    self.memory.free_slow(v)
                except Exception:
                    pass
        self.carried = {}

    def report(self) -> RunReport:
        ex = self.executor
        return RunReport(
            graph_name=self.graph.name, planner=ex.plan.planner, memory_system=self.memory.name,
            budget_bytes=ex.budget, iterations=len(self.iteration_seconds),
            iteration_seconds=list(self.iteration_seconds),
            kernel_seconds=np.median(np.stack(self.kernel_seconds), axis=0) if self.kernel_seconds else np.zeros(0),
            moves=list(ex.moves), peak_fast_bytes=self.peak_fast_bytes, bytes_to_slow=ex.to_slow_bytes,
            bytes_to_fast=ex.to_fast_bytes, losses=list(self.losses))
