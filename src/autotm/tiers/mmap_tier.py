"""``cpu+mmap``: DRAM as the fast tier, memory-mapped files as the slow tier (direct access).

Each slow storage is its own file in a private directory, extended with
``posix_fallocate`` (a full disk is a TierError up front, never a SIGBUS on first
touch), mapped shared and read-write, then unlinked: the mapping keeps it, and nothing is
left on disk however the process ends. ``slow_view`` returns a tensor over the mapping,
so kernels read and write slow memory in place; ``to_slow`` and ``to_fast`` copy through
it.

Where this is real: on a DAX mount (persistent memory in App Direct mode, e.g. ext4 or
xfs mounted with ``-o dax`` on /dev/pmem0) the mapping *is* the slow memory. On any other
file system the system works, but the mapped pages live in the page cache (DRAM) and are
written back to storage in the background: functional only, not a slow tier.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import threading
from dataclasses import dataclass

import torch

from autotm.tiers.base import (
    MemorySystem,
    SlowHandle,
    TensorLayout,
    TierError,
    make_private_dir,
    round_up,
    storage_bytes,
    tensor_on_bytes,
)


@dataclass(frozen=True, eq=False)
class Region:
    """One slow storage: a mapping of `size` bytes (None for an empty storage)."""

    serial: int
    size: int
    mapping: mmap.mmap | None


def region_address(mapping: mmap.mmap) -> int:
    """Start address of a writable mapping."""
    anchor = ctypes.c_char.from_buffer(mapping)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


class RegionMemorySystem(MemorySystem):
    """A direct-access memory system whose slow storages are mappings (one per storage).

    Subclasses say how to get a zero-filled slow mapping of `size` bytes
    (``_new_mapping``); moves, views and accounting are shared. The fast tier is the
    CPU's default allocator.
    """

    access = "direct"

    def __init__(self, slow_capacity_bytes: int | None) -> None:
        super().__init__()
        self.fast_device = torch.device("cpu")
        self.capacity = slow_capacity_bytes
        self._in_use = 0
        self._live: dict[int, Region] = {}
        self._lock = threading.Lock()
        self._serial = itertools.count()
        self._resources.add(self._live.clear)  # drop mappings (views keep theirs alive)

    def _new_mapping(self, size: int) -> mmap.mmap:
        raise NotImplementedError

    # ---- allocation

    def _allocate(self, layout: TensorLayout) -> Region:
        self._check_open()
        n = layout.storage_nbytes
        size = round_up(n) if n else 0
        with self._lock:
            if self.capacity is not None and self._in_use + size > self.capacity:
                raise TierError(
                    f"slow tier capacity exceeded: {self._in_use} bytes in use + {size} "
                    f"requested > slow_capacity_bytes={self.capacity}")
            self._in_use += size
        try:
            region = Region(next(self._serial), size, self._new_mapping(size) if size else None)
        except BaseException:
            with self._lock:
                self._in_use -= size
            raise
        with self._lock:
            self._live[region.serial] = region
        return region

    def _region_of(self, h: SlowHandle) -> Region:
        region = h.location
        if not isinstance(region, Region) or self._live.get(region.serial) is not region:
            raise TierError(f"slow handle for tensor {h.key} is not live in this {self.name} "
                            "memory system (freed, or from another system)")
        return region

    @staticmethod
    def _bytes_of(region: Region, n: int) -> torch.Tensor:
        if region.mapping is None:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(region.mapping, dtype=torch.uint8, count=n)

    # ---- interface

    def to_slow(self, key: int, t: torch.Tensor) -> SlowHandle:
        if t.device.type != "cpu":
            raise TierError(f"{self.name} moves CPU tensors, not {t.device} tensors")
        layout = TensorLayout.of(t)
        region = self._allocate(layout)
        if region.mapping is not None:
            self._bytes_of(region, layout.storage_nbytes).copy_(storage_bytes(t))
        return SlowHandle.for_layout(key, region.size, layout, region)

    def to_fast(self, h: SlowHandle) -> torch.Tensor:
        self._check_open()
        region = self._region_of(h)
        u8 = torch.empty(h.storage_nbytes, dtype=torch.uint8)
        if region.mapping is not None:
            u8.copy_(self._bytes_of(region, h.storage_nbytes))
        return tensor_on_bytes(u8, h.layout)

    def slow_view(self, h: SlowHandle) -> torch.Tensor:
        self._check_open()
        region = self._region_of(h)
        return tensor_on_bytes(self._bytes_of(region, h.storage_nbytes), h.layout)

    def alloc_slow(self, like: torch.Tensor | TensorLayout, key: int = -1
                   ) -> tuple[SlowHandle, torch.Tensor]:
        layout = like if isinstance(like, TensorLayout) else TensorLayout.of(like)
        region = self._allocate(layout)
        h = SlowHandle.for_layout(key, region.size, layout, region)
        return h, tensor_on_bytes(self._bytes_of(region, layout.storage_nbytes), layout)

    def free_slow(self, h: SlowHandle) -> None:
        self._check_not_in_flight(h)
        region = self._region_of(h)
        with self._lock:
            if self._live.pop(region.serial, None) is None:
                raise TierError("slow handle was already freed")
            self._in_use -= region.size
        # The mapping goes when the last view of it does.

    def slow_bytes_in_use(self) -> int:
        return self._in_use


class MmapMemorySystem(RegionMemorySystem):
    """DRAM + memory-mapped files (``cpu+mmap``); real slow memory only on a DAX mount.

    Args:
        slow_dir: directory for the files (a private subdirectory is made inside);
            default: $AUTOTM_SLOW_DIR, else the system temp dir. Point it at a DAX mount.
        slow_capacity_bytes: a hard limit on slow bytes in use; None: until full.
    """

    name = "cpu+mmap"

    def __init__(self, slow_dir: str | None = None,
                 slow_capacity_bytes: int | None = None) -> None:
        super().__init__(slow_capacity_bytes)
        self.directory = make_private_dir(slow_dir, "autotm-mmap-", self._resources)
        self._names = itertools.count()

    def _new_mapping(self, size: int) -> mmap.mmap:
        path = os.path.join(self.directory, f"t{next(self._names)}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise TierError(f"cannot create a file in slow directory {self.directory!r} "
                            f"({e.strerror})") from e
        try:
            os.unlink(path)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.ftruncate(fd, size)
            return mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise TierError(f"slow directory {self.directory!r} is full (no space left "
                                f"on device) while allocating {size} bytes; "
                                f"{self._in_use} bytes in use by autotm") from e
            raise TierError(f"cannot map a {size}-byte slow file in {self.directory!r}: "
                            f"{e.strerror or e}") from e
        finally:
            os.close(fd)
