"""glibc's heap policy for the fast tier's host memory: freed blocks kept for reuse while
iterations run, large blocks mapped on their own during one-off work before them. The
executor sets it to run, the profiler to time kernels as the executor runs them."""

from __future__ import annotations

import contextlib


def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt parameters (malloc.h)


def keep_freed_memory() -> None:
    """Make glibc keep freed blocks for reuse: no mmap, no trimming of its own.

    Each iteration allocates the same tensors again. With glibc's defaults, blocks over
    its mmap threshold (at most 32 MiB) are unmapped when freed, and a heap whose free top
    passes the trim threshold is shrunk, so the next iteration faults every page in again:
    vgg416 at the cpu preset took ~500k page faults (2 GB) per iteration through the
    executor, whose frees follow liveness, and still ~180k through eager PyTorch. Serving
    every block from a heap that is never trimmed makes the steady state fault-free, as a
    caching allocator would; the price is RSS at the heap's high-water mark, which under a
    budget the executor bounds by trimming (trim_heap) when RSS comes near the bound.
    Process-wide: code running in the same process afterwards gets the same policy.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, -1)


@contextlib.contextmanager
def large_blocks_mapped(threshold: int = 64 << 10):
    """While inside, glibc serves blocks of `threshold` bytes or more from mappings of their
    own, unmapped when freed; afterwards freed memory is kept (keep_freed_memory).

    For one-off work before a session in the same process, an eager capture above all:
    served from the heap, its tensors left glibc's heap spanning ~3.8 GB, 3.6 GB of it
    free (densenet264 at the cpu preset), and a session's later allocations scattered
    over those free chunks, touching new pages where a compact heap reuses the same
    ones. Under a budget the executor then trimmed the heap ~10 times an iteration and
    its kernels faulted ~170k pages back in: all-fast laid out in the arena ran 1.31x its
    time on the heap, 1.16-1.19x after a capture inside this (benchmarks/arena_overhead.py)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_MAX, 1 << 16)  # (glibc's default; keep_freed_memory sets 0)
        libc.mallopt(M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        keep_freed_memory()


def trim_heap() -> None:
    """Give the free memory at the top and inside glibc's heaps back to the OS (malloc_trim)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
