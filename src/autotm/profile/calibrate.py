"""The executor-overhead calibration hook: the executor's own time per kernel and per
sync move, beyond the calls the profile times, measured once per environment on a
calibration graph, cached, and added to the cost model.

The calibration runs the executor, a later stage: the profile never imports it, its
caller passes it in (`profile(measure_overhead=...)`, e.g.
`autotm.runtime.overhead.measure_executor_overhead`)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from ..ir.costmodel import EXECUTOR_OVERHEAD_NAMES as OVERHEAD_NAMES, HOST, CostModel, ExecutorOverhead, MoveCost
from ..ir.graph import TrainingGraph
from .cache import ProfileCache

OVERHEAD_PREFIX = "executor:"  # the cache's values of the executor's overheads

# (memory system, cost_model_of) -> the executor's overheads: runtime.overhead.measure_executor_overhead
MeasureOverhead = Callable[[Any, Callable[[TrainingGraph, Mapping[int, torch.Tensor]],
                                          tuple[CostModel, list[float]]]], ExecutorOverhead]


def cached_overhead(db: ProfileCache, env: str) -> ExecutorOverhead | None:
    values = [db.value(env, OVERHEAD_PREFIX + name) for name in OVERHEAD_NAMES]
    return None if any(v is None for v in values) else ExecutorOverhead(*values)


def put_overhead(db: ProfileCache, env: str, o: ExecutorOverhead) -> None:
    for name, v in o.as_dict().items():
        db.put_value(env, OVERHEAD_PREFIX + name, v)


def _plus(c: MoveCost, seconds: float) -> MoveCost:
    return MoveCost(c.latency_s + seconds, c.bandwidth_bytes_per_s, tuple((n, t + seconds) for n, t in c.points))


def with_overhead(moves: dict[tuple[str, str], MoveCost], o: ExecutorOverhead) -> dict[tuple[str, str], MoveCost]:
    """The executor's per-move seconds on top: a sync move's, an async move's on the calling
    thread (mode "host"; where the system has no host mode its overhead is left out)."""
    add = {"sync": o.sync_move_s, HOST: o.async_move_s}
    return {(d, m): _plus(c, add[m]) if add.get(m) else c for (d, m), c in moves.items()}
