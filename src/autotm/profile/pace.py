"""The machine's pace: is the machine that filled a profile cache the machine of now?

A profile's timings are only as good as the conditions they were measured in: taken while
other work loaded the machine (a test run, a benchmark beside it), every later plan that
reuses them is predicted several times too slow, and nothing in the cached numbers says
so (a CI clone's `make demo` predicted every plan ~10x its measurement from such a cache).
So each profile also times a fixed probe, a multi-threaded matmul and a large copy (the
two things a loaded machine slows: compute with every thread, and memory bandwidth),
stores the probe's time with the first measurements of its environment, and compares it
with the probe of every later profile that reuses them.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass

import torch

# beyond this ratio between the probe now and when the cache was filled, the cached
# timings are suspect (the probe's spread on this quiet machine: ~10 %)
PACE_TOLERANCE = 1.5
PACE_VALUE = "pace_probe_s"  # the cache value (ProfileCache.value) holding the probe's seconds


class PaceWarning(UserWarning):
    """Cached timings were measured while the machine ran at another pace than now."""


@dataclass(frozen=True)
class PaceCheck:
    now_s: float  # the probe's seconds in this profile
    cached_s: float | None  # the probe's seconds when this environment's timings were measured

    @property
    def ratio(self) -> float | None:
        """How many times slower the machine ran when the cache was filled than now."""
        return None if self.cached_s is None else self.cached_s / self.now_s

    @property
    def mismatched(self) -> bool:
        r = self.ratio
        return r is not None and not (1 / PACE_TOLERANCE <= r <= PACE_TOLERANCE)

    def describe(self) -> str:
        r = self.ratio
        if r is None:
            return f"machine pace probe {self.now_s * 1e3:.1f} ms"
        pace = f"{r:.2f}x slower" if r >= 1 else f"{1 / r:.2f}x faster"
        return (f"the cached timings were measured while this machine ran {pace} than now "
                f"(pace probe {self.cached_s * 1e3:.1f} ms then, {self.now_s * 1e3:.1f} ms now)")


def pace_probe_seconds(tries: int = 7) -> float:
    """Seconds of one fixed probe on the CPU: a 384x384 matmul (every torch thread) six
    times and a 16 MiB copy (~5 ms on a quiet 2-core machine); the median of `tries` runs.
    (Not the least: a probe this short can slip into a time slice a loaded machine leaves
    free, and the median of the quiet machine's runs is as steady, within ~10 %.)"""
    a = torch.ones(384, 384)
    b = torch.ones(384, 384)
    src = torch.ones(4 << 20)
    dst = torch.empty_like(src)
    torch.mm(a, b)
    dst.copy_(src)  # warm-up: the pages and the kernels' first call
    runs = []
    for _ in range(tries):
        t0 = time.perf_counter()
        for _ in range(6):
            torch.mm(a, b)
        dst.copy_(src)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def probe_pace(db, env: str, *, recache: bool) -> PaceCheck:
    """The probe now, and the cache's for `env` (none when re-measuring everything)."""
    return PaceCheck(now_s=pace_probe_seconds(), cached_s=None if recache else db.value(env, PACE_VALUE))


def settle_pace(db, env: str, check: PaceCheck, *, measured_new: bool) -> None:
    """After a profile: the first one to measure timings of `env` (or to re-measure them all)
    stores its probe; one whose probe is off the cache's by more than PACE_TOLERANCE warns
    (PaceWarning), naming the ratio and the way out."""
    if check.cached_s is None:
        if measured_new:
            db.put_value(env, PACE_VALUE, check.now_s)
        return
    if check.mismatched:
        mixed = " (this profile's new timings, measured now, sit beside them)" if measured_new else ""
        warnings.warn(f"profile cache {db.path}: {check.describe()}{mixed}; predictions from them may be off "
                      f"by as much. If the machine was busy then, profile again with --recache (Python: "
                      f"recache=True); if it is busy now, profile when it is not.", PaceWarning, stacklevel=4)
