"""The process's host memory as the runtime watches it: RSS read and sampled, and the
bound the executor keeps it under with a budget (glibc's heap policy: tiers/host_heap.py).

With a budget, peak RSS <= budget + the process's RSS before any tensor of the iteration
exists + a constant (benchmarks/rss_overhead.py states and measures it): glibc keeps
freed blocks for reuse (keep_freed_memory), and the executor gives them back (trim_heap)
only when the RSS it reads before a kernel, plus what that kernel and its moves will
allocate, would pass budget + baseline + RSS_SLACK_BYTES.
"""

from __future__ import annotations

import os
import threading

RSS_SLACK_BYTES = 64 << 20
"""With trim_memory, free heap memory may stay resident while RSS stays under budget +
the iteration's baseline RSS + this; beyond it the heaps are trimmed (malloc_trim).
Trimming costs page faults when the memory is used again, so it is done only when needed."""


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


class RssReader:
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


def pool_bytes() -> int:
    """Address space for the pool of allocations that miss the arena: the machine's memory
    (reserved, not committed: only the pages used become resident)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 64 << 30
