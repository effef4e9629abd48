"""Execute a plan: run training iterations of a TrainingGraph on real memory tiers.

The executor is the replay interpreter (interpret/replay.py: its one kernel loop and
hooks) plus the plan's moves, taken step by step from the validator's replay
(checks/validate.py: PlanReplay's KernelSteps, the timeline the simulator also reads). It
keeps its own account of fast-tier bytes (every storage it holds in fast memory, moves in
flight at both ends) and raises BudgetExceeded the moment that account passes the budget:
the budget is enforced by the runtime, not promised by the planner.

Between iterations, the weights, buffers and optimizer state are carried in the tier
their graph input starts in: an updated value whose input starts slow is written to slow
memory after the last kernel (a "carry" move, timed as part of the iteration).

Kernels run from the argument builders the replay compiles once (Replay.operand_builders,
as the replay and the profiler build operands); a pointwise kernel whose input dies at it
writes its output into that input's storage (Reuse, as the replay does: torch.optim's
in-place updates).

Failures: on any exception, KeyboardInterrupt included, the iteration waits for its moves
in flight and frees every slow copy it made before the exception propagates;
ExecutorSession (session.py) then frees the carried state and refuses to report.

Process memory with a budget: host_memory.py (the RSS bound and when the heaps are
trimmed); the plan's static layout: arena_following.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import torch

from ..checks.validate import KernelStep, validate
from ..errors import AutotmError, BudgetExceeded, ReplayError, SessionFailed
from ..interpret.replay import OperandBuilder, Replay, Reuse
from ..ir.graph import TrainingGraph
from ..ir.layout import LARGE_BLOCK_BYTES
from ..ir.plan import Plan, check_plan_matches, plan_graph
from ..tiers import cpu_arena
from ..tiers.base import MemorySystem, SlowHandle
from ..tiers.host_heap import keep_freed_memory, trim_heap
from .arena_following import ArenaFollower
from .host_memory import RSS_SLACK_BYTES, RssReader, rss_bytes
from .pieces import piece_runner
from .interrupts import CtrlCBetweenKernels
from .report import MoveRecord, RunReport

# (names callers imported from here before the runtime was split by role; ExecutorSession
# too, through __getattr__: session.py imports this module)
__all__ = ["BudgetExceeded", "Executor", "MoveRecord", "RunReport", "SessionFailed",
           "keep_freed_memory", "rss_bytes", "trim_heap"]


def __getattr__(name: str):
    if name == "ExecutorSession":
        from .session import ExecutorSession
        return ExecutorSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class _CompiledKernel:
    target: object
    args: object  # () -> list/tuple of arguments
    kwargs: object  # () -> dict, or None
    outputs: tuple  # (tensor id, index in the op's tuple or None, bytes, written to slow)
    reuse: Reuse | None  # the output into a dying input's storage (not for an output written to slow)
    frees: tuple  # tensor ids whose live range ends here


class Executor(Replay):
    """Runs iterations of `graph` following `plan` on `memory`.

    The plan is validated first; a plan the validator rejects never runs, and the
    validator's steps (one KernelStep per kernel: its sync and async moves) are the moves
    the executor makes.

    With a budget (given, or the plan's), the runtime also keeps the process's memory
    honest (`trim_memory`, default: whether there is a budget): the heaps are trimmed at
    the start of each iteration and before any kernel whose allocations would take RSS
    past budget + baseline + RSS_SLACK_BYTES, and idle read buffers a memory system
    recycles (Capabilities.read_cache) count against the budget: before each kernel, if
    the bytes the plan holds at that kernel plus the idle cache would pass the budget, the
    cache is released. Without a budget glibc simply keeps freed blocks for the next
    iteration (keep_freed_memory). A trimmed page costs a fresh first touch later, and
    glibc's heap fragments, so at tight budgets the trims cost time (benchmarks/HISTORY.md);
    `trim_memory=False` keeps the fast-tier byte account only.
    `use_arena=False`: do not follow the plan's layout (arena_following.py), glibc's heap only.
    """

    def __init__(self, graph: TrainingGraph, plan: Plan, memory: MemorySystem, *, budget_bytes: int | None = None,
                 trim_memory: bool | None = None, use_arena: bool = True):
        check_plan_matches(plan, graph)
        graph = plan_graph(plan, graph)  # (its kernels split as the plan runs them)
        super().__init__(graph, device=memory.fast_device)
        if plan.access != memory.access:
            raise AutotmError(f"plan is for {plan.access} access but {memory.name} is {memory.access}")
        self.plan = plan
        self.memory = memory
        self.budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
        self.validation = validate(plan, graph, budget_bytes=self.budget)
        # (host RSS honesty is for CPU fast tiers; a device's budget is on the device)
        self.trim_memory = trim_memory if trim_memory is not None else (self.budget is not None and self.device is None)
        keep_freed_memory()
        self._rss = RssReader() if self.trim_memory else None
        n = len(graph.kernels)
        self.initial = {tp.id: tp.initial for tp in plan.tensors}
        # per kernel, the validator's step: sync moves (evicts and drops first, then
        # prefetches) and async moves
        self.steps: tuple[KernelStep, ...] = self.validation.steps
        self.has_moves = [bool(s.sync_moves or s.async_moves) for s in self.steps]
        self.nbytes = [t.nbytes for t in graph.tensors]
        # the idle read-buffer cache may grow to (budget - what the plan holds at kernel k)
        self._release_cache = memory.capabilities.read_cache and self.budget is not None
        self.cache_headroom = ([int(self.budget - b) for b in self.validation.fast_bytes]
                               if self._release_cache else [])
        self.kernels = self._compile()
        self.pieces = {k: piece_runner(graph, k, memory) for k, kn in enumerate(graph.kernels) if kn.pieces > 1}
        self._getter = OperandBuilder(self.program, self.env, self.storage_value, self.device).node  # (scalars, views)
        # bytes kernel k's outputs and the prefetches before it allocate in fast memory
        self.incoming = [sum(b for _, _, b, slow in kc.outputs if not slow) for kc in self.kernels]
        for s in self.steps:
            for m in s.sync_moves + s.async_moves:
                if m.action.kind == "prefetch":
                    self.incoming[s.kernel] += self.nbytes[m.tensor]
        # the first kernel after which a carried value the caller holds in fast memory may
        # have been overwritten (its last use: updated in place, or its bytes reused); a
        # failure before it leaves the caller's state as the last iteration left it
        fast_carried = [tid for key, tid in self.program.input_keys
                        if key.split(":")[0] in ("param", "buffer", "opt") and self.initial.get(tid) == "fast"]
        # (or its first move: an evicted or dropped one's bytes in the arena go to other tensors)
        moved = {tp.id: min((a.at for a in tp.actions), default=n) for tp in plan.tensors}
        self.first_overwrite = min((min(graph.tensors[tid].live[1], moved.get(tid, n)) for tid in fast_carried),
                                   default=n)
        self.at_kernel = -1  # the kernel the current iteration has reached (-1: none yet)
        self._borrowed: set[int] = set()  # slow inputs the caller owns (never freed here)
        self._rss_floor: int | None = None  # with an arena: RSS without the iteration's tensors
        # per iteration (run_iteration): the Ctrl-C guard, the kernel from which a Ctrl-C lets
        # the iteration finish, whether the arena is mapped, the RSS floor and bound
        self._ctrl_c = CtrlCBetweenKernels()
        self._finish_from = n + 1
        self._arena_on = False
        self._floor: int | None = None
        self._rss_bound = 0
        self.layout: ArenaFollower | None = None
        if use_arena:
            self._follow_layout()
        self._reset_iteration()

    def _follow_layout(self) -> None:
        """Follow the plan's static layout (arena_following.py) when it has one and a
        budget, the fast tier is this process's memory, and the allocator can be built."""
        outputs = [[(tid, nb, to_slow) for tid, _i, nb, to_slow in ck.outputs] for ck in self.kernels]
        self.layout = ArenaFollower.of(self.plan, self.validation, outputs, self.nbytes, self.memory, self.budget,
                                       host_budget=self.trim_memory and self.device is None)
        if self.layout is None:
            return
        for k, b in enumerate(self.layout.placed_bytes):
            self.incoming[k] -= b
        if self._release_cache:  # the arena holds the budget: read buffers only for misses
            self.cache_headroom = [max(0, int(self.budget - self.plan.arena_bytes))] * len(self.kernels)

    @property
    def arena(self) -> cpu_arena.CpuArena | None:
        return self.layout.arena if self.layout is not None else None

    @property
    def pool(self) -> cpu_arena.CpuArena | None:
        return self.layout.pool if self.layout is not None else None

    @property
    def follows_layout(self) -> bool:
        """Whether iterations follow the plan's arena layout (arena_following.py)."""
        return self.layout is not None and self.layout.arena_bytes > 0

    def in_arena(self, t: torch.Tensor) -> bool:
        return self.layout is not None and self.layout.in_arena(t)

    def _trim(self, over=None) -> None:
        """Give free memory back: glibc's heap, and with a layout the free pages
        ArenaFollower.trim gives back."""
        if self.layout is not None:
            self.layout.trim(over)
        else:
            trim_heap()

    def arena_meta(self) -> dict:
        """For a run report: whether the plan's layout was followed, and how well (the last
        iteration): outputs placed at their offset or passed to the heap, inputs copied in."""
        if self.layout is None or self.layout.stats is None:
            why = (cpu_arena.load.reason if cpu_arena.load.tried and cpu_arena.load.reason
                   else "no layout, or no CPU budget")
            return {"arena": None, "arena_unused_because": why}
        return {"arena": dict(self.layout.stats)}

    def close(self) -> None:
        """Give the arena back (its memory goes when the last tensor in it dies)."""
        if self.layout is not None:
            self.layout.close()

    def _compile(self) -> list[_CompiledKernel]:
        p = self.program
        builders = self.operand_builders()
        out = []
        for k, node in enumerate(p.kernel_nodes):
            outputs = tuple((tid, i, self.nbytes[tid], self.initial[tid] == "slow") for tid, i in p.kernel_outputs[k])
            r = self.reuse[k] if k < len(self.reuse) else None
            val = node.meta.get("val")
            reuse = (r if r is not None and isinstance(val, torch.Tensor) and len(outputs) == 1
                     and not outputs[0][3] else None)
            out.append(_CompiledKernel(node.target, *builders[k], outputs, reuse, tuple(p.free_after[k])))
        return out

    def rebuild_operands(self, kernels) -> None:
        kernels = list(kernels)
        super().rebuild_operands(kernels)
        builders = self.operand_builders()
        for k in kernels:
            self.kernels[k] = dataclasses.replace(self.kernels[k], args=builders[k][0], kwargs=builders[k][1])

    # ---- accounting -------------------------------------------------------------------
    def _reset_iteration(self):
        self.fast: set[int] = set()  # tensors whose fast copy the executor holds
        self.slow: dict[int, SlowHandle] = {}
        self.fast_bytes = 0
        self.peak_fast = 0
        self.to_slow_bytes = 0
        self.to_fast_bytes = 0
        self.moves: list[MoveRecord] = []
        self.kernel_times = np.zeros(len(self.graph.kernels))  # per kernel: its call
        self.operand_times = np.zeros(len(self.graph.kernels))  # building its operands before
        self._pending: list[list] = []  # [tensor, action, Pending or None, start]
        self.kept: dict[int, torch.Tensor] = {}  # copies of the kept tensors (_copy_kept)
        self.inspection_seconds = 0.0  # this iteration's time spent making them
        self._outputs: dict[int, torch.Tensor | SlowHandle] = {}  # finish() fills it

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
        if self.fast_bytes > self.peak_fast:
            self.peak_fast = self.fast_bytes
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

    def _read_target(self, tid: int, k: int) -> torch.Tensor | None:
        return self.layout.read_target(tid, k, self.slow[tid]) if self.layout is not None else None

    # ---- the timeline: Replay's hooks ---------------------------------------------------
    def begin(self, inputs) -> None:
        """Step 0: the graph inputs in their initial tier; the RSS bound of this iteration."""
        self.place_inputs(inputs)
        if self._arena_on and isinstance(inputs, dict):
            # the executor owns the inputs now: each one's bytes free up when it dies here
            # (and the next tensor planned there gets them)
            inputs.clear()
        if self._rss is not None:
            if self._floor is None:  # the process's RSS before any tensor of the iteration exists
                self._floor = self._rss() - self.fast_bytes
            self._rss_bound = self._floor + self.budget + RSS_SLACK_BYTES

    def before_kernel(self, k: int) -> None:
        if self._ctrl_c.hit and k < self._finish_from:
            raise KeyboardInterrupt
        self.at_kernel = k
        rss, incoming = self._rss, self.incoming
        # (with an arena, kernels' temporaries and misplaced outputs grow the heap: look
        # before every kernel)
        if rss is not None and (incoming[k] or self._arena_on) and rss() + incoming[k] > self._rss_bound:
            bound = self._rss_bound
            self._trim(lambda: rss() + incoming[k] - bound)
        if self._release_cache and self.memory.cached_fast_bytes() > self.cache_headroom[k]:
            self.memory.release_cached()
        if self.has_moves[k]:
            self._start_moves(k)
        if self.keep:  # before an in-place kernel reuses a kept input's storage
            self._copy_kept(k)

    def _start_moves(self, k: int) -> None:
        step = self.steps[k]
        for m in step.sync_moves:  # step 1
            tid, a = m.tensor, m.action
            t0 = time.perf_counter()
            if a.kind == "evict":
                self.slow[tid] = self.memory.to_slow(tid, self.env[tid])
                self.to_slow_bytes += self.nbytes[tid]
                if not a.keep_fast:
                    self._release_fast(tid)
            elif a.kind == "drop":
                self._release_fast(tid)
            else:
                into = self._read_target(tid, k)
                v = (self.memory.to_fast(self.slow[tid]) if into is None
                     else self.memory.to_fast(self.slow[tid], into=into))
                self._hold_fast(tid, v, k)
                self.to_fast_bytes += self.nbytes[tid]
            self.moves.append(MoveRecord(tid, a.kind, "sync", k, self.nbytes[tid], time.perf_counter() - t0))
        for m in step.async_moves:  # step 2
            tid, a = m.tensor, m.action
            t0 = time.perf_counter()
            # registered before it starts, so that a Ctrl-C right after the start leaves no
            # move in flight that the cleanup (_finish_iteration) does not wait for
            entry = [tid, a, None, t0]
            self._pending.append(entry)
            if a.kind == "prefetch":
                into = self._read_target(tid, k)
                entry[2] = (self.memory.start_to_fast(self.slow[tid]) if into is None
                            else self.memory.start_to_fast(self.slow[tid], into))
                self.fast.add(tid)  # the destination is held from the start
                self.fast_bytes += self.nbytes[tid]
                self._check_budget(k)
            elif a.kind == "evict":
                entry[2] = self.memory.start_to_slow(tid, self.env[tid])

    def run_kernel(self, k: int) -> None:
        """Step 3: run kernel k, its outputs allocated in their initial tier."""
        ck = self.kernels[k]
        env = self.env
        layout = self.layout
        expect = layout.kernel_starts(k) if layout is not None else None
        try:
            out = self._call_kernel(ck, env, k)
        finally:
            if layout is not None:
                layout.kernel_done()
        r = ck.reuse
        if r is not None and r.tensor in env and r.tensor in self.fast:
            # the output now holds the dying input's storage: its bytes pass to the output
            # (counted once, as the validator counts them; the input's free releases nothing)
            self.fast.remove(r.tensor)
            self.fast_bytes -= self.nbytes[r.tensor]
        for tid, i, nb, to_slow in ck.outputs:
            v = out if i is None else out[i]
            if to_slow:  # direct access: the output goes to slow memory (staged: written there in pieces)
                self.slow[tid] = v if isinstance(v, SlowHandle) else self.memory.to_slow(tid, v)
                self.to_slow_bytes += nb if isinstance(v, SlowHandle) else 0
            else:
                if expect and nb >= LARGE_BLOCK_BYTES:
                    v = layout.settle(tid, v, k)
                env[tid] = v
                self.fast.add(tid)
                self.fast_bytes += nb
        self._check_budget(k)

    def _call_kernel(self, ck: _CompiledKernel, env: dict, k: int):
        # kernel_times: the call alone, as the profiler times a kernel; building its
        # operands (operand_times) is the executor's work between kernels, as in the profile
        t0 = time.perf_counter()
        pieces = self.pieces.get(k)
        born = ck.outputs[0][0] if ck.outputs and ck.outputs[0][3] and self.plan.access == "staged" else None
        if pieces is not None and (born is not None or any(t not in env for t in pieces.split)):  # (in slow memory)
            out = pieces.run(env, self.slow, lambda a: self._getter(a)(), self.device, born_slow=born)
            self.operand_times[k], self.kernel_times[k] = 0.0, time.perf_counter() - t0
            return out
        args = ck.args()
        kwargs = ck.kwargs() if ck.kwargs is not None else {}
        r = ck.reuse
        t1 = time.perf_counter()
        if r is not None and r.tensor in env:
            # the output goes into the storage of an input that dies here (in-place update;
            # the output's view inside the clock, as the profiler's Replay.call_kernel)
            out = r.call(env[r.tensor], args, kwargs)
        else:
            out = ck.target(*args, **kwargs)
        t2 = time.perf_counter()
        self.operand_times[k] = t1 - t0
        self.kernel_times[k] = t2 - t1
        return out

    def after_kernel(self, k: int) -> None:
        pend = self._pending  # step 4
        while pend:
            tid, a, pending, t0 = pend[0]
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
            pend.pop(0)
            self.moves.append(MoveRecord(tid, a.kind, "async", k, self.nbytes[tid], time.perf_counter() - t0))
        if self.keep:  # kept tensors made here
            self._copy_kept(k)

    def _copy_kept(self, k: int) -> None:
        """Copy the kept tensors that die at kernel k and exist now (verification reads them
        after the iteration): the plan then runs as it would unverified, and the copies stay
        outside its account and off the iteration's clock (inspection_seconds), the RSS
        bound raised by their bytes. Holding the tensors themselves instead moved the plan's
        arena layout to the heap and slowed verified iterations (benchmarks/HISTORY.md)."""
        t0 = time.perf_counter()
        copied = 0
        for tid in self.kernels[k].frees:
            if tid not in self.keep or tid in self.kept:
                continue
            if tid in self.env or (tid in self.slow and self.memory.slow_view(self.slow[tid]) is not None):
                v = self.storage_value(tid)
                st = v.untyped_storage().clone()  # the same view on a copy of its storage
                self.kept[tid] = torch.empty(0, dtype=v.dtype, device=v.device).set_(
                    st, v.storage_offset(), v.size(), v.stride())
            elif tid in self.slow:  # staged, last seen in slow memory: read back
                self.kept[tid] = self.memory.to_fast(self.slow[tid])
            else:  # not made yet (kernel k makes it)
                continue
            copied += self.nbytes[tid]
        self.inspection_seconds += time.perf_counter() - t0
        if self._rss is not None:
            self._rss_bound += copied

    def free(self, tid: int) -> None:  # step 5 (kept tensors too: _copy_kept has their copies)
        self._release_fast(tid)
        h = self.slow.pop(tid, None)
        if h is not None and tid not in self._borrowed:
            self.memory.free_slow(h)

    def finish(self) -> dict:
        """Step 6: the graph outputs, carried to slow memory where their input starts there,
        and the kept tensors."""
        p, nbytes = self.program, self.nbytes
        n = len(p.kernel_nodes)
        out = self._outputs
        slow_inputs = {key for key, tid in p.input_keys if self.initial.get(tid) == "slow"}
        for key, tid in p.output_keys.items():
            if key in slow_inputs:  # carry: the next iteration reads it from slow memory
                if tid in self.slow:
                    out[tid] = self.slow.pop(tid)
                else:
                    t0 = time.perf_counter()
                    out[tid] = self.memory.to_slow(tid, self.env[tid])
                    self.to_slow_bytes += nbytes[tid]
                    self.moves.append(MoveRecord(tid, "carry", "sync", n, nbytes[tid], time.perf_counter() - t0))
                    self._release_fast(tid)
            else:
                out[tid] = self.storage_value(tid) if tid in self.env else self.memory.to_fast(self.slow[tid])
        for tid in self.keep:
            if tid in self.kept:
                out[tid] = self.kept.pop(tid)
            elif tid in self.env:
                out[tid] = self.env[tid]
            elif tid in self.slow:  # kept for inspection, last seen in slow memory
                out[tid] = self.memory.to_fast(self.slow[tid])
        self.slow = {t: h for t, h in self.slow.items() if t not in self._borrowed}
        if self.layout is not None:
            self.layout.end_iteration()
        return out

    # ---- iterations -------------------------------------------------------------------
    def place_inputs(self, inputs: Mapping[int, torch.Tensor | SlowHandle]) -> None:
        """Put graph inputs in their initial tier (fast tensors or slow handles). Slow
        handles passed in stay the caller's: the executor reads them and never frees them.
        With an arena, fast inputs are copied into their slots, and `inputs` then holds the
        copies: the originals' bytes go back (trimmed every RSS_SLACK_BYTES copied, so that
        the first iteration never holds the state twice)."""
        copied = 0
        for tid, v in inputs.items():
            if isinstance(v, SlowHandle):
                self.slow[tid] = v
                self._borrowed.add(tid)
            elif self.initial.get(tid, "fast") == "slow":
                self.slow[tid] = self.memory.to_slow(tid, v)
            else:
                v = v if self.device is None else v.to(self.device)
                if self.arena is not None:
                    placed = self.layout.to_arena(tid, v)
                    if placed is not v and isinstance(inputs, dict):
                        inputs[tid] = v = placed
                        copied += self.nbytes[tid]
                        if copied > RSS_SLACK_BYTES and self._rss is not None:
                            self._trim()
                            copied = 0
                self._hold_fast(tid, v, 0)
        for tid, v in self.program.constants.items():
            if tid not in inputs:
                if self.initial.get(tid, "fast") == "slow":
                    self.slow[tid] = self.memory.to_slow(tid, v)
                else:
                    self._hold_fast(tid, v if self.device is None else v.to(self.device), 0)

    def run_iteration(self, inputs: Mapping[int, torch.Tensor | SlowHandle], keep: Iterable[int] = (),
                      ctrl_c: CtrlCBetweenKernels | None = None) -> dict:
        """One iteration (Replay.run with the hooks above). Returns the graph outputs: fast
        tensors, or SlowHandles for those whose matching input starts slow (carried there
        after the last kernel).

        On any exception (KeyboardInterrupt included) every move in flight is waited for and
        every slow copy the iteration made is freed before the exception propagates; graph
        inputs may have been partly overwritten (in-place updates), so they are no longer
        a consistent state (unless `at_kernel < first_overwrite`).

        `ctrl_c`: the caller's Ctrl-C guard (entered by the caller); with its `finish_from`
        set, a Ctrl-C at or after that kernel lets the iteration finish (the caller raises)."""
        self.at_kernel = -1
        guard = CtrlCBetweenKernels() if ctrl_c is None else contextlib.nullcontext(ctrl_c)
        finish_from = ctrl_c.finish_from if ctrl_c is not None and ctrl_c.finish_from is not None else None
        self._reset_iteration()
        self.env.clear()
        self._borrowed = set()
        n = len(self.program.kernel_nodes)
        rss = self._rss
        floor = self._rss_floor
        if rss is not None and floor is None:
            trim_heap()  # what the caller freed since the last iteration (a model copy, a batch)
            if self.follows_layout:
                # the process without the iteration's tensors, measured once: the arena's
                # pages (touched as used, kept for later iterations) count in the budget
                held = sum(self.nbytes[tid] for tid, v in inputs.items()
                           if isinstance(v, torch.Tensor) and self.initial.get(tid, "fast") == "fast")
                floor = self._rss_floor = rss() - held
        self._floor = floor
        serving = self.layout.begin_iteration() if self.layout is not None else contextlib.nullcontext()
        self._arena_on = self.arena is not None
        # (never, without finish_from: an interrupted iteration stops before its next kernel)
        self._finish_from = n + 1 if finish_from is None else finish_from
        with guard as ctrl_c, serving:
            self._ctrl_c = ctrl_c
            try:
                out = self.run(inputs, keep)
                if ctrl_c.hit and self._finish_from > n:
                    raise KeyboardInterrupt
            except BaseException:
                # slow copies handed out as carried outputs belong to the caller only on success
                self._discard_outputs(self._outputs)
                raise
            finally:
                self._finish_iteration()
            if ctrl_c.hit and self._finish_from > n:  # during the cleanup: nothing of the iteration goes to the caller
                for v in out.values():
                    if isinstance(v, SlowHandle):
                        self.memory.free_slow(v)
                raise KeyboardInterrupt
        return out

    def _discard_outputs(self, out) -> None:
        for tid, v in (out or {}).items():
            if isinstance(v, SlowHandle) and tid not in self._borrowed:
                self.slow.setdefault(tid, v)

    def _finish_iteration(self) -> None:
        """Wait for moves in flight, free every slow copy the executor owns, drop fast values."""
        while self._pending:
            tid, a, pending, _ = self._pending.pop()
            if pending is None:
                continue
            try:
                result = pending.wait()
            except BaseException:
                continue
            if isinstance(result, SlowHandle) and self.slow.get(tid) is not result:
                try:
                    self.memory.free_slow(result)
                except Exception:
                    pass
        for tid, h in self.slow.items():
            if tid in self._borrowed:
                continue
            try:
                self.memory.free_slow(h)
            except Exception:
                pass
        self.slow = {}
        self._borrowed = set()
        self.env.clear()
        self.fast = set()
        self.keep = set()
        self.kept = {}
        self._outputs = {}
