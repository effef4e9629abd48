"""RunReport: what one executed run measured, as data (frozen, JSON-serialisable).

ExecutorSession.report() makes one from a completed run; bench records and the CLI read
it. Bytes are integers, times float seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MoveRecord:
    tensor: int
    kind: str  # prefetch, evict, drop, carry
    mode: str  # sync or async
    at: int  # kernel index (len(kernels) for carry moves)
    nbytes: int
    seconds: float  # sync: the copy; async: start to completion


@dataclass(frozen=True, eq=False)
class RunReport:
    """What one executed run measured. Bytes are integers, times float seconds."""

    graph_name: str
    planner: str
    memory_system: str
    budget_bytes: int | None
    iterations: int
    iteration_seconds: list[float]
    kernel_seconds: np.ndarray  # per kernel, median over iterations: its call (operand building apart)
    moves: list[MoveRecord]  # of the last iteration
    peak_fast_bytes: int
    bytes_to_slow: int  # per iteration
    bytes_to_fast: int  # per iteration
    losses: list[float]
    peak_rss_bytes: int = 0
    baseline_rss_bytes: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def measured_seconds(self) -> float:
        """Median iteration time (the first iteration included only when it is the only one)."""
        xs = self.iteration_seconds[1:] if len(self.iteration_seconds) > 1 else self.iteration_seconds
        return float(np.median(xs))

    def summary(self) -> dict:
        return {
            "graph": self.graph_name,
            "planner": self.planner,
            "memory_system": self.memory_system,
            "budget_bytes": self.budget_bytes,
            "iterations": self.iterations,
            "measured_seconds": self.measured_seconds,
            "iteration_seconds": self.iteration_seconds,
            "peak_fast_bytes": self.peak_fast_bytes,
            "bytes_to_slow": self.bytes_to_slow,
            "bytes_to_fast": self.bytes_to_fast,
            "moves": len([m for m in self.moves if m.kind != "drop"]),
            "kernel_seconds_total": float(self.kernel_seconds.sum()),
            "move_seconds_sync": float(sum(m.seconds for m in self.moves if m.mode == "sync")),
            "peak_rss_bytes": self.peak_rss_bytes,
            "baseline_rss_bytes": self.baseline_rss_bytes,
            "losses": self.losses,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON data (kernel_seconds a list, moves a list of dicts)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["iteration_seconds"] = [float(x) for x in self.iteration_seconds]
        d["kernel_seconds"] = [float(x) for x in self.kernel_seconds]
        d["moves"] = [dataclasses.asdict(m) for m in self.moves]
        d["losses"] = [float(x) for x in self.losses]
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunReport":
        """The report `to_dict` gave (unknown keys refused by the constructor)."""
        d = dict(d)
        d["kernel_seconds"] = np.asarray(d["kernel_seconds"], dtype=float)
        d["moves"] = [MoveRecord(**m) for m in d["moves"]]
        d["iteration_seconds"] = list(d["iteration_seconds"])
        d["losses"] = list(d["losses"])
        d["meta"] = dict(d.get("meta", {}))
        return cls(**d)
