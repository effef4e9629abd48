"""The executor's own seconds per kernel and per move, measured once per environment.

A profile times each kernel's call and each move's call to the tier; the executor does
more around them, in Python, on the compute thread: building a kernel's operands,
checking RSS before kernels that may allocate (with an arena), freeing by liveness,
recording every move, reading into the arena slot, giving a slow copy back when its
tensor dies. That is a few microseconds a kernel and tens a move: at the test preset's
~50 us kernels and ~150 us moves, ~29 us a move was 13 % of an evict-all plan's iteration
(densenet264 test evict-all sync, 17.9 % under-predicted without it).

It is measured on a calibration graph built here (an MLP of small layers, so that the
executor's work dominates), profiled like any graph (its arena layout needs the kernels'
workspace), then run by the executor with two plans, alternately, iteration after
iteration: all-fast (F) and evict-all sync (S), S in its arena as a budgeted plan runs.
Measured only, nothing predicted: with T the median iteration, K the median sum of the
executor's timed kernel calls (so the kernels' own times, and their wake-up after a move,
stay out of it), B the sum of its times building the kernels' operands, R the sum of its
timed sync moves (each the tier's call and the record around it), M the sync evicts and
prefetches of S, N the kernels and Q the sum over them of the profile's position seconds
(the work after each kernel as the profiler's interpreter does it, building the next
kernel's operands included, as the executor builds them: already part of every kernel's
profiled time),

    kernel_s    = ((T_F - K_F) - Q) / N                          (at least 0)
    sync_move_s = ((T_S - K_S - B_S - R_S) - (T_F - K_F - B_F)) / M    (at least 0)

the executor's time outside kernel calls beyond what the profile counts after each kernel,
and the time outside kernel calls, operand building and moves that the moves add over
all-fast. (Building the operands of a kernel right after a sync move is slower, as the
kernel is: the profile's wake times, which time both, count it; in sync_move_s it was
counted twice, ~10 us a move, and the evict plans were over-predicted.) The profile
adds kernel_s to every kernel and sync_move_s to every sync move, and async_move_s =
sync_move_s to every async move's seconds on the calling thread ("host"): most of that
work (the slow copy given back when its tensor dies, the record, the RSS checks with an
arena, the arena slot to read into) is the same for an async move, and without it the
test preset's evict-all async plans were under-predicted (densenet264 7.7-11.0 % in five
runs, ~25 us an async move). The planner and the simulator see them without a term of
their own. Left out, and why:
- the part inside R beyond the tier's call (~10 us: the arena slot to read into, the
  record): telling it apart needs the tier's call timed alone in the executor;
- a measurement of its own for async moves: an evict-all async plan's residual against
  its prediction (less kernels and sync moves) came out 3-14 us a move, but moved with
  the error of each fresh profile's move and kernel models (the same kind of residual
  gave sync moves 0-82 us and kernels 0-4.5 us on fresh profiles of this machine,
  against 25-34 us and 2.3-2.5 us from the measured-only formulas above).
"""

from __future__ import annotations

import dataclasses
import statistics

import torch
from torch import nn

from ..ir.costmodel import ExecutorOverhead

# the calibration MLP: layers of WIDTH x WIDTH, BATCH rows (activations of 32 KiB, small
# moves as the test preset's); ~400 kernels, and ~100 moves an iteration of the evict plan
WIDTH, LAYERS, BATCH = 256, 32, 32
WARMUP, ROUNDS = 2, 20  # iterations of each plan: untimed, then timed (alternating plans)


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def calibration_graph():
    """(graph, batch, inputs) of the calibration MLP, captured on real tensors."""
    from ..frontend.capture import capture
    from ..interpret.replay import TrainingState

    model = _model()
    opt = _optimizer(model)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
    graph = capture(model, nn.CrossEntropyLoss(), opt, batch, name="executor-calibration")
    return graph, batch, TrainingState(graph, model, opt).inputs(batch)


def measure_executor_overhead(memory, cost_model_of) -> ExecutorOverhead:
    """Run the calibration (module doc) on `memory`; `cost_model_of(graph, inputs)` profiles
    the calibration graph without overheads (the caller's cache and environment) and returns
    (its CostModel, its position seconds per kernel: the profiled work after each kernel)."""
    from .session import ExecutorSession
    from ..ir.plan import all_fast_plan, evict_all_activations_plan
    from ..planner import laid_out
    from ..checks.validate import validate

    graph, batch, inputs = calibration_graph()
    cm, positions = cost_model_of(graph, inputs)
    del inputs
    plans = {"F": all_fast_plan(graph, memory.name, memory.access)}
    p = evict_all_activations_plan(graph, "sync", memory.name, memory.access)
    lp = laid_out(p, graph, cm)
    plans["S"] = dataclasses.replace(lp, budget_bytes=max(lp.arena_bytes, validate(p, graph).peak_fast_bytes))
    sessions = {}
    try:
        for key, plan in plans.items():
            model = _model()
            sessions[key] = ExecutorSession(graph, plan, memory, model, _optimizer(model))
        wall: dict[str, list[float]] = {k: [] for k in plans}
        kern: dict[str, list[float]] = {k: [] for k in plans}
        build: dict[str, list[float]] = {k: [] for k in plans}
        recorded: dict[str, list[float]] = {k: [] for k in plans}
        costed: dict[str, int] = {}
        for r in range(WARMUP + ROUNDS):
            for key, s in sessions.items():
                s.step(batch)
                if r >= WARMUP:
                    wall[key].append(s.iteration_seconds[-1])
                    kern[key].append(float(s.kernel_seconds[-1].sum()))
                    build[key].append(float(s.operand_seconds[-1].sum()))
                    sync = [m for m in s.executor.moves if m.mode == "sync"]
                    recorded[key].append(sum(m.seconds for m in sync))
                    costed[key] = sum(m.kind in ("evict", "prefetch") for m in sync)
    finally:
        for s in sessions.values():
            s.close()
    T = {k: statistics.median(v) for k, v in wall.items()}
    K = {k: statistics.median(v) for k, v in kern.items()}
    R = {k: statistics.median(v) for k, v in recorded.items()}
    B = {k: statistics.median(v) for k, v in build.items()}
    n = len(graph.kernels)
    kernel_s = max(0.0, (T["F"] - K["F"]) / n - sum(positions) / n)
    m_s = costed["S"]
    sync_s = max(0.0, ((T["S"] - K["S"] - B["S"] - R["S"]) - (T["F"] - K["F"] - B["F"])) / max(m_s, 1))
    return ExecutorOverhead(kernel_s, sync_s, sync_s)
