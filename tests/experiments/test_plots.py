"""Figures are built from real records of real (small, simulated) sweeps, and plot what the records say."""

import subprocess
import sys

import numpy as np
import pytest

from autotm.experiments import bench, plots
from autotm.experiments.bench import SweepOptions, run_cells
from autotm.planner import plan as make_plan
from autotm.profile.workloads import profile_workload
from autotm.experiments.results import store_for
from autotm.checks.validate import validate
from autotm.zoo import workload


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    opts = SweepOptions(time_limit=20, cache=str(out / "profile.sqlite"))
    small = dict(models="resnet50", preset="test")
    sweeps = [
        bench.conventional(str(out), memory="sim:nvme", formulations="all-fast,synchronous,first-touch,lru",
                           ratios="4:1,1:1", **small),
        bench.case_study(str(out), memory="sim:nvme", formulations="first-touch", ratios="8:1,4:1,1:1", **small),
        bench.case_study(str(out), memory="sim:optane", formulations="first-touch", ratios="8:1,4:1,1:1", **small),
        bench.gpu(str(out), memory="sim:pcie-host", formulations="all-fast,lru,synchronous", ratios="4:1", **small),
        bench.large(str(out), memory="sim:nvme", formulations="lru,first-touch", ratios="100MB", **small),
    ]
    for s in sweeps:
        run_cells(s.cells, s.store, opts)
    return out


def _records(out, experiment):
    return store_for(out, experiment).latest()


def _bar_heights(fig):
    from matplotlib.patches import Rectangle

    return sorted(p.get_height() for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle))


def test_speedup_bars_are_the_records_speedups(results):
    recs = _records(results, "conventional")
    t = {(r.formulation, r.ratio): r.predicted_seconds for r in recs if r.status == "ok"}
    expected = {f: {ratio: t[("first-touch", ratio)] / t[(f, ratio)] for ratio in ("4:1", "1:1")}
                for f in ("synchronous", "lru")}
    fig, data = plots.speedup_figure(recs, "sim:nvme")
    for f in expected:
        assert data["resnet50"][f] == pytest.approx(expected[f])
    assert data["resnet50"]["all-fast"] == pytest.approx(
        {ratio: t[("first-touch", ratio)] / t[("all-fast", None)] for ratio in ("4:1", "1:1")})
    assert _bar_heights(fig) == pytest.approx(sorted(v for d in expected.values() for v in d.values()))
    assert data["resnet50"]["synchronous"]["4:1"] > max(1.0, data["resnet50"]["lru"]["4:1"])  # AutoTM beats both
    assert "simulated on sim:nvme" in fig._suptitle.get_text()


def test_costs_bars_and_memory_cost(results):
    recs = _records(results, "conventional")
    t = {(r.formulation, r.ratio): r.predicted_seconds for r in recs if r.status == "ok"}
    fig, data = plots.costs_figure(recs, "sim:nvme")
    assert data["resnet50"] == pytest.approx({ratio: t[("all-fast", None)] / t[("synchronous", ratio)]
                                              for ratio in ("4:1", "1:1")})
    assert _bar_heights(fig) == pytest.approx(sorted(data["resnet50"].values()))
    assert plots.memory_cost("1:0") == pytest.approx(0.476, abs=1e-3)  # the paper's examples
    assert plots.memory_cost("4:1") == pytest.approx(0.581, abs=1e-3)
    assert plots.memory_cost("0:1") == 1.0


def test_case_study_panels_come_from_the_records(results):
    recs = _records(results, "case-study")
    for memory in ("sim:nvme", "sim:optane"):
        ft = sorted((r for r in recs if r.memory_system == memory and r.formulation == "first-touch"),
                    key=lambda r: r.budget_bytes)
        fast = next(r for r in recs if r.memory_system == memory and r.formulation == "all-fast")
        fig, data = plots.case_study_figure(recs, memory)
        d = data["first-touch"]
        assert d["budget_gb"] == pytest.approx([r.budget_bytes / 1e9 for r in ft])
        assert d["slowdown"] == pytest.approx([r.predicted_seconds / fast.predicted_seconds for r in ft])
        assert d["gb_to_fast"] == pytest.approx([(r.sync_bytes_to_fast + r.async_bytes_to_fast) / 1e9 for r in ft])
        assert all(s >= 1 for s in d["slowdown"])
        if memory == "sim:nvme":  # staged: moves, and inputs brought back are not counted as kept
            assert all(x > 0 for x in d["gb_to_fast"]) and all(x < 1 for x in d["inputs_fast"])
        else:  # direct: no moves; more of the operands are fast as the budget grows
            assert d["gb_to_fast"] == [0, 0, 0] and d["inputs_fast"] == sorted(d["inputs_fast"])
        assert len(fig.axes) == 3


def test_gpu_and_large_figures(results):
    recs = _records(results, "gpu")
    t = {r.formulation: r for r in recs if r.status == "ok"}
    fig, data = plots.gpu_figure(recs, "sim:pcie-host")
    (bars,) = data.values()
    lru = t["lru"].predicted_seconds
    assert bars["synchronous"] == pytest.approx(lru / t["synchronous"].predicted_seconds)
    assert bars["all-fast"] == pytest.approx(lru / t["all-fast"].predicted_seconds)
    assert bars["oracle"] == pytest.approx(lru / t["lru"].oracle_seconds)
    assert bars["oracle"] >= bars["all-fast"] * (1 - 1e-9)  # kernel time only: no plan is faster
    recs = _records(results, "large")
    fig, data = plots.large_figure(recs, "sim:nvme")
    (bars,) = data.values()
    t = {r.formulation: r.predicted_seconds for r in recs}
    assert bars == pytest.approx({"first-touch": t["lru"] / t["first-touch"]})


def test_every_figure_is_written_as_png_and_svg(results):
    for experiment, names in (("conventional", ("speedup", "costs")), ("case-study", ("case-study",)),
                              ("gpu", ("gpu",)), ("large", ("large",))):
        for name in names:
            paths = plots.FIGURES[name](_records(results, experiment), results, tag=experiment)
            assert paths and len(paths) % 2 == 0
            for p in paths:
                head = p.read_bytes()[:2000]
                assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in head
    with pytest.raises(plots.NothingToPlot):  # measured records only
        plots.error(_records(results, "conventional"), results)


def test_timeline_bytes_by_role_add_up_to_the_validator(tmp_path):
    w = workload("resnet50", "test")
    cache = str(tmp_path / "c.sqlite")
    graph, cm, _ = profile_workload(w, "sim:nvme", cache)
    plans = [make_plan(graph, cm, "4:1", f, time_limit=20) for f in ("first-touch", "lru", "asynchronous")]
    dgraph, dcm, _ = profile_workload(w, "sim:optane", cache)
    for g, p in [(graph, p) for p in plans] + [(dgraph, make_plan(dgraph, dcm, "4:1", "first-touch"))]:
        roles = plots.fast_bytes_by_role(p, g)
        assert np.array_equal(sum(roles.values()), validate(p, g).fast_bytes)
        assert roles["weight"].max() > 0
    paths = plots.timeline(plans[-1], graph, tmp_path, budget_label="4:1")
    assert [p.suffix for p in paths] == [".png", ".svg"] and paths[0].stat().st_size > 10_000


def test_plot_without_records_is_one_clear_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "autotm.cli", "plot", "speedup", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "autotm bench conventional" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_records_from_another_cost_model_are_not_compared(results):
    import dataclasses

    recs = _records(results, "conventional")
    old = dataclasses.replace(recs[0], timestamp="2000-01-01T00:00:00+00:00", budget="2:1", ratio="2:1",
                              oracle_seconds=recs[0].oracle_seconds * 3, predicted_seconds=1e9)
    assert plots._current(recs + [old]) == recs
    fig, data = plots.speedup_figure(recs + [old], "sim:nvme")
    assert "2:1" not in data["resnet50"].get(old.formulation, {})
