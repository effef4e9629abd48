"""``cpu+numa``: the local DRAM node as the fast tier, another NUMA memory node as the slow
tier (a CXL memory expander, or persistent memory in NUMA mode). Direct access.

Memory nodes are read from /sys/devices/system/node/has_memory. A slow storage is an
anonymous mapping bound to the slow node with ``mbind(MPOL_BIND)`` before it is first
touched, so its pages are allocated there: through libnuma's ``mbind`` when libnuma.so
is present, else the raw system call (libnuma's ``numa_alloc_onnode`` does the same
mmap + mbind, but a Python mmap object gives the mapping a lifetime tied to its views).
The fast tier is the CPU's default allocator (first touch, the local node).

Only the refusal on a one-node machine is tested in CI.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform

from autotm.tiers.base import TierError
from autotm.tiers.mmap_tier import RegionMemorySystem, region_address

NODE_SYSFS = "/sys/devices/system/node"
MPOL_BIND = 2
SYS_MBIND = {"x86_64": 237, "aarch64": 235, "ppc64le": 259, "s390x": 268}


def parse_node_list(text: str) -> list[int]:
    """'0-2,4' -> [0, 1, 2, 4] (the kernel's node list format)."""
    nodes: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        nodes.extend(range(int(lo), int(hi or lo) + 1))
    return nodes


def memory_nodes(sysfs: str = NODE_SYSFS) -> list[int]:
    """NUMA nodes that have memory, from `sysfs` (has_memory, else the node* dirs)."""
    try:
        with open(os.path.join(sysfs, "has_memory")) as f:
            return parse_node_list(f.read())
    except OSError:
        pass
    try:
        return sorted(int(d[4:]) for d in os.listdir(sysfs)
                      if d.startswith("node") and d[4:].isdigit())
    except OSError:
        return [0]


def cpu_nodes(sysfs: str = NODE_SYSFS) -> list[int]:
    try:
        with open(os.path.join(sysfs, "has_cpu")) as f:
            return parse_node_list(f.read())
    except OSError:
        return []


class _Binder:
    """Binds a fresh mapping to one node: libnuma's mbind, else the raw system call."""

    def __init__(self, use_libnuma: bool = True) -> None:
        self._mbind = None
        self.via = "mbind system call"
        name = ctypes.util.find_library("numa") if use_libnuma else None
        for lib in ([name] if name else []) + (["libnuma.so.1", "libnuma.so"] if use_libnuma
                                               else []):
            try:
                numa = ctypes.CDLL(lib, use_errno=True)
                self._mbind = numa.mbind
                self.via = "libnuma"
                break
            except (OSError, AttributeError):
                continue
        if self._mbind is None:
            nr = SYS_MBIND.get(platform.machine())
            if nr is None:
                raise TierError(f"cpu+numa: no libnuma and no known mbind system call number "
                                f"on {platform.machine()}")
            libc = ctypes.CDLL(None, use_errno=True)
            self._mbind = lambda *a: libc.syscall(ctypes.c_long(nr), *a)

    def bind(self, address: int, size: int, node: int) -> None:
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        words = node // bits + 1
        mask = (ctypes.c_ulong * words)()
        mask[node // bits] = 1 << (node % bits)
        rc = self._mbind(ctypes.c_void_p(address), ctypes.c_ulong(size), ctypes.c_int(MPOL_BIND),
                         mask, ctypes.c_ulong(words * bits + 1), ctypes.c_uint(0))
        if rc != 0:
            err = ctypes.get_errno()
            raise TierError(f"cpu+numa: mbind to node {node} failed: {os.strerror(err)}")


class NumaMemorySystem(RegionMemorySystem):
    """Local DRAM node + another NUMA memory node (``cpu+numa``).

    Args:
        slow_node: the node for slow memory; default: a memory node without CPUs if there
            is one (CXL, PMM), else the highest memory node other than the fast one.
        slow_capacity_bytes: a hard limit on slow bytes in use; None: until the node is
            full.
        sysfs: where to read the node topology (tests).
        use_libnuma: bind through libnuma when it is installed (else, or if False, the
            mbind system call).

    Raises:
        TierError: the machine has fewer than two memory nodes, or `slow_node` is not
            one of them.
    """

    name = "cpu+numa"

    def __init__(self, slow_node: int | None = None, slow_capacity_bytes: int | None = None,
                 *, sysfs: str = NODE_SYSFS, use_libnuma: bool = True) -> None:
        nodes = memory_nodes(sysfs)
        if len(nodes) < 2:
            listed = ", ".join(map(str, nodes))
            raise TierError(f"cpu+numa needs two or more NUMA memory nodes; this machine has "
                            f"node(s): {listed}")
        with_cpus = cpu_nodes(sysfs)
        fast = with_cpus[0] if with_cpus else nodes[0]
        if slow_node is None:
            cpuless = [n for n in nodes if n not in with_cpus]
            slow_node = cpuless[0] if cpuless else max(n for n in nodes if n != fast)
        if slow_node not in nodes:
            raise TierError(f"cpu+numa: slow_node={slow_node} is not a memory node; memory "
                            f"nodes: {', '.join(map(str, nodes))}")
        super().__init__(slow_capacity_bytes)
        self.fast_node = fast
        self.slow_node = slow_node
        self._binder = _Binder(use_libnuma)

    def _new_mapping(self, size: int) -> mmap.mmap:
        try:
            mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as e:
            raise TierError(f"cpu+numa: cannot map {size} bytes: {e.strerror}") from e
        self._binder.bind(region_address(mapping), size, self.slow_node)
        return mapping
