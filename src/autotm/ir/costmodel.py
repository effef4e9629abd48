"""CostModel: what the planner and the simulator know about time. Plain frozen data, JSON.

Produced by `autotm.profile.profile` (measured on a real memory system) or by
`autotm.profile.cost_model_from_spec` (a roofline over a hypothetical tier spec,
``simulated=True``). Consumed by planners and by `autotm.simulate`. No torch here.

- ``kernel_seconds[k]``: kernel k with every operand in fast memory.
- ``placement_seconds[k][placement]`` (direct access only): kernel k with its operands
  placed as ``placement``, one of "fast"/"slow" per unique tensor, in
  ``kernel.inputs + kernel.outputs`` order (see :func:`operand_tensors`).
  Kernels with more operands than the profiler enumerates exhaustively carry only the
  all-slow placement and the placements with exactly one slow operand; ``kernel_time``
  then adds up the slowdowns of the slow operands (capped at the all-slow time).
- ``moves[(direction, mode)]``: seconds to move n bytes, for direction ``to_slow`` /
  ``to_fast`` and mode ``sync`` / ``async``: latency + bytes / bandwidth, or, for a
  profiled tier, the measured (bytes, seconds) points joined by straight lines (a move's
  fixed cost is not one constant across sizes: small moves were mispredicted by up to 2x
  with a single line) and the fitted bandwidth beyond the largest point.
  An async move's seconds run from when it was issued to when its completion was seen.
- ``moves[(direction, "host")]`` (profiled tiers, optional): the seconds an async move
  takes on the calling thread itself, serial with the kernels: issuing it (on cpu+file
  the io_submit call, which pins the pages and builds the requests) and collecting its
  completion. Missing (tier specs, GPU copy streams): 0.
- ``moves[(direction, "pair")]`` (profiled AIO tiers, optional): the seconds from issuing
  two copies of n bytes each together to the completion of both, while computing as for
  "async". What a second copy adds at one kernel is pair(n) - async(n): here ~1 us for
  64 KiB writes (they overlap), about a whole copy from 256 KiB, and more than one for
  1 MiB (two took 485-544 us against 154-240 for one). Missing: copies add their bytes
  at the fitted bandwidth (see async_marginal_seconds).
- ``copy_interference[direction]`` (profiled, optional): how much slower a kernel
  computes while an async copy of that direction is in flight (0.2: its work takes 1.2x as
  long then; the copy's DMA and completions compete for memory bandwidth and cores).
- ``workspace_bytes[k]`` (profiled CPU tiers, optional): the bytes kernel k allocates and
  frees while it runs, beyond its outputs (oneDNN's reorder buffers and scratchpads,
  im2col): fast memory the kernel needs that no tensor of the graph names. The planners
  keep that much of the budget free at k. Empty: 0 for every kernel.
- ``wake_seconds[k]`` (profiled tiers whose sync moves leave the compute thread idle,
  optional): W_k, the seconds kernel k and kernel k + 1 together take beyond their
  profiled times when the thread waited on the slow tier just before k (its threads
  went to sleep and its caches cold; see :meth:`woken`). Empty: 0 for every kernel.
- ``executor_overhead`` (profiled host-timed tiers, optional): the executor's own seconds
  per kernel, per sync move and per async move (autotm.overhead), which the profile has
  already added to ``kernel_seconds``, ``placement_seconds``, the sync moves and the
  async moves' "host" seconds. Informational: nothing adds it again.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import InputError

COSTMODEL_VERSION = 1
DIRECTIONS = ("to_slow", "to_fast")
MOVE_MODES = ("sync", "async")
HOST = "host"  # the moves key of an async move's own time on the calling thread
PAIR = "pair"  # the moves key of two async copies of n bytes each, issued together
SLOWDOWN = "slowdown"  # profiler samples (not a moves key): computation slowed by an async copy


def operand_tensors(inputs: Iterable[int], outputs: Iterable[int]) -> tuple[int, ...]:
    """The unique tensor ids of a kernel, inputs then outputs, first occurrence order:
    the order of a placement tuple."""
    seen: dict[int, None] = {}
    for t in (*inputs, *outputs):
        seen.setdefault(t, None)
    return tuple(seen)


@dataclass(frozen=True)
class MoveCost:
    latency_s: float
    bandwidth_bytes_per_s: float
    points: tuple[tuple[int, float], ...] = ()  # measured (bytes, median seconds), sizes ascending

    def seconds(self, nbytes: int) -> float:
        pts = self.points
        if not pts:
            return self.latency_s + nbytes / self.bandwidth_bytes_per_s
        if nbytes <= pts[0][0]:  # a smaller move still costs a whole request
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1] + (nbytes - pts[-1][0]) / self.bandwidth_bytes_per_s
        i = bisect.bisect_left(pts, (nbytes, -1.0))
        (n0, t0), (n1, t1) = pts[i - 1], pts[i]
        return t0 + (t1 - t0) * (nbytes - n0) / (n1 - n0)


@dataclass(frozen=True)
class ExecutorOverhead:
    """The executor's own seconds around the kernels' and moves' calls, measured on a
    calibration graph (runtime/overhead.py); the profiler adds them to the kernels and
    moves of host-timed tiers (``CostModel.executor_overhead`` holds them as a dict)."""

    kernel_s: float = 0.0  # per kernel
    sync_move_s: float = 0.0  # per sync evict or prefetch
    async_move_s: float = 0.0  # per async evict or prefetch, on the compute thread (= sync_move_s)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


EXECUTOR_OVERHEAD_NAMES = ("kernel_s", "sync_move_s", "async_move_s")  # the profile cache's value names (prefixed)


@dataclass(frozen=True)
class CostModel:
    graph_fingerprint: str
    memory_system: str  # e.g. "cpu+file" or "sim:optane"
    access: str  # "staged" | "direct"
    kernel_seconds: tuple[float, ...]  # per kernel index, every operand in fast memory
    # direct access only: kernel -> {placement: seconds}; a placement is a tuple of
    # "fast"/"slow", one per unique tensor in kernel.inputs + kernel.outputs order; empty for staged
    placement_seconds: dict[int, dict[tuple[str, ...], float]]
    moves: dict[tuple[str, str], MoveCost]  # ("to_slow"|"to_fast", "sync"|"async"|"host"|"pair") -> cost
    simulated: bool
    environment: dict[str, Any] = field(default_factory=dict)
    # The async copies at one kernel are in flight together and may overlap (Linux AIO: 16
    # copies of 16 KiB took 0.5 ms together, 5 ms one after another; 1 MiB ones do not
    # overlap: moves "pair"); False: they run one after another (an I/O thread, one copy
    # stream). See async_seconds.
    async_overlap: bool = False
    workspace_bytes: tuple[int, ...] = ()  # per kernel; () = not profiled (0)
    copy_interference: dict[str, float] = field(default_factory=dict)  # direction -> slowdown; {} = none
    wake_seconds: tuple[float, ...] = ()  # per kernel W_k; () = not profiled (0)
    # what the profile added for the executor's own work (autotm.overhead: kernel_s,
    # sync_move_s, async_move_s), already in kernel_seconds and moves; {} = nothing added
    executor_overhead: dict[str, float] = field(default_factory=dict)

    # ---- queries ----------------------------------------------------------------------
    def kernel_time(self, k: int, placement: tuple[str, ...] | None = None) -> float:
        """Seconds of kernel k with its operands placed as `placement` (None or all
        "fast": the all-fast time). Staged models ignore the placement."""
        base = self.kernel_seconds[k]
        if placement is None or self.access != "direct" or "slow" not in placement:
            return base
        table = self.placement_seconds.get(k)
        if not table:
            raise KeyError(f"no placement timings for kernel {k} in this {self.access} cost model")
        placement = tuple(placement)
        if placement in table:
            return table[placement]
        n = len(placement)
        all_slow = table.get(("slow",) * n)
        extra = 0.0
        for i, p in enumerate(placement):
            if p == "slow":
                one = tuple("slow" if j == i else "fast" for j in range(n))
                if one not in table:
                    raise KeyError(f"kernel {k}: placement {placement} was not profiled "
                                   f"(expected {n} operands)")
                extra += max(0.0, table[one] - base)
        t = base + extra
        return min(t, all_slow) if all_slow is not None and all_slow >= base else t

    def move_seconds(self, nbytes: int, direction: str, mode: str) -> float:
        """Seconds to move `nbytes` `direction` ("to_slow" | "to_fast") in `mode`
        ("sync" | "async"). Zero bytes cost nothing."""
        if nbytes <= 0:
            return 0.0
        try:
            return self.moves[(direction, mode)].seconds(nbytes)
        except KeyError:
            raise KeyError(f"no move cost for {direction!r} {mode!r}; have {sorted(self.moves)}") from None

    def workspace(self, n_kernels: int) -> np.ndarray:
        """Per kernel, its workspace bytes (numpy int64; zeros where not profiled)."""
        w = np.zeros(n_kernels, dtype=np.int64)
        if self.workspace_bytes:
            w[:] = self.workspace_bytes
        return w

    def wake(self, n_kernels: int) -> np.ndarray:
        """Per kernel, W_k (numpy float; zeros where not profiled)."""
        w = np.zeros(n_kernels)
        if self.wake_seconds:
            w[:] = self.wake_seconds
        return w

    def woken(self, k: int, sync_copies: bool, async_copies_before: Iterable[tuple[int, str]] = ()) -> bool:
        """Does kernel k start after the compute thread waited idle on the slow tier? Yes when
        a sync copy (an evict or prefetch that costs time) comes right before it, or when an
        async copy (nbytes, direction) over kernel k - 1 takes longer than that kernel alone
        (the thread waits for its completion). Only where W_k was profiled. The planner's
        wake rows (ilp.solve_staged) encode exactly this rule."""
        if not self.wake_seconds or self.wake_seconds[k] <= 0.0:
            return False
        if sync_copies:
            return True
        if k == 0:
            return False
        before = self.kernel_seconds[k - 1]
        return any(self.move_seconds(nb, d, "async") > before for nb, d in async_copies_before)

    def interference_share(self, direction: str | None = None) -> float:
        """g = s / (1 + s) for slowdown s: the share of an async copy's time its kernel
        loses while the copy is in flight. None: the larger of the two directions (the
        one fixed cost of async_seconds is charged at that)."""
        if direction is None:
            return max([self.interference_share(d) for d in DIRECTIONS])
        s = max(0.0, float(self.copy_interference.get(direction, 0.0)))
        return s / (1.0 + s)

    def async_host_seconds(self, nbytes: int, direction: str) -> float:
        """Seconds an async move of `nbytes` takes on the thread that issues it (issue and
        completion), which no kernel overlaps; 0 where not profiled."""
        c = self.moves.get((direction, HOST))
        return 0.0 if c is None or nbytes <= 0 else c.seconds(nbytes)

    def async_marginal_seconds(self, nbytes: int, direction: str) -> float:
        """What an async copy adds to the others at its kernel, at most its whole time: when
        copies overlap (async_overlap), what a second copy of its size added to the first
        where measured (pair - async), else its bytes at the fitted bandwidth; else its
        whole time. (At the bandwidth alone two 1 MiB AIO writes were predicted ~160 us
        here; they took 485-544.)"""
        full = self.move_seconds(nbytes, direction, "async")
        if not self.async_overlap or nbytes <= 0:
            return full
        pair = self.moves.get((direction, PAIR))
        if pair is not None:
            return min(full, max(0.0, pair.seconds(nbytes) - full))
        return min(full, nbytes / self.moves[(direction, "async")].bandwidth_bytes_per_s)

    def async_seconds(self, copies: Iterable[tuple[int, str]]) -> float:
        """Seconds of the async copies (nbytes, direction) overlapping one kernel:
            A = sum_m marginal_m + max_m (full_m - marginal_m)
        (one copy's fixed cost shows, the rest only add bytes; without async_overlap,
        marginal = full and A is the plain sum)."""
        marg, _, extra = self._async_parts(copies)
        return marg + extra

    def async_interference_seconds(self, copies: Iterable[tuple[int, str]]) -> float:
        """What the async copies at one kernel add to its compute time (module doc of
        autotm.simulate): sum_m g_m marginal_m + g* max_m (full_m - marginal_m)."""
        _, slowed, extra = self._async_parts(copies)
        return slowed + self.interference_share() * extra

    def _async_parts(self, copies: Iterable[tuple[int, str]]) -> tuple[float, float, float]:
        """(sum_m marginal_m, sum_m g_m marginal_m, max_m (full_m - marginal_m))."""
        marg_sum, slowed, extra = 0.0, 0.0, 0.0
        for nbytes, direction in copies:
            full = self.move_seconds(nbytes, direction, "async")
            marg = self.async_marginal_seconds(nbytes, direction)
            marg_sum += marg
            slowed += self.interference_share(direction) * marg
            extra = max(extra, full - marg)
        return marg_sum, slowed, extra

    @property
    def total_kernel_seconds(self) -> float:
        return float(sum(self.kernel_seconds))

    # ---- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": COSTMODEL_VERSION,
            "graph_fingerprint": self.graph_fingerprint,
            "memory_system": self.memory_system,
            "access": self.access,
            "simulated": self.simulated,
            "environment": self.environment,
            "async_overlap": self.async_overlap,
            "moves": [{"direction": d, "mode": m, "latency_s": c.latency_s,
                       "bandwidth_bytes_per_s": c.bandwidth_bytes_per_s,
                       "points": [list(p) for p in c.points]}
                      for (d, m), c in sorted(self.moves.items())],
            "kernel_seconds": list(self.kernel_seconds),
            "workspace_bytes": list(self.workspace_bytes),
            "copy_interference": dict(self.copy_interference),
            "wake_seconds": list(self.wake_seconds),
            "executor_overhead": dict(self.executor_overhead),
            "placement_seconds": {str(k): [[list(p), s] for p, s in table.items()]
                                  for k, table in sorted(self.placement_seconds.items())},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        if not isinstance(d, dict):
            raise InputError("cost model JSON must be an object")
        if d.get("version") != COSTMODEL_VERSION:
            raise InputError(f"cost model version {d.get('version')!r} is not supported "
                             f"(expects {COSTMODEL_VERSION})")
        try:
            return cls(
                graph_fingerprint=str(d["graph_fingerprint"]),
                memory_system=str(d["memory_system"]),
                access=str(d["access"]),
                kernel_seconds=tuple(float(x) for x in d["kernel_seconds"]),
                placement_seconds={int(k): {tuple(p): float(s) for p, s in rows}
                                   for k, rows in d["placement_seconds"].items()},
                moves={(m["direction"], m["mode"]): MoveCost(
                    float(m["latency_s"]), float(m["bandwidth_bytes_per_s"]),
                    tuple((int(n), float(t)) for n, t in m.get("points", ())))
                       for m in d["moves"]},
                simulated=bool(d["simulated"]),
                environment=dict(d.get("environment", {})),
                async_overlap=bool(d.get("async_overlap", False)),
                workspace_bytes=tuple(int(x) for x in d.get("workspace_bytes", ())),
                copy_interference={str(k): float(v) for k, v in d.get("copy_interference", {}).items()},
                wake_seconds=tuple(float(x) for x in d.get("wake_seconds", ())),
                executor_overhead={str(k): float(v) for k, v in d.get("executor_overhead", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"malformed cost model JSON: {e!r}") from None

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        return cls.from_dict(json.loads(text))
