"""`autotm profile`: profile zoo workloads into the cache, with a progress bar and a
summary table (or JSON)."""

from __future__ import annotations

import json
import time

from ..profile.calibrate import MeasureOverhead
from ..profile.workloads import profile_workload


def profile_command(models: list[str], preset: str | None = None, batch: int | None = None,
                    image: int | None = None, memory: str = "cpu+file", cache: str | None = None,
                    recache: bool = False, as_json: bool = False,
                    measure_overhead: MeasureOverhead | None = None) -> list[dict]:
    """`autotm profile`: profile each model's workload on `memory`, with a progress bar
    (kernel timings done / total, ETA) and a summary table; or JSON on stdout (the bar then
    goes to stderr). Returns the summary rows."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn
    from rich.table import Table

    from ..zoo import workload

    out = Console()
    err = Console(stderr=True)
    if preset is None and (batch is None or image is None):
        preset = "test"
    rows = []
    for name in models:
        w = workload(name, preset, batch=batch, image=image)
        with Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                 TextColumn("{task.fields[what]}"), TimeElapsedColumn(), TextColumn("ETA"),
                 TimeRemainingColumn(), console=err, transient=as_json) as bar:
            task = bar.add_task(w.name, total=None, what="capturing")

            def progress(done: int, total: int, what: str, task=task) -> None:
                bar.update(task, completed=done, total=total, what=what[:40])

            t0 = time.perf_counter()
            graph, cm, stats = profile_workload(w, memory, cache, recache=recache, progress=progress,
                                                measure_overhead=measure_overhead)
            bar.update(task, what="done", completed=bar.tasks[0].total or 0)
        rows.append({
            "workload": w.name, "memory_system": cm.memory_system, "access": cm.access,
            "simulated": cm.simulated, "kernels": len(graph.kernels), "unique_kernels": graph.unique_signatures,
            "measured": stats.measured, "cache_hits": stats.cache_hits,
            "move_samples_measured": stats.move_samples_measured,
            "profile_seconds": round(stats.seconds, 3), "total_seconds": round(time.perf_counter() - t0, 3),
            "predicted_all_fast_seconds": round(cm.total_kernel_seconds, 6),
            "moves": {f"{d}/{m}": {"latency_s": c.latency_s, "bandwidth_bytes_per_s": c.bandwidth_bytes_per_s}
                      for (d, m), c in cm.moves.items()},
            "peak_workspace_bytes": max(cm.workspace_bytes, default=0),
            "copy_interference": dict(cm.copy_interference),
            "cache": stats.cache_path, "message": stats.message(),
            # how many times slower the machine ran when the cached timings were taken than now
            "pace_ratio": None if stats.pace is None or stats.pace.ratio is None else round(stats.pace.ratio, 3),
        })
        if stats.cache_rebuilt:
            err.print(f"[yellow]cache rebuilt: {stats.cache_rebuilt}[/yellow]")
    if as_json:
        print(json.dumps(rows, indent=2))
        return rows
    t = Table(title=f"profile on {memory}")
    for col in ("workload", "kernels", "unique", "measured", "cache hits", "seconds", "all-fast (pred.)",
                "max workspace"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        t.add_row(r["workload"], str(r["kernels"]), str(r["unique_kernels"]), str(r["measured"]),
                  str(r["cache_hits"]), f"{r['total_seconds']:.1f}", f"{r['predicted_all_fast_seconds']:.3f} s",
                  f"{r['peak_workspace_bytes'] / 2**20:.1f} MiB")
    out.print(t)
    for r in rows:
        out.print(f"{r['workload']}: {r['message']}")
    return rows
