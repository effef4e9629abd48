"""Fast CPU memory at the plan's offsets: one arena per executor, kernels' outputs and
prefetches placed where the planner's layout (planner/arena.py) put them.

Why: with glibc's heap, a budget on the process's RSS can only be kept by trimming
(malloc_trim), and each trimmed page is faulted in again by a later kernel: on this VM
~0.7-1.3 s per iteration of resnet50 at the cpu preset and 4:1 (0.6-1.4 M page faults),
a third of the iteration. The planner already gives every fast residency a byte offset in
an arena no larger than the budget; this module makes that layout real. The arena is
mapped once and its pages stay, so the steady state faults nothing and RSS stays at the arena
plus what the layout does not cover (kernels' temporaries, tensors that miss their slot).

How: a C++ extension (cpu_arena.cpp, built on first use with torch.utils.cpp_extension)
installs a CPU allocator in front of PyTorch's. The executor tells it, before each kernel,
the sizes and offsets of the outputs the kernel will allocate; an allocation of exactly
one of those sizes whose range is free goes there, anything else passes through. A range
is handed out only while no live block overlaps it, so a tensor that outlives its planned
residency (a view, a caller's reference) makes later claims on its bytes fall back to the
heap: never to shared memory. Reads of prefetched tensors go straight into their range
(`take`). Without a compiler the executor runs as before (`load()` returns None and says
why).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import shutil
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20  # the arena starts on one and asks for transparent huge pages (cpu_arena.cpp)

_SOURCE = Path(__file__).with_name("cpu_arena.cpp")
_NAME = "autotm_cpu_arena"
_ENV_OFF = "AUTOTM_CPU_ARENA"  # "0": never use the arena allocator


class _Loader:
    """Builds the extension once per process (torch caches the build on disk)."""

    def __init__(self):
        self.module = None
        self.reason: str | None = None
        self.tried = False
        self._lock = threading.Lock()  # the demo starts the build early on a thread

    def __call__(self):
        with self._lock:
            return self._load()

    def _load(self):
        if self.tried:
            return self.module
        self.tried = True
        if os.environ.get(_ENV_OFF, "1") == "0":
            self.reason = f"disabled by {_ENV_OFF}=0"
            return None
        try:
            from torch.utils.cpp_extension import load_inline

            _ninja_on_path()

            with _build_lock(_NAME):
                m = load_inline(_NAME, cpp_sources=_SOURCE.read_text(),
                                functions=["install", "is_installed", "create", "expect", "allocations", "take",
                                           "offset_of", "stats", "retire", "watch", "watched_bytes", "trim", "use_pool"],
                                extra_cflags=["-O2"], verbose=False)
            m.install()
            if not m.is_installed():
                raise RuntimeError("another CPU allocator of higher priority is installed")
            self.module = m
        except Exception as e:  # no compiler, no headers, no ninja: run without it
            self.reason = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            log.warning("autotm: the CPU arena allocator is unavailable (%s); the executor falls back to "
                        "glibc's heap and trims it to hold RSS near the budget", self.reason)
        return self.module


@contextlib.contextmanager
def _build_lock(name: str):
    """Hold an flock (released by the kernel however the holder dies) while torch builds or
    loads the extension, and under it remove torch's own lock file if one is there: torch
    waits forever on a lock file that a build killed mid-way left behind (a CI run stopped
    during `make install` hung the next one's build for 15 minutes)."""
    import fcntl

    try:
        from torch.utils.cpp_extension import _get_build_directory

        build_dir = _get_build_directory(name, False)
    except Exception:  # (a private function: without it, torch's own locking alone)
        yield
        return
    with open(build_dir.rstrip(os.sep) + ".autotm-lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = os.path.join(build_dir, "lock")
            if os.path.exists(stale):  # no autotm build runs but ours: nobody holds it
                log.warning("autotm: removing a stale build lock left by an interrupted build: %s", stale)
                os.remove(stale)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ninja_on_path() -> None:
    """torch's build runs `ninja` from PATH; the pip package's binary may not be there (a
    virtual environment used without activating it)."""
    if shutil.which("ninja") is None:
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass


load = _Loader()
"""load() -> the extension module or None; load.reason says why not."""


def kernel_footprint(call) -> tuple[int, int] | None:
    """Run call() with every CPU allocation counted: (peak bytes allocated during it that
    were alive at once, bytes of them still alive after it: its results), or None without
    the extension. Peak minus what stays is the call's workspace: temporaries a kernel
    allocates and frees (oneDNN's reorder buffers and scratchpads, im2col)."""
    m = load()
    if m is None:
        return None
    m.watch(True)
    try:
        r = call()
    finally:
        m.watch(False)
    cur, peak = m.watched_bytes()
    del r
    return int(peak), int(cur)


class CpuArena:
    """One arena of `nbytes` (page-aligned, its pages touched as used); closed: its memory is
    unmapped once the last tensor in it dies."""

    def __init__(self, nbytes: int):
        m = load()
        if m is None:
            raise RuntimeError(f"the CPU arena allocator is unavailable: {load.reason}")
        self._m = m
        self.nbytes = int(nbytes)
        self.id = m.create(max(self.nbytes, 1))

    def expect(self, entries: list[tuple[int, int, int]], temporaries: int = 0) -> None:
        """Allocations of these exact sizes go to these offsets while free: entries
        (nbytes, offset, skip), the first `skip` allocations of that size passing by.
        Other allocations of `temporaries` bytes or more (if > 0) go to the lowest free
        page-aligned range that avoids the entries' ranges, if any. Until done(),
        allocations are logged (allocations()) if there are entries or `temporaries`."""
        self._m.expect(self.id, entries, temporaries)

    def allocations(self) -> list[tuple[int, int]]:
        """(nbytes, address) of every CPU allocation since the last expect(), in order."""
        return self._m.allocations()

    def done(self) -> None:
        """No more expected allocations."""
        self._m.expect(self.id, [], 0)

    def take(self, offset: int, nbytes: int, length: int | None = None) -> torch.Tensor | None:
        """A uint8 tensor of `nbytes` at `offset`, holding [offset, offset + length) (default
        nbytes) until its storage dies; None if part of that range is in use."""
        return self._m.take(self.id, offset, nbytes if length is None else length, nbytes)

    def offset_of(self, t: torch.Tensor) -> int:
        """Where `t`'s storage starts in the arena, or -1."""
        return self._m.offset_of(self.id, t.untyped_storage().data_ptr())

    def stats(self) -> tuple[int, int, int, int, int, int]:
        """(live bytes, allocations placed, allocations passed on while expecting,
        temporaries placed, allocations served by a pool, the end of the highest block ever
        handed out here); the counts are for the process."""
        return tuple(self._m.stats(self.id))

    @contextlib.contextmanager
    def as_pool(self, min_bytes: int):
        """While inside: CPU allocations of `min_bytes` or more that no expected slot takes
        are served from this arena's lowest free range (first fit), not glibc's heap, while
        it has room. Its resident pages then follow the high-water mark of what is alive in
        it at once, whatever the process did before (executor.py: what glibc's fragmented
        heap cost under an RSS bound)."""
        self._m.use_pool(self.id, int(min_bytes))
        try:
            yield self
        finally:
            self._m.use_pool(0, 0)

    def trim(self, nbytes: int = 0) -> int:
        """Give back whole huge pages of the arena that no live block touches, the highest
        first, until at least `nbytes` (all of them if 0); zeroed when touched again.
        Returns the bytes released: pages given back before and not handed out since are
        skipped, and so are pages above the highest block ever handed out (never touched);
        a never-touched page below it counts, as nothing here tells it apart."""
        return int(self._m.trim(self.id, int(nbytes)))

    def close(self) -> None:
        if getattr(self, "id", None) is not None:
            try:
                self._m.retire(self.id)
            except Exception:  # interpreter shutdown
                pass
            self.id = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def arena_like(nbytes: int, capacity: int | None = None, huge_pages: bool = True) -> torch.Tensor:
    """A touched uint8 tensor of `nbytes` in memory like the arena's: 2 MiB-aligned, with
    transparent huge pages advised, `capacity` bytes (default nbytes) mapped behind it.
    Direct I/O speed depends on it (cpu_arena.cpp, create), so the profiler times moves
    from and into such memory. huge_pages=False: a plain page-aligned mapping of 4 KiB
    pages (where the executor puts a tensor smaller than a huge page)."""
    capacity = max(nbytes, capacity or 0)
    if not huge_pages:
        buf = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
        t.fill_(0)
        return t
    buf = mmap.mmap(-1, capacity + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    probe = ctypes.c_char.from_buffer(buf)
    off = -ctypes.addressof(probe) % HUGE_PAGE
    del probe  # (a live export would keep the mapping from closing)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, off, capacity)
        except OSError:
            pass
    t = torch.frombuffer(buf, dtype=torch.uint8, offset=off, count=nbytes)
    t.fill_(0)  # its pages exist, as an arena slot's do after the first iteration
    return t
