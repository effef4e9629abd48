"""Memory tiers: the fast and slow memory a plan runs on, and the moves between them.

``make_memory_system(name)`` builds one: ``cpu+file`` (DRAM + files with direct I/O, the
default), ``cpu+mmap`` (DRAM + memory-mapped files, e.g. on a DAX mount), ``cpu+numa``
(DRAM node + another NUMA memory node), ``cuda+host`` (GPU memory + pinned host memory,
with a copy stream for asynchronous moves; needs a CUDA GPU).
"""

from autotm.tiers.base import (
    MEMORY_SYSTEM_NAMES,
    MemorySystem,
    Pending,
    SlowHandle,
    TensorLayout,
    TierError,
    make_memory_system,
)

__all__ = [
    "MEMORY_SYSTEM_NAMES",
    "MemorySystem",
    "Pending",
    "SlowHandle",
    "TensorLayout",
    "TierError",
    "make_memory_system",
]
