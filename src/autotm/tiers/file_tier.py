"""``cpu+file``: DRAM as the fast tier, a file on local storage as the slow tier.

Design (measured on ext4 over virtio, see benchmarks/file_tier_bandwidth.py):

* **One arena file per memory system**, not one file per tensor. Slow tensors are
  extents of it, kept by a best-fit allocator with coalescing, 4096-byte granular. The
  file grows with ``posix_fallocate`` (so a full disk is reported before any data is
  written) and keeps its high-water size; freed extents are reused, and overwriting
  allocated blocks is the fastest direct-I/O write (no block allocation, no unlink
  and discard per tensor: unlinking a 256 MiB file cost 50 ms here).
* **The arena is unlinked right after it is opened**: its blocks belong to the open
  descriptor only, so nothing is left on disk however the process ends (even SIGKILL).
  Only the private directory remains to remove, which ``close()``, garbage collection
  and interpreter exit (including after Ctrl-C) do. For the same reason the slow file
  cannot be removed underneath a running system: deleting the directory (a temp
  cleaner) changes nothing until ``close()``.
* **Direct I/O (O_DIRECT) without copies.** O_DIRECT needs buffer addresses, file
  offsets and lengths aligned to 4096. A write takes the whole pages that hold the
  tensor's storage straight from the tensor's memory, and stores them at a 4096-aligned
  file offset, so the storage starts ``pad = data_ptr % 4096`` bytes into its extent
  (the bytes around it in those pages are written but never read back). A read goes into
  a page-aligned anonymous mapping, and the returned tensor is made over it with
  ``torch.frombuffer(..., offset=pad)``: its storage is exactly the original size.
  Fresh pages are costly (first-touch page faults ran at about the speed of the disk
  here), so those buffers are recycled: when the fast tensor dies its mapping returns to
  a small cache (``fast_cache_bytes``), as a caching allocator does. Storages under
  256 KiB are read into a cached buffer and copied into a plain ``torch.empty``
  tensor instead. Tensors read back from the file tier have non-resizable storages.
* **Asynchronous moves use Linux native AIO** (``linux_aio.py``): ``start_to_slow`` /
  ``start_to_fast`` queue O_DIRECT requests with ``io_submit`` on the calling thread and
  ``wait()`` collects them with ``io_getevents``, so the device works while the kernel
  runs and no thread has to be scheduled (the reasons and figures are in that module).
  Sync moves go the same way, started and waited for at once: the waiter polls for the
  completion before it sleeps, which a pwrite/pread cannot (at 1 MiB a sleeping
  waiter's wake-up and the Python around the call had held sync moves to 0.82-0.93 of a
  bare pwrite). Without AIO (or with buffered I/O, which AIO would run synchronously),
  sync moves are plain pwrite/pread and async ones run on the I/O worker thread as in
  every other memory system.
* **Fallback**: where O_DIRECT is refused (EINVAL, some file systems), a one-time warning
  is given and buffered I/O is used, with ``fdatasync`` and
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` after each write so the data leaves the page
  cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
import warnings
import weakref
from dataclasses import dataclass

import torch

from autotm.tiers import linux_aio
from autotm.tiers.file_extents import ArenaAllocator
from autotm.tiers.ranges import file_read_range, file_write_range
from autotm.tiers.slow_dirs import ABANDONED_NEW_SECONDS, DIR_PREFIX, owned_private_dir, remove_orphaned_dirs  # noqa: F401  (re-exported)
from autotm.tiers.base import (
    PAGE,
    Capabilities,
    MemorySystem,
    Pending,
    SlowHandle,
    TensorLayout,
    TierError,
    default_slow_base_dir,
    round_up,
    tensor_on_bytes,
)

SMALL_READ_BYTES = 256 << 10
"""Storages below this are read through a pooled buffer and copied into torch.empty."""

SMALL_BUFFER_BYTES = SMALL_READ_BYTES + PAGE
"""The one size of the small reads' buffers (a storage under SMALL_READ_BYTES, rounded up
to pages, plus a page for its offset within its first page)."""

SMALL_POOL_BYTES = 8 * SMALL_BUFFER_BYTES
"""At most this many bytes of idle small-read buffers are kept (~2 MiB, within the
executor's RSS slack): one per small read in flight at a time is all a run needs."""

IO_CHUNK = 1 << 30
"""Largest single pread/pwrite (Linux moves at most 2 GiB - 4 KiB per call)."""

HUGE_PAGE_MIN = 4 << 20
"""Fast buffers at least this large ask for transparent huge pages (fewer page faults)."""


@dataclass(frozen=True, eq=False)
class Extent:
    """Where one slow storage lives in the arena: bytes [offset, offset + length) of the
    file, the storage starting `pad` bytes in."""

    offset: int
    length: int
    pad: int


class AioPending(Pending):
    """An asynchronous move queued with Linux AIO: ``done()`` polls the kernel; ``wait()``
    collects the completions on the calling thread, then builds the result (the slow
    handle, or the tensor over the read buffer). ``finished_at`` is when the last
    completion was collected. No Event: waiters take turns on the lock, and the first
    finishes the move (an Event's set and wait cost a 1 MiB move 2 % of its time)."""

    __slots__ = ("_ctx", "_tokens", "_complete", "_lock", "_finished")

    def __init__(self, ctx: linux_aio.AioContext, tokens: list[int], complete) -> None:
        self._result = self._error = self.finished_at = None
        self._ctx, self._tokens, self._complete = ctx, tokens, complete
        self._lock = threading.Lock()
        self._finished = False

    def done(self) -> bool:
        return self._finished or self._ctx.done(self._tokens)

    def wait(self, timeout: float | None = None):
        with self._lock:
            if not self._finished:
                # the completions stay with the context until this move is finished: a
                # Ctrl-C between collecting them and building the result must not leave a
                # later wait() (the executor's cleanup) waiting for them forever
                results = self._ctx.wait(self._tokens, timeout, forget=False)
                try:
                    self._result = self._complete(results)
                except BaseException as e:  # handed to every waiter, as the worker does
                    self._error = e
                self._finished = True
                self._ctx.forget(self._tokens)
                self.finished_at = max((when for _, when in results), default=None)
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self, result=None, error=None) -> None:
        raise AssertionError("an AIO move is finished by its own wait()")


def _empty_tensor(h: SlowHandle) -> torch.Tensor:
    return tensor_on_bytes(torch.empty(0, dtype=torch.uint8), h.layout)


def _failed_or(start, *args) -> Pending:
    """start(*args), or a Pending holding its error: as with the worker thread, a move's
    error reaches the caller from ``wait()``."""
    try:
        return start(*args)
    except Exception as e:
        failed = Pending()
        failed._finish(error=e)
        return failed


class _SmallBuffer(mmap.mmap):
    """A small read's buffer (goes back to _BufferCache's small pool)."""


class _BufferCache:
    """Page-aligned anonymous mappings to read into, recycled when their tensor dies.

    Reads of small storages (under SMALL_READ_BYTES) all use buffers of one size,
    SMALL_BUFFER_BYTES, kept in a pool of at most SMALL_POOL_BYTES that clear() leaves
    alone: their data is copied out at once, so they are the tier's own fixed working
    memory, not tensors. Released with the other idle buffers before every kernel that
    moves (an arena plan leaves no headroom for them), each small read mapped a new buffer
    and faulted its pages in, and the release unmapped it again: densenet264 test
    evict-all sync spent 40 ms of a 0.81 s iteration on that (685 releases, 46 us each).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.cached_bytes = 0  # idle buffers of tensor size (not the small pool)
        self._by_size: dict[int, list[mmap.mmap]] = {}
        self._small: list[mmap.mmap] = []
        self._lock = threading.RLock()  # a tensor may die (and give back) anywhere
        self._closed = False

    def take(self, size: int, small: bool = False) -> mmap.mmap:
        """A buffer of at least `size` bytes; `small`: for a read copied out at once."""
        with self._lock:
            if small and size <= SMALL_BUFFER_BYTES:
                if self._small:
                    return self._small.pop()
                return _SmallBuffer(-1, SMALL_BUFFER_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            stack = self._by_size.get(size)
            if stack:
                self.cached_bytes -= size
                return stack.pop()
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if size >= HUGE_PAGE_MIN and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                buf.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        return buf

    def give(self, buf: mmap.mmap) -> None:
        size = len(buf)
        with self._lock:
            if not self._closed:
                if isinstance(buf, _SmallBuffer):
                    if (len(self._small) + 1) * size <= SMALL_POOL_BYTES:
                        self._small.append(buf)
                        return
                elif self.cached_bytes + size <= self.max_bytes:
                    self._by_size.setdefault(size, []).append(buf)
                    self.cached_bytes += size
                    return
        try:
            buf.close()
        except BufferError:  # still exported somewhere: unmapped when that goes
            pass

    def clear(self, small: bool = False) -> None:
        """Unmap the idle buffers (with `small`, the small pool's too)."""
        with self._lock:
            bufs = [b for stack in self._by_size.values() for b in stack]
            self._by_size.clear()
            self.cached_bytes = 0
            if small:
                bufs += self._small
                self._small = []
        for b in bufs:
            try:
                b.close()
            except BufferError:
                pass

    def close(self) -> None:
        self._closed = True
        self.clear(small=True)


def _open_arena(directory: str, direct_io: bool | None) -> tuple[int, bool]:
    """Create the arena file, unlink it, return (fd, whether O_DIRECT is on)."""
    path = os.path.join(directory, "arena")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    use_direct = direct_io is not False and hasattr(os, "O_DIRECT")
    try:
        if use_direct:
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o600)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                if direct_io:
                    raise TierError(f"the file system of {directory!r} refuses direct I/O "
                                    "(O_DIRECT)") from e
                warnings.warn(
                    f"autotm cpu+file: the file system of {directory!r} refuses direct I/O "
                    "(O_DIRECT); falling back to buffered I/O with fdatasync and "
                    "POSIX_FADV_DONTNEED, which is slower. Put the slow directory on local "
                    "storage (AUTOTM_SLOW_DIR) for direct I/O.", RuntimeWarning, stacklevel=4)
                use_direct = False
                fd = os.open(path, flags, 0o600)
        else:
            fd = os.open(path, flags, 0o600)
        os.unlink(path)
    except OSError as e:
        raise TierError(f"cannot create a file in slow directory {directory!r} "
                        f"({e.strerror})") from e
    return fd, use_direct


def _pages(ptr: int, nbytes: int) -> tuple[int, int]:
    """(length, pad): the whole pages holding bytes [ptr, ptr + nbytes) span `length`
    bytes from ptr - pad."""
    pad = ptr % PAGE
    return round_up(pad + nbytes), pad


def _page_span(ptr: int, nbytes: int) -> tuple[ctypes.Array, int]:
    """Those pages as a buffer, and ptr's offset into the first one."""
    length, pad = _pages(ptr, nbytes)
    return (ctypes.c_char * length).from_address(ptr - pad), pad


class FileMemorySystem(MemorySystem):
    """DRAM + an arena file on local storage moved with direct I/O (``cpu+file``).

    Args:
        slow_dir: directory to put the arena in (a private subdirectory is made inside);
            default: $AUTOTM_SLOW_DIR, else the system temp dir.
        slow_capacity_bytes: a hard limit on slow bytes in use; None: until the disk is
            full.
        direct_io: None: O_DIRECT where the file system allows it, else buffered I/O with
            a warning; True: O_DIRECT or TierError; False: buffered I/O (tests).
        fast_cache_bytes: at most this much DRAM is kept in recycled read buffers.
        async_io: how asynchronous moves run: "aio" (Linux native AIO, needs direct I/O),
            "thread" (the I/O worker thread), None: AIO where available, else the thread.
    """

    name = "cpu+file"
    access = "staged"
    idle_sync_moves = True  # the compute thread waits for the device (it sleeps after SPIN_SECONDS)

    def __init__(self, slow_dir: str | None = None, slow_capacity_bytes: int | None = None,
                 *, direct_io: bool | None = None, fast_cache_bytes: int = 1 << 30,
                 async_io: str | None = None) -> None:
        if async_io not in (None, "aio", "thread"):
            raise ValueError(f"async_io must be 'aio', 'thread' or None, not {async_io!r}")
        super().__init__()
        self.fast_device = torch.device("cpu")
        base = default_slow_base_dir() if slow_dir is None else os.fspath(slow_dir)
        if os.path.isdir(base):
            remove_orphaned_dirs(base)
        self.directory = owned_private_dir(slow_dir, self._resources)
        try:
            self._fd, self._direct = _open_arena(self.directory, direct_io)
        except BaseException:
            self.close()  # removes the directory now, not when the traceback goes
            raise
        fd = self._fd
        self._resources.add(lambda: os.close(fd))
        self._alloc = ArenaAllocator(slow_capacity_bytes)
        self._lock = threading.Lock()
        self._live: dict[int, Extent] = {}  # id(extent) -> extent
        self._cache = _BufferCache(fast_cache_bytes)
        self._resources.add(self._cache.close)
        self._can_fallocate = True
        self._aio: linux_aio.AioContext | None = None
        if async_io != "thread" and self._direct:
            self._aio = linux_aio.open_context()
        if self._aio is not None:
            # released first (last added): what is in flight finishes before the file closes
            self._resources.add(self._aio.close)
        elif async_io == "aio":
            self.close()
            raise TierError("Linux AIO is not available here" + ("" if self._direct else
                            " (it needs direct I/O, which this directory refuses)"))

    # ---- inspection

    @property
    def direct_io(self) -> bool:
        """Whether the arena is read and written with O_DIRECT."""
        return self._direct

    def fileno(self) -> int:
        """The arena's file descriptor (the file itself is already unlinked)."""
        self._check_open()
        return self._fd

    def arena_bytes(self) -> int:
        """Size of the arena file (its high-water mark; freed extents are reused)."""
        return self._alloc.end

    def cached_fast_bytes(self) -> int:
        """DRAM held in recycled read buffers that no tensor uses now."""
        return self._cache.cached_bytes

    def release_cached(self) -> None:
        """Unmap the recycled read buffers."""
        self._cache.clear()

    def slow_bytes_in_use(self) -> int:
        return self._alloc.in_use

    @property
    def async_engine(self) -> str:
        """"aio" (Linux native AIO) or "thread" (the I/O worker): how async moves run."""
        return "aio" if self._aio is not None else "thread"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(read_into=True, read_cache=True, async_engine=self.async_engine)

    # ---- moves

    def to_slow(self, key: int, t: torch.Tensor) -> SlowHandle:
        self._check_open()
        if self._aio is not None:
            return self._polled(self._aio_to_slow(key, t))
        if t.device.type != "cpu":
            raise TierError(f"cpu+file moves CPU tensors, not {t.device} tensors")
        layout = TensorLayout.of(t)
        n = layout.storage_nbytes
        if n == 0:
            return self._empty_handle(key, layout)
        span, pad = _page_span(t.untyped_storage().data_ptr(), n)
        ext = self._allocate(len(span), pad)
        try:
            self._write(memoryview(span), ext.offset)
        except BaseException:
            self._release(ext)
            raise
        return SlowHandle.for_layout(key, ext.length, layout, ext)

    def _empty_handle(self, key: int, layout: TensorLayout) -> SlowHandle:
        ext = Extent(0, 0, 0)
        with self._lock:
            self._live[id(ext)] = ext
        return SlowHandle.for_layout(key, 0, layout, ext)

    def _polled(self, pending: Pending):
        """The result of a move this thread has just started and now waits for: with AIO,
        sync moves are queued and polled for like async ones (linux_aio.SPIN_SECONDS),
        which at 1 MiB is ~10-25 us sooner than a pwrite/pread that sleeps in the kernel
        until the device is done. A Ctrl-C lets the transfer end first, as a pwrite's
        would (its memory is in use until then); a finished write's extent is freed."""
        try:
            return pending.wait()
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):  # the Ctrl-C is what the caller must see
                result = pending.wait()
                if isinstance(result, SlowHandle):
                    self.free_slow(result)
            raise

    def read_span(self, h: SlowHandle) -> tuple[int, int]:
        """(bytes a read of `h` writes, offset of the tensor's bytes in them): a destination
        given to to_fast(h, into=...) must have that many bytes writable from a page boundary."""
        ext = self._extent_of(h)
        return ext.length, ext.pad

    def _check_into(self, into: torch.Tensor, ext: Extent, h: SlowHandle) -> None:
        """A caller's destination must be as read_span says: pad 0, page-aligned."""
        if ext.pad or into.data_ptr() % PAGE or into.untyped_storage().nbytes() != h.storage_nbytes:
            raise TierError(f"cannot read tensor {h.key} into the given destination: it must start on a "
                            f"page, hold {h.storage_nbytes} bytes, and the slow copy must have no pad")

    def _into(self, into: torch.Tensor, ext: Extent, h: SlowHandle) -> memoryview:
        """The read target for a caller's destination."""
        self._check_into(into, ext, h)
        return memoryview((ctypes.c_char * ext.length).from_address(into.data_ptr())).cast("B")

    def to_fast(self, h: SlowHandle, into: torch.Tensor | None = None) -> torch.Tensor:
        """As MemorySystem.to_fast; `into`: read into that uint8 tensor's storage instead of
        a buffer of this tier (see read_span)."""
        self._check_open()
        if self._aio is not None:
            return self._polled(self._aio_to_fast(h, into))
        ext = self._extent_of(h)
        n = h.storage_nbytes
        if n == 0:
            return _empty_tensor(h)
        if into is not None:
            self._read(self._into(into, ext, h), ext.offset)
            return tensor_on_bytes(into, h.layout)
        buf = self._cache.take(round_up(n) + PAGE, small=n < SMALL_READ_BYTES)  # room for any pad
        try:
            self._read(memoryview(buf)[:ext.length], ext.offset)
        except BaseException:
            self._cache.give(buf)
            raise
        return self._tensor_in(buf, ext, h)

    def read_range(self, h: SlowHandle, start: int, stop: int, buf: mmap.mmap) -> torch.Tensor:
        return file_read_range(self, h, start, stop, buf)

    def empty_slow(self, key: int, layout: TensorLayout) -> SlowHandle:
        self._check_open()
        if not layout.storage_nbytes:
            return self._empty_handle(key, layout)
        ext = self._allocate(round_up(layout.storage_nbytes), 0)
        return SlowHandle.for_layout(key, ext.length, layout, ext)

    def write_range(self, h: SlowHandle, start: int, buf: mmap.mmap, nbytes: int) -> None:
        file_write_range(self, h, start, buf, nbytes)

    def _tensor_in(self, buf: mmap.mmap, ext: Extent, h: SlowHandle) -> torch.Tensor:
        """The tensor of `h` over the read buffer `buf` (copied out of it when small)."""
        n = h.storage_nbytes
        try:
            if n >= SMALL_READ_BYTES:
                return self._tensor_over(buf, ext, h)
            u8 = torch.empty(n, dtype=torch.uint8)
            u8.copy_(torch.frombuffer(buf, dtype=torch.uint8, offset=ext.pad, count=n))
        except BaseException:
            self._cache.give(buf)
            raise
        self._cache.give(buf)
        return tensor_on_bytes(u8, h.layout)

    def _tensor_over(self, buf: mmap.mmap, ext: Extent, h: SlowHandle) -> torch.Tensor:
        """The tensor of `h` over `buf`, which goes back to the cache when the tensor's
        storage dies (on an error here it is the caller's still)."""
        view = memoryview(buf)
        u8 = torch.frombuffer(view, dtype=torch.uint8, offset=ext.pad, count=h.storage_nbytes)
        x = tensor_on_bytes(u8, h.layout)
        weakref.finalize(view, self._cache.give, buf).atexit = False
        return x

    # ---- asynchronous moves with Linux AIO

    def start_to_slow(self, key: int, t: torch.Tensor) -> Pending:
        if self._aio is None:
            return super().start_to_slow(key, t)
        self._check_open()
        return _failed_or(self._aio_to_slow, key, t)

    def start_to_fast(self, h: SlowHandle, into: torch.Tensor | None = None) -> Pending:
        if self._aio is None:
            return super().start_to_fast(h, into)
        self._check_open()
        return _failed_or(self._aio_to_fast, h, into)

    def _requests(self, op: int, addr: int, length: int, offset: int) -> list[tuple]:
        if length <= IO_CHUNK:
            return [(op, self._fd, addr, length, offset)]
        return [(op, self._fd, addr + i, min(IO_CHUNK, length - i), offset + i)
                for i in range(0, length, IO_CHUNK)]

    def _finish_io(self, results: list[tuple[int, float]], reqs: list[tuple], doing: str) -> None:
        """Check the completions of `reqs`; finish a short transfer synchronously (the
        caller keeps the requests' memory alive until this returns)."""
        for (res, _), (op, _fd, addr, n, off) in zip(results, reqs):
            if res < 0:
                raise self._error(OSError(-res, os.strerror(-res)), doing)
            if res < n:  # short: do the rest as a plain transfer (it reports why it stops)
                rest = memoryview((ctypes.c_char * (n - res)).from_address(addr + res)).cast("B")
                (self._write if op == linux_aio.IOCB_CMD_PWRITE else self._read)(rest, off + res)

    def _aio_to_slow(self, key: int, t: torch.Tensor) -> Pending:
        if t.device.type != "cpu":
            raise TierError(f"cpu+file moves CPU tensors, not {t.device} tensors")
        if t.layout != torch.strided:
            TensorLayout.of(t)  # raises the tier's error for it
        storage = t.untyped_storage()
        n = storage.nbytes()
        if n == 0:
            done = Pending()
            done._finish(self._empty_handle(key, TensorLayout.of(t)))
            return done
        # Only what io_submit needs comes before it; the rest (the layout, the handle) is
        # built while the device writes: at 1 MiB, that Python is 4 % of the move.
        ptr = storage.data_ptr()
        length, pad = _pages(ptr, n)
        ext = self._allocate(length, pad)
        reqs = self._requests(linux_aio.IOCB_CMD_PWRITE, ptr - pad, ext.length, ext.offset)
        try:
            tokens = self._aio.submit(reqs, keep=t)  # t's storage stays alive until written
        except BaseException as e:  # (a Ctrl-C too: nothing of it is in flight, submit drained it)
            self._release(ext)
            if isinstance(e, OSError):
                raise self._error(e, f"writing {n} bytes") from e
            raise
        try:
            handle = SlowHandle.for_layout(key, ext.length, TensorLayout.of(t), ext)
        except BaseException:  # a tensor the tier cannot hold: its write must end first
            self._aio.wait(tokens)
            self._release(ext)
            raise

        def complete(results, _source=t) -> SlowHandle:  # (holds t for a short write's rest)
            try:
                self._finish_io(results, reqs, f"writing {n} bytes")
            except BaseException:
                self._release(ext)
                raise
            return handle

        return AioPending(self._aio, tokens, complete)

    def _aio_to_fast(self, h: SlowHandle, into: torch.Tensor | None = None) -> Pending:
        ext = self._extent_of(h)
        n = h.storage_nbytes
        if n == 0:
            done = Pending()
            done._finish(_empty_tensor(h))
            return done
        if into is not None:
            return self._aio_into(h, ext, into)
        settle = self._read_started(h)  # free_slow(h) refuses until this is waited for
        buf = self._cache.take(round_up(n) + PAGE, small=n < SMALL_READ_BYTES)
        target = (ctypes.c_char * ext.length).from_buffer(buf)
        reqs = self._requests(linux_aio.IOCB_CMD_PREAD, ctypes.addressof(target), ext.length,
                              ext.offset)
        try:
            tokens = self._aio.submit(reqs, keep=(buf, target))
        except BaseException as e:
            del target
            self._cache.give(buf)
            settle()
            if isinstance(e, OSError):
                raise self._error(e, f"reading {n} bytes") from e
            raise
        # A large read's tensor over the buffer is built while the device reads (at
        # 1 MiB, building it after the read cost 5 % of the move); it is handed out only
        # once the read is complete. From here the buffer goes back to the cache with it.
        x = None
        if n >= SMALL_READ_BYTES:
            try:
                x = self._tensor_over(buf, ext, h)
            except BaseException:
                self._aio.wait(tokens)
                target = None
                self._cache.give(buf)
                settle()
                raise

        def complete(results) -> torch.Tensor:
            nonlocal target, x
            try:
                self._finish_io(results, reqs, f"reading {n} bytes")
            except BaseException:
                target = None
                if x is None:
                    self._cache.give(buf)
                x = None  # (its buffer goes back with it)
                raise
            finally:
                settle()
            target = None  # the buffer's export for the device's transfer ends here
            return x if x is not None else self._tensor_in(buf, ext, h)

        return AioPending(self._aio, tokens, complete)

    def _aio_into(self, h: SlowHandle, ext: Extent, into: torch.Tensor) -> Pending:
        self._check_into(into, ext, h)
        n = h.storage_nbytes
        settle = self._read_started(h)
        reqs = self._requests(linux_aio.IOCB_CMD_PREAD, into.data_ptr(), ext.length, ext.offset)
        try:
            tokens = self._aio.submit(reqs, keep=into)  # the destination stays alive until read
        except BaseException as e:
            settle()
            if isinstance(e, OSError):
                raise self._error(e, f"reading {n} bytes") from e
            raise

        def complete(results) -> torch.Tensor:
            try:
                self._finish_io(results, reqs, f"reading {n} bytes")
            finally:
                settle()
            return tensor_on_bytes(into, h.layout)

        return AioPending(self._aio, tokens, complete)

    def free_slow(self, h: SlowHandle) -> None:
        self._check_not_in_flight(h)
        ext = self._extent_of(h)
        self._release(ext)

    # ---- allocation

    def _allocate(self, length: int, pad: int) -> Extent:
        with self._lock:
            offset, grow = self._alloc.alloc(length)
            if grow:
                self._grow(self._alloc.end, grow)
                self._alloc.commit_growth(offset, length)
            ext = Extent(offset, length, pad)
            self._live[id(ext)] = ext
        return ext

    def _grow(self, start: int, nbytes: int) -> None:
        if not self._can_fallocate:
            return
        try:
            os.posix_fallocate(self._fd, start, nbytes)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self._can_fallocate = False  # the writes will extend the file
                return
            raise self._error(e, f"growing the slow file by {nbytes} bytes") from e

    def _release(self, ext: Extent) -> None:
        with self._lock:
            if self._live.pop(id(ext), None) is None:
                raise TierError("slow handle was already freed")
            if ext.length:
                self._alloc.free(ext.offset, ext.length)

    def _extent_of(self, h: SlowHandle) -> Extent:
        ext = h.location
        if not isinstance(ext, Extent) or self._live.get(id(ext)) is not ext:
            raise TierError(f"slow handle for tensor {h.key} is not live in this cpu+file "
                            "memory system (freed, or from another system)")
        return ext

    # ---- I/O

    def _write(self, data: memoryview, offset: int) -> None:
        fd, done, n = self._fd, 0, len(data)
        try:
            while done < n:
                k = os.pwrite(fd, data[done:done + IO_CHUNK], offset + done)
                if k <= 0:
                    raise OSError(errno.EIO, "short write")
                done += k
            if not self._direct:
                os.fdatasync(fd)
                os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            raise self._error(e, f"writing {n} bytes") from e

    def _read(self, data: memoryview, offset: int) -> None:
        fd, done, n = self._fd, 0, len(data)
        try:
            while done < n:
                k = os.preadv(fd, [data[done:done + IO_CHUNK]], offset + done)
                if k <= 0:
                    raise OSError(errno.EIO, "slow file is shorter than expected (truncated?)")
                done += k
            if not self._direct:
                os.posix_fadvise(fd, offset, n, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            raise self._error(e, f"reading {n} bytes") from e

    def _error(self, e: OSError, doing: str) -> TierError:
        if e.errno == errno.ENOSPC:
            try:
                st = os.statvfs(self.directory)
                free = f"{st.f_bavail * st.f_frsize} bytes free"
            except OSError:
                free = "free space unknown"
            return TierError(f"slow directory {self.directory!r} is full (no space left on "
                             f"device) while {doing}; {free}, {self._alloc.in_use} bytes "
                             "in use by autotm. Free space or use a larger slow_dir.")
        if e.errno == errno.EBADF:
            return TierError(f"the slow file of {self.directory!r} was closed underneath "
                             f"autotm while {doing}")
        return TierError(f"I/O error on the slow file in {self.directory!r} while {doing}: "
                         f"{e.strerror or e}")
