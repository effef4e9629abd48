"""The timing rules: how a kernel is sampled, when its samples are enough, what they estimate.

Repeated (direct access: each placement of the operands; `time_call`): the first call is
a warm-up and sets the batch size: a call shorter than `MIN_BATCH_S` (too short for the
timer) is repeated n times per sample, n = ceil(MIN_BATCH_S / t), and the per-call time
is the batch time / n. Samples are taken until the median is stable: at least
`MIN_SAMPLES`, then stop as soon as adding a sample moves the median by at most
`REL_TOL`, or at `MAX_SAMPLES`, or after `MAX_KERNEL_S`. The result is the median.

In situ (the all-fast time of every kernel, any access model; `insitu.ProfilingReplay`
takes the samples): a signature is final (`insitu_done`) with at least `MIN_SAMPLES`
samples and a stable estimate (moved by at most `REL_TOL` by the last iteration), or
`LONG_KERNEL_S` of samples (a long kernel: the timer's error is negligible), or
`MAX_SAMPLES`, or after `MAX_ITERATIONS` iterations. The estimate (`insitu_estimate`) is
the median over iterations of the mean over the signature's occurrences in each iteration.

Placements (direct access): which placements of a kernel's operands are timed
(`placements`) and how the cache names them (`placement_key`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

MIN_BATCH_S = 200e-6  # a sample shorter than this is a batch of repeated calls
MIN_SAMPLES = 3
MAX_SAMPLES = 15
REL_TOL = 0.03
MAX_KERNEL_S = 1.0  # time spent on samples of one kernel placement, at most (after MIN_SAMPLES)
MAX_ITERATIONS = 4  # in-situ sampling: replay iterations at most (the last window's first ends it)
# In-situ iterations are taken in one window after each move phase (MOVE_PHASES), estimates
# final only in the last: a signature's samples come from iterations seconds to a minute
# apart, so a slow spell of the machine holds one window's samples, not every sample
# (benchmarks/HISTORY.md, "Notes moved from the code").
LONG_KERNEL_S = 0.25  # in-situ sampling: this much sampled time of a kernel is enough

# Direct access: kernels with at most this many unique operands get every placement;
# others get all-slow and the single-slow placements (CostModel.kernel_time adds them up).
MAX_EXHAUSTIVE_OPERANDS = 4


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



def arg_pattern(program, k: int) -> str:
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

