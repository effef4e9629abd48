"""The memory-system interface: a fast tier, a slow tier, and moves between them.

Every memory system (``cpu+file``, ``cpu+mmap``, ``cpu+numa``, ``cuda+host``)
implements :class:`MemorySystem`. A tensor here is one *storage*: a move carries the whole
storage as raw bytes, and the :class:`SlowHandle` records dtype, shape, stride and storage
offset, so any strided tensor (a non-contiguous view, a 0-dim tensor, an empty one)
comes back bit for bit with the same layout.

Moves are synchronous (``to_slow``, ``to_fast``: on the calling thread) or asynchronous
(``start_to_slow``, ``start_to_fast``: on the system's one background I/O worker thread;
``Pending.wait()`` returns the result or re-raises the worker's error). Asynchronous moves
overlap one kernel: the caller starts them before the kernel and waits right after it.

Access models (docs/architecture.md): *staged* systems only move whole tensors
(``slow_view`` is None, ``alloc_slow`` raises NotImplementedError); *direct* systems also
let kernels read and write slow memory in place through ``slow_view`` and ``alloc_slow``.
"""

from __future__ import annotations

import atexit
import os
import queue
import tempfile
import threading
import time
import warnings
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

import torch

from autotm.errors import TierError
from autotm.ir.layout import PAGE

MEMORY_SYSTEM_NAMES = ("cpu+file", "cpu+mmap", "cpu+numa", "cuda+host")


def round_up(n: int, multiple: int = PAGE) -> int:
    return -(-n // multiple) * multiple


# ----------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class TensorLayout:
    """How a strided tensor sits in its storage: enough to rebuild it from the bytes."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # in elements of dtype, as torch counts it
    storage_nbytes: int

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorLayout":
        """The layout of `t` (any device, including ``meta``). Raises TierError for
        tensors whose bytes alone do not determine their value (sparse, quantized,
        lazily conjugated or negated)."""
        if t.layout != torch.strided:
            raise TierError(f"only strided tensors can be moved between tiers, not {t.layout}")
        if t.is_quantized:
            raise TierError(f"quantized tensors ({t.dtype}) are not supported by memory tiers")
        if t.is_conj() or t.is_neg():
            raise TierError(
                "tensor has a lazy conjugate/negative bit; call resolve_conj()/resolve_neg() "
                "before moving it"
            )
        return cls(
            dtype=t.dtype,
            shape=tuple(t.shape),
            stride=tuple(t.stride()),
            storage_offset=t.storage_offset(),
            storage_nbytes=t.untyped_storage().nbytes(),
        )


@dataclass(frozen=True)
class SlowHandle:
    """A tensor's storage held in slow memory.

    ``nbytes`` is the slow memory the handle occupies (the storage's bytes rounded up to
    the tier's granularity): the sum over live handles is ``slow_bytes_in_use()``.
    ``location`` is the backend's own record (a file extent, a mapped region), opaque to
    callers. ``storage_offset`` and ``stride`` count elements of ``dtype``.
    """

    key: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_nbytes: int
    location: Any

    @property
    def layout(self) -> TensorLayout:
        return TensorLayout(self.dtype, self.shape, self.stride, self.storage_offset,
                            self.storage_nbytes)

    @classmethod
    def for_layout(cls, key: int, nbytes: int, layout: TensorLayout, location: Any) -> "SlowHandle":
        return cls(key, nbytes, layout.dtype, layout.shape, layout.stride,
                   layout.storage_offset, layout.storage_nbytes, location)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-d uint8 tensor over all of `t`'s storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def tensor_on_bytes(u8: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    """The tensor with `layout` over the storage of the 1-d uint8 tensor `u8`, which must
    start at its storage's beginning and hold ``layout.storage_nbytes`` bytes."""
    storage = u8.untyped_storage()
    if storage.nbytes() != layout.storage_nbytes:
        raise AssertionError(f"storage holds {storage.nbytes()} bytes, layout wants "
                             f"{layout.storage_nbytes}")
    return torch.empty(0, dtype=layout.dtype, device=u8.device).set_(
        storage, layout.storage_offset, layout.shape, layout.stride)


# ------------------------------------------------------------------- async machinery


class Pending:
    """The result of an asynchronous move. ``wait()`` blocks until the worker has done
    it, then returns the SlowHandle (``start_to_slow``) or tensor (``start_to_fast``),
    or re-raises the error the worker met."""

    __slots__ = ("_event", "_result", "_error", "finished_at")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self.finished_at: float | None = None  # time.perf_counter() when the worker finished

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"asynchronous move not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self.finished_at = time.perf_counter()
        self._event.set()


class IOWorker:
    """One daemon thread running submitted jobs in order (first in, first out)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(target=self._run, args=(self._queue,), name=name,
                                        daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        pending = Pending()
        if self._closing:
            pending._finish(error=TierError("the memory system is closed"))
        else:
            self._queue.put((fn, args, pending))
        return pending

    def _run(self, q: queue.SimpleQueue) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            fn, args, pending = item
            if self._closing:
                pending._finish(error=TierError("the memory system was closed before this "
                                                "asynchronous move ran"))
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the waiter, never lost in the thread
                pending._finish(error=e)
            else:
                pending._finish(result)
            del item, fn, args, pending

    def close(self, timeout: float = 60.0) -> bool:
        """Cancel queued jobs, let the running one finish, stop the thread. Returns False
        if the running job did not finish within `timeout` seconds."""
        self._closing = True
        self._queue.put(None)
        if self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Resources:
    """Cleanup actions for one memory system, run once, last registered first.

    Runs on ``close()``, when the system is garbage-collected, and at interpreter exit
    (also after Ctrl-C). Holds no reference to the system itself. If a cleanup is
    interrupted (a second KeyboardInterrupt), the remaining actions still run at exit.
    """

    def __init__(self) -> None:
        self._actions: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        atexit.register(self.release)

    def add(self, action: Callable[[], None]) -> None:
        with self._lock:
            self._actions.append(action)

    def release(self) -> None:
        with self._lock:
            while self._actions:
                action = self._actions.pop()
                try:
                    action()
                except Exception as e:  # cleanup must go on; say what was left
                    warnings.warn(f"autotm tier cleanup failed: {e!r}", RuntimeWarning,
                                  stacklevel=2)
            atexit.unregister(self.release)


# -------------------------------------------------------------------- slow directory


def _mount_fs_type(path: str) -> str | None:
    """File system type of the mount holding `path` (from /proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return None
    path = os.path.realpath(path)
    best, fstype = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mnt = fields[4].encode().decode("unicode_escape")
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, right.split()[0]
    return fstype


RAM_FILESYSTEMS = ("tmpfs", "ramfs")


def default_slow_base_dir() -> str:
    """$AUTOTM_SLOW_DIR, else the system temp dir if it is on storage, else /var/tmp."""
    env = os.environ.get("AUTOTM_SLOW_DIR")
    if env:
        return env
    tmp = tempfile.gettempdir()
    if _mount_fs_type(tmp) in RAM_FILESYSTEMS and os.path.isdir("/var/tmp") \
            and _mount_fs_type("/var/tmp") not in RAM_FILESYSTEMS:
        return "/var/tmp"
    return tmp


def make_private_dir(base: str | None, prefix: str, resources: Resources) -> str:
    """Create a new directory under `base` (default: :func:`default_slow_base_dir`) that
    `resources` removes on release. Raises TierError naming the problem."""
    base = default_slow_base_dir() if base is None else os.fspath(base)
    if not os.path.exists(base):
        raise TierError(f"slow directory {base!r} does not exist; create it, or pass another "
                        "slow_dir (or set AUTOTM_SLOW_DIR)")
    if not os.path.isdir(base):
        raise TierError(f"slow directory {base!r} is not a directory")
    try:
        path = tempfile.mkdtemp(prefix=prefix, dir=base)
    except OSError as e:
        raise TierError(f"slow directory {base!r} is not writable (creating a directory in "
                        f"it failed: {e.strerror}); pass a writable slow_dir on local storage "
                        "(or set AUTOTM_SLOW_DIR)") from e

    def remove() -> None:
        import shutil
        shutil.rmtree(path, ignore_errors=True)

    resources.add(remove)
    return path


# ------------------------------------------------------------------------- interface


@dataclass(frozen=True)
class Capabilities:
    """What a memory system offers beyond the interface every one implements. Callers read
    these (``memory.capabilities``) instead of probing for methods.

    Attributes:
        read_into: ``to_fast(h, into=)`` reads into a caller's destination laid out as
            ``read_span(h)`` says (cpu+file); the executor reads prefetches straight into
            the plan's arena.
        read_cache: the system keeps idle read buffers in fast memory:
            ``cached_fast_bytes()`` counts them, ``release_cached()`` unmaps them (cpu+file);
            the executor counts them against the budget.
        async_engine: how asynchronous moves run when the system says: ``"aio"`` (Linux
            native AIO) or ``"thread"`` (the I/O worker); None: the base I/O worker.
        device_timed_moves: ``move_seconds(t)`` measures the moves on the device itself
            (cuda+host); the profiler then needs no move fits of its own.

    ``read_span`` and ``move_seconds`` are defined only by the systems whose capability
    says so (read_into, device_timed_moves): callers read the flag, never probe the method.
    """

    read_into: bool = False
    read_cache: bool = False
    async_engine: str | None = None
    device_timed_moves: bool = False


class MemorySystem(ABC):
    """A fast tier, a slow tier and the moves between them.

    Attributes:
        name: the memory system's name, e.g. ``"cpu+file"``.
        access: ``"staged"`` (kernels only touch fast memory) or ``"direct"`` (kernels
            may read and write slow memory in place).
        fast_device: the torch device of the fast tier.
        idle_sync_moves: a sync move leaves the compute thread idle, waiting on a device
            (the file tier's direct I/O); the profiler then measures what the kernels
            right after one lose (CostModel.wake_seconds).
        capabilities: what it offers beyond this interface (Capabilities).

    Use as a context manager, or call ``close()``: it removes every file the system
    created (it also runs when the object is garbage-collected and at interpreter exit).
    """

    name: str
    access: Literal["staged", "direct"]
    fast_device: torch.device
    idle_sync_moves: bool = False

    def __init__(self) -> None:
        self._resources = Resources()
        weakref.finalize(self, self._resources.release).atexit = False
        self._worker: IOWorker | None = None
        self._worker_lock = threading.Lock()
        self._closed = False
        self._in_flight: dict[int, int] = {}  # id(location) -> async reads running
        self._in_flight_lock = threading.Lock()

    # ---- synchronous moves

    @abstractmethod
    def to_slow(self, key: int, t: torch.Tensor) -> SlowHandle:
        """Copy the bytes of `t`'s storage to slow memory, on this thread. `t` is not
        changed; the caller frees it when it wants."""

    @abstractmethod
    def to_fast(self, h: SlowHandle) -> torch.Tensor:
        """A new fast tensor with `h`'s bytes, dtype, shape, stride and storage offset,
        read on this thread. The slow copy stays until ``free_slow(h)``."""

    @abstractmethod
    def free_slow(self, h: SlowHandle) -> None:
        """Release `h`'s slow memory. Using `h` afterwards raises TierError."""

    @abstractmethod
    def slow_bytes_in_use(self) -> int:
        """Bytes of slow memory held by live handles."""

    # ---- direct access

    def slow_view(self, h: SlowHandle) -> torch.Tensor | None:
        """A tensor that lives in slow memory (direct access systems), for kernels to
        read and write in place; None for staged systems."""
        return None

    def read_range(self, h: SlowHandle, start: int, stop: int, buf: Any) -> torch.Tensor:
        """Bytes [start, stop) of `h`'s storage as a uint8 tensor, read into `buf`
        (tiers.ranges.bounce_buffer) or, under direct access, a view of slow memory: how a
        kernel that runs in pieces reads an input held in slow memory."""
        view = self.slow_view(h)
        if view is None:
            raise TierError(f"{self.name} cannot read part of a slow tensor")
        return storage_bytes(view)[start:stop]

    def empty_slow(self, key: int, layout: TensorLayout) -> SlowHandle:
        """Slow memory for a contiguous tensor of `layout` that a kernel running in pieces
        writes range by range (write_range): how it writes its output to slow memory."""
        raise TierError(f"{self.name} cannot write part of a slow tensor")

    def write_range(self, h: SlowHandle, start: int, buf: Any, nbytes: int) -> None:
        """Write the first `nbytes` bytes of `buf` (tiers.ranges.bounce_buffer) to bytes
        [start, start + nbytes) of `h`'s storage; `start` on a page boundary."""
        raise TierError(f"{self.name} cannot write part of a slow tensor")

    def alloc_slow(self, like: torch.Tensor | TensorLayout, key: int = -1
                   ) -> tuple[SlowHandle, torch.Tensor]:
        """Allocate slow memory laid out like `like` (a tensor, possibly on ``meta``, or a
        TensorLayout) and return its handle and a view of it, for a kernel to write its
        output into. Direct access systems only."""
        raise NotImplementedError(f"{self.name} is a staged memory system: kernels cannot "
                                  "write into slow memory")

    # ---- asynchronous moves (on the one I/O worker)

    def start_to_slow(self, key: int, t: torch.Tensor) -> Pending:
        """Start ``to_slow(key, t)`` on the I/O worker. Do not modify `t` until waited."""
        return self._submit(self.to_slow, key, t)

    def start_to_fast(self, h: SlowHandle, into: torch.Tensor | None = None) -> Pending:
        """Start ``to_fast(h)`` on the I/O worker. ``free_slow(h)`` refuses until waited.
        `into`: for tiers whose to_fast takes a destination (cpu+file), passed on."""
        self._check_open()
        settle = self._read_started(h)

        def job() -> torch.Tensor:
            try:
                return self.to_fast(h) if into is None else self.to_fast(h, into=into)
            finally:
                settle()

        return self._submit(job)

    def _read_started(self, h: SlowHandle) -> Callable[[], None]:
        """Count an async read of `h` as running (free_slow(h) refuses until then); returns
        the call that ends it."""
        loc = id(h.location)
        with self._in_flight_lock:
            self._in_flight[loc] = self._in_flight.get(loc, 0) + 1

        def settle() -> None:
            with self._in_flight_lock:
                left = self._in_flight.pop(loc) - 1
                if left:
                    self._in_flight[loc] = left
        return settle

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Pending:
        self._check_open()
        with self._worker_lock:
            if self._worker is None:
                self._worker = IOWorker(f"autotm-{self.name}-io")
                worker = self._worker
                self._resources.add(lambda: _stop_worker(worker))
        return self._worker.submit(fn, *args)

    def _check_not_in_flight(self, h: SlowHandle) -> None:
        with self._in_flight_lock:
            if id(h.location) in self._in_flight:
                raise TierError(f"cannot free slow tensor {h.key}: an asynchronous read of it "
                                "is still running (wait for it first)")

    # ---- capabilities (Capabilities; the defaults: none)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    @property
    def async_engine(self) -> str | None:
        """How asynchronous moves run (Capabilities.async_engine)."""
        return self.capabilities.async_engine

    if TYPE_CHECKING:  # defined only where the capability is (read_into, device_timed_moves)
        def read_span(self, h: SlowHandle) -> tuple[int, int]:
            """(bytes a read of `h` writes, offset of the tensor's bytes in them): Capabilities.read_into."""

        def move_seconds(self, t: torch.Tensor, load_kernels: int = 8) -> dict[tuple[str, str], float]:
            """Each move of `t`'s bytes timed on the device: Capabilities.device_timed_moves."""

    def cached_fast_bytes(self) -> int:
        """Fast memory held in idle read buffers (Capabilities.read_cache); 0 without."""
        return 0

    def release_cached(self) -> None:
        """Unmap the idle read buffers (Capabilities.read_cache)."""

    # ---- the fast device (no-ops for CPU systems; cuda+host overrides them)

    def synchronize(self) -> None:
        """Wait until the work queued on the fast device is done (timing reads the clock after)."""

    def reset_device_peaks(self) -> None:
        """Start the fast device's allocator peaks afresh (a session's start)."""

    def run_meta(self) -> dict:
        """What this system adds to a run report's meta (e.g. the device allocator's peaks)."""
        return {}

    # ---- lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise TierError(f"the {self.name} memory system is closed")

    def close(self) -> None:
        """Stop the I/O worker and remove every file and directory this system created.
        Idempotent."""
        self._closed = True
        self._resources.release()

    def __enter__(self) -> "MemorySystem":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} access={self.access}>"


def _stop_worker(worker: IOWorker) -> None:
    if not worker.close():
        warnings.warn("autotm I/O worker still busy at close", RuntimeWarning, stacklevel=2)
