"""The GPU check: the paper's Figure 12 experiment on cuda+host, small enough to run once.

For each workload (gpu-preset sizes, `--workloads model@batch,...`): capture it (CPU),
profile it on cuda+host (CUDA events), then run, in this order, until `--deadline`:
all-fast (no budget), and per budget (`--ratios`, slow:fast of the iteration's peak) lru,
synchronous and asynchronous plans, then PyTorch's save_on_cpu (no budget). Each run is
timed for `--iterations` training iterations with default settings, then checked once
against eager PyTorch on the same GPU (`--verify-iterations`, deterministic settings: bit
for bit, else within the tolerance stated in autotm/verify.py). The paper's baseline, the
whole pool in CUDA managed memory, is not run (autotm never uses managed memory); lru,
demand paging at tensor granularity, stands in for it.

Writes into OUT: gpu_check.jsonl (one record per run, every field, appended as it
finishes), gpu.jsonl (the same runs as autotm.results records, which `autotm plot gpu
--out OUT` reads), Figure 12 (autotm.plots' fig12-gpu-*.png and .svg; figure12.png
from this script if that fails) and table.txt (the table printed at the end). Cells not
started before the deadline are recorded as skipped.

    PYTHONPATH=src python3 benchmarks/gpu_check.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before anything starts cuBLAS

import torch  # noqa: E402

FORMULATIONS = ("lru", "synchronous", "asynchronous")


def parse_workloads(text: str):
    from autotm.zoo import MIN_IMAGE, Workload, preset_sizes

    out = []
    for item in text.split(","):  # model[@batch[@image]]
        model, *rest = item.strip().split("@")
        sizes = dict(preset_sizes(model, "gpu"))
        b = int(rest[0]) if rest else next(iter(sizes))
        image = int(rest[1]) if len(rest) > 1 else sizes.get(b, max(MIN_IMAGE[model], 224 if model != "transformer" else 512))
        out.append(Workload(model, "gpu" if sizes.get(b) == image else None, b, image))
    return out


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "gpu_check.jsonl"
        self.start = time.monotonic()
        self.records: list[dict] = []

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.start)

    def log(self, *parts) -> None:
        print(f"[{time.monotonic() - self.start:6.1f} s]", *parts, flush=True)

    def write(self, rec: dict) -> None:
        self.records.append(rec)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec, default=float) + "\n")
        shown = {k: rec.get(k) for k in ("workload", "formulation", "budget", "status", "measured_seconds",
                                         "verification")}
        self.log(json.dumps(shown, default=str))

    # ------------------------------------------------------------------------ one workload
    def workload(self, w) -> None:
        from autotm.planner import InfeasibleBudget, plan
        from autotm.profile.workloads import profile_workload
        from autotm.tiers import make_memory_system
        from autotm.runtime.verify import eager_reference

        a = self.args
        base = {"workload": w.name, "model": w.model, "batch": w.batch, "image": w.image,
                "memory_system": a.memory, "device": device_name(a.memory)}
        cells = [("all-fast", None)] + [(f, r) for r in a.ratios for f in FORMULATIONS] + [("save-on-cpu", None)]
        if self.left() <= 0:
            for f, r in cells:
                self.write({**base, "formulation": f, "budget": r, "status": "skipped", "message": "deadline"})
            return
        t0 = time.perf_counter()
        graph, cm, stats = profile_workload(w, a.memory, a.cache)
        base.update(kernels=len(graph.kernels), peak_live_bytes=int(graph.peak_live_bytes),
                    oracle_seconds=float(cm.total_kernel_seconds), profile_seconds=time.perf_counter() - t0)
        self.log(f"{w.name}: profiled {len(graph.kernels)} kernels in {base['profile_seconds']:.1f} s "
                 f"({stats.message()}); peak live {graph.peak_live_bytes / 1e9:.2f} GB")
        reference = None
        with make_memory_system(a.memory) as memory:
            for f, r in cells:
                rec = {**base, "formulation": f, "budget": r}
                if self.left() <= 0:
                    self.write({**rec, "status": "skipped", "message": "deadline"})
                    continue
                try:
                    if f == "save-on-cpu" and memory.fast_device.type != "cuda":
                        rec.update(status="unsupported", message="save-on-cpu is a GPU baseline")
                    elif f == "save-on-cpu":
                        rec.update(self.save_on_cpu(w))
                    else:
                        t1 = time.perf_counter()
                        p = all_fast(graph, cm) if f == "all-fast" else plan(graph, cm, r, f, time_limit=a.time_limit)
                        rec.update(plan_seconds=time.perf_counter() - t1, budget_bytes=p.meta.budget_bytes,
                                   predicted_seconds=p.meta.predicted_seconds, gap=p.meta.gap,
                                   solver_status=p.meta.status)
                        if a.verify_iterations and reference is None:
                            reference = eager_reference(w, a.verify_iterations, device=memory.fast_device)
                        rec.update(self.execute(w, graph, cm, p, memory, reference))
                    rec.setdefault("status", "ok")
                except InfeasibleBudget as e:
                    rec.update(status="infeasible", message=str(e), min_budget_bytes=int(e.minimum))
                except Exception as e:  # record it and go on with the next cell
                    rec.update(status="error", message=f"{type(e).__name__}: {e}")
                    traceback.print_exc()
                torch.cuda.empty_cache()
                self.write(rec)
        del reference, graph, cm

    def execute(self, w, graph, cm, p, memory, reference) -> dict:
        from autotm.api import run_workload

        a = self.args
        torch.cuda.empty_cache()  # the run's reserved peak is its own
        r = run_workload(w, graph, cm, p, memory, iterations=a.iterations)
        rep = r.report
        out = {"measured_seconds": rep.measured_seconds, "iteration_seconds": rep.iteration_seconds,
               "peak_fast_bytes": rep.peak_fast_bytes, "bytes_to_slow": rep.bytes_to_slow,
               "bytes_to_fast": rep.bytes_to_fast,
               "async_moves": sum(m.mode == "async" for m in rep.moves if m.kind != "drop"),
               "sync_moves": sum(m.mode == "sync" for m in rep.moves if m.kind != "drop"),
               "peak_allocated_bytes": rep.meta.get("peak_allocated_bytes"),
               "peak_reserved_bytes": rep.meta.get("peak_reserved_bytes"), "losses": rep.losses}
        if a.verify_iterations:
            torch.cuda.empty_cache()
            v = run_workload(w, graph, cm, p, memory, iterations=a.verify_iterations, verify=True,
                             reference=reference)
            m = v.report.meta  # on the CPU (a dry run) only bits are compared
            out.update(identical=v.identical, matched=m.get("matched", v.identical),
                       verification=m.get("verification", "bit-identical" if v.identical else "differs"),
                       nondeterministic=m.get("nondeterministic"), approximate=m.get("approximate"),
                       mismatches=v.mismatches[:5])
        return out

    def save_on_cpu(self, w) -> dict:
        from autotm.runtime.gpu_baselines import run_save_on_cpu

        d = run_save_on_cpu(w, iterations=self.args.iterations, verify=bool(self.args.verify_iterations))
        d["verification"] = None if d["identical"] is None else (
            "bit-identical to eager" if d["identical"] else "differs from eager")
        return d

    # --------------------------------------------------------------------------- report
    def table(self) -> str:
        by = {}
        for r in self.records:
            by.setdefault(r["workload"], {})[(r["formulation"], r.get("budget"))] = r

        def sec(r):
            return r.get("measured_seconds") if r and r.get("status") == "ok" else None

        def fmt(x, spec=".3f"):
            return "-" if x is None else format(x, spec)

        def ratio(a, b):
            return None if a is None or b is None else a / b

        lines = [f"{'workload':36} {'budget':6} {'all-fast':>8} {'save-cpu':>8} {'lru':>8} {'sync':>8} {'async':>8} "
                 f"{'sync/AF':>7} {'async/AF':>8} {'lru/async':>9} {'soc/async':>9}  matched eager (sync, async, lru)"]
        for wname, cells in by.items():
            af = sec(cells.get(("all-fast", None)))
            soc = sec(cells.get(("save-on-cpu", None)))
            for r in self.args.ratios:
                lru, sy, asy = (cells.get((f, r)) for f in FORMULATIONS)
                s_l, s_s, s_a = sec(lru), sec(sy), sec(asy)
                ver = ", ".join(_short(c) for c in (sy, asy, lru))
                lines.append(f"{wname:36} {r:6} {fmt(af)} {fmt(soc):>8} {fmt(s_l):>8} {fmt(s_s):>8} {fmt(s_a):>8} "
                             f"{fmt(ratio(s_s, af), '.2f'):>7} {fmt(ratio(s_a, af), '.2f'):>8} "
                             f"{fmt(ratio(s_l, s_a), '.2f'):>9} {fmt(ratio(soc, s_a), '.2f'):>9}  {ver}")
            extra = [c for c in cells.values() if c.get("status") not in ("ok",)]
            for c in extra:
                lines.append(f"    {c['formulation']} {c.get('budget') or ''}: {c['status']}: {str(c.get('message'))[:150]}")
            af_rec, soc_rec = cells.get(("all-fast", None)), cells.get(("save-on-cpu", None))
            lines.append(f"    all-fast matched eager: {_short(af_rec)}; save-on-cpu same as eager: "
                         f"{(soc_rec or {}).get('verification')}; peak reserved GB all-fast "
                         f"{fmt(_gb(af_rec), '.2f')}, save-on-cpu {fmt(_gb(soc_rec), '.2f')}")
        lines.append("seconds: median training iteration (after the first); X/AF: time over all-fast; "
                     "lru/async, soc/async: speedup of async over lru and over save_on_cpu")
        return "\n".join(lines)

    def figure(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups, series = [], {"synchronous": [], "asynchronous": [], "save-on-cpu": [], "all-fast": []}
        by = {}
        for r in self.records:
            by.setdefault(r["workload"], {})[(r["formulation"], r.get("budget"))] = r
        for cells in by.values():
            for ratio in self.args.ratios:
                lru = cells.get(("lru", ratio))
                if not lru or lru.get("status") != "ok":
                    continue
                base = lru["measured_seconds"]
                groups.append(f"{cells[('lru', ratio)]['model']}\nbatch {cells[('lru', ratio)]['batch']}\n{ratio}")
                for f in series:
                    c = cells.get((f, None if f in ("save-on-cpu", "all-fast") else ratio))
                    ok = c is not None and c.get("status") == "ok" and c.get("measured_seconds")
                    series[f].append(base / c["measured_seconds"] if ok else 0.0)
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4))
        width = 0.8 / len(series)
        for i, (f, ys) in enumerate(series.items()):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, ys, width, label=f if f != "all-fast" else "all-fast (no budget)")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="lru")
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_ylabel("speedup over lru (tensor demand paging)")
        ax.set_title(f"Figure 12 on {device_name(self.args.memory)}: {self.args.memory}, "
                     "budget = slow:fast ratio of the peak")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def to_record(rec: dict):
    """An autotm.results.Record of one run (how it compared with eager goes to `message`)."""
    import datetime

    from autotm.experiments.results import Record

    budget = rec.get("budget")
    status = rec.get("status", "ok")
    if status == "skipped":
        status = "error"  # not final: a later sweep runs it
    msg = rec.get("message") or (f"eager PyTorch on the GPU: {rec['verification']}" if rec.get("verification") else "")
    return Record.from_dict({
        **{k: rec.get(k) for k in ("workload", "model", "batch", "image", "memory_system", "formulation",
                                   "budget_bytes", "predicted_seconds", "measured_seconds", "oracle_seconds",
                                   "plan_seconds", "gap", "solver_status", "peak_fast_bytes", "peak_live_bytes",
                                   "bytes_to_slow", "bytes_to_fast", "identical", "peak_allocated_bytes",
                                   "peak_reserved_bytes", "min_budget_bytes")},
        "experiment": "gpu", "preset": "gpu", "access": "staged", "simulated": False, "budget": budget,
        "ratio": budget if budget and ":" in budget else None, "status": status, "message": msg,
        "iteration_seconds": rec.get("iteration_seconds") or [], "num_kernels": rec.get("kernels"),
        "environment": {"device": rec.get("device"), "torch": torch.__version__, "cuda": torch.version.cuda},
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })


def all_fast(graph, cm):
    """The all-fast plan (no budget, no moves), with its predicted time."""
    from autotm.ir.plan import all_fast_plan
    from autotm.checks.simulate import simulate

    import dataclasses

    p = all_fast_plan(graph, memory_system=cm.memory_system, access=cm.access)
    return dataclasses.replace(p, meta=dataclasses.replace(p.meta, predicted_seconds=simulate(p, graph, cm).predicted_seconds))


def device_name(memory: str) -> str:
    return torch.cuda.get_device_name() if memory.startswith("cuda") else "cpu"


def _short(rec) -> str:
    if not rec:
        return "-"
    if rec.get("status") != "ok":
        return rec.get("status", "-")
    v = rec.get("verification")
    if v is None:
        return "not checked"
    return "bits" if v == "bit-identical" else ("tolerance" if str(v).startswith("within") else "DIFFERS")


def _gb(rec):
    return None if not rec or rec.get("peak_reserved_bytes") is None else rec["peak_reserved_bytes"] / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", default="vgg19@64,resnet50@64,transformer@16")
    ap.add_argument("--ratios", default="1:2,1:1", help="slow:fast budgets, of the iteration's peak live bytes")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--verify-iterations", type=int, default=2, help="0: no check against eager")
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver seconds per plan")
    ap.add_argument("--deadline", type=float, default=240.0, help="start no run after this many seconds")
    ap.add_argument("--cache", default=None, help="profile cache (default: the user's autotm cache)")
    ap.add_argument("--memory", default="cuda+host", help="cpu+file: a dry run of this driver without a GPU")
    args = ap.parse_args(argv)
    args.ratios = [r.strip() for r in args.ratios.split(",") if r.strip()]
    if args.memory == "cuda+host" and not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU; torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    check = Check(args)
    check.log(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {device_name(args.memory)}")
    try:
        for w in parse_workloads(args.workloads):
            try:
                check.workload(w)
            except Exception as e:  # a workload that cannot be captured or profiled
                traceback.print_exc()
                check.write({"workload": w.name, "model": w.model, "batch": w.batch, "image": w.image,
                             "formulation": "profile", "budget": None, "status": "error",
                             "message": f"{type(e).__name__}: {e}"})
    except KeyboardInterrupt:  # out of time (gpu_check.sh's timeout): report what finished
        check.log("interrupted: the table and figure hold the runs that finished")
    table = check.table()
    print(table, flush=True)
    (check.out / "table.txt").write_text(table + "\n")
    figures = []
    try:  # the project's Figure 12 from autotm.experiments.results records
        from autotm.experiments.plots import gpu as plot_gpu
        from autotm.experiments.results import ResultsStore

        records = [to_record(r) for r in check.records if r.get("formulation") != "profile"]
        store = ResultsStore(check.out / "gpu.jsonl")
        for r in records:
            store.append(r)
        figures = plot_gpu(records, check.out, tag="gpu")
    except Exception:
        traceback.print_exc()
    if not figures:
        try:
            check.figure(check.out / "figure12.png")
        except Exception:
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
