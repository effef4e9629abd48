"""profile(): measure a graph's kernels and a memory system's moves into a CostModel.

Kernels are timed *in situ*: a `Replay` subclass runs iterations of the graph on real
tensors and times each kernel where it runs, with the operands, caches and allocator state
the executor will give it. Each unique signature is timed until its estimate is final,
then never again (the result is cached).

Timing rule, in situ (the all-fast time of every kernel, any access model):
- warm-up: the first time a signature is met in this process, one untimed functional call
  (lazy initialization, e.g. oneDNN primitives, is not counted), and that occurrence gives
  no sample (the warm-up left its operands in the CPU caches, which the iteration would not);
- a sample is the time of the replay's own call of the kernel's op, its operands already
  built (with `OperandBuilder`, as the executor builds them; that work goes to the
  position before, below). Every occurrence of a signature gives one sample; the replay
  is repeated in three windows, one after each phase of the move rounds (below), so
  that a signature's samples come from iterations seconds to a minute apart: in the first
  two until every signature has a sample in the window, in the last (up to
  `MAX_ITERATIONS` iterations in all, each stopped after the last kernel that still needs
  samples) until every signature is final (`insitu_done`): at least
  `MIN_SAMPLES` samples and a stable estimate (moved by at most `REL_TOL` by the last
  iteration), or `LONG_KERNEL_S` of samples (a long kernel: the timer's error is
  negligible), or `MAX_SAMPLES`. The estimate (`insitu_estimate`) is the median over
  iterations of the mean over the signature's occurrences in each iteration: occurrences
  at different places differ systematically (cache state), so they are averaged, and
  repeats (iterations) are reduced by the median.
- the interpreter's work after kernel k until the next kernel's call starts (freeing the
  tensors that die at k: returning large blocks to the OS is not free; building the next
  kernel's operands, views re-derived) depends on the position, not the signature: it
  is sampled per position in the same iterations (at least one full iteration per
  graph), cached per graph, and its median is added to ``kernel_seconds[k]``.

Timing rule, repeated (direct access: each placement of the operands; `time_call`): the
first call is a warm-up and sets the batch size: a call shorter than `MIN_BATCH_S` (too
short for the timer) is repeated n times per sample, n = ceil(MIN_BATCH_S / t), and the
per-call time is the batch time / n. Samples are taken until the median is stable: at
least `MIN_SAMPLES`, then stop as soon as adding a sample moves the median by at most
`REL_TOL`, or at `MAX_SAMPLES`, or after `MAX_KERNEL_S`. The result is the median. A
placement's time is the in-situ all-fast time times (repeated placement time / repeated
all-fast time), both repeated times the call alone (its operands built once before the
repeats, as the in-situ samples leave the building out). For repeated timing, slow input
operands are copied to the slow tier and read through `slow_view`; slow outputs are
written there after the call (as the executor does). The calls are functional (`node.target(*args)`), never the replay's in-place reuse
path, so repeating a kernel changes nothing; the RNG state is restored around warm-up and
repeated calls so random kernels (dropout) produce the values the replay would.

Workspace: the call right after a kernel's warm-up (not timed) runs with every CPU
allocation counted (`cpu_arena.kernel_footprint`, the arena extension; without it, no
workspace is known): the peak of the bytes alive at once minus the bytes still alive
after it (its outputs) is what the kernel needs beyond its tensors, cached per signature.

Interference: while an async move is timed, this thread runs small matmuls; their slowdown
against the same matmuls alone is how much a copy in flight slows the kernel it overlaps
(`CostModel.copy_interference`, the median per direction).

Moves: sync and async seconds of `to_slow` and `to_fast` over sizes 4 KiB .. 64 MiB (async
ones measured while this thread computes, as the kernel they overlap will),
fitted per direction and mode as latency + bytes / bandwidth (least squares on relative
error, both coefficients non-negative). Their rounds are taken in three phases (each followed by
a window of the kernels' in-situ iterations; the kernels timed after a move come after
the second), so that a slow spell of the device does not hold every round.

The executor's own time per kernel and per sync move, beyond the calls timed here, is
measured once per environment on a calibration graph (`autotm.overhead`) and added.

Every measurement goes to the SQLite cache (`autotm.profile_cache`) as it completes,
keyed by signature + placement + environment; `recache=True` measures everything again.

Hypothetical hardware: ``profile(graph, "sim:optane")`` builds a roofline cost model
from a tier spec (`autotm/specs/*.toml`); it needs no real tensors (fake-captured graphs
work) and is labelled ``simulated=True``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import statistics
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from ..ir.costmodel import DIRECTIONS, EXECUTOR_OVERHEAD_NAMES as OVERHEAD_NAMES, HOST, MOVE_MODES, PAIR, SLOWDOWN, \
    CostModel, ExecutorOverhead, MoveCost, operand_tensors
from ..ir.graph import Role, TrainingGraph
from .pace import PaceCheck, probe_pace, settle_pace
from .cache import ProfileCache
from ..interpret.replay import Replay
from ..ir.layout import LARGE_BLOCK_BYTES
from ..tiers import cpu_arena
from ..tiers.host_heap import keep_freed_memory, large_blocks_mapped
from ..errors import InputError

log = logging.getLogger("autotm.profile")

# ---- timing rule -------------------------------------------------------------------------
LOAD_ROWS = 48  # rows of the profiler's 192x192 load matmul run between polls of an async move
MIN_BATCH_S = 200e-6  # a sample shorter than this is a batch of repeated calls
MIN_SAMPLES = 3
MAX_SAMPLES = 15
REL_TOL = 0.03
MAX_KERNEL_S = 1.0  # time spent on samples of one kernel placement, at most (after MIN_SAMPLES)
MAX_ITERATIONS = 4  # in-situ sampling: replay iterations at most (the last window's first ends it)
# In-situ iterations are taken in one window after each move phase (MOVE_PHASES), estimates
# final only in the last: a signature's samples come from iterations seconds to a minute
# apart. From one window (most signatures were final after their first sampled iteration),
# two profiles of the same graph minutes apart predicted all-fast up to 16-24 % apart
# (densenet264 and inception_v4 test).
LONG_KERNEL_S = 0.25  # in-situ sampling: this much sampled time of a kernel is enough

OVERHEAD_PREFIX = "executor:"  # the cache's values of autotm.overhead

# ---- moves -------------------------------------------------------------------------------
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

# ---- kernels after a blocking move (memory systems with idle_sync_moves) --------------------
WAKE_ROUNDS = 3  # replay iterations per phase of WakeReplay
WAKE_PAUSE_BYTES = (1 << 20, 64 << 20)  # the blocking move's bytes: at least, at most (wake_pause_bytes)
WAKE_ROLES = ("cold", "second", "warm")

# Direct access: kernels with at most this many unique operands get every placement;
# others get all-slow and the single-slow placements (CostModel.kernel_time adds them up).
MAX_EXHAUSTIVE_OPERANDS = 4

Progress = Callable[[int, int, str], None]  # (done, total, what)
# (memory system, cost_model_of) -> the executor's overheads: runtime.overhead.measure_executor_overhead
MeasureOverhead = Callable[[Any, Callable[[TrainingGraph, Mapping[int, torch.Tensor]],
                                          tuple[CostModel, list[float]]]], ExecutorOverhead]


@dataclass
class ProfileStats:
    measured: int = 0  # kernel placements timed in this run
    cache_hits: int = 0  # kernel placements found in the cache
    move_samples_measured: int = 0
    move_samples_cached: int = 0
    unique_kernels: int = 0
    total_kernels: int = 0
    seconds: float = 0.0
    cache_path: str = ""
    cache_rebuilt: str | None = None
    iterations: int = 0  # in-situ replay iterations run
    simulated_from: str | None = None  # the tier spec of a sim:<spec> cost model
    overhead_measured: bool = False  # the executor's overheads were measured (autotm.overhead)
    pace: PaceCheck | None = None  # the machine's pace now and when the cache was filled
    # wall seconds by part of the profile: "pace", "moves", "kernels" (in-situ iterations),
    # "wake" (kernels after a blocking move), "overhead" (the executor's, autotm.overhead)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    waited_seconds: float = 0.0  # waiting for another process measuring into the same cache

    def add_seconds(self, part: str, seconds: float) -> None:
        self.stage_seconds[part] = self.stage_seconds.get(part, 0.0) + seconds

    @property
    def nothing_new(self) -> bool:
        return (self.measured == 0 and self.move_samples_measured == 0 and self.iterations == 0
                and not self.overhead_measured)

    def message(self) -> str:
        if self.simulated_from:
            return f"simulated: roofline from tier spec {self.simulated_from} (nothing measured but the peak FLOP/s)"
        if self.nothing_new:
            return (f"nothing new measured: {self.cache_hits} kernel timings and "
                    f"{self.move_samples_cached} move samples from the cache")
        return (f"measured {self.measured} kernel timings and {self.move_samples_measured} move samples "
                f"in {self.iterations} replay iterations ({self.cache_hits} kernel timings from the cache)"
                + (", and the executor's overheads" if self.overhead_measured else "")
                + f" in {self.seconds:.1f} s")


# ------------------------------------------------------------------------------ environment

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(memory_system: str, device: torch.device | None = None,
                async_engine: str | None = None) -> dict:
    """What a measurement depends on besides the kernel: the cache key's environment part.

    `device`: the fast tier's device; for a GPU, "device" is the GPU's name (so CPU timings
    are never reused for it) and the CUDA and cuDNN versions are part of the key."""
    env = {
        "device": cpu_model(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "memory_system": memory_system,
        # how things are timed: a new method measures everything again (what each changed:
        # benchmarks/HISTORY.md, "Profile methods")
        "method": 16,
    }
    if async_engine is not None:  # cpu+file: Linux AIO or the I/O thread
        env["async_io"] = async_engine
    if device is not None and torch.device(device).type == "cuda":
        env.update(device=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env


# ------------------------------------------------------------------------------- timing

def time_call(fn: Callable[[], Any], *, first_seconds: float | None = None,
              min_batch_s: float = MIN_BATCH_S, min_samples: int = MIN_SAMPLES,
              max_samples: int = MAX_SAMPLES, rel_tol: float = REL_TOL,
              max_seconds: float = MAX_KERNEL_S) -> tuple[float, int]:
    """Median seconds per call of `fn` and the number of samples (rule: module docstring).

    `first_seconds`: the duration of a call that just ran (it serves as the warm-up).
    """
    if first_seconds is None:
        # the shorter of two calls: a single stall of this VM (milliseconds, now and then)
        # left a 1 us call unbatched, timed at the clock's resolution
        first_seconds = math.inf
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            first_seconds = min(first_seconds, time.perf_counter() - t0)
    n = 1 if first_seconds >= min_batch_s else max(1, math.ceil(min_batch_s / max(first_seconds, 1e-7)))
    samples: list[float] = []
    spent = 0.0
    prev_median = None
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        spent += dt
        samples.append(dt / n)
        med = statistics.median(samples)
        if len(samples) >= min_samples:
            if prev_median is not None and abs(med - prev_median) <= rel_tol * prev_median:
                break
            if len(samples) >= max_samples or spent >= max_seconds:
                break
        prev_median = med
    return statistics.median(samples), len(samples)


# ----------------------------------------------------------------------- placement keys

def _arg_pattern(program, k: int) -> str:
    """How kernel k's tensor arguments map to its unique tensors (a mul(x, x) is not a mul(x, y))."""
    node = program.kernel_nodes[k]
    labels: dict[int, int] = {}
    out = []
    for a in node.all_input_nodes:
        tid = program.node_tensor.get(a)
        if tid is not None:
            out.append(str(labels.setdefault(tid, len(labels))))
    return ",".join(out)


def placement_key(placement: tuple[str, ...] | None, pattern: str = "") -> str:
    """The cache's placement column: "fast" (every operand fast), else pattern + f/s letters."""
    if placement is None or "slow" not in placement:
        return "fast"
    return f"{pattern}:{''.join(p[0] for p in placement)}"


def placements(n: int) -> list[tuple[str, ...]]:
    """The placements (with at least one slow operand) profiled for n unique operands."""
    if n == 0:
        return []
    if n <= MAX_EXHAUSTIVE_OPERANDS:
        out = []
        for mask in range(1, 2 ** n):
            out.append(tuple("slow" if mask >> i & 1 else "fast" for i in range(n)))
        return out
    singles = [tuple("slow" if j == i else "fast" for j in range(n)) for i in range(n)]
    return singles + [("slow",) * n]


# ------------------------------------------------------------------ in-situ kernel timing

class _Enough(Exception):
    pass


def _cuda_mark():
    """A CUDA event recorded now on the current stream, with timing."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _settle(lists) -> None:
    """Replace (start, end) CUDA event pairs in `lists` by their seconds."""
    for xs in lists:
        for i, x in enumerate(xs):
            if isinstance(x, tuple):
                xs[i] = x[0].elapsed_time(x[1]) / 1e3


class ProfilingReplay(Replay):
    """Runs iterations of the graph and times kernels where they run.

    - In situ (every access model): each kernel whose signature still needs samples is
      timed where it runs (the replay's own call of its op, its operands built before the
      clock starts); the first call of a signature in this process is preceded by an
      untimed warm-up call and gives no sample. `samples[signature]` collects them; the
      time from the end of kernel k to the start of the next one's call (its operands
      built) goes to `position_samples[k]`.
    - Repeated (direct access): `batch_jobs[k]` lists placements timed with `time_call`
      on the real operands the first time kernel k is met (slow operands moved there for
      the timing); `record(k, key, seconds, n)` stores each result.
    - On a GPU (the memory system's fast device), a launch returns before the kernel runs:
      a sample is the time between CUDA events recorded on the stream around the call
      (the gap after kernel k likewise), read once the iteration is done.
    """

    def __init__(self, graph: TrainingGraph, memory, batch_jobs: dict[int, list[tuple]], record: Callable,
                 need: set[str], samples: dict[str, list[list[float]]],
                 record_workspace: Callable[[str, int], None] | None = None):
        super().__init__(graph, device=getattr(memory, "fast_device", None))
        self.record_workspace = record_workspace
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.memory = memory
        self.batch_jobs = batch_jobs  # kernel index -> [(placement or None, cache placement key)]
        self.record = record
        self.need = need  # signatures that still need in-situ samples
        self.samples = samples
        self.warm: set[str] = set()
        self._open: tuple[int, float] | None = None
        self._closed: int | None = None  # the position whose sample before_kernel just took
        self.last_needed = len(graph.kernels) - 1
        self.position_samples: list[list[float]] = [[] for _ in graph.kernels]
        self.iteration = -1
        self._group: dict[str, int] = {}
        self.full = False  # run the whole iteration (position samples are missing)

    def run_kernel(self, k: int) -> None:
        jobs = self.batch_jobs.pop(k, None)
        if jobs:
            self._time_kernel(k, jobs)
        sig = self.graph.kernels[k].signature
        if sig not in self.need:
            super().run_kernel(k)
            return
        if sig not in self.warm:
            self.warm.add(sig)
            rng = torch.get_rng_state()
            cuda_rng = torch.cuda.get_rng_state(self.device) if self.cuda else None
            args, kwargs = self.operands(k)
            self.program.kernel_nodes[k].target(*args, **kwargs)  # functional: no input reused
            del args, kwargs
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self.device)
            # no sample right after the warm-up: it left the operands in the CPU caches;
            # that call's allocations give the kernel's workspace (CPU: the arena
            # allocator counts them; peak bytes alive at once minus what stays, its outputs)
            fp = None
            if self.record_workspace is not None and not self.cuda:
                fp = cpu_arena.kernel_footprint(lambda: super(ProfilingReplay, self).run_kernel(k))
            if fp is None:
                super().run_kernel(k)
            else:
                self.record_workspace(sig, max(0, fp[0] - fp[1]))
            return
        if self.cuda:  # events around the launch; settled into seconds after the iteration
            t0 = _cuda_mark()
            super().run_kernel(k)
            dt = (t0, _cuda_mark())
        else:
            # the call alone (its operands' building goes to the position before: operands())
            args, kwargs = self.operands(k)
            t0 = time.perf_counter()
            out = self.call_kernel(k, args, kwargs)
            dt = time.perf_counter() - t0
            del args, kwargs
            self.store_outputs(k, out)
        groups = self.samples.setdefault(sig, [])
        if self._group.get(sig) != self.iteration:  # one group of samples per iteration
            self._group[sig] = self.iteration
            groups.append([])
        groups[-1].append(dt)

    def after_kernel(self, k: int) -> None:
        # from here to the start of the next kernel's call: the interpreter's work after
        # kernel k (freeing the tensors that die there, building the next kernel's
        # operands), a cost of the position, not the signature
        self._open = (k, _cuda_mark() if self.cuda else time.perf_counter())

    def _close(self) -> None:
        if self._open is not None:
            k, t0 = self._open
            self.position_samples[k].append((t0, _cuda_mark()) if self.cuda else time.perf_counter() - t0)
            self._open = None
            self._closed = k

    def operands(self, k: int):
        # building kernel k's operands (re-deriving its views) is work of the position
        # before it, between kernel calls; the executor does the same work the same way
        # (OperandBuilder). Left out of every sample, the executor's kernels measured ~5 %
        # over their prediction (resnet50 test: threshold_backward 26 us a call, 37 us
        # with its operands)
        closed, self._closed = self._closed, None
        if closed != k - 1 or self.cuda:  # (None: no position sample just taken)
            return super().operands(k)
        t0 = time.perf_counter()
        out = super().operands(k)
        self.position_samples[closed][-1] += time.perf_counter() - t0
        return out

    def before_kernel(self, k: int) -> None:
        self._close()
        if k > self.last_needed:
            raise _Enough  # nothing after this kernel needs timing: stop the replay here

    def run(self, inputs, keep=()):
        """One iteration, up to the last kernel that still needs timing."""
        self.iteration += 1
        ks = self.graph.kernels
        self.last_needed = len(ks) - 1 if self.full else max(
            [k for k in range(len(ks)) if ks[k].signature in self.need] + list(self.batch_jobs) + [-1])
        self._open = None
        try:
            return super().run(inputs, keep)
        except _Enough:
            self.env.clear()
            return {}
        finally:
            self._close()
            if self.cuda:
                torch.cuda.synchronize(self.device)
                _settle([g for groups in self.samples.values() for g in groups])
                _settle(self.position_samples)

    def _time_kernel(self, k: int, jobs: list[tuple]) -> None:
        kern = self.graph.kernels[k]
        operands = operand_tensors(kern.inputs, kern.outputs)
        outputs = set(kern.outputs)
        target = self.program.kernel_nodes[k].target
        outs = self.program.kernel_outputs[k]
        mem = self.memory
        env = self.env
        rng = torch.get_rng_state()
        try:
            for placement, key in jobs:
                slow_handles = []
                fast_values = {}  # the storages a slow placement swaps out of env, put back after
                try:
                    slow_out = []
                    if placement is not None:
                        for tid, where in zip(operands, placement):
                            if where != "slow":
                                continue
                            if tid in outputs:
                                slow_out.append(tid)
                            else:
                                h = mem.to_slow(tid, self.storage_value(tid))
                                slow_handles.append(h)
                                view = mem.slow_view(h)
                                if view is None:
                                    raise ValueError(f"{mem.name} has no direct access to slow memory")
                                fast_values[tid] = env[tid]
                                env[tid] = view
                    # the call alone, as the in-situ samples time it: the operands are built
                    # once (as the interpreter builds them, views over the slow copies; not
                    # self.operands, which times the building into the position before k)
                    args, kwargs = Replay.operands(self, k)

                    def fn(args=args, kwargs=kwargs, slow_out=slow_out):
                        out = target(*args, **kwargs)
                        if slow_out:  # the executor writes slow outputs after the kernel
                            for tid, i in outs:
                                if tid in slow_out:
                                    mem.free_slow(mem.to_slow(tid, out if i is None else out[i]))
                        return out
                    seconds, samples = time_call(fn)
                    del fn, args, kwargs
                finally:
                    env.update(fast_values)
                    for h in slow_handles:
                        mem.free_slow(h)
                self.record(k, key, seconds, samples)
        finally:
            torch.set_rng_state(rng)


class WakeReplay(Replay):
    """Times every kernel where it runs, some of them right after a blocking sync move.

    In phase p (0, 1, 2) the iteration writes `pause_bytes` to the slow tier (sync, the
    thread waits in the I/O) before each kernel k with k % 3 == p: kernel k is timed
    "cold", k + 1 "second", k + 2 "warm" (in executor runs the excess over the profile was
    +41 us at a kernel right after sync moves, +52 us at the next, none at the one after:
    densenet264 test preset). Three phases time every position in every role; each
    iteration appends one sample per kernel to samples[role][k]."""

    def __init__(self, graph: TrainingGraph, memory, samples: dict[str, list[list[float]]], pause_bytes: int):
        super().__init__(graph)
        self.memory = memory
        self.samples = samples
        self.phase = 0
        self.pause = torch.randint(0, 255, (pause_bytes,), dtype=torch.uint8)

    def run_kernel(self, k: int) -> None:
        role = (k - self.phase) % 3
        if role == 0:
            self.memory.free_slow(self.memory.to_slow(-1, self.pause))
        t0 = time.perf_counter()
        super().run_kernel(k)
        self.samples[WAKE_ROLES[role]][k].append(time.perf_counter() - t0)


def wake_pause_bytes(graph: TrainingGraph) -> int:
    """The blocking move WakeReplay times kernels after: as long as a typical move of the
    plans, the bytes-weighted median activation (half of the activations' bytes are in
    larger ones), within WAKE_PAUSE_BYTES. The longer the thread waits, the colder the next
    kernels (resnet50 cpu preset, mean excess of a kernel right after a write of 1 MiB
    ~0 us, of 16 MiB 200 us, of 64 MiB 700 us; sync evict-all plans measured 920 us)."""
    sizes = np.sort(np.asarray([t.nbytes for t in graph.tensors if t.role == Role.ACTIVATION], dtype=np.int64))
    lo, hi = WAKE_PAUSE_BYTES
    if not len(sizes):
        return lo
    half = sizes[int(np.searchsorted(np.cumsum(sizes), sizes.sum() / 2))]
    return int(min(max(int(half), lo), hi))


def wake_excess(graph: TrainingGraph, samples: dict[str, list[list[float]]]) -> dict[str, tuple[float, float]]:
    """Per signature, from WakeReplay's samples: (cold, second) = the median over its
    positions of the median cold (second) time less the median warm one, at least 0 (one
    kernel's samples are few and noisy, a signature's positions many)."""
    med = {r: [statistics.median(x) if x else math.nan for x in samples[r]] for r in WAKE_ROLES}
    by_sig: dict[str, tuple[list[float], list[float]]] = {}
    for k, kern in enumerate(graph.kernels):
        c, e = by_sig.setdefault(kern.signature, ([], []))
        if not math.isnan(med["warm"][k]):
            if not math.isnan(med["cold"][k]):
                c.append(med["cold"][k] - med["warm"][k])
            if not math.isnan(med["second"][k]):
                e.append(med["second"][k] - med["warm"][k])
    return {s: (max(0.0, statistics.median(c)) if c else 0.0, max(0.0, statistics.median(e)) if e else 0.0)
            for s, (c, e) in by_sig.items()}


def wake_from_excess(graph: TrainingGraph, excess: Mapping[str, tuple[float, float]]) -> tuple[float, ...]:
    """W_k = cold excess of sig(k) + second excess of sig(k + 1)."""
    ks = graph.kernels
    return tuple(excess[ks[k].signature][0] + (excess[ks[k + 1].signature][1] if k + 1 < len(ks) else 0.0)
                 for k in range(len(ks)))


def wake_seconds(graph: TrainingGraph, samples: dict[str, list[list[float]]]) -> tuple[float, ...]:
    """W_k for every kernel from WakeReplay's samples (wake_excess, wake_from_excess)."""
    return wake_from_excess(graph, wake_excess(graph, samples))


def cached_wake_samples(graph: TrainingGraph, db: ProfileCache, env: str, recache: bool = False) -> tuple[dict, int]:
    """(samples, iterations done) of WakeReplay for `graph` from the cache (fresh if none,
    or of another pause size)."""
    n = len(graph.kernels)
    pause = wake_pause_bytes(graph)
    samples = None if recache else db.wake_samples(env, graph.fingerprint)
    if (samples is None or samples.get("pause_bytes") != pause
            or any(len(samples.get(r, ())) != n for r in WAKE_ROLES)):
        samples = {"pause_bytes": pause, **{r: [[] for _ in range(n)] for r in WAKE_ROLES}}
    return samples, (sum(len(samples[r][0]) for r in WAKE_ROLES) if n else 0)


def measure_wakes(graph: TrainingGraph, memory, db: ProfileCache, env: str, inputs, samples: dict, done: int, *,
                  rounds: int = WAKE_ROUNDS, stats: ProfileStats | None = None,
                  progress: Callable[[str], None] | None = None,
                  replace: bool = False) -> tuple[float, ...]:
    """W_k for every kernel of `graph`, from 3 x `rounds` WakeReplay iterations, continuing
    `samples` after `done` of them (cached_wake_samples); the samples are committed after
    each iteration (a killed profile resumes), then each signature's excess (wake_excess),
    which later graphs reuse: a signature already in the cache keeps its value (unless
    `replace`), so every graph's kernels of one signature are charged alike."""
    replay = WakeReplay(graph, memory, samples, samples["pause_bytes"])
    while graph.kernels and done < 3 * rounds:
        replay.phase = done % 3
        with torch.no_grad():
            replay.run(dict(inputs))
        db.put_wake_samples(env, graph.fingerprint, samples)
        done += 1
        if stats is not None:
            stats.iterations += 1
        if progress is not None:
            progress("kernels after a blocking move")
    db.put_wake_excess(env, wake_excess(graph, samples) if graph.kernels else {}, replace=replace)
    return wake_from_excess(graph, db.wake_excess(env))


def insitu_estimate(groups: list[list[float]]) -> float:
    """Seconds of a signature from its in-situ samples, one group per iteration: the median
    over iterations of the mean over the signature's occurrences in that iteration.

    (Occurrences of one signature at different places in the iteration are not repeats of
    one measurement: their operands are in different cache states, so they differ
    systematically. The mean over occurrences makes count x estimate their total; the
    median over iterations rejects iterations disturbed by other work on the machine.)
    """
    means = [statistics.fmean(g) for g in groups if g]
    return statistics.median(means)


def insitu_done(groups: list[list[float]], before: int, iteration: int) -> bool:
    """The in-situ rule. `groups`: samples per iteration; `before`: how many groups there
    were before the last iteration. Done with at least MIN_SAMPLES samples and a stable
    estimate (the last iteration moved it by at most REL_TOL; one iteration with
    MIN_SAMPLES occurrences is taken as stable); or with LONG_KERNEL_S of samples (a long
    kernel: the timer's error is negligible, one sample after the warm-up will do); or
    at MAX_SAMPLES samples or MAX_ITERATIONS iterations."""
    n = sum(len(g) for g in groups)
    if n == 0:
        return False
    if n >= MAX_SAMPLES or iteration + 1 >= MAX_ITERATIONS or sum(map(sum, groups)) >= LONG_KERNEL_S:
        return True
    if n < MIN_SAMPLES:
        return False
    full = [g for g in groups if g]
    if len(full) == 1:
        return True
    old = insitu_estimate(full[:-1])
    return abs(insitu_estimate(full) - old) <= REL_TOL * old


def synthetic_inputs(graph: TrainingGraph, seed: int = 0) -> dict[int, torch.Tensor]:
    """Stand-in values for every graph input (timing does not depend on them): small
    positive floats, zero integers (valid class indices), False booleans."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for _key, tid in graph.program.input_keys:
        t = graph.tensors[tid]
        dtype = getattr(torch, t.dtype)
        item = torch.empty((), dtype=dtype).element_size()
        flat = torch.zeros(max(t.nbytes // item, 1), dtype=dtype)
        if dtype.is_floating_point:
            flat.uniform_(0.01, 0.1, generator=gen)
        out[tid] = flat.as_strided(t.shape, t.stride)
    return out


# -------------------------------------------------------------------------------- moves

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
    collected the completion, at the poll after a block, so the blocks are short, ~25-40
    us here, and the completion is taken at the midpoint between the last two polls; the
    poll after whole 192x192 matmuls, 80-140 us, had timed a 64 KiB write 120-180 us,
    against ~32 us polled without computing), its seconds on this thread (the issue
    call, plus the call that saw it done and the wait that built its result), and how
    much slower the blocks ran than `mm_alone` seconds each (-1 when fewer than 3 ran:
    too short to tell)."""
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
    stamps = [getattr(p, "finished_at", None) for p in pendings]
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
    # moves faster than the executor's (the host still held them), and predictions of
    # resnet50's evict-all plan 30 % low.
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
    (tiers/cpu_arena.py). From heap tensors (64-byte aligned, so bounced through the tier's
    aligned buffers) a 1 MiB sync write took 615 us against 274 us from a slot, and the
    test preset's sync moves were predicted 1.4-1.5x what the executor met; from fresh
    huge-page memory, 480 us."""

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
    if not hasattr(memory, "read_span"):
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
    device_timed = getattr(memory, "move_seconds", None)
    modes = MOVE_MODES if device_timed is not None else MOVE_MODES + (HOST, SLOWDOWN)
    # copies issued together overlap only where the tier queues them together (AIO; an I/O
    # thread runs them one after another: CostModel.async_overlap)
    if device_timed is None and getattr(memory, "async_engine", None) == "aio":
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
    device_timed = getattr(memory, "move_seconds", None)
    keys = move_keys(memory)
    modes = {m for _, m in keys}
    pairs = PAIR in modes
    # repeat-major: each size is sampled across the whole measurement, so a slow spell of
    # the device weighs on every size alike instead of biasing some; each round in its own
    # (seeded) order: in ascending order every 4 KiB sample followed a 64 MiB one, which
    # made it 3x slower (300 us, against 100 in the executor's runs of small moves)
    want = move_rounds(sizes, repeats)
    mine = [(n, r) for n, r in want if phases is None or r % MOVE_PHASES in phases]
    missing = [(n, r) for n, r in mine if any((d, m, n, r) not in have for d, m in keys)]
    if stats is not None:
        stats.move_samples_cached += len(keys) * (len(mine) - len(missing))
    load = torch.randn(192, 192)  # computed in blocks of LOAD_ROWS rows while a move is in flight

    # (the executor's layout: moves of LARGE_BLOCK_BYTES or more from and into arena slots)
    slots = _MoveSlots(max(sizes)) if device_timed is None and missing and cpu_arena.load() is not None else None

    def sample(n: int, region: int = 0, like: torch.Tensor | None = None) -> torch.Tensor:
        """The n bytes a move is timed with (random, or a copy of `like`): from 64 KiB, in an
        arena slot (_MoveSlots; without the extension, from 2 MiB in memory like one:
        arena_like); smaller ones from the heap, where the executor keeps them."""
        src = torch.randint(0, 255, (n,), dtype=torch.uint8) if like is None else like
        if slots is not None and n >= slots.min_bytes:
            slot = slots.take(region, n)
            if slot is not None:
                return slot.copy_(src)
        if device_timed is None and n >= cpu_arena.HUGE_PAGE:
            return cpu_arena.arena_like(n).copy_(src)
        return src if like is None else src.clone()

    def seconds(n: int, mm_alone: float) -> dict:
        if device_timed is not None:
            return device_timed(sample(n))
        t = sample(n)
        return _host_move_seconds(memory, t, load, mm_alone, slots, sample(n, 2, like=t) if pairs else None)

    try:  # (the slots' arena is resident: given back on an interruption too)
        if missing:
            # warm-up, one untimed round of every size: files, buffers and the I/O worker exist,
            # and the slow file's blocks have been written once, as in an executor's iterations
            # after the first (the first round's moves were the slowest of every size, its 4 KiB
            # async writes 1-4 ms against 20 us later: likely ext4 converting fallocated blocks)
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


# ------------------------------------------------------------------------------ profile

def cached_overhead(db: ProfileCache, env: str) -> ExecutorOverhead | None:
    values = [db.value(env, OVERHEAD_PREFIX + name) for name in OVERHEAD_NAMES]
    return None if any(v is None for v in values) else ExecutorOverhead(*values)


def put_overhead(db: ProfileCache, env: str, o: ExecutorOverhead) -> None:
    for name, v in o.as_dict().items():
        db.put_value(env, OVERHEAD_PREFIX + name, v)


def _plus(c: MoveCost, seconds: float) -> MoveCost:
    return MoveCost(c.latency_s + seconds, c.bandwidth_bytes_per_s, tuple((n, t + seconds) for n, t in c.points))


def with_overhead(moves: dict[tuple[str, str], MoveCost], o: ExecutorOverhead) -> dict[tuple[str, str], MoveCost]:
    """The executor's per-move seconds on top: a sync move's, an async move's on the calling
    thread (mode "host"; where the system has no host mode its overhead is left out)."""
    add = {"sync": o.sync_move_s, HOST: o.async_move_s}
    return {(d, m): _plus(c, add[m]) if add.get(m) else c for (d, m), c in moves.items()}


def _open_cache(cache) -> tuple[ProfileCache, bool]:
    if isinstance(cache, ProfileCache):
        return cache, False
    return ProfileCache(cache), True


def profile(graph: TrainingGraph, memory_system, cache: ProfileCache | str | os.PathLike | None = None, *,
            inputs: Mapping[int, torch.Tensor] | None = None, recache: bool = False,
            progress: Progress | None = None, return_stats: bool = False,
            move_sizes: tuple[int, ...] = MOVE_SIZES, move_repeats: int = MOVE_REPEATS,
            wake_rounds: int = WAKE_ROUNDS, executor_overhead: bool = True,
            measure_overhead: MeasureOverhead | None = None):
    """Profile `graph` on `memory_system` and return its CostModel.

    Args:
        graph: a TrainingGraph captured on real tensors (fake-captured graphs only work
            with ``sim:<spec>`` memory systems).
        memory_system: a MemorySystem, or a name: ``"cpu+file"`` etc. (built and closed
            here), or ``"sim:<spec>"`` (a tier spec name or a path to a TOML file).
        cache: a ProfileCache, a path to its SQLite file, or None for the default file.
        inputs: graph input values by tensor id (e.g. ``TrainingState(graph, model,
            opt).inputs(batch)``); default: synthetic values of the right layout.
        recache: measure everything again (replacing this environment's cached values).
        progress: called as progress(done, total, what) after each measurement.
        return_stats: return (CostModel, ProfileStats) instead of the CostModel.
        move_sizes, move_repeats: the sizes (bytes) and repeats of the move measurements.
        wake_rounds: replay iterations per phase timing the kernels after a blocking move
            (memory systems with idle_sync_moves; 0: none, CostModel.wake_seconds empty).
        executor_overhead: add the executor's own seconds per kernel and per sync move
            (autotm.overhead: measured once per environment on a calibration graph and
            cached; host-timed memory systems only). False: the kernels' and moves' calls alone.
        measure_overhead: runs that calibration where the cache has no overheads for this
            environment (autotm.runtime.overhead.measure_executor_overhead: it runs the
            executor, a later stage, so the caller passes it); None: uncached overheads
            are left out.
    """
    if isinstance(memory_system, str) and memory_system.startswith("sim:"):
        cm, stats = _profile_sim(graph, memory_system, cache, recache=recache)
        return (cm, stats) if return_stats else cm
    owned = None
    if isinstance(memory_system, str):
        from ..tiers import make_memory_system

        memory_system = owned = make_memory_system(memory_system)
    db, owned_db = _open_cache(cache)
    try:
        opts = dict(inputs=inputs, recache=recache, progress=progress, move_sizes=tuple(move_sizes),
                    move_repeats=move_repeats, wake_rounds=wake_rounds, executor_overhead=executor_overhead,
                    measure_overhead=measure_overhead)
        try:  # everything in the cache: nothing to wait for
            cm, stats = _profile_real(graph, memory_system, db, measure=False, **opts)
            must_measure = False
        except _MustMeasure:
            must_measure = True
        if must_measure:
            # one process measures at a time (ProfileCache.measuring); one that waited finds
            # what the other measured, and times only what is still missing
            t_wait = time.perf_counter()

            def waiting(pid: int | None) -> None:
                what = f"waiting for autotm process {pid or '?'}, measuring into {db.path}"
                log.info(what)
                if progress is not None:
                    progress(0, 0, what)

            with db.measuring(waiting):
                waited = time.perf_counter() - t_wait
                cm, stats = _profile_real(graph, memory_system, db, **opts)
            stats.waited_seconds = waited
            stats.add_seconds("wait", waited)
    finally:
        if owned_db:
            db.close()
        if owned is not None:
            owned.close()
    log.info("profile %s on %s: %s", graph.name, cm.memory_system, stats.message())
    return (cm, stats) if return_stats else cm


class _MustMeasure(Exception):
    """_profile_real(measure=False) found something the cache does not hold."""


def _profile_real(graph, memory, cache, *, inputs, recache, progress, move_sizes, move_repeats, wake_rounds,
                  executor_overhead=True, measure_overhead=None, recache_moves=None, measure=True):
    if graph.fake:
        raise InputError(f"graph {graph.name} was captured on fake tensors: it cannot be timed on "
                         f"{memory.name}; capture it on real tensors, or profile on a sim:<spec> system")
    # the executor's allocator policy, so kernels are timed as it runs them: their outputs
    # land in reused heap memory, not in fresh pages that fault in on every call
    keep_freed_memory()
    t_start = time.perf_counter()
    db, owned = _open_cache(cache)
    try:
        stats = ProfileStats(total_kernels=len(graph.kernels), cache_path=str(db.path),
                             cache_rebuilt=db.rebuilt_reason, unique_kernels=graph.unique_signatures)
        device = getattr(memory, "fast_device", None)
        envd = environment(memory.name, device, getattr(memory, "async_engine", None))
        env = db.environment(envd)
        have = {} if recache else db.kernel_times(env)  # recache: measure again, replace the rows
        pending = {} if recache else db.pending(env)
        direct = memory.access == "direct"
        program = graph.program

        # in situ: every signature without a final all-fast time
        need = {k.signature for k in graph.kernels if (k.signature, "fast") not in have}
        stats.cache_hits += graph.unique_signatures - len(need)
        # direct access: repeated timings of each placement, and of all-fast for the ratio
        needs: list[list[tuple]] = []
        batch_jobs: dict[int, list[tuple]] = {}
        planned: set[tuple[str, str]] = set()
        for k, kern in enumerate(graph.kernels):
            jobs = []
            if direct:
                pattern = _arg_pattern(program, k)
                n = len(operand_tensors(kern.inputs, kern.outputs))
                jobs = [(None, "batch:fast")] + [(p, "batch:" + placement_key(p, pattern)) for p in placements(n)]
            needs.append(jobs)
            for p, key in jobs:
                ck = (kern.signature, key)
                if ck in planned:
                    continue
                planned.add(ck)
                if ck in have:
                    stats.cache_hits += 1
                else:
                    batch_jobs.setdefault(k, []).append((p, key))
        rounds = move_rounds(move_sizes, move_repeats)
        n_move = len(rounds)
        wake_on = getattr(memory, "idle_sync_moves", False) and wake_rounds > 0
        # a kernel's wake excess is its signature's: a graph whose signatures are all known
        # (from any graph profiled in this environment) runs no wake iterations
        wake_known = {} if recache or not wake_on else db.wake_excess(env)
        wake_on = wake_on and not all(k.signature in wake_known for k in graph.kernels)
        wake_samples, wake_done = cached_wake_samples(graph, db, env, recache) if wake_on else ({}, 0)
        n_wake = max(0, 3 * wake_rounds - wake_done) if wake_on else 0
        # the executor's own time (autotm.overhead): host-timed systems, where it is serial with kernels
        overhead_on = executor_overhead and getattr(memory, "move_seconds", None) is None and (
            device is None or torch.device(device).type == "cpu")
        overhead = None if recache or not overhead_on else cached_overhead(db, env)
        measure_on = overhead_on and overhead is None and measure_overhead is not None
        if not measure:
            pos_cached = None if recache else db.position_samples(env, graph.fingerprint)
            if (recache or need or batch_jobs or wake_on or measure_on
                    or pos_cached is None or len(pos_cached) != len(graph.kernels) or not all(pos_cached)
                    or moves_missing(memory, db, env, move_sizes, move_repeats)):
                raise _MustMeasure
        # the machine's pace now against when the cached timings were taken (autotm.pace);
        # a GPU's kernels do not slow with the host's load this probe sees
        t_part = time.perf_counter()
        pace = None if device is not None and torch.device(device).type == "cuda" else probe_pace(
            db, env, recache=recache)
        stats.add_seconds("pace", time.perf_counter() - t_part)
        total = (len(need) + sum(len(v) for v in batch_jobs.values()) + n_move + n_wake
                 + int(measure_on))
        done = [0]

        def tick(what: str) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], total, what)

        def record(k: int, key: str, seconds: float, samples: int) -> None:
            sig = graph.kernels[k].signature
            db.put_kernel(env, sig, key, seconds, samples)
            have[(sig, key)] = seconds
            stats.measured += 1
            tick(graph.kernels[k].op)

        def move_phase(phase: int):
            """The move rounds of one phase (MOVE_PHASES); the fit once all are in."""
            before = done[0]
            t_part = time.perf_counter()
            got = measure_moves(memory, db, env, sizes=move_sizes, repeats=move_repeats,
                                recache=recache if recache_moves is None else recache_moves,
                                stats=stats, progress=tick, phases=(phase,))
            stats.add_seconds("moves", time.perf_counter() - t_part)
            # the rounds found in the cache count as done too
            done[0] = before + sum(1 for _, r in rounds if r % MOVE_PHASES == phase)
            if progress is not None:
                progress(done[0], total, "moves")
            return got

        move_phase(0)

        workspace = {} if recache else db.workspaces(env)
        pos = None if recache else db.position_samples(env, graph.fingerprint)
        pos_missing = pos is None or len(pos) != len(graph.kernels) or not all(pos)
        interp = None
        if need or batch_jobs or pos_missing:
            if inputs is None:
                inputs = synthetic_inputs(graph)
            if device is not None and device.type != "cpu":  # kernels run where the fast tier is
                inputs = {tid: v.to(device) for tid, v in inputs.items()}
            samples = {sig: list(pending[sig][0]) for sig in need if sig in pending}
            iters = {sig: pending[sig][1] for sig in need if sig in pending}
            def record_workspace(sig: str, nbytes: int) -> None:
                db.put_workspace(env, sig, nbytes)
                workspace[sig] = nbytes

            on_cpu = device is None or device.type == "cpu"
            interp = ProfilingReplay(graph, memory, batch_jobs, record, need, samples,
                                     record_workspace if on_cpu and cpu_arena.load() is not None else None)
            if not pos_missing:
                interp.position_samples = [list(x) for x in pos]
            op_of = {k.signature: k.op for k in graph.kernels}

        def insitu_window(window: int) -> None:
            """In-situ iterations of one window (the one after move phase `window`). Before the
            last, until every signature still needed has a sample in this window; in the last,
            until each one's estimate is final (insitu_done), each sample kept as its iteration ends."""
            t_part = time.perf_counter()
            try:
                _insitu_window(window)
            finally:
                stats.add_seconds("kernels", time.perf_counter() - t_part)

        def _insitu_window(window: int) -> None:
            nonlocal pos, pos_missing
            final = window == MOVE_PHASES - 1
            start = {sig: len(samples.get(sig, ())) for sig in need}
            it = 0
            while need or interp.batch_jobs or pos_missing:
                interp.full = pos_missing
                before = {sig: len(samples.get(sig, ())) for sig in need}
                with torch.no_grad():
                    interp.run(dict(inputs))
                unfinished = []
                for sig in sorted(need):
                    xs = samples.get(sig, [])
                    n_it = iters.get(sig, 0)
                    if final and insitu_done(xs, before[sig], n_it):
                        t = insitu_estimate(xs)
                        db.put_final(env, sig, "fast", t, sum(len(g) for g in xs))
                        have[(sig, "fast")] = t
                        need.discard(sig)
                        stats.measured += 1
                        tick(op_of[sig])
                    else:
                        iters[sig] = n_it + 1
                        unfinished.append((env, sig, xs, n_it + 1))
                db.put_pending(unfinished)
                pos = interp.position_samples = [x[-MAX_SAMPLES:] for x in interp.position_samples]
                pos_missing = not all(pos)
                stats.iterations += 1
                db.put_position_samples(env, graph.fingerprint, pos)
                it += 1
                if progress is not None:  # (an iteration, not a measurement done: the count stays)
                    progress(done[0], total, f"kernels in situ, window {window}")
                if not final and not interp.batch_jobs and not pos_missing and (it >= 2 or all(
                        any(samples.get(sig, [])[start[sig]:]) for sig in need)):
                    return
                if it > MAX_ITERATIONS + 2:  # cannot happen while insitu_done caps iterations
                    raise RuntimeError(f"profiling {graph.name}: kernels still unmeasured after {it} iterations: "
                                       f"{sorted(need)[:3]}")

        # the kernels are timed in a window after each move phase, so that a slow spell of
        # the machine holds one window's samples, not every sample
        if interp is not None:
            insitu_window(0)
        move_phase(1)
        if interp is not None:
            insitu_window(1)
        wake: tuple[float, ...] = wake_from_excess(graph, wake_known) if wake_known and not wake_on else ()
        if wake_on:
            if n_wake and inputs is None:
                inputs = synthetic_inputs(graph)
            t_part = time.perf_counter()
            wake = measure_wakes(graph, memory, db, env, inputs, wake_samples, wake_done, rounds=wake_rounds,
                                 stats=stats, progress=tick, replace=recache)
            stats.add_seconds("wake", time.perf_counter() - t_part)
        moves, slowdown = move_phase(2)
        if interp is not None:
            insitu_window(2)
            del interp
        if measure_on:
            def calibration_model(g, g_inputs):
                # this cache and environment; with recache, its kernels timed again, not the moves
                g_cm = _profile_real(g, memory, db, inputs=g_inputs, recache=recache, progress=None,
                                     move_sizes=move_sizes, move_repeats=move_repeats, wake_rounds=wake_rounds,
                                     executor_overhead=False, recache_moves=False)[0]
                return g_cm, [statistics.median(x) for x in db.position_samples(env, g.fingerprint)]
            t_part = time.perf_counter()
            overhead = measure_overhead(memory, calibration_model)
            put_overhead(db, env, overhead)
            stats.add_seconds("overhead", time.perf_counter() - t_part)
            stats.overhead_measured = True
            tick("executor overhead")
        o = overhead or ExecutorOverhead()
        after = [statistics.median(x) for x in pos]
        kernel_seconds = tuple(have[(k.signature, "fast")] + after[i] + o.kernel_s
                               for i, k in enumerate(graph.kernels))
        placement_seconds: dict[int, dict[tuple[str, ...], float]] = {}
        if direct:
            # the in-situ all-fast time, scaled by the slowdown the repeated timings measured
            for k, kern in enumerate(graph.kernels):
                base = have[(kern.signature, "batch:fast")]
                call = have[(kern.signature, "fast")]
                placement_seconds[k] = {p: call * have[(kern.signature, key)] / base + after[k] + o.kernel_s
                                        for p, key in needs[k] if p is not None}
        moves = with_overhead(moves, o)
        stats.seconds = time.perf_counter() - t_start
        if pace is not None:
            stats.pace = pace
            settle_pace(db, env, pace, measured_new=not stats.nothing_new)
        cm = CostModel(graph_fingerprint=graph.fingerprint, memory_system=memory.name, access=memory.access,
                       kernel_seconds=kernel_seconds, placement_seconds=placement_seconds, moves=moves,
                       simulated=False, environment=envd,
                       # Linux AIO keeps a kernel's copies in flight together
                       async_overlap=getattr(memory, "async_engine", None) == "aio",
                       workspace_bytes=tuple(workspace.get(k.signature, 0) for k in graph.kernels)
                       if workspace else (),
                       copy_interference=slowdown, wake_seconds=wake,
                       executor_overhead=o.as_dict() if overhead is not None else {})
        return cm, stats
    finally:
        if owned:
            db.close()


# ----------------------------------------------------------------------- tier specs (sim)

SPEC_DIR = Path(__file__).with_name("specs")
_G = 1e9


@dataclass(frozen=True)
class TierSpec:
    """A hypothetical memory system read from a TOML spec (see autotm/specs/*.toml)."""

    name: str
    description: str
    access: str  # "staged" | "direct"
    fast_read_bw: float  # bytes/s a kernel reads from fast memory
    fast_write_bw: float
    slow_read_bw: float
    slow_write_bw: float
    fast_latency_s: float
    slow_latency_s: float
    moves: dict[tuple[str, str], MoveCost]
    peak_flops: float | None  # None: this machine's measured peak
    source: str = ""
    extra: dict = field(default_factory=dict)


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def load_spec(spec: str | os.PathLike) -> TierSpec:
    """A tier spec by name ("optane", "sim:optane") or path to a TOML file."""
    s = str(spec)
    if s.startswith("sim:"):
        s = s[4:]
    path = Path(s)
    if not (path.suffix == ".toml" and path.exists()):
        path = SPEC_DIR / f"{s}.toml"
        if not path.exists():
            raise InputError(f"unknown tier spec {s!r}; shipped specs: {', '.join(spec_names())} "
                             "(or pass a path to a .toml file)")
    try:
        d = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"tier spec {path} is not valid TOML: {e}") from None
    try:
        fast, slow, mv = d["fast"], d["slow"], d["moves"]
        moves = {}
        for direction in DIRECTIONS:
            for mode in MOVE_MODES:
                m = mv[direction][mode]
                moves[(direction, mode)] = MoveCost(float(m.get("latency_us", 0.0)) * 1e-6,
                                                    float(m["bandwidth_gbps"]) * _G)
        access = d["access"]
        if access not in ("staged", "direct"):
            raise InputError(f"access must be 'staged' or 'direct', got {access!r}")
        peak = d.get("compute", {}).get("peak_gflops")
        return TierSpec(
            name=d.get("name", path.stem), description=d.get("description", ""), access=access,
            fast_read_bw=float(fast["read_gbps"]) * _G, fast_write_bw=float(fast["write_gbps"]) * _G,
            slow_read_bw=float(slow["read_gbps"]) * _G, slow_write_bw=float(slow["write_gbps"]) * _G,
            fast_latency_s=float(fast.get("latency_ns", 0.0)) * 1e-9,
            slow_latency_s=float(slow.get("latency_ns", 0.0)) * 1e-9,
            moves=moves, peak_flops=None if peak is None else float(peak) * _G,
            source=d.get("source", ""), extra={"path": str(path)})
    except KeyError as e:
        raise InputError(f"tier spec {path} is missing {e}") from None


def measure_peak_flops(cache: ProfileCache | str | os.PathLike | None = None, *, recache: bool = False,
                       size: int = 1024) -> float:
    """This machine's float32 matmul FLOP/s (a size x size matmul, median), cached."""
    db, owned = _open_cache(cache)
    try:
        env = db.environment({k: v for k, v in environment("compute").items()})
        if not recache:
            v = db.value(env, "peak_flops")
            if v is not None:
                return v
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        seconds, _ = time_call(lambda: torch.mm(a, b), min_samples=5)
        flops = 2.0 * size ** 3 / seconds
        db.put_value(env, "peak_flops", flops)
        return flops
    finally:
        if owned:
            db.close()


def operand_bytes(graph: TrainingGraph, k: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes kernel k reads from each input tensor and writes to each output tensor, as the
    kernel sees them (views, not whole storages; capped at the storage's size)."""
    kern = graph.kernels[k]
    reads: dict[int, int] = {}
    writes: dict[int, int] = {t: graph.tensors[t].nbytes for t in kern.outputs}
    p = graph.program
    if p is not None and getattr(p, "kernel_nodes", None):
        node = p.kernel_nodes[k]
        for a in node.all_input_nodes:
            tid = p.node_tensor.get(a)
            v = a.meta.get("val")
            if tid is None:
                continue
            vals = v if isinstance(v, (list, tuple)) else [v]
            nb = sum(x.numel() * x.element_size() for x in vals if isinstance(x, torch.Tensor))
            reads[tid] = reads.get(tid, 0) + nb
        out = node.meta.get("val")
        for tid, i in p.kernel_outputs[k]:
            v = out if i is None else out[i]
            if isinstance(v, torch.Tensor):
                writes[tid] = v.numel() * v.element_size()
    for t in kern.inputs:
        reads[t] = min(reads.get(t, graph.tensors[t].nbytes), graph.tensors[t].nbytes)
    for t in kern.outputs:
        writes[t] = min(writes[t], graph.tensors[t].nbytes)
    return reads, writes


def roofline_seconds(flops: float, reads: Mapping[int, int], writes: Mapping[int, int],
                     placement: Mapping[int, str], spec: TierSpec, peak_flops: float) -> float:
    """max(flops / peak, sum over operands of bytes / bandwidth of its tier), plus the
    access latency of each tier the kernel touches."""
    mem = 0.0
    tiers = set()
    for tid, nb in reads.items():
        slow = placement.get(tid) == "slow"
        tiers.add(slow)
        mem += nb / (spec.slow_read_bw if slow else spec.fast_read_bw)
    for tid, nb in writes.items():
        slow = placement.get(tid) == "slow"
        tiers.add(slow)
        mem += nb / (spec.slow_write_bw if slow else spec.fast_write_bw)
    lat = sum(spec.slow_latency_s if s else spec.fast_latency_s for s in tiers)
    return max(flops / peak_flops, mem) + lat


def cost_model_from_spec(graph: TrainingGraph, spec: str | os.PathLike | TierSpec, *,
                         cache: ProfileCache | str | os.PathLike | None = None,
                         peak_flops: float | None = None) -> CostModel:
    """A roofline CostModel of `graph` on the hypothetical memory system `spec`.

    Kernel time = max(kernel.flops / peak_flops, sum over operands of bytes / bandwidth
    of the tier the operand is in) + the latency of each tier touched. Peak FLOP/s: the
    argument, else the spec's, else this machine's measured peak (cached).
    """
    spec = spec if isinstance(spec, TierSpec) else load_spec(spec)
    if peak_flops is None:
        peak_flops = spec.peak_flops if spec.peak_flops is not None else measure_peak_flops(cache)
    kernel_seconds = []
    placement_seconds: dict[int, dict[tuple[str, ...], float]] = {}
    for k, kern in enumerate(graph.kernels):
        reads, writes = operand_bytes(graph, k)
        kernel_seconds.append(roofline_seconds(kern.flops, reads, writes, {}, spec, peak_flops))
        if spec.access == "direct":
            ops = operand_tensors(kern.inputs, kern.outputs)
            table = {}
            for p in placements(len(ops)):
                table[p] = roofline_seconds(kern.flops, reads, writes, dict(zip(ops, p)), spec, peak_flops)
            placement_seconds[k] = table
    env = {"spec": spec.name, "spec_path": spec.extra.get("path", ""), "peak_flops": peak_flops,
           "description": spec.description}
    return CostModel(graph_fingerprint=graph.fingerprint, memory_system=f"sim:{spec.name}", access=spec.access,
                     kernel_seconds=tuple(kernel_seconds), placement_seconds=placement_seconds,
                     moves=dict(spec.moves), simulated=True, environment=env)


def _profile_sim(graph, name, cache, *, recache):
    t0 = time.perf_counter()
    spec = load_spec(name)
    peak = spec.peak_flops if spec.peak_flops is not None else measure_peak_flops(cache, recache=recache)
    cm = cost_model_from_spec(graph, spec, peak_flops=peak)
    stats = ProfileStats(unique_kernels=graph.unique_signatures, total_kernels=len(graph.kernels),
                         seconds=time.perf_counter() - t0, simulated_from=spec.extra.get("path", spec.name))
    return cm, stats


# ---------------------------------------------------------------------------- workloads

def capture_real(w, seed: int = 0):
    """Capture workload `w` on real tensors: (graph, model, optimizer, batch, inputs)."""
    from ..frontend.capture import capture
    from ..interpret.replay import TrainingState

    model = w.build_model(seed=seed)
    opt = w.make_optimizer(model.parameters())
    batch = w.make_batch(seed=seed)
    # the capture's tensors are not to stay behind in glibc's heap, where a session run
    # later in this process would scatter its allocations over them (large_blocks_mapped)
    with large_blocks_mapped():
        graph = capture(model, w.loss_fn(), opt, batch, name=w.name)
    inputs = TrainingState(graph, model, opt).inputs(batch)
    return graph, model, opt, batch, inputs


def profile_workload(w, memory: str = "cpu+file", cache=None, *, recache: bool = False,
                     progress: Progress | None = None, before_profile=None,
                     measure_overhead: MeasureOverhead | None = None):
    """Capture `w` (fake for sim:<spec>, real otherwise) and profile it: (graph, CostModel, ProfileStats).
    `before_profile(graph)` runs between the two (a budget checked before minutes of profile)."""
    if memory.startswith("sim:"):
        from ..frontend.workloads import capture_workload

        graph = capture_workload(w, fake=True)
        if before_profile is not None:
            before_profile(graph)
        cm, stats = profile(graph, memory, cache, recache=recache, return_stats=True)
        return graph, cm, stats
    graph, model, opt, batch, inputs = capture_real(w)
    del model, opt, batch
    if before_profile is not None:
        before_profile(graph)
    cm, stats = profile(graph, memory, cache, inputs=inputs, recache=recache, progress=progress,
                        return_stats=True, measure_overhead=measure_overhead)
    return graph, cm, stats


def profile_command(models: list[str], preset: str | None = None, batch: int | None = None,
                    image: int | None = None, memory: str = "cpu+file", cache: str | None = None,
                    recache: bool = False, as_json: bool = False,
                    measure_overhead: MeasureOverhead | None = None) -> list[dict]:
    """`autotm profile`: profile each model's workload on `memory`, with a progress bar
    (kernel timings done / total, ETA) and a summary table; or JSON on stdout (the bar then
    goes to stderr). Returns the summary rows."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn
    from rich.table import Table

    from ..zoo import workload

    out = Console()
    err = Console(stderr=True)
    if preset is None and (batch is None or image is None):
        preset = "test"
    rows = []
    for name in models:
        w = workload(name, preset, batch=batch, image=image)
        with Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                 TextColumn("{task.fields[what]}"), TimeElapsedColumn(), TextColumn("ETA"),
                 TimeRemainingColumn(), console=err, transient=as_json) as bar:
            task = bar.add_task(w.name, total=None, what="capturing")

            def progress(done: int, total: int, what: str, task=task) -> None:
                bar.update(task, completed=done, total=total, what=what[:40])

            t0 = time.perf_counter()
            graph, cm, stats = profile_workload(w, memory, cache, recache=recache, progress=progress,
                                                measure_overhead=measure_overhead)
            bar.update(task, what="done", completed=bar.tasks[0].total or 0)
        rows.append({
            "workload": w.name, "memory_system": cm.memory_system, "access": cm.access,
            "simulated": cm.simulated, "kernels": len(graph.kernels), "unique_kernels": graph.unique_signatures,
            "measured": stats.measured, "cache_hits": stats.cache_hits,
            "move_samples_measured": stats.move_samples_measured,
            "profile_seconds": round(stats.seconds, 3), "total_seconds": round(time.perf_counter() - t0, 3),
            "predicted_all_fast_seconds": round(cm.total_kernel_seconds, 6),
            "moves": {f"{d}/{m}": {"latency_s": c.latency_s, "bandwidth_bytes_per_s": c.bandwidth_bytes_per_s}
                      for (d, m), c in cm.moves.items()},
            "peak_workspace_bytes": max(cm.workspace_bytes, default=0),
            "copy_interference": dict(cm.copy_interference),
            "cache": stats.cache_path, "message": stats.message(),
            # how many times slower the machine ran when the cached timings were taken than now
            "pace_ratio": None if stats.pace is None or stats.pace.ratio is None else round(stats.pace.ratio, 3),
        })
        if stats.cache_rebuilt:
            err.print(f"[yellow]cache rebuilt: {stats.cache_rebuilt}[/yellow]")
    if as_json:
        print(json.dumps(rows, indent=2))
        return rows
    t = Table(title=f"profile on {memory}")
    for col in ("workload", "kernels", "unique", "measured", "cache hits", "seconds", "all-fast (pred.)",
                "max workspace"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        t.add_row(r["workload"], str(r["kernels"]), str(r["unique_kernels"]), str(r["measured"]),
                  str(r["cache_hits"]), f"{r['total_seconds']:.1f}", f"{r['predicted_all_fast_seconds']:.3f} s",
                  f"{r['peak_workspace_bytes'] / 2**20:.1f} MiB")
    out.print(t)
    for r in rows:
        out.print(f"{r['workload']}: {r['message']}")
    return rows
