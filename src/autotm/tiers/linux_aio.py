"""Linux native asynchronous I/O (io_submit / io_getevents) for the file tier, by syscall.

Why not a worker thread: on a machine whose cores are all busy with a kernel's threads, a
Python I/O thread waits for a core (and for the GIL) before each copy starts and again
before it is marked finished. Measured on the 2-core machine here, with a 2-thread matmul
running, a 1 MiB asynchronous write through the thread ran at 0.05-0.3 GB/s instead of
1.3 GB/s, and even with nothing running the hand-off cost 87 us per copy. With O_DIRECT,
``io_submit`` queues the transfer to the block device from the calling thread and returns;
the device does the work while the kernel runs, and the caller collects the completion
with ``io_getevents`` afterwards: no thread, no GIL, no scheduling.

:class:`AioContext` is one kernel AIO context: ``submit`` takes (opcode, fd, address,
length, offset) requests and returns tokens; ``wait(tokens)`` blocks until they are
complete and returns each one's result (bytes transferred, or -errno). The caller keeps
the memory behind each request alive and unchanged until it completes; the context also
holds a reference to the objects passed as ``keep`` until then.

Only O_DIRECT descriptors are really asynchronous (buffered AIO runs synchronously in
io_submit), so the file tier uses this only with direct I/O. :func:`open_context` returns
None where AIO is missing (another OS, a seccomp filter, a full aio-max-nr): the tier then
falls back to its I/O thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import threading
import time
from typing import Any

IOCB_CMD_PREAD = 0
IOCB_CMD_PWRITE = 1

# A waiter polls for completions this long before it sleeps in io_getevents: waking a
# sleeping thread when the device finishes cost a 1 MiB move ~10 us here (a blocking
# wait 224 us, a polled one 214 us, a plain pwrite 217 us). The waiter is the compute
# thread with nothing else to do, and most waits are for a copy about to finish (it
# overlapped a kernel); a long one sleeps after 1 ms.
SPIN_SECONDS = 1e-3

# (io_setup, io_destroy, io_getevents, io_submit)
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
    "arm64": (0, 1, 4, 2),
}


class _Iocb(ctypes.Structure):
    # struct iocb from <linux/aio_abi.h>, little-endian field order
    _fields_ = [("aio_data", ctypes.c_uint64), ("aio_key", ctypes.c_uint32),
                ("aio_rw_flags", ctypes.c_int32), ("aio_lio_opcode", ctypes.c_uint16),
                ("aio_reqprio", ctypes.c_int16), ("aio_fildes", ctypes.c_uint32),
                ("aio_buf", ctypes.c_uint64), ("aio_nbytes", ctypes.c_uint64),
                ("aio_offset", ctypes.c_int64), ("aio_reserved2", ctypes.c_uint64),
                ("aio_flags", ctypes.c_uint32), ("aio_resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64),
                ("res", ctypes.c_int64), ("res2", ctypes.c_int64)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _timespec(seconds: float) -> _Timespec:
    return _Timespec(int(seconds), int((seconds % 1) * 1e9))


class AioContext:
    """One kernel AIO context with room for `depth` requests in flight. Thread-safe."""

    def __init__(self, depth: int = 256) -> None:
        nums = _SYSCALLS.get(platform.machine())
        if sys.platform != "linux" or nums is None or sys.byteorder != "little":
            raise OSError(errno.ENOSYS, "Linux AIO is supported on little-endian x86_64 and aarch64 Linux")
        self._setup, self._destroy, self._getevents, self._submit = nums
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        # typed entry points for the two calls of every move: ctypes converts the
        # arguments in C (a move's own Python time is what a 1 MiB copy loses to it)
        long, ulong, ptr = ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p
        self._io_submit = ctypes.CFUNCTYPE(long, long, ulong, long, ptr, use_errno=True)(
            ("syscall", self._libc))
        self._io_getevents = ctypes.CFUNCTYPE(long, long, ulong, long, long, ptr, ptr,
                                              use_errno=True)(("syscall", self._libc))
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, ctypes.c_long(depth), ctypes.byref(self._ctx)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"io_setup: {os.strerror(e)}")
        self._ctx_id = self._ctx.value
        self.depth = depth
        self._lock = threading.Lock()
        self._next = 1
        self._flight: dict[int, tuple[_Iocb, Any]] = {}  # token -> (iocb, what must stay alive)
        self._results: dict[int, tuple[int, float]] = {}  # token -> (res, perf_counter when reaped)
        self._events = (_IoEvent * depth)()
        self._events_at = ctypes.addressof(self._events)
        self._pointers = (ctypes.c_void_p * depth)()  # the iocb pointers handed to io_submit
        self._pointers_at = ctypes.addressof(self._pointers)
        self._timeouts = {t: _timespec(t) for t in (0.0, 0.1)}  # the ones every wait uses
        self._closed = False

    # ---- submission

    def submit(self, requests: list[tuple[int, int, int, int, int]], keep: Any = None) -> list[int]:
        """Queue `requests`, each (opcode, fd, address, nbytes, offset); returns one token
        per request. `keep` is referenced until the last of them completes."""
        tokens = []
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the AIO context is closed")
            cbs = []
            try:
                for op, fd, addr, n, off in requests:
                    tok = self._next
                    self._next += 1
                    tokens.append(tok)
                    cb = _Iocb(aio_data=tok, aio_lio_opcode=op, aio_fildes=fd, aio_buf=addr,
                               aio_nbytes=n, aio_offset=off)
                    self._flight[tok] = (cb, keep)
                    cbs.append(cb)
                self._submit_all(cbs)
            except BaseException:
                for tok in tokens:  # never submitted (a partial submit reaps the rest first)
                    self._flight.pop(tok, None)
                raise
        return tokens

    def _submit_all(self, cbs: list[_Iocb]) -> None:
        i = 0
        try:
            while i < len(cbs):
                chunk = cbs[i:i + self.depth]
                for j, c in enumerate(chunk):
                    self._pointers[j] = ctypes.addressof(c)
                r = self._io_submit(self._submit, self._ctx_id, len(chunk), self._pointers_at)
                if r > 0:
                    i += r
                    continue
                e = ctypes.get_errno() if r < 0 else errno.EAGAIN
                if e in (errno.EAGAIN, errno.EINTR):
                    self._reap(1, 0.1)  # the ring is full: make room
                    continue
                raise OSError(e, f"io_submit: {os.strerror(e)}")
        except BaseException:  # an error or a Ctrl-C: what was queued must finish before its memory can go
            if i:
                self._drain(cbs[:i])
            raise

    # ---- completion

    def _reap(self, min_nr: int, timeout: float | None) -> int:
        """Collect completions (the lock is held). Returns how many."""
        ts = None
        if timeout is not None:
            ts = self._timeouts.get(timeout) or _timespec(timeout)
        r = self._io_getevents(self._getevents, self._ctx_id, min_nr, self.depth, self._events_at,
                               ctypes.addressof(ts) if ts is not None else None)
        now = time.perf_counter()
        if r < 0:
            e = ctypes.get_errno()
            if e == errno.EINTR:
                return 0
            raise OSError(e, f"io_getevents: {os.strerror(e)}")
        events = self._events
        for k in range(r):
            ev = events[k]
            tok = ev.data
            self._flight.pop(tok, None)
            self._results[tok] = (ev.res, now)
        return r

    def _drain(self, cbs: list[_Iocb]) -> None:
        want = {int(c.aio_data) for c in cbs}
        while not want.issubset(self._results):
            self._reap(1, 0.1)
        for tok in want:
            self._results.pop(tok, None)

    def done(self, tokens: list[int]) -> bool:
        """Whether every request in `tokens` has completed (polls the kernel, never blocks)."""
        with self._lock:
            if all(t in self._results for t in tokens):
                return True
            self._reap(0, 0.0)
            return all(t in self._results for t in tokens)

    def wait(self, tokens: list[int], timeout: float | None = None, forget: bool = True) -> list[tuple[int, float]]:
        """Block until every request in `tokens` has completed; returns (result, time it was
        collected) per token and forgets them (with `forget`; else forget(tokens) does, so
        a caller interrupted before it used them can wait again). Raises TimeoutError after
        `timeout` seconds. Polls for the first SPIN_SECONDS before it sleeps in the kernel."""
        now = time.perf_counter()
        deadline = None if timeout is None else now + timeout
        spin_until = now + SPIN_SECONDS
        while True:
            with self._lock:
                if all(t in self._results for t in tokens):
                    got = [self._results[t] for t in tokens]
                    if forget:
                        for t in tokens:
                            self._results.pop(t, None)
                    return got
                now = time.perf_counter()
                if deadline is not None and now >= deadline:
                    raise TimeoutError(f"asynchronous I/O not finished after {timeout} s")
                if now < spin_until:
                    self._reap(0, 0.0)
                else:
                    # short sleeps in the kernel, so a Ctrl-C is seen within 0.1 s
                    self._reap(1, 0.1)

    def forget(self, tokens: list[int]) -> None:
        """Drop the completions of `tokens` (after wait(..., forget=False))."""
        with self._lock:
            for t in tokens:
                self._results.pop(t, None)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._flight)

    # ---- lifetime

    def close(self, timeout: float = 60.0) -> bool:
        """Wait for every request in flight (their memory is still in use), then destroy
        the context. Returns False if some did not finish within `timeout` seconds."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            deadline = time.perf_counter() + timeout
            while self._flight and time.perf_counter() < deadline:
                self._reap(1, 0.1)
            finished = not self._flight
            self._syscall(self._destroy, self._ctx)  # also waits for what is left
            self._flight.clear()
            self._results.clear()
        return finished


def open_context(depth: int = 256) -> AioContext | None:
    """A new AIO context, or None where this machine does not offer Linux AIO."""
    try:
        return AioContext(depth)
    except (OSError, AttributeError):
        return None
