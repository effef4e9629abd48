"""Which kernels a staged plan runs in pieces (ir/split.py), and the floor that gives.

A kernel runs in pieces only where the budget needs it: where the tightest staged plan
(floor.py) of the unsplit graph holds more than the budget, and splitting lowers what
it holds there. Split, the kernel holds its output, its inputs still in fast memory,
and one piece of each input (the bounce buffers, counted as its workspace). The floor
with splits is the floor of the graph with every kernel split where that helps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.graph import TrainingGraph
from ..ir.split import bounce_bytes, kernel_pieces, with_pieces
from .floor import SPLIT_FORMULATIONS, Accounting, Floor, accounting, smallest_feasible


def may_split(graph: TrainingGraph, formulation: str, access: str, memory_system: str, acc: Accounting) -> bool:
    """Does this planner split kernels here? The staged ILP, on a memory system that can
    read part of a slow tensor (cpu+file; simulated ones), without pinned tensors."""
    return (bool(graph.splittable) and formulation in SPLIT_FORMULATIONS and access == "staged"
            and not acc.pinned and (memory_system == "cpu+file" or memory_system.startswith("sim:")))


def bounce(graph: TrainingGraph) -> np.ndarray:
    """Per kernel, its bounce buffers' bytes (0 where it runs whole)."""
    return np.asarray([bounce_bytes(graph, k) for k in range(len(graph.kernels))], dtype=np.int64)


def with_bounce(graph: TrainingGraph, workspace: np.ndarray) -> Accounting:
    """The accounting of a split graph: each kernel's workspace and its bounce buffers."""
    return accounting(graph, np.asarray(workspace, dtype=np.int64) + bounce(graph))


def _need(graph: TrainingGraph, workspace: np.ndarray, memory_system: str) -> np.ndarray:
    """Per kernel, what the tightest staged plan holds there with its workspace."""
    from ..checks.validate import validate
    from .floor import tightest_staged_plan

    held = validate(tightest_staged_plan(graph, memory_system=memory_system), graph, budget_bytes=2**62).fast_bytes
    return np.asarray(held + workspace, dtype=np.int64)


@dataclass(frozen=True)
class Splits:
    """The kernels whose pieces lower what the tightest plan holds there (kernel ->
    pieces), and what that plan holds at each kernel of the unsplit graph."""
    helpful: dict[int, int]
    whole: np.ndarray


def helpful_splits(graph: TrainingGraph, workspace: np.ndarray, memory_system: str) -> Splits:
    """Splits of `graph` (two tightest plans: plan() makes them once per call)."""
    whole = _need(graph, np.asarray(workspace, dtype=np.int64), memory_system)
    every = with_pieces(graph, {k: kernel_pieces(graph, k) for k in graph.splittable})
    split = _need(every, with_bounce(every, workspace).workspace, memory_system)
    return Splits({k: every.kernels[k].pieces for k in sorted(graph.splittable)
                   if every.kernels[k].pieces > 1 and split[k] < whole[k]}, whole)


def split_floor(graph: TrainingGraph, formulation: str, workspace: np.ndarray, memory_system: str,
                splits: Splits | None = None) -> Floor:
    """The floor of the staged ILP with kernels split where that helps."""
    splits = splits or helpful_splits(graph, workspace, memory_system)
    g = with_pieces(graph, splits.helpful)
    return smallest_feasible(g, formulation, "staged", with_bounce(g, workspace), memory_system)


def split_for_budget(graph: TrainingGraph, formulation: str, workspace: np.ndarray, memory_system: str,
                     budget_bytes: int, splits: Splits | None = None) -> TrainingGraph:
    """`graph` with the kernels split that `budget_bytes` needs split: those of
    helpful_splits whose unsplit need is over the budget (all of them, should that
    selection still not fit)."""
    splits = splits or helpful_splits(graph, workspace, memory_system)
    chosen = {k: p for k, p in splits.helpful.items() if splits.whole[k] > budget_bytes}
    g = with_pieces(graph, chosen)
    if not chosen or smallest_feasible(g, formulation, "staged", with_bounce(g, workspace),
                                       memory_system).bytes <= budget_bytes:
        return g
    return with_pieces(graph, splits.helpful)
