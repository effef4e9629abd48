"""Reading and writing part of a slow tensor: the bytes [start, stop) of its storage, for
a kernel that runs in pieces (ir/split.py) and reads an input from slow memory, or writes
its output there, one piece at a time, through a bounce buffer of the caller's
(`bounce_buffer`)."""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

import torch

from .base import PAGE, SlowHandle, TierError, round_up

if TYPE_CHECKING:
    from .file_tier import FileMemorySystem


def bounce_buffer(nbytes: int) -> mmap.mmap:
    """A page-aligned buffer that holds any range of up to `nbytes` bytes read by
    read_range (with the pages around it that direct I/O reads)."""
    return mmap.mmap(-1, round_up(nbytes) + 2 * PAGE)


def file_read_range(memory: FileMemorySystem, h: SlowHandle, start: int, stop: int, buf: mmap.mmap) -> torch.Tensor:
    """Bytes [start, stop) of `h`'s storage as a uint8 tensor over `buf`: the whole pages
    around them read from the slow file (direct I/O reads whole, aligned pages)."""
    if not 0 <= start <= stop <= h.storage_nbytes:
        raise TierError(f"bytes [{start}, {stop}) are outside tensor {h.key}'s {h.storage_nbytes} bytes")
    ext = memory._extent_of(h)
    first = ext.offset + ext.pad + start
    lo = first - first % PAGE
    hi = min(round_up(ext.offset + ext.pad + stop), ext.offset + ext.length)
    if hi - lo > len(buf):
        raise TierError(f"a bounce buffer of {len(buf)} bytes cannot hold bytes [{start}, {stop}) of tensor {h.key}")
    if stop > start:
        memory._read(memoryview(buf)[:hi - lo], lo)
    return torch.frombuffer(buf, dtype=torch.uint8, offset=first - lo, count=stop - start) if stop > start \
        else torch.empty(0, dtype=torch.uint8)


def file_write_range(memory: FileMemorySystem, h: SlowHandle, start: int, buf: mmap.mmap, nbytes: int) -> None:
    """Write the first `nbytes` bytes of `buf` to bytes [start, start + nbytes) of `h`'s
    storage in the slow file: whole pages from `buf` (direct I/O writes whole, aligned
    pages), so `start` is on a page boundary and `h` starts on one (FileMemorySystem.empty_slow);
    the bytes of a last partial page past the storage are the extent's own padding."""
    ext = memory._extent_of(h)
    if ext.pad or start % PAGE or not 0 <= start <= start + nbytes <= h.storage_nbytes:
        raise TierError(f"bytes [{start}, {start + nbytes}) of tensor {h.key} are not a page-aligned range "
                        f"of its {h.storage_nbytes} bytes")
    length = round_up(nbytes)
    if length > len(buf):
        raise TierError(f"a bounce buffer of {len(buf)} bytes cannot hold {length} bytes of tensor {h.key}")
    if nbytes:
        memory._write(memoryview(buf)[:length], ext.offset + start)
