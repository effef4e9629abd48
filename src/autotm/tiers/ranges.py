"""Reading part of a slow tensor: the bytes [start, stop) of its storage, for a kernel
that runs in pieces (ir/split.py) and reads an input from slow memory one piece at a
time, through a bounce buffer of the caller's (`bounce_buffer`)."""

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
