"""The wake interpreter: what a kernel loses right after a blocking sync move (memory
systems with idle_sync_moves), measured by WakeReplay and kept per signature.

W_k, the wake seconds of kernel k (`CostModel.wake_seconds`), is the "cold" excess of
kernel k's signature plus the "second" excess of kernel k + 1's (`wake_from_excess`)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Mapping

import numpy as np
import torch

from ..interpret.replay import Replay
from ..ir.graph import Role, TrainingGraph
from .cache import ProfileCache
from .stats import ProfileStats

WAKE_ROUNDS = 3  # replay iterations per phase of WakeReplay
WAKE_PAUSE_BYTES = (1 << 20, 64 << 20)  # the blocking move's bytes: at least, at most (wake_pause_bytes)
WAKE_ROLES = ("cold", "second", "warm")


class WakeReplay(Replay):
    """Times every kernel where it runs, some of them right after a blocking sync move.

    In phase p (0, 1, 2) the iteration writes `pause_bytes` to the slow tier (sync, the
    thread waits in the I/O) before each kernel k with k % 3 == p: kernel k is timed
    "cold", k + 1 "second", k + 2 "warm" (the executor's kernels ran slower at the two
    positions after a sync move, not at the third: benchmarks/HISTORY.md). Three phases
    time every position in every role; each iteration appends one sample per kernel to
    samples[role][k]."""

    def __init__(self, graph: TrainingGraph, memory, samples: dict[str, list[list[float]]], pause_bytes: int):
        super().__init__(graph)
        self.memory = memory
        self.samples = samples
        self.phase = 0
        self.pause = torch.randint(0, 255, (pause_bytes,), dtype=torch.uint8)

    def run_kernel(self, k: int) -> None:
        role = (k - self.phase) % 3
        if role == 0:
            self.memory.free_slow(self.memory.to_slow(-1, self.pause))
        t0 = time.perf_counter()
        super().run_kernel(k)
        self.samples[WAKE_ROLES[role]][k].append(time.perf_counter() - t0)


def wake_pause_bytes(graph: TrainingGraph) -> int:
    """The blocking move WakeReplay times kernels after: as long as a typical move of the
    plans, the bytes-weighted median activation (half of the activations' bytes are in
    larger ones), within WAKE_PAUSE_BYTES. The longer the thread waits, the colder the next
    kernels (benchmarks/HISTORY.md, "Notes moved from the code")."""
    sizes = np.sort(np.asarray([t.nbytes for t in graph.tensors if t.role == Role.ACTIVATION], dtype=np.int64))
    lo, hi = WAKE_PAUSE_BYTES
    if not len(sizes):
        return lo
    half = sizes[int(np.searchsorted(np.cumsum(sizes), sizes.sum() / 2))]
    return int(min(max(int(half), lo), hi))


def wake_excess(graph: TrainingGraph, samples: dict[str, list[list[float]]]) -> dict[str, tuple[float, float]]:
    """Per signature, from WakeReplay's samples: (cold, second) = the median over its
    positions of the median cold (second) time less the median warm one, at least 0 (one
    kernel's samples are few and noisy, a signature's positions many)."""
    med = {r: [statistics.median(x) if x else math.nan for x in samples[r]] for r in WAKE_ROLES}
    by_sig: dict[str, tuple[list[float], list[float]]] = {}
    for k, kern in enumerate(graph.kernels):
        c, e = by_sig.setdefault(kern.signature, ([], []))
        if not math.isnan(med["warm"][k]):
            if not math.isnan(med["cold"][k]):
                c.append(med["cold"][k] - med["warm"][k])
            if not math.isnan(med["second"][k]):
                e.append(med["second"][k] - med["warm"][k])
    return {s: (max(0.0, statistics.median(c)) if c else 0.0, max(0.0, statistics.median(e)) if e else 0.0)
            for s, (c, e) in by_sig.items()}


def wake_from_excess(graph: TrainingGraph, excess: Mapping[str, tuple[float, float]]) -> tuple[float, ...]:
    """W_k = cold excess of sig(k) + second excess of sig(k + 1)."""
    ks = graph.kernels
    return tuple(excess[ks[k].signature][0] + (excess[ks[k + 1].signature][1] if k + 1 < len(ks) else 0.0)
                 for k in range(len(ks)))


def wake_seconds(graph: TrainingGraph, samples: dict[str, list[list[float]]]) -> tuple[float, ...]:
    """W_k for every kernel from WakeReplay's samples (wake_excess, wake_from_excess)."""
    return wake_from_excess(graph, wake_excess(graph, samples))


def cached_wake_samples(graph: TrainingGraph, db: ProfileCache, env: str, recache: bool = False) -> tuple[dict, int]:
    """(samples, iterations done) of WakeReplay for `graph` from the cache (fresh if none,
    or of another pause size)."""
    n = len(graph.kernels)
    pause = wake_pause_bytes(graph)
    samples = None if recache else db.wake_samples(env, graph.fingerprint)
    if (samples is None or samples.get("pause_bytes") != pause
            or any(len(samples.get(r, ())) != n for r in WAKE_ROLES)):
        samples = {"pause_bytes": pause, **{r: [[] for _ in range(n)] for r in WAKE_ROLES}}
    return samples, (sum(len(samples[r][0]) for r in WAKE_ROLES) if n else 0)


def measure_wakes(graph: TrainingGraph, memory, db: ProfileCache, env: str, inputs, samples: dict, done: int, *,
                  rounds: int = WAKE_ROUNDS, stats: ProfileStats | None = None,
                  progress: Callable[[str], None] | None = None,
                  replace: bool = False) -> tuple[float, ...]:
    """W_k for every kernel of `graph`, from 3 x `rounds` WakeReplay iterations, continuing
    `samples` after `done` of them (cached_wake_samples); the samples are committed after
    each iteration (a killed profile resumes), then each signature's excess (wake_excess),
    which later graphs reuse: a signature already in the cache keeps its value (unless
    `replace`), so every graph's kernels of one signature are charged alike."""
    replay = WakeReplay(graph, memory, samples, samples["pause_bytes"])
    while graph.kernels and done < 3 * rounds:
        replay.phase = done % 3
        with torch.no_grad():
            replay.run(dict(inputs))
        db.put_wake_samples(env, graph.fingerprint, samples)
        done += 1
        if stats is not None:
            stats.iterations += 1
        if progress is not None:
            progress("kernels after a blocking move")
    db.put_wake_excess(env, wake_excess(graph, samples) if graph.kernels else {}, replace=replace)
    return wake_from_excess(graph, db.wake_excess(env))

