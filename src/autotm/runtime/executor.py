"""Execute a plan: run training iterations of a TrainingGraph on real memory tiers.

The executor is the replay interpreter plus the plan's moves, performed on the timeline
that `autotm.plan` defines (the same one the validator and simulator replay). It keeps its
own account of fast-tier bytes (every storage it holds in fast memory, moves in flight at
both ends) and raises BudgetExceeded the moment that account passes the budget: the
budget is enforced by the runtime, not promised by the planner.

Between iterations, the weights, buffers and optimizer state are carried in the tier
their graph input starts in: an updated value whose input starts slow is written to slow
memory after the last kernel (a "carry" move, timed as part of the iteration).

Kernels run from the argument builders the replay compiles once (Replay.operand_builders,
as the replay and the profiler build operands); a pointwise kernel whose input dies at it writes
its output into that input's storage, as the replay interpreter does (torch.optim's
in-place updates).

Failures: on any exception, KeyboardInterrupt included, the iteration waits for its moves
in flight and frees every slow copy it made before the exception propagates;
ExecutorSession then frees the carried state and refuses to report.

Process memory (RSS) with a budget: peak RSS <= budget + the process's RSS before any
tensor of the iteration exists + a constant (benchmarks/rss_overhead.py states and
measures it). glibc keeps freed blocks for reuse (no page faults in the steady state,
keep_freed_memory), and the executor gives them back (malloc_trim) only when the RSS it
reads before a kernel, plus what that kernel and its moves will allocate, would pass
budget + baseline + RSS_SLACK_BYTES; the tier's idle read buffers count against the budget.

With a plan that has a static layout within the budget (the planner's arena), the executor
follows it (tiers/cpu_arena.py): one arena of the layout's size, mapped once; each
kernel's outputs allocated at their offsets, prefetches read straight into their slots,
graph inputs copied into theirs, large temporaries of a kernel put in the arena's free
pages when they fit, and every other allocation of LARGE_BLOCK_BYTES or more served from a
pool of the allocator's own (first fit from its lowest address, so that its resident pages
are the high-water mark of what was alive in it at once, whatever glibc's heap looked like
before). RSS then holds the arena, the pool and small blocks, and is trimmed (glibc's heap,
then the pool's free huge pages from the top) only when that passes the same bound. With
those allocations in glibc's heap instead, fragmented by capture and profiling in the
same process, the kernels faulted pages back in after every trim (benchmarks/HISTORY.md,
arena_overhead.py). A layout larger than the budget (one the planner could not
fit) is followed too, and when RSS passes the bound the arena's whole free huge pages are
given back with the heap's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import torch

from ..errors import AutotmError, BudgetExceeded, ReplayError, SessionFailed, StateChanged
from ..ir.graph import TrainingGraph
from ..frontend.optim_lowering import GroupHyper, derived
from ..ir.plan import Action, Plan, check_plan_matches
from ..interpret.replay import Replay, StepResult, TrainingState, check_batch
from ..ir.layout import LARGE_BLOCK_BYTES, PAGE, TEMPORARY_MIN_BYTES
from ..tiers import cpu_arena
from ..tiers.base import MemorySystem, SlowHandle
from ..tiers.host_heap import keep_freed_memory, trim_heap
from ..checks.validate import validate


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
    kernel_seconds: np.ndarray  # per kernel, median over iterations: its call (operand building apart)
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


def _pool_bytes() -> int:
    """Address space for the pool of allocations that miss the arena: the machine's memory
    (reserved, not committed: only the pages used become resident)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 64 << 30


RSS_SLACK_BYTES = 64 << 20
"""With trim_memory, free heap memory may stay resident while RSS stays under budget +
the iteration's baseline RSS + this; beyond it the heaps are trimmed (malloc_trim).
Trimming costs page faults when the memory is used again, so it is done only when needed."""


class _RssReader:
    """The process's RSS from /proc/self/statm through a kept-open descriptor (~2 us)."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        try:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:  # no procfs: trim before every kernel that allocates
            self.fd = None

    def __call__(self) -> int:
        if self.fd is None:
            return 1 << 62
        return int(os.pread(self.fd, 128, 0).split()[1]) * self.page

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    __del__ = close


@dataclass(frozen=True)
class _CompiledKernel:
    target: object
    args: object  # () -> list/tuple of arguments
    kwargs: object  # () -> dict, or None
    outputs: tuple  # (tensor id, index in the op's tuple or None, bytes, written to slow)
    reuse: tuple | None  # (out overload, input tensor id, out kwarg name, shape, stride)
    frees: tuple  # tensor ids whose live range ends here
    inplace: object = None  # with reuse, when the dying input is the first argument: op_ (e.g. relu_)


class Executor(Replay):
    """Runs iterations of `graph` following `plan` on `memory`.

    The plan is validated first; a plan the validator rejects never runs.

    With a budget (given, or the plan's), the runtime also keeps the process's memory
    honest (`trim_memory`, default: whether there is a budget): the heaps are trimmed at
    the start of each iteration and before any kernel whose allocations would take RSS
    past budget + baseline + RSS_SLACK_BYTES, and idle read buffers a
    memory system recycles (cpu+file's cache) count against the budget: before each
    kernel, if the bytes the plan holds at that kernel plus the idle cache would pass the
    budget, the cache is released. Without a budget glibc simply keeps freed blocks for the
    next iteration (keep_freed_memory). The price of trimming, measured on this VM: a
    trimmed page costs a fresh first touch later (about 2 GB/s here), and glibc's heap
    fragments, so at tight budgets (resnet50 cpu at 4:1) the trims cost ~1 s per
    iteration; `trim_memory=False` keeps the fast-tier byte account only.
    `use_arena=False`: do not follow the plan's layout (module doc), glibc's heap only.
    """

    def __init__(self, graph: TrainingGraph, plan: Plan, memory: MemorySystem, *, budget_bytes: int | None = None,
                 trim_memory: bool | None = None, use_arena: bool = True):
        super().__init__(graph, device=getattr(memory, "fast_device", None))
        check_plan_matches(plan, graph)
        if plan.access != memory.access:
            raise AutotmError(f"plan is for {plan.access} access but {memory.name} is {memory.access}")
        self.plan = plan
        self.memory = memory
        self.budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
        self.validation = validate(plan, graph, budget_bytes=self.budget)
        # (host RSS honesty is for CPU fast tiers; a device's budget is on the device)
        self.trim_memory = trim_memory if trim_memory is not None else (self.budget is not None and self.device is None)
        keep_freed_memory()
        self._rss = _RssReader() if self.trim_memory else None
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
        self.has_moves = [bool(s or a) for s, a in zip(self.sync_at, self.async_at)]
        self.nbytes = [t.nbytes for t in graph.tensors]
        # the idle read-buffer cache may grow to (budget - what the plan holds at kernel k)
        cached = getattr(memory, "cached_fast_bytes", None)
        release = getattr(memory, "release_cached", None)
        self._cache_ctl = (cached, release) if (cached is not None and release is not None
                                                and self.budget is not None) else None
        self.cache_headroom = ([int(self.budget - b) for b in self.validation.fast_bytes]
                               if self._cache_ctl else [])
        self.kernels = self._compile()
        # bytes kernel k's outputs and the prefetches before it allocate in fast memory
        self.incoming = [sum(b for _, _, b, slow in kc.outputs if not slow) for kc in self.kernels]
        for tp in plan.tensors:
            for a in tp.actions:
                if a.kind == "prefetch":
                    self.incoming[a.at] += self.nbytes[tp.id]
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
        self.arena: cpu_arena.CpuArena | None = None
        self._arena_bytes = 0  # > 0: the layout is followed (the arena is mapped on first use)
        self._arena_stats: dict | None = None
        self._arena_over = False  # the plan's layout is larger than the budget (_open_arena)
        self._arena_trimmed = 0  # bytes of its free pages given back (_trim)
        self.pool: cpu_arena.CpuArena | None = None  # with an arena: what misses it (_open_pool)
        self._pool_trimmed = 0
        self._rss_floor: int | None = None  # with an arena: RSS without the iteration's tensors

        self._expect: list[list[tuple[int, int, int]]] | None = None  # per kernel: (bytes, offset, skip) of its outputs
        self._read_at: dict[tuple[int, int], int] = {}  # (tensor, kernel) -> arena offset of a prefetch
        self._input_at: dict[int, int] = {}  # fast graph input -> arena offset
        self._out_at: dict[tuple[int, int], int] = {}  # (tensor, kernel making it) -> arena offset
        if use_arena:
            self._open_arena()
        self._reset_iteration()

    def _open_arena(self) -> None:
        """Follow the plan's static layout (tiers/cpu_arena.py) when it has one and a
        budget, the fast tier is this process's memory, and the allocator can be built."""
        p = self.plan
        if (not self.trim_memory or self.device is not None or p.arena_bytes is None or self.budget is None
                or not 0 < p.arena_bytes or cpu_arena.load() is None):
            return
        # A layout larger than the budget (the planner could not fit one: meta["arena_fits"]
        # False) is followed too: its free huge pages are given back when RSS nears its
        # bound, as the heap is trimmed (inception_v4 cpu 8:1, arena 31 % over the budget:
        # on glibc's heap, trimmed, 6.85 s per iteration for 4.92 predicted)
        self._arena_over = p.arena_bytes > self.budget
        blocks: dict[int, list[tuple[int, int]]] = {}
        for b in self.validation.fast_blocks:
            blocks.setdefault(b.tensor, []).append((b.start, b.end))
        spans: dict[int, list[tuple[int, int, int]]] = {}
        for tp in p.tensors:
            bl = sorted(blocks.get(tp.id, ()))
            if tp.offsets and len(tp.offsets) == len(bl):
                spans[tp.id] = [(s, e, o) for (s, e), o in zip(bl, tp.offsets)]

        def offset_at(tid: int, *steps: int) -> int | None:
            # steps on the validator's half-step clock: 2k (after kernel k's sync moves), 2k + 1 (kernel k)
            for step in steps:
                for s, e, o in spans.get(tid, ()):
                    if s <= step <= e:
                        return o
            return None

        n = len(self.kernels)
        self._expect = [[] for _ in range(n)]
        # Small tensors stay in the heap (their slots go unused): one that lives longer than
        # planned (outputs of one size trade slots; state updated in place) would hold
        # bytes the layout gives to a large tensor later, which then misses its slot.
        for k, ck in enumerate(self.kernels):
            for tid, _i, nb, to_slow in ck.outputs:
                o = None if to_slow or nb < LARGE_BLOCK_BYTES else offset_at(tid, 2 * k + 1)
                if o is not None:
                    self._expect[k].append((nb, o, 0))
                    self._out_at[(tid, k)] = o
                    if not self._arena_over:  # lands in the arena's resident pages: no new RSS
                        self.incoming[k] -= nb
        reads = hasattr(self.memory, "read_span")
        for tp in p.tensors:
            for a in tp.actions:
                if a.kind == "prefetch" and reads:
                    o = offset_at(tp.id, *((2 * a.at, 2 * a.at + 1) if a.mode == "sync" else (2 * a.at + 1, 2 * a.at)))
                    if o is not None:
                        self._read_at[(tp.id, a.at)] = o
                        if not self._arena_over:
                            self.incoming[a.at] -= self.nbytes[tp.id]
            if tp.initial == "fast" and self.nbytes[tp.id] >= LARGE_BLOCK_BYTES:
                o = offset_at(tp.id, 0)
                if o is not None:
                    self._input_at[tp.id] = o
        self._arena_bytes = p.arena_bytes  # mapped by the first iteration, after its trim
        if self._cache_ctl is not None:  # the arena holds the budget: read buffers only for misses
            self.cache_headroom = [max(0, int(self.budget - p.arena_bytes))] * n

    def _trim(self, over=None) -> None:
        """Give free memory back: glibc's heap, then free huge pages of an arena larger than
        the budget, as many as `over()` (bytes over the RSS bound, after the heap's trim)
        says, every one without it."""
        trim_heap()
        if self.pool is not None:
            need = 0 if over is None else over()
            if over is None or need > 0:
                self._pool_trimmed += self.pool.trim(need)
        if self._arena_over and self.arena is not None:
            need = 0 if over is None else over()
            if over is None or need > 0:
                self._arena_trimmed += self.arena.trim(need)

    def arena_meta(self) -> dict:
        """For a run report: whether the plan's layout was followed, and how well (the last
        iteration): outputs placed at their offset or passed to the heap, inputs copied in."""
        if self._arena_stats is None:
            why = (cpu_arena.load.reason if cpu_arena.load.tried and cpu_arena.load.reason
                   else "no layout, or no CPU budget")
            return {"arena": None, "arena_unused_because": why}
        return {"arena": dict(self._arena_stats)}

    def close(self) -> None:
        """Give the arena back (its memory goes when the last tensor in it dies)."""
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._expect = None
        self._arena_bytes = 0

    @property
    def follows_layout(self) -> bool:
        """Whether iterations follow the plan's arena layout (module doc)."""
        return self._arena_bytes > 0

    def in_arena(self, t: torch.Tensor) -> bool:
        return self.arena is not None and self.arena.offset_of(t) >= 0

    def _read_target(self, tid: int, k: int) -> torch.Tensor | None:
        """The prefetch destination of `tid` at kernel k in the arena, or None (a tier buffer)."""
        if self.arena is None:
            return None
        off = self._read_at.get((tid, k))
        if off is None or off % PAGE:  # (small blocks are not page-aligned: read into a tier buffer)
            return None
        h = self.slow[tid]
        length, pad = self.memory.read_span(h)
        if pad or h.storage_nbytes <= 0:
            return None
        return self.arena.take(off, h.storage_nbytes, length)

    def _to_arena(self, tid: int, v: torch.Tensor) -> torch.Tensor:
        """A fast graph input at its arena offset (copied there once if it is elsewhere)."""
        off = self._input_at.get(tid)
        if off is None or v.device.type != "cpu":
            return v
        st = v.untyped_storage()
        if self.arena.offset_of(v) == off or st.nbytes() != self.nbytes[tid] or st.nbytes() == 0:
            return v
        placed = self._copy_into_slot(v, off)
        if placed is not None:
            self.arena_copies += 1
            return placed
        return v

    def _copy_into_slot(self, v: torch.Tensor, off: int) -> torch.Tensor | None:
        """`v` with its storage copied to arena offset `off`, or None if that range is in use."""
        st = v.untyped_storage()
        dst = self.arena.take(off, st.nbytes())
        if dst is None:
            return None
        dst.copy_(torch.empty(0, dtype=torch.uint8).set_(st))
        return torch.empty(0, dtype=v.dtype).set_(dst.untyped_storage(), v.storage_offset(), v.shape, v.stride())

    def _compile(self) -> list[_CompiledKernel]:
        p = self.program
        builders = self.operand_builders()
        out = []
        for k, node in enumerate(p.kernel_nodes):
            outputs = tuple((tid, i, self.nbytes[tid], self.initial[tid] == "slow") for tid, i in p.kernel_outputs[k])
            reuse = None
            inplace = None
            r = self.reuse[k] if k < len(self.reuse) else None
            val = node.meta.get("val")
            if (r is not None and isinstance(val, torch.Tensor) and len(outputs) == 1 and not outputs[0][3]):
                reuse = (r[0], r[1], r[2], tuple(val.shape), tuple(val.stride()))
                inplace = r[5]
            out.append(_CompiledKernel(node.target, *builders[k], outputs, reuse, tuple(p.free_after[k]), inplace))
        return out

    def rebuild_operands(self, kernels) -> None:
        kernels = list(kernels)
        super().rebuild_operands(kernels)
        builders = self.operand_builders()
        for k in kernels:
            self.kernels[k] = dataclasses.replace(self.kernels[k], args=builders[k][0], kwargs=builders[k][1])

    # ---- accounting -------------------------------------------------------------------
    def _reset_iteration(self):
        self.arena_copies = 0  # graph inputs copied into their arena slot this iteration
        self.arena_settled_bytes = 0  # outputs copied into their slot this iteration (_settle)
        self.arena_large_bytes = [0, 0]  # large planned outputs this iteration: bytes, bytes in the arena
        self.fast: set[int] = set()  # tensors whose fast copy the executor holds
        self.slow: dict[int, SlowHandle] = {}
        self.fast_bytes = 0
        self.peak_fast = 0
        self.to_slow_bytes = 0
        self.to_fast_bytes = 0
        self.moves: list[MoveRecord] = []
        self.kernel_times = np.zeros(len(self.graph.kernels))  # per kernel: its call
        self.operand_times = np.zeros(len(self.graph.kernels))  # building its operands before
        self._pending: list[tuple[int, Action, object, float]] = []
        self.kept: dict[int, torch.Tensor] = {}  # copies of the kept tensors (_copy_kept)
        self.inspection_seconds = 0.0  # this iteration's time spent making them

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

    # ---- the timeline -----------------------------------------------------------------
    def before_kernel(self, k: int) -> None:
        if self._cache_ctl is not None:
            cached, release = self._cache_ctl
            if cached() > self.cache_headroom[k]:
                release()
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
                into = self._read_target(tid, k)
                v = (self.memory.to_fast(self.slow[tid]) if into is None
                     else self.memory.to_fast(self.slow[tid], into=into))
                self._hold_fast(tid, v, k)
                self.to_fast_bytes += self.nbytes[tid]
            self.moves.append(MoveRecord(tid, a.kind, "sync", k, self.nbytes[tid], time.perf_counter() - t0))
        for tid, a in self.async_at[k]:  # step 2
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
        expect = self._expect[k] if self._expect is not None else None
        arena = self.arena
        if arena is not None:  # its outputs' allocations go to their planned offsets
            arena.expect(expect, TEMPORARY_MIN_BYTES)
        try:
            out = self._call_kernel(ck, env, k)
        finally:
            if arena is not None:
                arena.done()
        for tid, i, nb, to_slow in ck.outputs:
            v = out if i is None else out[i]
            if to_slow:  # direct access: the output goes to slow memory
                self.slow[tid] = self.memory.to_slow(tid, v)
            else:
                if expect and nb >= LARGE_BLOCK_BYTES:
                    v = self._settle(tid, v, k)
                env[tid] = v
                self.fast.add(tid)
                self.fast_bytes += nb
        self._check_budget(k)

    def _learn_skip(self, k: int, nbytes: int, off: int, ptr: int) -> None:
        """The output came after other allocations of its size (a kernel's temporaries, e.g.
        oneDNN's reorder buffers): next time let that many pass before placing it. Kernels
        allocate in the same order every call."""
        same = [a for n, a in self.arena.allocations() if n == nbytes]
        if ptr in same:
            entries = self._expect[k]
            for j, (n, o, _skip) in enumerate(entries):
                if n == nbytes and o == off:
                    entries[j] = (n, o, same.index(ptr))

    def _settle(self, tid: int, v: torch.Tensor, k: int) -> torch.Tensor:
        """A large output that some kernel allocated outside its slot (its own allocator, or
        a temporary of the same size still alive) is copied into the slot: in the heap it
        would grow RSS past the arena, and leave a page-unaligned copy for the file tier."""
        arena = self.arena
        nb = self.nbytes[tid]
        self.arena_large_bytes[0] += nb
        off = self._out_at.get((tid, k))
        at = arena.offset_of(v)
        if at >= 0 and (off is None or at == off):
            self.arena_large_bytes[1] += nb
            return v
        st = v.untyped_storage()
        if off is None or st.nbytes() != self.nbytes[tid]:
            return v
        self._learn_skip(k, st.nbytes(), off, st.data_ptr())
        placed = self._copy_into_slot(v, off)
        if placed is None:
            return v
        self.arena_settled_bytes += st.nbytes()
        self.arena_large_bytes[1] += nb
        return placed

    def _call_kernel(self, ck: _CompiledKernel, env: dict, k: int):
        # kernel_times: the call alone, as the profiler times a kernel; building its
        # operands (operand_times) is the executor's work between kernels, as in the profile
        t0 = time.perf_counter()
        args = ck.args()
        kwargs = ck.kwargs() if ck.kwargs is not None else {}
        r = ck.reuse
        t1 = time.perf_counter()
        if r is not None and r[1] in env:
            # the output goes into the storage of an input that dies here (in-place update):
            # with the op's in-place form when that input is its first argument (the same
            # kernel as out=, and for some ops, relu among them, several times faster)
            if ck.inplace is not None:
                out = ck.inplace(*args, **kwargs)
            else:  # (the output's view inside the clock, as the profiler's Replay.call_kernel)
                out = r[0](*args, **kwargs, **{r[2]: env[r[1]].as_strided(r[3], r[4], 0)})
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

    def _copy_kept(self, k: int, keep: set[int]) -> int:
        """Copy the kept tensors that die at kernel k and exist now (verification reads them
        after the iteration): the plan then runs as it would unverified, and the copies stay
        outside its account. Holding the tensors themselves instead moved the plan's arena
        layout to the heap (resnet50 test 4:1 synchronous: 283 of 455 MB of outputs) and
        made the verified iterations 1.5x slower. The copying is taken off the iteration's
        clock (inspection_seconds). Returns the bytes copied."""
        t0 = time.perf_counter()
        copied = 0
        for tid in self.kernels[k].frees:
            if tid not in keep or tid in self.kept:
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
        return copied

    def free(self, tid: int) -> None:  # step 5
        self._release_fast(tid)
        h = self.slow.pop(tid, None)
        if h is not None and tid not in self._borrowed:
            self.memory.free_slow(h)

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
                    placed = self._to_arena(tid, v)
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
                      ctrl_c: "_CtrlCBetweenKernels | None" = None) -> dict:
        """One iteration. Returns the graph outputs: fast tensors, or SlowHandles for those
        whose matching input starts slow (carried there after the last kernel).

        On any exception (KeyboardInterrupt included) every move in flight is waited for and
        every slow copy the iteration made is freed before the exception propagates; graph
        inputs may have been partly overwritten (in-place updates), so they are no longer
        a consistent state (unless `at_kernel < first_overwrite`).

        `ctrl_c`: the caller's Ctrl-C guard (entered by the caller); with its `finish_from`
        set, a Ctrl-C at or after that kernel lets the iteration finish (the caller raises)."""
        self.at_kernel = -1
        own_guard = ctrl_c is None
        guard = _CtrlCBetweenKernels() if own_guard else contextlib.nullcontext(ctrl_c)
        finish_from = ctrl_c.finish_from if ctrl_c is not None and ctrl_c.finish_from is not None else None
        self._reset_iteration()
        self.env.clear()
        self._borrowed = set()
        keep = set(keep)
        self.keep = keep
        self.kept = {}
        self.inspection_seconds = 0.0
        p = self.program
        n = len(p.kernel_nodes)
        nbytes, has_moves, kernels = self.nbytes, self.has_moves, self.kernels
        cache_ctl = self._cache_ctl
        rss = self._rss
        incoming = self.incoming
        floor = self._rss_floor
        if rss is not None and floor is None:
            trim_heap()  # what the caller freed since the last iteration (a model copy, a batch)
            if self._arena_bytes:
                # the process without the iteration's tensors, measured once: the arena's
                # pages (touched as used, kept for later iterations) count in the budget
                held = sum(self.nbytes[tid] for tid, v in inputs.items()
                           if isinstance(v, torch.Tensor) and self.initial.get(tid, "fast") == "fast")
                floor = self._rss_floor = rss() - held
        if self._arena_bytes and self.arena is None:
            self.arena = cpu_arena.CpuArena(self._arena_bytes)
            self.pool = cpu_arena.CpuArena(_pool_bytes())
        arena_on = self.arena is not None
        counts0 = self.arena.stats() if arena_on else None
        pool_trimmed0 = self._pool_trimmed
        # (with an arena, the large allocations that miss it go to the pool: cpu_arena.cpp)
        serving = self.pool.as_pool(LARGE_BLOCK_BYTES) if self.pool is not None else contextlib.nullcontext()
        if finish_from is None:
            finish_from = n + 1  # (never: an interrupted iteration stops before its next kernel)
        with guard as ctrl_c, serving:
            try:
                self.place_inputs(inputs)
                if arena_on and isinstance(inputs, dict):
                    # the executor owns the inputs now: each one's bytes free up when it dies here
                    # (and the next tensor planned there gets them)
                    inputs.clear()
                if rss is not None:
                    if floor is None:  # the process's RSS before any tensor of the iteration exists
                        floor = rss() - self.fast_bytes
                    rss_bound = floor + self.budget + RSS_SLACK_BYTES
                for k in range(n):
                    if ctrl_c.hit and k < finish_from:
                        raise KeyboardInterrupt
                    self.at_kernel = k
                    # (with an arena, kernels' temporaries and misplaced outputs grow the heap:
                    # look before every kernel)
                    if rss is not None and (incoming[k] or arena_on) and rss() + incoming[k] > rss_bound:
                        self._trim(lambda k=k, rss_bound=rss_bound: rss() + incoming[k] - rss_bound)
                    if has_moves[k]:
                        self.before_kernel(k)
                    elif cache_ctl is not None and cache_ctl[0]() > self.cache_headroom[k]:
                        cache_ctl[1]()
                    if keep:  # before an in-place kernel reuses a kept input's storage
                        copied = self._copy_kept(k, keep)
                        if rss is not None:
                            rss_bound += copied
                    self.execute_kernel(k)
                    if self._pending:
                        self.after_kernel(k)
                    if keep:  # kept tensors made here
                        copied = self._copy_kept(k, keep)
                        if rss is not None:
                            rss_bound += copied
                    for tid in kernels[k].frees:
                        self.free(tid)
                out: dict[int, torch.Tensor | SlowHandle] = {}
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
                for tid in keep:
                    if tid in self.kept:
                        out[tid] = self.kept.pop(tid)
                    elif tid in self.env:
                        out[tid] = self.env[tid]
                    elif tid in self.slow:  # kept for inspection, last seen in slow memory
                        out[tid] = self.memory.to_fast(self.slow[tid])
                self.slow = {t: h for t, h in self.slow.items() if t not in self._borrowed}
                if arena_on:
                    _live, placed, passed, temps, pooled, _high = self.arena.stats()
                    self._arena_stats = dict(arena_bytes=self.arena.nbytes, over_budget=self._arena_over,
                                             trimmed_bytes=self._arena_trimmed,
                                             pooled=pooled - counts0[4], pool_high_bytes=self.pool.stats()[5],
                                             pool_trimmed_bytes=self._pool_trimmed - pool_trimmed0,
                                             outputs_placed=placed - counts0[1], passed=passed - counts0[2],
                                             temporaries_placed=temps - counts0[3], inputs_copied=self.arena_copies,
                                             outputs_copied_bytes=self.arena_settled_bytes,
                                             large_outputs_bytes=self.arena_large_bytes[0],
                                             large_outputs_in_arena_bytes=self.arena_large_bytes[1])
                if ctrl_c.hit and finish_from > n:
                    raise KeyboardInterrupt
            except BaseException:
                # slow copies handed out as carried outputs belong to the caller only on success
                self._discard_outputs(locals().get("out"))
                raise
            finally:
                self._finish_iteration()
            if ctrl_c.hit and finish_from > n:  # during the cleanup: nothing of the iteration goes to the caller
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


class _CtrlCBetweenKernels:
    """Within an iteration a Ctrl-C takes effect before the next kernel (or after the last):
    one landing between an I/O completion and its bookkeeping left a move the cleanup
    waited for forever, or a slow extent nobody freed. A second Ctrl-C interrupts at once.
    Only on the main thread, and only over Python's default handler."""

    def __init__(self, finish_from: int | None = None) -> None:
        self.hit = False
        self._old = None
        self.finish_from = finish_from  # see Executor.run_iteration

    def __enter__(self) -> "_CtrlCBetweenKernels":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


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
        self._bound_hypers = None  # what set_hyperparameters last bound
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
        with _CtrlCBetweenKernels(finish_from=self.executor.first_overwrite) as ctrl_c:
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
            carried = {id(v) for v in self.carried.values()}
            for v in (locals().get("out") or {}).values():
                if isinstance(v, SlowHandle) and id(v) not in carried:
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
