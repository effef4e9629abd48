"""Wall time to profile zoo workloads on a real memory system from an empty cache.

For each model (default: vgg19, resnet200, inception_v4, densenet264 at the `cpu` preset
on `cpu+file`): capture on real tensors, then `autotm.profile.profile` with a fresh
temporary cache file; reports capture and profile seconds, unique versus total kernels,
timings measured and move samples. Target: all four profiled in at most 10 minutes.

    .venv/bin/python benchmarks/profile_time.py [--models vgg19,resnet200] [--preset cpu]
        [--memory cpu+file] [--threads N] [--json out.json] [--keep-cache DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time

import torch

from autotm.profile.profiler import profile
from autotm.profile.workloads import capture_real
from autotm.runtime.overhead import measure_executor_overhead
from autotm.zoo import workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vgg19,resnet200,inception_v4,densenet264")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--memory", default="cpu+file")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--keep-cache", default=None, metavar="DIR",
                    help="keep each model's cache as DIR/MODEL.sqlite (default: temporary files)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.keep_cache:
        os.makedirs(a.keep_cache, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()}")
    rows = []
    t_all = time.perf_counter()
    for name in a.models.split(","):
        w = workload(name, a.preset)
        t0 = time.perf_counter()
        graph, model, opt, batch, inputs = capture_real(w)
        del model, opt
        t_capture = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(a.keep_cache or d, f"{name}.sqlite")
            if os.path.exists(path):
                raise SystemExit(f"{path} exists: the benchmark profiles from an empty cache")
            cm, st = profile(graph, a.memory, path, inputs=inputs, return_stats=True,
                            measure_overhead=measure_executor_overhead)
        rows.append({"workload": w.name, "kernels": len(graph.kernels), "unique_kernels": graph.unique_signatures,
                     "measured": st.measured, "move_samples": st.move_samples_measured,
                     "capture_s": round(t_capture, 1), "profile_s": round(st.seconds, 1),
                     "predicted_all_fast_s": round(cm.total_kernel_seconds, 3)})
        print(json.dumps(rows[-1]), flush=True)
        del graph, inputs, batch, cm
        gc.collect()
    total = time.perf_counter() - t_all
    print()
    print(f"{'workload':40s} {'kernels':>8s} {'unique':>7s} {'capture s':>10s} {'profile s':>10s} {'all-fast s (pred.)':>19s}")
    for r in rows:
        print(f"{r['workload']:40s} {r['kernels']:8d} {r['unique_kernels']:7d} {r['capture_s']:10.1f} "
              f"{r['profile_s']:10.1f} {r['predicted_all_fast_s']:19.3f}")
    prof = sum(r["profile_s"] for r in rows)
    print(f"profile total {prof:.1f} s, with capture {total:.1f} s (target: <= 600 s); "
          f"load average at the end {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "profile_total_s": prof, "total_s": total}, f, indent=2)


if __name__ == "__main__":
    main()
