"""Where the cpu+file tier's tensors live in its one slow file: best-fit extents."""

from __future__ import annotations

import bisect

from autotm.tiers.base import TierError


class ArenaAllocator:
    """Best-fit allocation of 4096-aligned extents in a file that only grows."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.end = 0  # file size
        self.in_use = 0
        self._free: list[tuple[int, int]] = []  # (offset, length), sorted, coalesced

    def alloc(self, length: int) -> tuple[int, int]:
        """Return (offset, bytes the file must grow by first)."""
        if self.capacity is not None and self.in_use + length > self.capacity:
            raise TierError(
                f"slow tier capacity exceeded: {self.in_use} bytes in use + {length} "
                f"requested > slow_capacity_bytes={self.capacity}")
        best = None
        for i, (_off, ln) in enumerate(self._free):
            if ln >= length and (best is None or ln < self._free[best][1]):
                best = i
                if ln == length:
                    break
        if best is not None:
            off, ln = self._free[best]
            if ln == length:
                del self._free[best]
            else:
                self._free[best] = (off + length, ln - length)
            self.in_use += length
            return off, 0
        # Grow: reuse a free extent that ends at the end of the file, if any.
        start = self.end
        if self._free and sum(self._free[-1]) == self.end:
            start = self._free[-1][0]
        grow = start + length - self.end
        if self.capacity is not None and start + length > self.capacity:
            raise TierError(
                f"slow tier capacity exceeded: no free extent of {length} bytes within "
                f"slow_capacity_bytes={self.capacity} ({self.in_use} bytes in use, arena "
                "fragmented)")
        return start, grow

    def commit_growth(self, start: int, length: int) -> None:
        """The file now reaches start + length: take the extent."""
        if self._free and self._free[-1][0] == start:
            self._free.pop()
        self.end = max(self.end, start + length)
        self.in_use += length

    def free(self, offset: int, length: int) -> None:
        self.in_use -= length
        i = bisect.bisect_left(self._free, (offset, 0))
        # Coalesce with the next and the previous free extent.
        if i < len(self._free) and offset + length == self._free[i][0]:
            length += self._free[i][1]
            del self._free[i]
        if i > 0 and sum(self._free[i - 1]) == offset:
            offset, length = self._free[i - 1][0], self._free[i - 1][1] + length
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (offset, length))
