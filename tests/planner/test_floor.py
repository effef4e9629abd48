"""The smallest feasible budget (planner/floor.py): every planner plans at the minimum an
InfeasibleBudget states, and not a byte below it; `budget="min"` plans there.

Zoo graphs are captured on fake tensors and priced by sim: specs (staged: sim:nvme;
direct: sim:optane), as real profiles of every model would take too long.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autotm
from autotm.errors import AutotmError
from autotm.ir.graph import Role
from autotm.planner import InfeasibleBudget, plan
from autotm.planner.floor import accounting, in_place_bytes, kernel_needs, operand_bytes, smallest_feasible, tightest_staged_plan
from autotm.checks.validate import validate
from graphs import make_graph
from eager_twin import eager_step
from test_planner import cost_model, direct_cost_model

STAGED = ("first-touch", "lru", "synchronous", "asynchronous")
DIRECT = ("first-touch", "lru", "static", "synchronous", "asynchronous")


def reported_minimum(g, cm, formulation, **opts) -> int:
    with pytest.raises(InfeasibleBudget) as e:
        plan(g, cm, 1, formulation, arena=False, **opts)
    assert e.value.planner == formulation and e.value.budget == 1
    assert f"{e.value.minimum:,} bytes" in str(e.value)
    return e.value.minimum


def plans_exactly_at_the_minimum(g, cm, formulation, time_limit=1.0, arena=False, **opts) -> int:
    """The reported minimum: a plan there validates against it (workspace included), none
    a byte below; returns it. (At the minimum every solver has a start that is a plan,
    floor.tightest_*: a time limit returns it.)"""
    minimum = reported_minimum(g, cm, formulation, **opts)
    p = plan(g, cm, minimum, formulation, time_limit=time_limit, arena=arena, **opts)
    ws = cm.workspace(len(g.kernels))
    extra = accounting(g, ws, opts.get("pin_params", False)).flat_extra
    v = validate(p, g, budget_bytes=minimum + extra, reserved_bytes=ws if ws.any() else None)
    assert v.peak_fast_bytes <= minimum + extra
    assert p.meta.budget_bytes == minimum
    with pytest.raises(InfeasibleBudget) as e:
        plan(g, cm, minimum - 1, formulation, arena=False, time_limit=time_limit, **opts)
    assert e.value.minimum == minimum
    return minimum


def test_infeasible_budget_is_an_autotm_error_exported_from_the_package():
    assert autotm.InfeasibleBudget is InfeasibleBudget
    assert issubclass(InfeasibleBudget, AutotmError) and issubclass(InfeasibleBudget, ValueError)
    assert "InfeasibleBudget" in autotm.__all__


def _zoo_models():
    from autotm.zoo import MODELS

    return MODELS


# models whose every planner (ILPs included) plans at its minimum here; the larger ones
# (1,000-4,500 kernels: 2-4 minutes each on a loaded 2-core machine) plan their baselines
# at theirs, and their ILPs' minimum is checked through the start that guarantees a plan
# there (floor.tightest_*, the solvers' start of last resort): it validates at it
SOLVED = ("resnet50", "vgg19", "transformer")


@pytest.mark.parametrize("model", _zoo_models())
def test_every_planner_plans_at_its_reported_minimum_for_every_zoo_model(model, tmp_path):
    """The test preset of each zoo model, staged (sim:nvme) and direct (sim:optane): each
    planner's reported minimum plans and validates, a byte less does not; and on a machine
    whose kernels need large workspaces (a CPU whose oneDNN picks other algorithms) the
    minimum moves up with them and still plans. (sim: specs give no workspace: here each
    convolution's is as large as its operands, as oneDNN's reorder buffers can be.)"""
    from autotm.planner.floor import tightest_direct_plan
    from autotm.profile import profile
    from autotm.frontend.workloads import capture_workload
    from autotm.zoo import workload

    g = capture_workload(workload(model, "test"), fake=True)
    cache = str(tmp_path / "c.sqlite")
    staged = profile(g, "sim:nvme", cache)
    direct = profile(g, "sim:optane", cache)
    solved = model in SOLVED
    floors = {f: plans_exactly_at_the_minimum(g, staged, f) if solved or f not in ILPS
              else minimum_of_the_tightest_plan(g, staged, f) for f in STAGED}
    # the staged ILP moves what first-touch keeps (the batch, between its uses); lru stages
    # every operand on demand: each floor is its own; the ILP's is lower still where it
    # runs a kernel in pieces (ir/split.py)
    whole = smallest_feasible(g, "synchronous", "staged", accounting(g, staged.workspace(len(g.kernels))))
    assert floors["synchronous"] == floors["asynchronous"] <= whole.bytes
    assert whole.bytes >= floors["lru"]
    assert floors["first-touch"] >= floors["lru"]
    # "min" is the same budget
    assert plan(g, staged, "min", "lru", arena=False).meta.budget_bytes == floors["lru"]
    if not solved:
        assert minimum_of_the_tightest_plan(g, direct, "static", tightest_direct_plan(g)) <= floors["synchronous"]
        return
    direct_floors = {f: plans_exactly_at_the_minimum(g, direct, f) for f in DIRECT}
    assert direct_floors["static"] <= direct_floors["synchronous"] <= floors["synchronous"]
    # large workspaces (another CPU's algorithms): the floors follow, and still plan
    ops = operand_bytes(g) - in_place_bytes(g)  # (an output written over its dying input once)
    ws = tuple(int(b) if "convolution" in k.op else 0 for k, b in zip(g.kernels, ops))
    if any(ws):
        other = dataclasses.replace(staged, workspace_bytes=ws)
        whole_kernels = np.array([k not in g.splittable for k in range(len(g.kernels))])
        for f in ("lru", "synchronous"):
            held = (ops + np.array(ws)) * (whole_kernels if f == "synchronous" else 1)
            assert plans_exactly_at_the_minimum(g, other, f) >= max(floors[f], int(held.max()))


ILPS = ("synchronous", "asynchronous", "static")


def minimum_of_the_tightest_plan(g, cm, formulation, tightest=None) -> int:
    """The reported minimum of an ILP formulation, a byte below it infeasible, and the
    tightest plan (its solver's start there; default: the staged one of the graph as
    plan() splits it there) valid at it; returns it."""
    from autotm.planner.splitting import split_for_budget, with_bounce

    minimum = reported_minimum(g, cm, formulation)
    ws = cm.workspace(len(g.kernels))
    held_by, reserved = g, ws
    if tightest is None:
        held_by = split_for_budget(g, formulation, ws, cm.memory_system, minimum)
        tightest, reserved = tightest_staged_plan(held_by), with_bounce(held_by, ws).workspace
    validate(tightest, held_by, budget_bytes=minimum, reserved_bytes=reserved if reserved.any() else None)
    with pytest.raises(InfeasibleBudget):
        plan(g, cm, minimum - 1, formulation, arena=False)
    return minimum


def test_the_error_names_the_kernel_its_module_and_an_updates_parameter():
    """The optimizer update of a weight needs parameter, gradient and momentum at once:
    the error says so, naming the parameter."""
    from autotm.ir.graph import Kernel, Tensor, TrainingGraph

    mb = 2**20
    tensors = (
        Tensor(0, "w", 4 * mb, "float32", (mb,), (1,), Role.WEIGHT, None, (0, 1), (0, 1),
               state_key="param:classifier.0.weight"),
        Tensor(1, "m", 4 * mb, "float32", (mb,), (1,), Role.OPTIMIZER_STATE, None, (1,), (0, 1),
               state_key="opt:classifier.0.weight:momentum_buffer"),
        Tensor(2, "g", 4 * mb, "float32", (mb,), (1,), Role.GRADIENT, 0, (1,), (0, 1)),
        Tensor(3, "w2", 4 * mb, "float32", (mb,), (1,), Role.WEIGHT, 1, (), (1, 1), is_graph_output=True,
               state_key="param:classifier.0.weight"),
    )
    kernels = (Kernel(0, "aten.mul.Tensor", (0,), (2,), "s0", 0, 0, "classifier.0", "backward"),
               Kernel(1, "aten.add.Tensor", (0, 1, 2), (3,), "s1", 0, 0, "", "optimizer"))
    g = TrainingGraph(name="g", kernels=kernels, tensors=tensors, parameters=mb, program=None)
    text = kernel_needs(g, 1, 0)
    assert "the update of `classifier.0.weight` (4.0 MiB)" in text
    assert "parameter" in text and "gradient" in text and "momentum" in text
    assert "in `classifier.0`" in kernel_needs(g, 0, 3 * mb) and "workspace (3.0 MiB)" in kernel_needs(g, 0, 3 * mb)


@st.composite
def random_case(draw):
    n = draw(st.integers(3, 12))
    sizes, kernels, live = [], [], []
    roles = {}
    for _ in range(n):
        reads = draw(st.lists(st.sampled_from(live), max_size=3, unique=True)) if live else []
        t = len(sizes)
        sizes.append(draw(st.integers(1, 64)) * 1024)
        kernels.append((reads, [t]))
        live.append(t)
    # a weight or two read by some kernels (graph inputs that may start slow)
    for _ in range(draw(st.integers(0, 2))):
        w = len(sizes)
        sizes.append(draw(st.integers(1, 64)) * 1024)
        roles[w] = Role.WEIGHT
        for k in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True)):
            kernels[k][0].append(w)
    roles[n - 1] = Role.OUTPUT
    g = make_graph(sizes, kernels, outputs=(n - 1,), roles=roles)
    seconds = [draw(st.floats(1e-4, 1e-2)) for _ in range(n)]
    workspace = [draw(st.sampled_from([0, 0, 4096, 65536])) for _ in range(n)]
    return g, seconds, workspace


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case(), st.booleans())
def test_every_planner_plans_at_its_reported_minimum_on_random_graphs(case, direct):
    g, seconds, workspace = case
    if direct:
        cm = dataclasses.replace(direct_cost_model(g, seconds), workspace_bytes=tuple(workspace))
    else:
        cm = dataclasses.replace(cost_model(g, seconds, bw=5e6), workspace_bytes=tuple(workspace))
    for f in DIRECT if direct else STAGED:
        plans_exactly_at_the_minimum(g, cm, f, time_limit=10.0)


def test_the_tightest_staged_plan_peaks_at_the_ilp_floor():
    """floor.py's staged ILP floor is the peak of a plan (a solution of the model), with
    the workspace at each kernel on top."""
    g = make_graph([100, 1, 1, 100, 1, 1, 1], [([], [0, 1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]),
                                               ([0, 5], [6])], outputs=(6,), roles={6: Role.OUTPUT})
    ws = np.array([0, 0, 50, 0, 0, 0])
    floor = smallest_feasible(g, "synchronous", "staged", accounting(g, ws))
    peak = validate(tightest_staged_plan(g), g, budget_bytes=2**40).fast_bytes + ws
    assert floor.bytes == int(peak.max()) == 151 and floor.kernel == 2  # s1 + tmp (100) + 50
    assert "workspace (0.0 MiB)" in floor.what


def test_a_budget_under_the_floor_of_the_graph_alone_fails_before_the_profile():
    """check_before_profile: sizes under the operands' floor, and ratios that no workspace
    can make feasible (peak < r * floor), raise a lower bound; the rest pass to the profile."""
    from autotm.planner.floor import check_before_profile

    g = make_graph([100, 1, 1, 100, 1, 1, 1], [([], [0, 1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]),
                                               ([0, 5], [6])], outputs=(6,), roles={6: Role.OUTPUT})
    floor = smallest_feasible(g, "lru", "staged", accounting(g, np.zeros(6, dtype=np.int64))).bytes
    assert floor == 102 and g.peak_live_bytes == 201
    with pytest.raises(InfeasibleBudget) as e:
        check_before_profile(g, 101, "lru", "staged")
    assert not e.value.exact and e.value.minimum == 102 and "before profiling" in str(e.value)
    check_before_profile(g, 102, "lru", "staged")
    check_before_profile(g, "1:1", "lru", "staged")  # 201 >= 1 * 102: a workspace may decide
    with pytest.raises(InfeasibleBudget):
        check_before_profile(g, "2:1", "lru", "staged")  # 201 < 2 * 102: whatever the workspaces
    # and indeed: with any workspace W at any kernel, 2:1 of the peak stays under the floor
    for k in range(6):
        for w in (0, 50, 500):
            ws = tuple(w if j == k else 0 for j in range(6))
            cm = dataclasses.replace(cost_model(g, [1.0] * 6), workspace_bytes=ws)
            with pytest.raises(InfeasibleBudget):
                plan(g, cm, "2:1", "lru", arena=False)
    # a workspace known from the cache joins the check
    with pytest.raises(InfeasibleBudget) as e:
        check_before_profile(g, 150, "lru", "staged", workspace=np.array([0, 0, 0, 60, 0, 0]))
    assert e.value.minimum == 161
    check_before_profile(g, 1, "all-fast", "staged")
    check_before_profile(g, "min", "synchronous", "staged")


def test_all_fast_over_a_budget_says_so():
    """all-fast ignores the budget: over it, the plan carries a warning and fits_budget
    False (and arena_fits False), never a silent fit."""
    g = make_graph([100, 1, 1, 100, 1, 1, 1], [([], [0, 1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]),
                                               ([0, 5], [6])], outputs=(6,), roles={6: Role.OUTPUT})
    cm = cost_model(g, [1.0] * 6)
    p = plan(g, cm, 102, "all-fast")
    assert p.meta.fits_budget is False and p.meta.arena_fits is False
    assert "all-fast ignores the budget" in p.meta.warning and "x the budget of 102 bytes" in p.meta.warning
    p = plan(g, cm, 201, "all-fast", arena=False)
    assert p.meta.fits_budget is True and not p.meta.warning
    assert plan(g, cm, None, "all-fast").meta.fits_budget is True
    p = plan(g, cm, "min", "synchronous", arena=False)
    assert p.meta.fits_budget is True and p.meta.budget_bytes == 102


def test_the_demo_falls_back_to_the_smallest_budget_every_planner_fits():
    """demo_budget on a machine whose kernels need more workspace than the 4:1 budget
    holds: one line says so, and every planner plans at the budget it gives."""
    from autotm.experiments.demo import PLANNERS, demo_budget

    g = make_graph([100, 1, 1, 100, 1, 1, 1], [([], [0, 1]), ([1], [2]), ([2], [3]), ([3], [4]), ([4], [5]),
                                               ([0, 5], [6])], outputs=(6,), roles={6: Role.OUTPUT})
    free = cost_model(g, [1.0] * 6)
    from autotm.planner import smallest_feasible_budget

    highest = max(smallest_feasible_budget(g, free, name).bytes for name in PLANNERS if name != "all-fast")
    assert demo_budget(g, free, "1:1")[0] == highest > 100  # 1:1 of 201 B
    budget, note = demo_budget(g, free, "0:1")
    assert budget == 201 and note is None
    inflated = dataclasses.replace(free, workspace_bytes=(0, 0, 0, 400, 0, 0))
    budget, note = demo_budget(g, inflated, "4:1")
    assert budget == 501 and "\n" not in note  # at k3: s2 + tmp + s3 + 400 of workspace
    assert note.startswith("note: 4:1") and "infeasible on this machine" in note
    for name in PLANNERS:
        p = plan(g, inflated, None if name == "all-fast" else budget, name, time_limit=5)
        if name != "all-fast":
            validate(p, g, budget_bytes=budget, reserved_bytes=np.array(inflated.workspace_bytes))
    assert demo_budget(g, inflated, "min") == (budget, None)


def test_the_demo_runs_where_4_to_1_is_infeasible(tmp_path):
    """`autotm demo` on a machine whose convolution backward needs a workspace twice the
    iteration's peak (another CPU's oneDNN, by construction: the real profile, its
    largest such workspace inflated): one line says 4:1 is infeasible, every planner runs
    at the fallback budget, bit-identical to eager PyTorch."""
    from rich.console import Console

    from autotm.experiments.demo import run_demo
    from autotm.profile import profile as real

    def other_cpu(graph, *args, **kwargs):
        out = real(graph, *args, **kwargs)
        cm, stats = out if isinstance(out, tuple) else (out, None)
        ws = list(cm.workspace(len(graph.kernels)))
        k = max((k for k in graph.kernels if k.op == "aten.convolution_backward.default"),
                key=lambda k: ws[k.index]).index
        ws[k] = 2 * graph.peak_live_bytes
        cm = dataclasses.replace(cm, workspace_bytes=tuple(int(w) for w in ws))
        return (cm, stats) if isinstance(out, tuple) else cm
    console = Console(record=True, width=400)
    assert run_demo(console, budget="4:1", out=str(tmp_path), iterations=1, time_limit=4.0, profile=other_cpu)
    text = console.export_text()
    notes = [line for line in text.splitlines() if "is infeasible on this machine" in line]
    assert len(notes) == 1 and notes[0].startswith("note: 4:1") and "aten.convolution_backward" in notes[0]
    assert "(fallback)" in text and "error" not in text.lower()
    assert (tmp_path / "demo.png").exists()


def test_compile_fails_fast_under_the_floor_and_trains_at_min(tmp_path):
    """autotm.compile: a budget the graph alone rules out raises InfeasibleBudget before
    any profile (no cache written); budget="min" trains at the smallest feasible budget,
    bit for bit like eager PyTorch."""
    import torch
    from torch import nn

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    data = [(torch.randn(8, 64), torch.randint(0, 10, (8,))) for _ in range(3)]
    loss_fn = nn.CrossEntropyLoss()
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cache = tmp_path / "cache.sqlite"
    with pytest.raises(autotm.InfeasibleBudget) as e:
        autotm.compile(model, loss_fn, opt, data[0], budget=1000, formulation="lru", cache=str(cache))
    assert not e.value.exact and e.value.minimum > 1000 and not cache.exists()
    eager = net()
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    step = autotm.compile(model, loss_fn, opt, data[0], budget="min", formulation="lru", cache=str(cache))
    try:
        minimum = step.plan.meta.budget_bytes
        assert minimum == autotm.planner.smallest_feasible_budget(step.graph, step.cost_model, "lru").bytes
        assert step.plan.meta.bytes_to_slow > 0
        for x, y in data:
            expected = eager_step(eager, loss_fn, eager_opt, (x, y))
            assert torch.equal(step(x, y), expected)
        for (n, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), n
    finally:
        step.close()
