"""Memory tiers: the fast and slow memory a plan runs on, and the moves between them.

``make_memory_system(name)`` builds one: ``cpu+file`` (DRAM + files with direct I/O, the
default), ``cpu+mmap`` (DRAM + memory-mapped files, e.g. on a DAX mount), ``cpu+numa``
(DRAM node + another NUMA memory node), ``cuda+host`` (GPU memory + pinned host memory,
with a copy stream for asynchronous moves; needs a CUDA GPU).
"""

from autotm.tiers.base import (
    MEMORY_SYSTEM_NAMES,
    Capabilities,
    MemorySystem,
    Pending,
    SlowHandle,
    TensorLayout,
    TierError,
)
from autotm.errors import InputError


def make_memory_system(name: str = "cpu+file", *, slow_dir: str | None = None,
                       slow_capacity_bytes: int | None = None,
                       fast_capacity_bytes: int | None = None) -> MemorySystem:
    """Build the memory system called `name`.

    Args:
        name: ``"cpu+file"`` (DRAM + files read and written with direct I/O),
            ``"cpu+mmap"`` (DRAM + memory-mapped files, e.g. on a DAX mount),
            ``"cpu+numa"`` (DRAM node + another NUMA memory node) or ``"cuda+host"``
            (GPU memory + pinned host memory; needs a CUDA GPU, else TierError).
        slow_dir: where slow files go (a new private directory is made inside it);
            default: $AUTOTM_SLOW_DIR, else the system temp dir (if that is RAM-backed,
            /var/tmp). Ignored by ``cpu+numa``.
        slow_capacity_bytes: a hard limit on slow bytes in use; None: until the
            storage is full.
        fast_capacity_bytes: ``cuda+host`` only: cap the CUDA caching allocator at this
            many bytes (an emulated smaller GPU); None: the whole GPU.
    """
    if fast_capacity_bytes is not None and name != "cuda+host":
        raise InputError(f"fast_capacity_bytes is for cuda+host only, not {name!r}")
    if name == "cpu+file":
        from autotm.tiers.file_tier import FileMemorySystem
        return FileMemorySystem(slow_dir, slow_capacity_bytes)
    if name == "cpu+mmap":
        from autotm.tiers.mmap_tier import MmapMemorySystem
        return MmapMemorySystem(slow_dir, slow_capacity_bytes)
    if name == "cpu+numa":
        from autotm.tiers.numa_tier import NumaMemorySystem
        return NumaMemorySystem(slow_capacity_bytes=slow_capacity_bytes)
    if name == "cuda+host":
        from autotm.tiers.cuda_tier import CudaHostMemorySystem
        return CudaHostMemorySystem(slow_capacity_bytes=slow_capacity_bytes,
                                    fast_capacity_bytes=fast_capacity_bytes)
    raise InputError(f"unknown memory system {name!r}; valid names: "
                     f"{', '.join(MEMORY_SYSTEM_NAMES)}")

__all__ = [
    "MEMORY_SYSTEM_NAMES",
    "Capabilities",
    "MemorySystem",
    "Pending",
    "SlowHandle",
    "TensorLayout",
    "TierError",
    "make_memory_system",
]
