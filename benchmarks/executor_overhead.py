"""Executor overhead: the all-fast plan through the executor versus eager PyTorch.

For each model (default: every zoo model at the `cpu` preset) a fresh subprocess builds
two copies of the model, trains one eagerly (zero_grad, forward, loss, backward,
optimizer.step) and one through an ExecutorSession running the all-fast plan on cpu+file
(nothing moves, so only the executor's own cost shows), interleaving the two (ABBA
order, to cancel drift) after one warm-up iteration of each. Prints the median seconds
per iteration of each and their ratio (target <= 1.05).

    python benchmarks/executor_overhead.py [--models vgg19,resnet50] [--iterations 4]
        [--plans all-fast,evict-sync,evict-async] [--timeout 900]

With --plans, the executor runs each listed plan in turn (evict plans move every
activation through the file tier, with a budget of the plan's own peak): their times
are for information, the ratio that matters is all-fast's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _child import ChildFailed, emit, run_child

MODELS = ("vgg19", "vgg416", "resnet50", "resnet200", "inception_v4", "densenet264", "transformer")


def one(model: str, preset: str, iterations: int, plans: list[str]) -> dict:
    from autotm.frontend.capture import capture
    from autotm.runtime.session import ExecutorSession
    from autotm.ir.plan import all_fast_plan, evict_all_activations_plan
    from autotm.tiers import make_memory_system
    from autotm.checks.validate import validate
    from autotm.zoo import workload

    w = workload(model, preset)
    batch = w.make_batch(seed=0)
    loss_fn = w.loss_fn()
    eager_model = w.build_model(seed=0)
    eager_opt = w.make_optimizer(eager_model.parameters())

    def eager_step():
        eager_opt.zero_grad(set_to_none=True)
        loss = loss_fn(eager_model(batch[0]), batch[1])
        loss.backward()
        eager_opt.step()
        return float(loss)

    m = w.build_model(seed=0)
    opt = w.make_optimizer(m.parameters())
    t0 = time.perf_counter()
    graph = capture(m, w.loss_fn(), opt, batch, name=w.name)
    capture_s = time.perf_counter() - t0
    makers = {"all-fast": lambda: all_fast_plan(graph),
              "evict-sync": lambda: evict_all_activations_plan(graph, "sync"),
              "evict-async": lambda: evict_all_activations_plan(graph, "async")}
    out = {"model": model, "preset": preset, "batch": w.batch, "image": w.image, "kernels": len(graph.kernels),
           "capture_s": capture_s, "plans": {}}
    with make_memory_system("cpu+file") as memory:
        for name in plans:
            plan = makers[name]()
            budget = validate(plan, graph).peak_fast_bytes if name != "all-fast" else None
            s = ExecutorSession(graph, plan, memory, m, opt, budget_bytes=budget)
            if name == plans[-1]:
                del m, opt  # the session has its own copies
            eager_step(), s.step(batch)  # warm-up
            eager_t, exec_t, eager_cpu, exec_cpu = [], [], [], []
            for i in range(iterations):
                order = ("e", "x") if i % 2 == 0 else ("x", "e")
                for who in order:
                    t, c = time.perf_counter(), time.process_time()
                    if who == "e":
                        eager_step()
                        eager_t.append(time.perf_counter() - t)
                        eager_cpu.append(time.process_time() - c)
                    else:
                        s.step(batch)
                        exec_t.append(time.perf_counter() - t)
                        exec_cpu.append(time.process_time() - c)
            rep = s.report()
            s.close()
            e, x = statistics.median(eager_t), statistics.median(exec_t)
            ec, xc = statistics.median(eager_cpu), statistics.median(exec_cpu)
            out["plans"][name] = {"eager_s": e, "executor_s": x, "ratio": x / e, "eager_all": eager_t,
                                  "cpu_ratio": xc / ec, "eager_cpu_all": eager_cpu, "executor_cpu_all": exec_cpu,
                                  "executor_all": exec_t, "kernel_s": float(rep.kernel_seconds.sum()),
                                  "bytes_to_slow": rep.bytes_to_slow, "budget": budget}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--plans", default="all-fast")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    plans = a.plans.split(",")
    if a.one:
        emit(one(a.one, a.preset, a.iterations, plans))
        return
    print(f"executor (all-fast plan, cpu+file) vs eager PyTorch, {a.preset} preset, median of {a.iterations} "
          f"interleaved iterations after a warm-up (cpu-time ratio: process CPU seconds, less sensitive to other load); torch threads: {os.environ.get('OMP_NUM_THREADS', 'default')}")
    head = (f"{'model':<13} {'batch x image':>13} {'kernels':>7} {'plan':<12} {'eager s':>8} {'executor s':>10} "
            f"{'ratio':>6} {'cpu-time ratio':>14}  per-iteration seconds (eager | executor)")
    print(head)
    print("-" * len(head))
    for model in a.models.split(","):
        try:
            d = run_child(__file__, ["--one", model, "--preset", a.preset, "--iterations", str(a.iterations),
                                     "--plans", a.plans], a.timeout)
        except ChildFailed as e:
            print(f"{model:<13} {e}", flush=True)
            continue
        for name, p in d["plans"].items():
            print(f"{model:<13} {str(d['batch']) + ' x ' + str(d['image']):>13} {d['kernels']:>7} {name:<12} "
                  f"{p['eager_s']:>8.3f} {p['executor_s']:>10.3f} {p['ratio']:>6.3f} {p['cpu_ratio']:>14.3f}  "
                  f"{' '.join(f'{v:.2f}' for v in p['eager_all'])} | {' '.join(f'{v:.2f}' for v in p['executor_all'])}",
                  flush=True)


if __name__ == "__main__":
    main()
