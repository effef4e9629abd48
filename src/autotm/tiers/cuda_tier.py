"""``cuda+host``: GPU memory as the fast tier, pinned host memory as the slow tier. Staged.

The paper's GPU experiment (reference §6): a smaller GPU is emulated by a budget on the
bytes the runtime holds on the device (the executor's own account, BudgetExceeded past
it); ``fast_capacity_bytes`` can in addition cap the CUDA caching allocator itself
(``torch.cuda.set_per_process_memory_fraction``), so that allocator overhead and library
workspaces count too, as on a real smaller GPU. Run reports carry the allocator's
allocated and reserved peaks (``run_meta``), reset when a session starts.

Streams and events (the ordering the plan's timeline needs, reference §6.1):

* **Synchronous moves** run on the caller's current stream (the compute stream): they
  are ordered after the kernel that produced the tensor and before every later kernel by
  the stream itself. The host does not block (cudaMemcpyAsync from pinned memory).
* **Asynchronous moves** run on one dedicated copy stream. ``start_to_*`` records an event
  on the compute stream and makes the copy stream wait for it, so the copy starts after
  every kernel launched so far (the tensor's producer included) and overlaps the kernel
  launched next: the one the plan names. ``Pending.wait()`` makes the compute stream wait
  for the copy's own event, so nothing launched after the wait reads or frees the data
  before the copy has landed; the host never blocks.
* **The caching allocator**: the device tensor a copy reads (evict) or writes (prefetch)
  is marked with ``record_stream(copy_stream)``, so its block is not handed out again
  while the copy stream may still use it. A prefetch's destination is allocated on the
  compute stream (where it will be used and freed) and the copy waits for the compute
  stream first, so the block's previous owner is done with it.
* **Pinned buffers** come from a pool (:class:`PinnedPool`, no cudaHostAlloc per move).
  Each buffer carries *fences*: the last event, per stream, of every copy that read or
  wrote it. A buffer handed out again is written only after its fences (the new writer's
  stream waits for them, or the host does for a host-side write), so freeing a slow handle
  whose read is still in flight is safe.

Never uses CUDA managed (unified) memory. Without a GPU, building the system raises
TierError; the pool and its bookkeeping are plain Python and are tested on the CPU.

Untested on a GPU when written: the CUDA paths were written against the documented torch
API (torch >= 2.4) on a machine without one; ``tests/runtime/test_cuda.py`` and
``benchmarks/gpu_check.sh`` exercise them where a GPU is present.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from autotm.tiers.base import (
    Capabilities,
    MemorySystem,
    Pending,
    SlowHandle,
    TensorLayout,
    TierError,
    storage_bytes,
    tensor_on_bytes,
)

NO_CUDA = "cuda+host needs a CUDA GPU; torch.cuda.is_available() is False"

DETERMINISTIC_CUBLAS = ":4096:8"
"""CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS; read when cuBLAS starts, so it is set
before this system touches the GPU (verification compares with eager PyTorch bit for bit)."""

MIN_CLASS = 4096


def size_class(nbytes: int) -> int:
    """The pinned buffer size serving `nbytes`: the next power of two, at least 4 KiB.

    torch's pinned-memory allocator rounds every block up to a power of two anyway, so
    these classes waste nothing more and a freed buffer serves any later storage of its
    class (the same sizes recur every iteration)."""
    if nbytes <= 0:
        return 0
    return max(MIN_CLASS, 1 << (nbytes - 1).bit_length())


@dataclass(eq=False)
class PinnedBuffer:
    """One pinned host buffer. `data` is a 1-d uint8 tensor of `size` bytes; `fences`
    maps a stream (its handle) to the last event of a copy on it that used the buffer."""

    data: torch.Tensor
    size: int
    fences: dict[int, Any] = field(default_factory=dict)


class PinnedPool:
    """Pinned host buffers by size class, given back on free and reused.

    Args:
        allocate: allocate(size) -> 1-d uint8 tensor of `size` bytes (pinned memory on a
            GPU machine; any host memory in tests).
        capacity_bytes: a hard limit on bytes held by live handles (TierError past it);
            None: until allocation fails.
    """

    def __init__(self, allocate: Callable[[int], torch.Tensor], capacity_bytes: int | None = None) -> None:
        self._allocate = allocate
        self.capacity_bytes = capacity_bytes
        self.in_use_bytes = 0  # in buffers handed out
        self.cached_bytes = 0  # in free buffers kept for reuse
        self.allocations = 0  # calls of allocate (pinned allocations made)
        self._free: dict[int, list[PinnedBuffer]] = {}
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """All pinned bytes this pool holds: in use plus cached."""
        return self.in_use_bytes + self.cached_bytes

    def take(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least `nbytes` (its class): a cached one, else a new one. Its
        fences still hold: the caller waits for them before writing it."""
        size = size_class(nbytes)
        with self._lock:
            if self.capacity_bytes is not None and self.in_use_bytes + size > self.capacity_bytes:
                raise TierError(f"slow tier capacity exceeded: {self.in_use_bytes} bytes in use + {size} "
                                f"requested > slow_capacity_bytes={self.capacity_bytes}")
            stack = self._free.get(size)
            if stack:
                buf = stack.pop()
                self.cached_bytes -= size
                self.in_use_bytes += size
                return buf
            self.in_use_bytes += size  # reserved before allocating, outside the lock
        try:
            data = self._allocate(size)
        except BaseException as e:
            with self._lock:
                self.in_use_bytes -= size
            if isinstance(e, RuntimeError):  # cudaHostAlloc failed: out of pinnable host memory
                raise TierError(f"cannot allocate {size} bytes of pinned host memory ({e}); "
                                f"{self.held_bytes} bytes held by autotm. Lower the slow bytes or "
                                "raise the locked-memory limit (ulimit -l).") from e
            raise
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() < size:
            with self._lock:
                self.in_use_bytes -= size
            raise AssertionError(f"allocate({size}) returned {data.dtype}{list(data.shape)}")
        with self._lock:
            self.allocations += 1
        return PinnedBuffer(data, size)

    def give(self, buf: PinnedBuffer) -> None:
        """Return a buffer (with its fences) for reuse."""
        with self._lock:
            self.in_use_bytes -= buf.size
            self.cached_bytes += buf.size
            self._free.setdefault(buf.size, []).append(buf)

    def clear(self) -> list[PinnedBuffer]:
        """Forget the cached buffers; returns them (their fences may still be pending)."""
        with self._lock:
            bufs = [b for stack in self._free.values() for b in stack]
            self._free.clear()
            self.cached_bytes = 0
        return bufs


@dataclass(eq=False)
class HostSlot:
    """Where one slow storage lives: its pinned buffer (None for an empty storage) and the
    event after which its bytes are there (None: written by the host, already there)."""

    buffer: PinnedBuffer | None
    written: Any = None


class CudaPending(Pending):
    """An asynchronous move on the copy stream. ``wait()`` makes the caller's current
    stream wait for the copy (the host does not block) and returns its result;
    ``done()`` asks whether the copy has finished. ``seconds()`` is the copy's duration
    on the copy stream, when it was started with timing events."""

    __slots__ = ("_done_event", "_start_event", "_device")

    def __init__(self, result: Any, done_event: Any = None, start_event: Any = None,
                 device: torch.device | None = None) -> None:
        super().__init__()
        self._done_event = done_event
        self._start_event = start_event
        self._device = device
        self._finish(result)

    def done(self) -> bool:
        return self._done_event is None or bool(self._done_event.query())

    def wait(self, timeout: float | None = None) -> Any:
        if self._done_event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._done_event)
        return super().wait(timeout)

    def seconds(self) -> float:
        """Seconds from the copy's start to its end (synchronizes with the copy)."""
        if self._start_event is None or self._done_event is None:
            raise TierError("this move was not started with timing events")
        self._done_event.synchronize()
        return self._start_event.elapsed_time(self._done_event) / 1e3


def _event(stream: Any, timing: bool = False):
    """A CUDA event recorded on `stream` now."""
    ev = torch.cuda.Event(enable_timing=timing)
    ev.record(stream)
    return ev


class CudaHostMemorySystem(MemorySystem):
    """GPU memory + pinned host memory (``cuda+host``).

    Args:
        device: the GPU (default: the current CUDA device).
        slow_capacity_bytes: a hard limit on pinned bytes held by live handles.
        fast_capacity_bytes: if given, the CUDA caching allocator may reserve at most this
            many bytes of the device (an emulated smaller GPU); allocations past it raise
            torch.OutOfMemoryError. Restored when the system closes. None: the whole GPU.
    """

    name = "cuda+host"
    access = "staged"

    def __init__(self, device: str | torch.device | int | None = None, slow_capacity_bytes: int | None = None,
                 fast_capacity_bytes: int | None = None) -> None:
        if not torch.cuda.is_available():
            raise TierError(NO_CUDA)
        # before the first cuBLAS call of the process, or it has no effect (see verify.py)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS)
        if device is None:
            device = torch.cuda.current_device()
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type != "cuda":
            raise TierError(f"cuda+host needs a CUDA device, not {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        super().__init__()
        self.fast_device = dev
        self.device = dev
        self.device_name = torch.cuda.get_device_name(dev)
        self.copy_stream = torch.cuda.Stream(device=dev)
        self._pool = PinnedPool(lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True), slow_capacity_bytes)
        self._live: dict[int, HostSlot] = {}
        self._lock = threading.Lock()
        pool = self._pool
        self._resources.add(lambda: _release_pool(pool, dev))
        self.fast_capacity_bytes = fast_capacity_bytes
        if fast_capacity_bytes is not None:
            total = torch.cuda.get_device_properties(dev).total_memory
            if not 0 < fast_capacity_bytes <= total:
                self.close()
                raise TierError(f"fast_capacity_bytes={fast_capacity_bytes} is not within the GPU's "
                                f"{total} bytes")
            torch.cuda.set_per_process_memory_fraction(fast_capacity_bytes / total, dev)
            self._resources.add(lambda: torch.cuda.set_per_process_memory_fraction(1.0, dev))

    # ---- inspection

    def slow_bytes_in_use(self) -> int:
        return self._pool.in_use_bytes

    def pinned_bytes(self) -> int:
        """Pinned host memory held: by live handles and cached for reuse."""
        return self._pool.held_bytes

    def compute_stream(self):
        """The caller's current stream on the device: where kernels and sync moves run."""
        return torch.cuda.current_stream(self.fast_device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.fast_device)

    def reset_device_peaks(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.fast_device)

    def run_meta(self) -> dict:
        """The device's allocator peaks since `reset_device_peaks`, and pinned memory."""
        d = self.fast_device
        return {
            "device": self.device_name,
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(d)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(d)),
            "pinned_bytes": int(self._pool.held_bytes),
            "pinned_allocations": int(self._pool.allocations),
            "fast_capacity_bytes": self.fast_capacity_bytes,
            # kernels run asynchronously: the executor's per-kernel host clock sees launches
            "kernel_seconds": "host launch time",
        }

    # ---- synchronous moves (the compute stream)

    def to_slow(self, key: int, t: torch.Tensor) -> SlowHandle:
        self._check_open()
        layout = TensorLayout.of(t)
        n = layout.storage_nbytes
        if n == 0:
            return self._handle(key, layout, HostSlot(None))
        self._check_device(t)
        buf = self._pool.take(n)
        try:
            dst, src = buf.data[:n], storage_bytes(t)
            if t.device.type == "cpu":  # a host copy: wait until no copy uses the buffer
                for ev in buf.fences.values():
                    ev.synchronize()
                buf.fences.clear()
                dst.copy_(src)
                written = None
            else:
                stream = self.compute_stream()
                for ev in buf.fences.values():
                    stream.wait_event(ev)
                dst.copy_(src, non_blocking=True)
                written = _event(stream)
                buf.fences = {stream.cuda_stream: written}
        except BaseException:
            self._pool.give(buf)
            raise
        return self._handle(key, layout, HostSlot(buf, written))

    def to_fast(self, h: SlowHandle) -> torch.Tensor:
        self._check_open()
        slot = self._slot_of(h)
        n = h.storage_nbytes
        if n == 0:
            return tensor_on_bytes(torch.empty(0, dtype=torch.uint8, device=self.fast_device), h.layout)
        stream = self.compute_stream()
        dst = torch.empty(n, dtype=torch.uint8, device=self.fast_device)
        if slot.written is not None:
            stream.wait_event(slot.written)
        dst.copy_(slot.buffer.data[:n], non_blocking=True)
        slot.buffer.fences[stream.cuda_stream] = _event(stream)
        return tensor_on_bytes(dst, h.layout)

    def free_slow(self, h: SlowHandle) -> None:
        """Release `h`. Safe while a copy of it is in flight: its buffer is written again
        only after the buffer's fences."""
        slot = self._slot_of(h)
        with self._lock:
            self._live.pop(id(slot), None)
        if slot.buffer is not None:
            self._pool.give(slot.buffer)

    # ---- asynchronous moves (the copy stream)

    def start_to_slow(self, key: int, t: torch.Tensor) -> Pending:
        return self._start_to_slow(key, t)

    def start_to_fast(self, h: SlowHandle) -> Pending:
        return self._start_to_fast(h)

    def _start_to_slow(self, key: int, t: torch.Tensor, timing: bool = False) -> CudaPending:
        self._check_open()
        if t.device.type == "cpu" or t.untyped_storage().nbytes() == 0:
            return CudaPending(self.to_slow(key, t))  # nothing on the device to overlap
        self._check_device(t)
        layout = TensorLayout.of(t)
        n = layout.storage_nbytes
        buf = self._pool.take(n)
        try:
            copy = self.copy_stream
            copy.wait_event(_event(self.compute_stream()))  # after t's producer
            for ev in buf.fences.values():
                copy.wait_event(ev)
            start = _event(copy, timing) if timing else None
            with torch.cuda.stream(copy):
                buf.data[:n].copy_(storage_bytes(t), non_blocking=True)
            t.record_stream(copy)  # its block is not reused while the copy reads it
            done = _event(copy, timing)
            buf.fences = {copy.cuda_stream: done}
        except BaseException:
            self._pool.give(buf)
            raise
        return CudaPending(self._handle(key, layout, HostSlot(buf, done)), done, start, self.fast_device)

    def _start_to_fast(self, h: SlowHandle, timing: bool = False) -> CudaPending:
        self._check_open()
        slot = self._slot_of(h)
        n = h.storage_nbytes
        if n == 0:
            return CudaPending(self.to_fast(h))
        copy = self.copy_stream
        # allocated on the compute stream, where it is used and freed; the copy waits for
        # that stream so the block's previous owner is done with it
        dst = torch.empty(n, dtype=torch.uint8, device=self.fast_device)
        copy.wait_event(_event(self.compute_stream()))
        if slot.written is not None:
            copy.wait_event(slot.written)
        start = _event(copy, timing) if timing else None
        with torch.cuda.stream(copy):
            dst.copy_(slot.buffer.data[:n], non_blocking=True)
        dst.record_stream(copy)
        done = _event(copy, timing)
        slot.buffer.fences[copy.cuda_stream] = done
        return CudaPending(tensor_on_bytes(dst, h.layout), done, start, self.fast_device)

    # ---- profiling

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(device_timed_moves=True)

    def move_seconds(self, t: torch.Tensor, load_kernels: int = 8) -> dict[tuple[str, str], float]:
        """Seconds of each move of `t`'s bytes, timed with CUDA events: sync moves on the
        compute stream, async moves on the copy stream while the compute stream runs
        `load_kernels` matmuls (as the kernel they overlap will)."""
        dev = self.fast_device
        x = t.to(dev)
        load = torch.randn(1024, 1024, device=dev)
        stream = self.compute_stream()
        out: dict[tuple[str, str], float] = {}
        # untimed first, so that the pool's buffer and the allocator's blocks for this size
        # exist (the host allocating them would leave the GPU idle between the events)
        h = self.to_slow(-1, x)
        back = self.to_fast(h)
        self.free_slow(h)
        del back
        self.synchronize()
        s0 = _event(stream, True)
        h = self.to_slow(-1, x)
        s1 = _event(stream, True)
        f0 = _event(stream, True)
        back = self.to_fast(h)
        f1 = _event(stream, True)
        self.free_slow(h)
        del back
        p = self._start_to_slow(-1, x, timing=True)
        for _ in range(load_kernels):
            torch.mm(load, load)
        h = p.wait()
        q = self._start_to_fast(h, timing=True)
        for _ in range(load_kernels):
            torch.mm(load, load)
        back = q.wait()
        self.synchronize()
        out[("to_slow", "sync")] = s0.elapsed_time(s1) / 1e3
        out[("to_fast", "sync")] = f0.elapsed_time(f1) / 1e3
        out[("to_slow", "async")] = p.seconds()
        out[("to_fast", "async")] = q.seconds()
        self.free_slow(h)
        del back
        return out

    # ---- bookkeeping

    def _handle(self, key: int, layout: TensorLayout, slot: HostSlot) -> SlowHandle:
        with self._lock:
            self._live[id(slot)] = slot
        nbytes = slot.buffer.size if slot.buffer is not None else 0
        return SlowHandle.for_layout(key, nbytes, layout, slot)

    def _slot_of(self, h: SlowHandle) -> HostSlot:
        slot = h.location
        if not isinstance(slot, HostSlot) or self._live.get(id(slot)) is not slot:
            raise TierError(f"slow handle for tensor {h.key} is not live in this cuda+host memory system "
                            "(freed, or from another system)")
        return slot

    def _check_device(self, t: torch.Tensor) -> None:
        if t.device.type == "cpu" or t.device == self.fast_device:
            return
        raise TierError(f"cuda+host on {self.fast_device} moves tensors of that device (or the CPU), "
                        f"not {t.device} tensors")


def _release_pool(pool: PinnedPool, device: torch.device) -> None:
    """On close: let every copy finish, then drop the cached pinned buffers."""
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:  # CUDA already torn down at interpreter exit
        pass
    pool.clear()
