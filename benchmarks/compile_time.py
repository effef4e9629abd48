"""Seconds of `autotm.compile`, stage by stage: capture, profile (moves, kernels, ...), plan,
the executor's set-up and the first step; from an empty kernel cache and from a warm one.

The machine's part of the profile (moves, the executor's overheads, the pace probe) is
measured once, by compiling a one-layer model into a fresh cache ("machine" row); each
model then compiles twice, each time in a fresh process: into a copy of that cache with
every kernel measurement dropped (`ProfileCache.forget_kernels`: "empty" rows), then again
into the same file ("warm" rows). Models: zoo workloads at a preset (`resnet50`,
`transformer`, ...), hand-written nn.Modules (`mlp`, `cnn`, `lstm`) and, where torchvision
is installed, `tv:<name>` (e.g. `tv:mobilenet_v3_small`, 64x64, batch 2). Where the budget
is under a model's minimum on this CPU (the cnn's batch-norm backward and its workspace at
1:1), the row is the compile at that minimum, from the cache the failed attempt found,
and says so in brackets, as `make demo` does.

Targets (issue 33): a model of <= 1,000 kernels compiles in <= 20 s with an empty kernel
cache once the machine's profile exists, <= 5 s with its kernels cached.

    python benchmarks/compile_time.py [--models mlp,lstm,resnet50] [--preset test]
        [--budget 1:1] [--formulation asynchronous] [--memory cpu+file] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _child import ChildFailed, emit, run_child  # noqa: E402

def import_torchvision():
    """torchvision's models without its C++ ops: the PyPI wheel matching a CPU torch is a
    CUDA build whose extension cannot load (`operator torchvision::nms does not exist`, in
    its meta registrations); the classifiers need none of those ops (as tests/compat_models)."""
    import types

    if "torchvision" not in sys.modules:
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torchvision

    return torchvision


DEFAULT_MODELS = "mlp,cnn,lstm,resnet50,transformer,tv:mobilenet_v3_small"


def build(name: str, preset: str):
    """(model, loss_fn, optimizer, batch) for a model name (module doc)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "tiny":  # the machine's profile: as few kernels as a training step has
        model = nn.Linear(16, 4)
        batch = (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
    elif name == "mlp":
        model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))
        batch = (torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g))
    elif name == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        batch = (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))
    elif name == "lstm":
        class LSTMNet(nn.Module):  # two LSTM layers written out, unrolled over the sequence
            def __init__(self):
                super().__init__()
                self.ih = nn.ModuleList([nn.Linear(64, 512), nn.Linear(128, 512)])
                self.hh = nn.ModuleList([nn.Linear(128, 512, bias=False) for _ in range(2)])
                self.head = nn.Linear(128, 10)

            def forward(self, x):
                seq = list(x.unbind(1))
                for ih, hh in zip(self.ih, self.hh):
                    h = c = None
                    out = []
                    for xt in seq:
                        gates = ih(xt) if h is None else ih(xt) + hh(h)
                        i, f, g, o = gates.chunk(4, 1)
                        c = i.sigmoid() * g.tanh() if c is None else f.sigmoid() * c + i.sigmoid() * g.tanh()
                        h = o.sigmoid() * c.tanh()
                        out.append(h)
                    seq = out
                return self.head(seq[-1])
        model = LSTMNet()
        batch = (torch.randn(4, 16, 64, generator=g), torch.randint(0, 10, (4,), generator=g))
    elif name.startswith("tv:"):
        torchvision = import_torchvision()
        model = getattr(torchvision.models, name[3:])(num_classes=10)
        batch = (torch.randn(2, 3, 64, 64, generator=g), torch.randint(0, 10, (2,), generator=g))
    else:
        from autotm.zoo import workload

        w = workload(name, preset)
        model = w.build_model(seed=0)
        opt = w.make_optimizer(model.parameters())
        return model, w.loss_fn(), opt, w.make_batch(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, nn.CrossEntropyLoss(), opt, batch


def child(a) -> None:
    """One compile in this process; the stages as a RESULT line."""
    import autotm

    model, loss_fn, opt, batch = build(a.model, a.preset)
    before = a.cache + ".before" if os.path.exists(a.cache) else None
    if before:
        shutil.copy(a.cache, before)  # (a fallback starts from the cache this attempt found; not timed)
    seen: dict[str, float] = {}
    t0 = time.perf_counter()

    def progress(stage, done, total, what):
        seen.setdefault(stage, time.perf_counter() - t0)

    out: dict = {"model": a.model}
    # the machine's row plans nothing (its one layer fits no ratio's budget)
    budget, formulation = (None, "all-fast") if a.model == "tiny" else (a.budget, a.formulation)

    def compile_at(b):
        return autotm.compile(model, loss_fn, opt, batch, memory=a.memory, budget=b, formulation=formulation,
                              cache=a.cache, progress=progress,
                              **({} if a.time_limit is None else {"time_limit": a.time_limit}))
    try:
        try:
            step = compile_at(budget)
        except autotm.InfeasibleBudget as e:
            # as the demo does: where the ratio is under this CPU's minimum (its workspaces),
            # compile at that minimum instead, timed from the same cache, and say so
            out["fallback"] = (f"{budget} ({e.budget:,} B) infeasible after {time.perf_counter() - t0:.1f} s; "
                               f"at its minimum, {e.minimum:,} B")
            if before:
                shutil.copy(before, a.cache)
            seen.clear()
            t0 = time.perf_counter()
            step = compile_at(e.minimum)
    except Exception as e:  # the stages reached, and why it stopped
        out.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", stages_started=seen,
                   seconds=time.perf_counter() - t0)
        emit(out)
        return
    t_compiled = time.perf_counter() - t0
    t1 = time.perf_counter()
    step(*batch)
    first = time.perf_counter() - t1
    t1 = time.perf_counter()
    step(*batch)
    second = time.perf_counter() - t1
    st = step.profile_stats
    m = step.plan.meta
    out.update(kernels=len(step.graph.kernels), unique=step.graph.unique_signatures,
               stages={**step.stage_seconds, "first_step": first}, compile_s=t_compiled, second_step_s=second,
               profile_parts=st.stage_seconds, measured=st.measured, cache_hits=st.cache_hits,
               move_samples_measured=st.move_samples_measured, iterations=st.iterations,
               solve_s=m.solve_seconds, status=m.status, gap=m.gap,
               predicted_s=m.predicted_seconds)
    step.close()
    emit(out)


def row_text(kind: str, r: dict) -> str:
    if "error" in r:
        return f"{r['model']:22s} {kind:7s} failed after {r.get('seconds', 0):.1f} s: {r['error']}"
    s = r["stages"]
    p = r["profile_parts"]
    machine = sum(p.get(k, 0.0) for k in ("pace", "moves", "wake", "overhead"))
    return (f"{r['model']:22s} {kind:7s} {r['kernels']:6d} {r['unique']:6d} {s['capture']:8.1f} {s['profile']:8.1f} "
            f"{machine:8.1f} {p.get('wake', 0.0):6.1f} {p.get('kernels', 0.0):8.1f} {s['plan']:7.1f} "
            f"{s['session']:7.2f} {s['first_step']:6.2f} {r['compile_s'] + s['first_step']:8.1f}  "
            f"{r['measured']}/{r['cache_hits']} {r['status']} gap {100 * (r['gap'] or 0):.1f} % "
            f"pred. {1e3 * (r['predicted_s'] or 0):.1f} ms" + (f" [{r['fallback']}]" if r.get("fallback") else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--preset", default="test")
    ap.add_argument("--budget", default="1:1")
    ap.add_argument("--formulation", default="asynchronous")
    ap.add_argument("--memory", default="cpu+file")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="compile's solver time limit (default: compile's own)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per compile, at most")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    from autotm.profile.cache import ProfileCache

    common = ["--preset", a.preset, "--budget", a.budget, "--formulation", a.formulation, "--memory", a.memory]
    if a.time_limit is not None:
        common += ["--time-limit", str(a.time_limit)]
    script = os.path.abspath(__file__)
    print(f"load average {os.getloadavg()}; {a.memory}, budget {a.budget}, {a.formulation}, preset {a.preset}")
    print(f"{'model':22s} {'cache':7s} {'kern.':>6s} {'unique':>6s} {'capture':>8s} {'profile':>8s} "
          f"{'machine':>8s} {'wake':>6s} {'kernels':>8s} {'plan':>7s} {'session':>7s} {'step1':>6s} {'total':>8s}  "
          "measured/hits")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        machine = os.path.join(d, "machine.sqlite")

        def one(model: str, kind: str, cache: str) -> None:
            try:
                r = run_child(script, ["--child", "--model", model, "--cache", cache, *common], timeout=a.timeout)
            except ChildFailed as e:
                r = {"model": model, "error": str(e)}
            r["cache"] = kind
            rows.append(r)
            print(row_text(kind, r), flush=True)

        # the machine's profile, once (the kernel rows it leaves are dropped below)
        one("tiny", "machine", machine)
        with ProfileCache(machine) as db:
            db.forget_kernels()
        for model in a.models.split(","):
            if model.startswith("tv:"):
                try:
                    import_torchvision()
                except Exception as e:  # (not installed, or built for another torch)
                    print(f"{model}: torchvision cannot be imported ({type(e).__name__}: {e}), skipped")
                    continue
            cache = os.path.join(d, f"{model.replace(':', '_')}.sqlite")
            shutil.copy(machine, cache)
            one(model, "empty", cache)
            one(model, "warm", cache)
    print("seconds; profile = machine (pace, moves, wake, executor overhead) + kernels (in-situ iterations) + "
          f"the rest; total = compile + first step. Load average at the end {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
