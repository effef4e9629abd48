"""Following a plan's static layout (the planner's arena) on the CPU.

With a plan that has a static layout within the budget, the executor follows it
(tiers/cpu_arena.py): one arena of the layout's size, mapped once; each kernel's outputs
allocated at their offsets, prefetches read straight into their slots, graph inputs copied
into theirs, large temporaries of a kernel put in the arena's free pages when they fit,
and every other allocation of LARGE_BLOCK_BYTES or more served from a pool of the
allocator's own (first fit from its lowest address, so that its resident pages are the
high-water mark of what was alive in it at once, whatever glibc's heap looked like
before). RSS then holds the arena, the pool and small blocks, and is trimmed (glibc's
heap, then the pool's free huge pages from the top) only when that passes the executor's
bound. With those allocations in glibc's heap instead, fragmented by capture and
profiling in the same process, kernels faulted pages back in after every trim
(benchmarks/HISTORY.md, arena_overhead.py). A layout larger than the budget (one the
planner could not fit) is followed too, and when RSS passes the bound the arena's whole
free huge pages are given back with the heap's.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from ..checks.validate import ValidationReport
from ..ir.layout import LARGE_BLOCK_BYTES, PAGE, TEMPORARY_MIN_BYTES
from ..ir.plan import Plan
from ..tiers import cpu_arena
from ..tiers.base import MemorySystem, SlowHandle
from ..tiers.host_heap import trim_heap
from .host_memory import pool_bytes


class ArenaFollower:
    """The executor's side of a plan's layout: where each output, prefetch and fast graph
    input goes in the arena, the arena and pool themselves (mapped by the first iteration),
    and what the last iteration placed.

    `outputs[k]`: kernel k's outputs as (tensor id, bytes, written to slow).
    `placed_bytes[k]`: bytes of kernel k's outputs and of the prefetches before it that land
    in the arena's resident pages (no new RSS; 0 when the layout is over the budget)."""

    def __init__(self, plan: Plan, arena_bytes: int, validation: ValidationReport,
                 outputs: list[list[tuple[int, int, bool]]], nbytes: list[int], memory: MemorySystem,
                 budget: int) -> None:
        self.memory = memory
        self.nbytes = nbytes
        # A layout larger than the budget (the planner could not fit one: meta["arena_fits"]
        # False) is followed too: its free huge pages are given back when RSS nears its
        # bound, as the heap is trimmed
        self.over = arena_bytes > budget
        blocks: dict[int, list[tuple[int, int]]] = {}
        for b in validation.fast_blocks:
            blocks.setdefault(b.tensor, []).append((b.start, b.end))
        spans: dict[int, list[tuple[int, int, int]]] = {}
        for tp in plan.tensors:
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

        n = len(outputs)
        self.placed_bytes = [0] * n
        expect: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # per kernel: (bytes, offset, skip)
        self.out_at: dict[tuple[int, int], int] = {}  # (tensor, kernel making it) -> arena offset
        self.read_at: dict[tuple[int, int], int] = {}  # (tensor, kernel) -> arena offset of a prefetch
        self.input_at: dict[int, int] = {}  # fast graph input -> arena offset
        # Small tensors stay in the heap (their slots go unused): one that lives longer than
        # planned (outputs of one size trade slots; state updated in place) would hold
        # bytes the layout gives to a large tensor later, which then misses its slot.
        for k, outs in enumerate(outputs):
            for tid, nb, to_slow in outs:
                o = None if to_slow or nb < LARGE_BLOCK_BYTES else offset_at(tid, 2 * k + 1)
                if o is not None:
                    expect[k].append((nb, o, 0))
                    self.out_at[(tid, k)] = o
                    if not self.over:  # lands in the arena's resident pages: no new RSS
                        self.placed_bytes[k] += nb
        reads = memory.capabilities.read_into
        for tp in plan.tensors:
            for a in tp.actions:
                if a.kind == "prefetch" and reads:
                    o = offset_at(tp.id, *((2 * a.at, 2 * a.at + 1) if a.mode == "sync" else (2 * a.at + 1, 2 * a.at)))
                    if o is not None:
                        self.read_at[(tp.id, a.at)] = o
                        if not self.over:
                            self.placed_bytes[a.at] += nbytes[tp.id]
            if tp.initial == "fast" and nbytes[tp.id] >= LARGE_BLOCK_BYTES:
                o = offset_at(tp.id, 0)
                if o is not None:
                    self.input_at[tp.id] = o
        self.expect: list[list[tuple[int, int, int]]] | None = expect  # None once closed
        self.arena_bytes = arena_bytes  # mapped by the first iteration, after its trim
        self.arena: cpu_arena.CpuArena | None = None
        self.pool: cpu_arena.CpuArena | None = None  # what misses the arena
        self.arena_trimmed = 0  # bytes of its free pages given back (trim)
        self.pool_trimmed = 0
        self.stats: dict | None = None  # the last iteration's, for a run report
        self._counts0: tuple[int, ...] | None = None  # the arena's counters when the iteration began
        self._pool_trimmed0 = 0
        self.begin_iteration_counts()

    @classmethod
    def of(cls, plan: Plan, validation: ValidationReport, outputs: list[list[tuple[int, int, bool]]],
           nbytes: list[int], memory: MemorySystem, budget: int | None, *, host_budget: bool) -> "ArenaFollower | None":
        """A follower when the plan has a layout and a budget, the fast tier is this
        process's memory held to it (`host_budget`: the executor trims it), and the
        allocator can be built; else None."""
        if (not host_budget or plan.arena_bytes is None or budget is None
                or not 0 < plan.arena_bytes or cpu_arena.load() is None):
            return None
        return cls(plan, plan.arena_bytes, validation, outputs, nbytes, memory, budget)

    # ---- an iteration ------------------------------------------------------------------
    def begin_iteration_counts(self) -> None:
        self.copies = 0  # graph inputs copied into their arena slot this iteration
        self.settled_bytes = 0  # outputs copied into their slot this iteration (settle)
        self.large_bytes = [0, 0]  # large planned outputs this iteration: bytes, bytes in the arena

    def begin_iteration(self) -> contextlib.AbstractContextManager:
        """Map the arena and the pool (the first iteration), note the counters; returns the
        context serving the large allocations that miss the arena from the pool."""
        if self.arena_bytes and self.arena is None:
            self.arena = cpu_arena.CpuArena(self.arena_bytes)
            self.pool = cpu_arena.CpuArena(pool_bytes())
        self.begin_iteration_counts()
        self._counts0 = self.arena.stats() if self.arena is not None else None
        self._pool_trimmed0 = self.pool_trimmed
        # (with an arena, the large allocations that miss it go to the pool: cpu_arena.cpp)
        return self.pool.as_pool(LARGE_BLOCK_BYTES) if self.pool is not None else contextlib.nullcontext()

    def end_iteration(self) -> None:
        """Record what this (completed) iteration placed, for arena_meta."""
        arena, pool, counts0 = self.arena, self.pool, self._counts0
        if arena is None or pool is None or counts0 is None:
            return
        _live, placed, passed, temps, pooled, _high = arena.stats()
        self.stats = dict(arena_bytes=arena.nbytes, over_budget=self.over,
                          trimmed_bytes=self.arena_trimmed,
                          pooled=pooled - counts0[4], pool_high_bytes=pool.stats()[5],
                          pool_trimmed_bytes=self.pool_trimmed - self._pool_trimmed0,
                          outputs_placed=placed - counts0[1], passed=passed - counts0[2],
                          temporaries_placed=temps - counts0[3], inputs_copied=self.copies,
                          outputs_copied_bytes=self.settled_bytes,
                          large_outputs_bytes=self.large_bytes[0],
                          large_outputs_in_arena_bytes=self.large_bytes[1])

    def trim(self, over: Callable[[], int] | None = None) -> None:
        """Give free memory back: glibc's heap, then free huge pages of the pool and of an
        arena larger than the budget, as many as `over()` (bytes over the RSS bound, after
        the heap's trim) says, every one without it."""
        trim_heap()
        if self.pool is not None:
            need = 0 if over is None else over()
            if over is None or need > 0:
                self.pool_trimmed += self.pool.trim(need)
        if self.over and self.arena is not None:
            need = 0 if over is None else over()
            if over is None or need > 0:
                self.arena_trimmed += self.arena.trim(need)

    def close(self) -> None:
        """Give the arena back (its memory goes when the last tensor in it dies)."""
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.expect = None
        self.arena_bytes = 0

    def in_arena(self, t: torch.Tensor) -> bool:
        return self.arena is not None and self.arena.offset_of(t) >= 0

    # ---- placing tensors ---------------------------------------------------------------
    def kernel_starts(self, k: int) -> list[tuple[int, int, int]] | None:
        """Before kernel k's call: its outputs' allocations go to their planned offsets.
        Returns what it expects (None: nothing to settle after)."""
        expect = self.expect[k] if self.expect is not None else None
        if self.arena is not None and expect is not None:
            self.arena.expect(expect, TEMPORARY_MIN_BYTES)
        return expect

    def kernel_done(self) -> None:
        if self.arena is not None:
            self.arena.done()

    def read_target(self, tid: int, k: int, h: SlowHandle) -> torch.Tensor | None:
        """The prefetch destination of `tid` (slow copy `h`) at kernel k in the arena, or None
        (a tier buffer)."""
        if self.arena is None:
            return None
        off = self.read_at.get((tid, k))
        if off is None or off % PAGE:  # (small blocks are not page-aligned: read into a tier buffer)
            return None
        length, pad = self.memory.read_span(h)
        if pad or h.storage_nbytes <= 0:
            return None
        return self.arena.take(off, h.storage_nbytes, length)

    def to_arena(self, tid: int, v: torch.Tensor) -> torch.Tensor:
        """A fast graph input at its arena offset (copied there once if it is elsewhere)."""
        off = self.input_at.get(tid)
        if off is None or v.device.type != "cpu" or self.arena is None:
            return v
        st = v.untyped_storage()
        if self.arena.offset_of(v) == off or st.nbytes() != self.nbytes[tid] or st.nbytes() == 0:
            return v
        placed = self._copy_into_slot(v, off)
        if placed is not None:
            self.copies += 1
            return placed
        return v

    def _copy_into_slot(self, v: torch.Tensor, off: int) -> torch.Tensor | None:
        """`v` with its storage copied to arena offset `off`, or None if that range is in use."""
        st = v.untyped_storage()
        assert self.arena is not None  # (called while an iteration runs)
        dst = self.arena.take(off, st.nbytes())
        if dst is None:
            return None
        dst.copy_(torch.empty(0, dtype=torch.uint8).set_(st))
        return torch.empty(0, dtype=v.dtype).set_(dst.untyped_storage(), v.storage_offset(), v.shape, v.stride())

    def _learn_skip(self, k: int, nbytes: int, off: int, ptr: int) -> None:
        """The output came after other allocations of its size (a kernel's temporaries, e.g.
        oneDNN's reorder buffers): next time let that many pass before placing it. Kernels
        allocate in the same order every call."""
        assert self.arena is not None and self.expect is not None  # (called while an iteration runs)
        same = [a for n, a in self.arena.allocations() if n == nbytes]
        if ptr in same:
            entries = self.expect[k]
            for j, (n, o, _skip) in enumerate(entries):
                if n == nbytes and o == off:
                    entries[j] = (n, o, same.index(ptr))

    def settle(self, tid: int, v: torch.Tensor, k: int) -> torch.Tensor:
        """A large output that some kernel allocated outside its slot (its own allocator, or
        a temporary of the same size still alive) is copied into the slot: in the heap it
        would grow RSS past the arena, and leave a page-unaligned copy for the file tier."""
        arena = self.arena
        assert arena is not None  # (called while an iteration runs)
        nb = self.nbytes[tid]
        self.large_bytes[0] += nb
        off = self.out_at.get((tid, k))
        at = arena.offset_of(v)
        if at >= 0 and (off is None or at == off):
            self.large_bytes[1] += nb
            return v
        st = v.untyped_storage()
        if off is None or st.nbytes() != self.nbytes[tid]:
            return v
        self._learn_skip(k, st.nbytes(), off, st.data_ptr())
        placed = self._copy_into_slot(v, off)
        if placed is None:
            return v
        self.settled_bytes += st.nbytes()
        self.large_bytes[1] += nb
        return placed
