"""Solve time and gap of the ILP on the conventional networks (fake-captured, sim: cost model).

For each network: capture on fake tensors (nothing allocated), cost model from a tier spec
(default sim:nvme, a staged system), then the synchronous and asynchronous formulations at
4:1 with a 60 s limit and a 1 % gap target. Prints one row per (network, formulation),
and the first-touch and lru baselines' predicted times from the same cost model as a
reference point (ratio = ILP / baseline, lower is better).

    python benchmarks/solve_time.py [--spec sim:nvme] [--ratio 4:1] [--models vgg19,resnet200,...]

With several windows (--window 1,3,7,15,31) it measures instead the effect of the async
window on the asynchronous formulation: per network, one synchronous solve (the warm
start, as plan() does it), then one asynchronous solve per window, printing the predicted
time relative to the window-15 plan (or the last window listed) and the solve time.

Window study, 2026-12-02, this shared 2-core machine (other jobs running), sim:nvme, 4:1,
conventional preset, 40 s limit, 1 % gap target (pred s: the plan's predicted iteration):

    network       window   vars   solve s  gap %   pred s  vs w15
    resnet200       1      9015     2.9    0.01   2050.7   1.018
                    3      9142     1.0    0.02   2015.9   1.000
                    7     10678     0.9    0.11   2017.4   1.001
                   15     11108     7.1    0.00   2015.2   1.000
                   31     11099     6.5    0.05   2016.3   1.001
    inception_v4    1      7681     0.5    0.55   3346.9   1.016
                    3      7698     0.6    0.09   3302.6   1.003
                    7      8598     3.4    0.00   3293.6   1.000
                   15      9863     7.4    0.00   3293.6   1.000
                   31      9905     8.4    0.00   3293.6   1.000
    densenet264     1     11849     0.8    0.42    629.8   1.056
                    3     12223     3.7    0.11    602.8   1.011
                    7     13211     2.8    0.58    597.7   1.002
                   15     14014     9.6    0.38    596.4   1.000
                   31     14176    10.0    0.05    594.4   0.997

Window 1 loses 2-6 %, window 7 is within 0.2 % of 15, 31 gains at most 0.3 % for a
little more solve time: 15 stays the default.
"""

from __future__ import annotations

import argparse
import time

from autotm.ir.plan_meta import SolverStats
from autotm.planner import _best_baseline, plan
from autotm.planner.staged import solve_staged
from autotm.profile.profiler import profile
from autotm.checks.simulate import simulate
from autotm.frontend.workloads import capture_workload
from autotm.zoo import workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="sim:nvme")
    ap.add_argument("--ratio", default="4:1")
    ap.add_argument("--models", default="vgg19,resnet200,inception_v4,densenet264")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--window", default="15", help="one window, or a list for the window study")
    args = ap.parse_args()
    windows = [int(w) for w in args.window.split(",")]
    if len(windows) > 1:
        return window_study(args, windows)
    print(f"{'network':<36} {'formulation':<13} {'kernels':>7} {'vars':>7} {'rows':>7} {'nnz':>9} "
          f"{'build s':>7} {'solve s':>7} {'gap %':>6} {'pred s':>9} {'vs lru':>7} {'vs f-t':>7}")
    for name in args.models.split(","):
        w = workload(name, "conventional")
        t0 = time.perf_counter()
        g = capture_workload(w, fake=True)
        cm = profile(g, args.spec)
        base = {}
        for b in ("lru", "first-touch"):
            try:
                base[b] = plan(g, cm, args.ratio, b).meta.predicted_seconds
            except Exception as e:  # infeasible budget
                base[b] = float("nan")
                print(f"  {b}: {e}")
        for f in ("synchronous", "asynchronous"):
            try:
                p = plan(g, cm, args.ratio, f, time_limit=args.time_limit, window=windows[0], arena=False)
            except Exception as e:
                print(f"{w.name:<36} {f:<13} {type(e).__name__}: {e}")
                continue
            m = p.meta
            st = m.solver or SolverStats()
            print(f"{w.name:<36} {f:<13} {len(g.kernels):>7} {st.variables:>7} {st.rows:>7} {st.nonzeros:>9} "
                  f"{st.build_seconds:>7.1f} {m.solve_seconds:>7.1f} {100 * m.gap:>6.2f} "
                  f"{m.predicted_seconds:>9.2f} {m.predicted_seconds / base['lru']:>7.3f} "
                  f"{m.predicted_seconds / base['first-touch']:>7.3f}", flush=True)
        print(f"  (capture + profile + plans: {time.perf_counter() - t0:.0f} s; simulated on {args.spec})", flush=True)


def window_study(args, windows: list[int]) -> None:
    from autotm.ir.budget import parse_budget

    ref_w = 15 if 15 in windows else windows[-1]
    print(f"{'network':<36} {'window':>6} {'vars':>7} {'rows':>7} {'solve s':>7} {'gap %':>6} {'pred s':>9} "
          f"{f'vs w{ref_w}':>7}", flush=True)
    for name in args.models.split(","):
        w = workload(name, "conventional")
        g = capture_workload(w, fake=True)
        cm = profile(g, args.spec)
        budget = parse_budget(args.ratio, g.peak_live_bytes)
        start = _best_baseline(g, cm, budget)
        sync, st = solve_staged(g, cm, budget, formulation="synchronous", time_limit=args.time_limit / 4,
                                warm_start=start[0] if start else None)
        print(f"{w.name:<36} {'sync':>6} {st.variables:>7} {st.rows:>7} {st.solve_seconds:>7.1f} "
              f"{100 * st.gap:>6.2f} {simulate(sync, g, cm).predicted_seconds:>9.3f}", flush=True)
        rows = []
        for win in windows:
            try:
                p, st = solve_staged(g, cm, budget, formulation="asynchronous", window=win,
                                     time_limit=args.time_limit, warm_start=sync)
            except TimeoutError as e:
                print(f"{w.name:<36} {win:>6} {e}", flush=True)
                continue
            rows.append((win, st, simulate(p, g, cm).predicted_seconds))
        ref = next((pred for win, _, pred in rows if win == ref_w), float("nan"))
        for win, st, pred in rows:
            print(f"{w.name:<36} {win:>6} {st.variables:>7} {st.rows:>7} {st.solve_seconds:>7.1f} "
                  f"{100 * st.gap:>6.2f} {pred:>9.3f} {pred / ref:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
