"""Move measurement and fits: the seconds of `to_slow` and `to_fast`, sync and async, of a
memory system, and how much a copy in flight slows the computation it overlaps.

Moves: sync and async seconds of `to_slow` and `to_fast` over sizes 4 KiB .. 64 MiB (async
ones measured while this thread computes, as the kernel they overlap will), fitted per
direction and mode as latency + bytes / bandwidth (least squares on relative error, both
coefficients non-negative), with the median per size kept as points (`_move_cost`).
Their rounds are taken in three phases (each followed by a window of the kernels' in-situ
iterations; the kernels timed after a move come after the second), so that a slow spell
of the device does not hold every round.

Interference: while an async move is timed, this thread runs small matmuls; their slowdown
against the same matmuls alone is how much a copy in flight slows the kernel it overlaps
(`CostModel.copy_interference`, the median per direction).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np
import torch

from ..ir.costmodel import DIRECTIONS, HOST, MOVE_MODES, PAIR, SLOWDOWN, MoveCost
from ..ir.layout import LARGE_BLOCK_BYTES
from ..tiers import cpu_arena
from .cache import ProfileCache
from .stats import ProfileStats

LOAD_ROWS = 48  # rows of the profiler's 192x192 load matmul run between polls of an async move
MOVE_SIZES = tuple(4096 * 4 ** i for i in range(8))  # 4 KiB .. 64 MiB
MOVE_REPEATS = 6
# The rounds are taken in MOVE_PHASES phases spread over the profile (round r in phase
# r % MOVE_PHASES), each followed by a window of the kernels' in-situ iterations, so that
# a slow spell of the disk (seconds long) has two of six rounds and the median stays out
# of it (benchmarks/HISTORY.md, "Notes moved from the code").
MOVE_PHASES = 3
# Small moves take a few hundred microseconds, and a slow spell of the device can make
# several of the first rounds 10x slower. They cost little to sample, so sizes up to
# SMALL_MOVE_BYTES get SMALL_MOVE_ROUNDS x the rounds, the extra ones after the others.
SMALL_MOVE_BYTES = 256 * 1024
SMALL_MOVE_ROUNDS = 3


def _fit_move(points: list[tuple[int, float]]) -> MoveCost:
    """latency + nbytes / bandwidth, least squares on relative error, both >= 0."""
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([max(p[1], 1e-9) for p in points], dtype=float)
    w = 1.0 / t
    A = np.stack([w, n * w], axis=1)  # rows: (1/t, n/t) . (a, b) ~= 1
    y = np.ones_like(t)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if a < 0:  # through the origin
        a = 0.0
        x = n * w
        b = float(x @ y / (x @ x))
    if b <= 0:  # size does not matter: latency only
        b = 1e-18
        a = float(statistics.median(t))
    return MoveCost(latency_s=float(a), bandwidth_bytes_per_s=float(1.0 / b))


def _while_computing(start, a: torch.Tensor, mm_alone: float):
    """Issue an async move (`start()` returns its Pending, or a list of them: moves issued
    together, done when all are) and run small matmuls (a block of LOAD_ROWS rows of a @
    a) on this thread until it is done, as the executor runs a kernel over it. Returns
    its result (a list for a list), its seconds in flight (from the end of the issue to
    its completion: the worker stamps finished_at; AIO stamps the moment this thread
    collected the completion, at the poll after a block, so the blocks are short and the
    completion is taken at the midpoint between the last two polls: polled after whole
    matmuls, small writes were timed several times too long), its seconds on this thread
    (the issue call, plus the call that saw it done and the wait that built its result),
    and how much slower the blocks ran than `mm_alone` seconds each (-1 when fewer than 3
    ran: too short to tell)."""
    block = a[:LOAD_ROWS]
    t0 = time.perf_counter()
    started = start()
    pendings = started if isinstance(started, list) else [started]
    issued = time.perf_counter()
    n, busy = 0, 0.0
    seen_running = issued  # the last poll that found the move still in flight
    while True:
        t_poll = time.perf_counter()
        if all(p.done() for p in pendings):
            break
        seen_running = t_poll
        t_mm = time.perf_counter()
        torch.mm(block, a)
        busy += time.perf_counter() - t_mm
        n += 1
    results = [p.wait() for p in pendings]
    t_end = time.perf_counter()
    stamps = [p.finished_at for p in pendings]
    end = t_end if None in stamps else max(stamps)
    result = results if isinstance(started, list) else results[0]
    if end >= t_poll:
        # stamped when collected (AIO), not when done: it finished between the last two
        # polls, at their midpoint on average
        end = (seen_running + t_poll) / 2
    flight = end - issued
    slowdown = busy / n / mm_alone - 1.0 if n >= 3 else -1.0
    return result, max(flight, 0.0), (issued - t0) + (t_end - t_poll), slowdown


def _host_move_seconds(memory, t: torch.Tensor, load: torch.Tensor, mm_alone: float,
                       slots: "_MoveSlots | None" = None, twin: torch.Tensor | None = None
                       ) -> dict[tuple[str, str], float]:
    """Seconds of the four moves of `t` by the host's clock; the async moves' own seconds on
    this thread (mode "host"; the issue is not part of the "async" seconds) and the
    slowdown of the computation they overlapped (mode "slowdown", a ratio, -1: unknown).
    With a `twin` (as many bytes as `t`): the flight of `t` and `twin` written together,
    and read back together (mode "pair"), which tells how far copies at one kernel
    overlap (CostModel.async_marginal_seconds)."""
    got = {}
    # No untimed warm-up round trip: writing the same bytes just before made the timed
    # moves faster than the executor's (the host still held them).
    t0 = time.perf_counter()
    h = memory.to_slow(-1, t)
    got[("to_slow", "sync")] = time.perf_counter() - t0
    into = _read_destination(memory, h, slots)
    t0 = time.perf_counter()
    back = memory.to_fast(h) if into is None else memory.to_fast(h, into=into)
    got[("to_fast", "sync")] = time.perf_counter() - t0
    del back, into  # (the slot is free again for the async read)
    memory.free_slow(h)
    # async: while this thread computes, as in the executor (the copy competes with
    # the kernel it overlaps for cores and memory bandwidth)
    h, got[("to_slow", "async")], got[("to_slow", HOST)], got[("to_slow", SLOWDOWN)] = _while_computing(
        lambda: memory.start_to_slow(-1, t), load, mm_alone)
    into = _read_destination(memory, h, slots)
    back, got[("to_fast", "async")], got[("to_fast", HOST)], got[("to_fast", SLOWDOWN)] = _while_computing(
        lambda: memory.start_to_fast(h) if into is None else memory.start_to_fast(h, into), load, mm_alone)
    del back, into
    if twin is not None:
        hs, got[("to_slow", PAIR)], _, _ = _while_computing(
            lambda: [memory.start_to_slow(-1, t), memory.start_to_slow(-2, twin)], load, mm_alone)
        memory.free_slow(h)
        into = [_read_destination(memory, x, slots, region) for x, region in zip(hs, (1, 3))]
        back, got[("to_fast", PAIR)], _, _ = _while_computing(
            lambda: [memory.start_to_fast(x) if d is None else memory.start_to_fast(x, d) for x, d in zip(hs, into)],
            load, mm_alone)
        del back, into
        for x in hs:
            memory.free_slow(x)
    else:
        memory.free_slow(h)
    return got


class _MoveSlots:
    """Where moves of LARGE_BLOCK_BYTES or more are timed from and into: page-aligned slots
    of one arena (regions 0 and 2: sources, 1 and 3: destinations), touched once, on huge
    pages, as the executor holds such tensors when it follows a plan's layout
    (tiers/cpu_arena.py). Heap tensors (64-byte aligned) are bounced through the tier's
    aligned buffers, and timed moves from them slower than the executor's."""

    def __init__(self, largest: int):
        self.min_bytes = LARGE_BLOCK_BYTES
        self.region_bytes = -(-(largest + cpu_arena.HUGE_PAGE) // cpu_arena.HUGE_PAGE) * cpu_arena.HUGE_PAGE
        self.arena = cpu_arena.CpuArena(4 * self.region_bytes)
        whole = self.arena.take(0, 4 * self.region_bytes)
        whole.fill_(1)  # resident, as an executor's arena is after its first iteration
        del whole

    def take(self, region: int, nbytes: int, length: int | None = None) -> torch.Tensor | None:
        """A slot at the start of region 0 or 2 (a move's source), 1 or 3 (a read's destination)."""
        return self.arena.take(region * self.region_bytes, nbytes, length)

    def close(self) -> None:
        self.arena.close()


def _read_destination(memory, h, slots: _MoveSlots | None = None, region: int = 1) -> torch.Tensor | None:
    """Where the executor reads a prefetched tensor when it follows the plan's arena
    (tiers/cpu_arena.py): its slot, touched (on huge pages from 2 MiB). A tier buffer of
    64 MiB is a fresh mapping each time, and faulting its pages in doubled the measured
    time of the largest reads. None where the tier reads only into its own buffers."""
    if not memory.capabilities.read_into:
        return None
    length, pad = memory.read_span(h)
    if pad:
        return None
    if slots is not None and h.storage_nbytes >= slots.min_bytes:
        into = slots.take(region, h.storage_nbytes, length)
        if into is not None:
            return into
    return cpu_arena.arena_like(h.storage_nbytes, length, huge_pages=h.storage_nbytes >= cpu_arena.HUGE_PAGE)


def _matmul_seconds(a: torch.Tensor, repeats: int = 30) -> float:
    """Median seconds of one block of the load (LOAD_ROWS rows of a @ a, as _while_computing
    runs it) on this thread with nothing else running."""
    block = a[:LOAD_ROWS]
    torch.mm(block, a)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(block, a)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interference(samples: list[float]) -> float:
    """A direction's slowdown of computation under its async copies: the median of the
    samples long enough to tell (>= 0), 0 without any."""
    good = [x for x in samples if x > -0.999]  # (-1: no matmul finished during the copy)
    return max(0.0, statistics.median(good)) if good else 0.0


def move_rounds(sizes, repeats: int) -> list[tuple[int, int]]:
    """The (size, round) move samples to take, in order: `repeats` rounds of every size, each
    round in its own seeded order, then the small sizes' extra rounds (SMALL_MOVE_ROUNDS)."""
    def rounds(n: int) -> int:
        return repeats * (SMALL_MOVE_ROUNDS if n <= SMALL_MOVE_BYTES else 1)
    return [(int(sizes[i]), r) for r in range(repeats * SMALL_MOVE_ROUNDS)
            for i in np.random.default_rng(r).permutation(len(sizes)) if r < rounds(int(sizes[i]))]


def move_keys(memory) -> list[tuple[str, str]]:
    """The (direction, mode) samples each move round takes on `memory`."""
    # a GPU system times its own moves with CUDA events (the host clock sees launches only)
    device_timed = memory.capabilities.device_timed_moves
    modes = MOVE_MODES if device_timed else MOVE_MODES + (HOST, SLOWDOWN)
    # copies issued together overlap only where the tier queues them together (AIO; an I/O
    # thread runs them one after another: CostModel.async_overlap)
    if not device_timed and memory.capabilities.async_engine == "aio":
        modes += (PAIR,)
    return [(d, m) for d in DIRECTIONS for m in modes]


def moves_missing(memory, cache: ProfileCache, env: str, sizes=MOVE_SIZES, repeats=MOVE_REPEATS) -> bool:
    """Whether any move sample of `memory` is still to be measured."""
    have = cache.move_samples(env)
    keys = move_keys(memory)
    return any((d, m, n, r) not in have for n, r in move_rounds(sizes, repeats) for d, m in keys)


def measure_moves(memory, cache: ProfileCache, env: str, *, sizes=MOVE_SIZES, repeats=MOVE_REPEATS,
                  recache: bool = False, progress: Callable[[str], None] | None = None,
                  stats: ProfileStats | None = None, phases: tuple[int, ...] | None = None):
    """Sync and async seconds of both directions over `sizes`, fitted per direction and
    mode; for host-timed systems also the async moves' seconds on the calling thread
    (mode "host"). Returns (moves, copy interference per direction: {} when device-timed).
    `phases`: measure only the rounds of these phases (MOVE_PHASES; None: all), and return
    (None, None) while rounds of other phases are still missing. `recache` with phases:
    the samples of those phases are measured again."""
    have = cache.move_samples(env)
    if recache:
        have = {} if phases is None else {key: v for key, v in have.items() if key[3] % MOVE_PHASES not in phases}
    device_timed = memory.capabilities.device_timed_moves
    keys = move_keys(memory)
    modes = {m for _, m in keys}
    pairs = PAIR in modes
    # repeat-major: each size is sampled across the whole measurement, so a slow spell of
    # the device weighs on every size alike instead of biasing some; each round in its own
    # (seeded) order: in ascending order every 4 KiB sample followed a 64 MiB one, which
    # made it slower than the executor's small moves
    want = move_rounds(sizes, repeats)
    mine = [(n, r) for n, r in want if phases is None or r % MOVE_PHASES in phases]
    missing = [(n, r) for n, r in mine if any((d, m, n, r) not in have for d, m in keys)]
    if stats is not None:
        stats.move_samples_cached += len(keys) * (len(mine) - len(missing))
    load = torch.randn(192, 192)  # computed in blocks of LOAD_ROWS rows while a move is in flight

    # (the executor's layout: moves of LARGE_BLOCK_BYTES or more from and into arena slots)
    slots = _MoveSlots(max(sizes)) if not device_timed and missing and cpu_arena.load() is not None else None

    def sample(n: int, region: int = 0, like: torch.Tensor | None = None) -> torch.Tensor:
        """The n bytes a move is timed with (random, or a copy of `like`): from 64 KiB, in an
        arena slot (_MoveSlots; without the extension, from 2 MiB in memory like one:
        arena_like); smaller ones from the heap, where the executor keeps them."""
        src = torch.randint(0, 255, (n,), dtype=torch.uint8) if like is None else like
        if slots is not None and n >= slots.min_bytes:
            slot = slots.take(region, n)
            if slot is not None:
                return slot.copy_(src)
        if not device_timed and n >= cpu_arena.HUGE_PAGE:
            return cpu_arena.arena_like(n).copy_(src)
        return src if like is None else src.clone()

    def seconds(n: int, mm_alone: float) -> dict:
        if device_timed:
            return memory.move_seconds(sample(n))
        t = sample(n)
        return _host_move_seconds(memory, t, load, mm_alone, slots, sample(n, 2, like=t) if pairs else None)

    try:  # (the slots' arena is resident: given back on an interruption too)
        if missing:
            # warm-up, one untimed round of every size: files, buffers and the I/O worker exist,
            # and the slow file's blocks have been written once, as in an executor's iterations
            # after the first (the first round's moves were the slowest of every size)
            rough = _matmul_seconds(load, repeats=3)
            for n in sizes:
                seconds(n, rough)
            mm_alone = _matmul_seconds(load)
        for n, r in missing:
            got = seconds(n, mm_alone)
            for (d, m), s in got.items():
                cache.put_move(env, d, m, n, r, s)
                have[(d, m, n, r)] = s
            if stats is not None:
                stats.move_samples_measured += len(got)
            if progress is not None:
                progress(f"move {n >> 10} KiB")
    finally:
        if slots is not None:
            slots.close()
    if any((d, m, n, r) not in have for n, r in want for d, m in keys):
        return None, None  # other phases' rounds to come
    return {(d, m): _move_cost([(n, have[(d, m, n, r)]) for n, r in want]) for d, m in keys if m != SLOWDOWN}, \
        {d: interference([have[(d, SLOWDOWN, n, r)] for n, r in want]) for d in DIRECTIONS if SLOWDOWN in modes}


def _move_cost(points: list[tuple[int, float]]) -> MoveCost:
    """The fit (its bandwidth carries past the largest size) and the median per size,
    made non-decreasing in size (a larger move never predicted cheaper) by isotonic
    regression: a running maximum let one slow small size raise every size above it."""
    fit = _fit_move(points)
    by_size: dict[int, list[float]] = {}
    for n, t in points:
        by_size.setdefault(n, []).append(t)
    sizes = sorted(by_size)
    med = _isotonic([statistics.median(by_size[n]) for n in sizes], [len(by_size[n]) for n in sizes])
    return MoveCost(fit.latency_s, fit.bandwidth_bytes_per_s, tuple(zip(sizes, med)))


def _isotonic(y: list[float], w: list[float]) -> list[float]:
    """The non-decreasing sequence closest to y in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(y, w):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(c)]

