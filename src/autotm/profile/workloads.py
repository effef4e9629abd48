"""Workload glue: capture a zoo workload (on real tensors, or fake for `sim:<spec>`) and
profile it."""

from __future__ import annotations

from ..tiers.host_heap import large_blocks_mapped
from .calibrate import MeasureOverhead
from .profiler import profile
from .stats import Progress


def capture_real(w, seed: int = 0):
    """Capture workload `w` on real tensors: (graph, model, optimizer, batch, inputs)."""
    from ..frontend.capture import capture
    from ..interpret.replay import TrainingState

    model = w.build_model(seed=seed)
    opt = w.make_optimizer(model.parameters())
    batch = w.make_batch(seed=seed)
    # the capture's tensors are not to stay behind in glibc's heap, where a session run
    # later in this process would scatter its allocations over them (large_blocks_mapped)
    with large_blocks_mapped():
        graph = capture(model, w.loss_fn(), opt, batch, name=w.name)
    inputs = TrainingState(graph, model, opt).inputs(batch)
    return graph, model, opt, batch, inputs


def profile_workload(w, memory: str = "cpu+file", cache=None, *, recache: bool = False,
                     progress: Progress | None = None, before_profile=None,
                     measure_overhead: MeasureOverhead | None = None):
    """Capture `w` (fake for sim:<spec>, real otherwise) and profile it: (graph, CostModel, ProfileStats).
    `before_profile(graph)` runs between the two (a budget checked before minutes of profile)."""
    if memory.startswith("sim:"):
        from ..frontend.workloads import capture_workload

        graph = capture_workload(w, fake=True)
        if before_profile is not None:
            before_profile(graph)
        cm, stats = profile(graph, memory, cache, recache=recache, return_stats=True)
        return graph, cm, stats
    graph, model, opt, batch, inputs = capture_real(w)
    del model, opt, batch
    if before_profile is not None:
        before_profile(graph)
    cm, stats = profile(graph, memory, cache, inputs=inputs, recache=recache, progress=progress,
                        return_stats=True, measure_overhead=measure_overhead)
    return graph, cm, stats
