"""Experiment drivers and the results store: records are complete, durable, and an
interrupted sweep resumes without redoing or losing a cell."""

import json
import subprocess
import sys

import pytest

from budgets import feasible_ratio
from autotm.experiments import bench
from autotm.experiments.bench import SweepOptions, kernel_io, move_stats, run_cells
from autotm.planner import plan as make_plan
from autotm.profile.workloads import profile_workload
from autotm.experiments.results import Record, ResultsStore
from autotm.checks.validate import validate
from autotm.zoo import workload


def _record(**kw) -> Record:
    base = dict(experiment="test", workload="w", model="resnet50", preset="test", batch=2, image=64,
                memory_system="sim:nvme", access="staged", simulated=True, formulation="lru", budget="4:1",
                ratio="4:1", budget_bytes=10)
    base.update(kw)
    return Record(**base)


def test_store_round_trips_and_survives_a_cut_off_write(tmp_path, caplog):
    store = ResultsStore(tmp_path / "r.jsonl")
    a = _record(predicted_seconds=1.5, iteration_seconds=[1.0, 2.0], environment={"torch": "x"})
    b = _record(budget="1:1", ratio="1:1", status="infeasible", min_budget_bytes=7)
    store.append(a)
    store.append(b)
    assert store.load() == [a, b]
    # a kill in the middle of a write leaves half a line
    with open(store.path, "a") as f:
        f.write(_record(budget="8:1").to_json()[:40])
    assert store.load() == [a, b]
    assert "truncated last line" in caplog.text
    c = _record(budget="8:1", ratio="8:1")
    store.append(c)  # drops the fragment first
    assert store.load() == [a, b, c]
    assert all(json.loads(line) for line in store.path.read_text().splitlines())
    # the latest record of a cell wins; errors are retried, final statuses are done
    store.append(_record(budget="2:1", ratio="2:1", status="error", message="boom"))
    assert store.done_keys() == {a.key, b.key, c.key}
    store.append(_record(budget="2:1", ratio="2:1"))
    assert len(store.latest()) == 4 and len(store.done_keys()) == 4


def test_a_malformed_line_in_the_middle_is_an_error(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    store.path.write_text("{not json\n" + _record().to_json() + "\n")
    with pytest.raises(ValueError, match="r.jsonl:1"):
        store.load()


def test_case_study_ratios_are_the_papers():
    assert bench.case_study_ratios() == (
        "0:1", "1:3", "1:2", "1:1", "2:1", "3:1", "4:1", "5:1", "6:1", "7:1", "8:1", "9:1", "19:1", "39:1",
        "59:1", "79:1", "99:1", "1:0")


def test_cells_follow_the_memory_system():
    staged = bench.conventional("out", memory="sim:nvme", models="resnet50", ratios="common")
    assert {c.formulation for c in staged.cells} == {"all-fast", "synchronous", "asynchronous", "first-touch", "lru"}
    assert len(staged.cells) == 1 + 4 * 5 and staged.cells[0].formulation == "all-fast"
    assert staged.cells[0].preset == "conventional"
    direct = bench.conventional("out", memory="sim:optane", models="resnet50", ratios="4:1,1:1")
    assert {c.formulation for c in direct.cells} == {"all-fast", "all-slow", "static", "synchronous", "first-touch"}
    assert len(direct.cells) == 2 + 3 * 2
    assert bench.conventional("out", models="resnet50").cells[0].preset == "cpu"
    with pytest.raises(ValueError, match="not a budget"):
        bench.conventional("out", ratios="4:1,lots")
    with pytest.raises(ValueError, match="unknown formulation"):
        bench.conventional("out", formulations="magic")


def test_interrupted_sweep_resumes_without_redoing_or_losing_cells(tmp_path):
    sweep = bench.conventional(str(tmp_path), memory="sim:nvme", models="resnet50", preset="test",
                               formulations="all-fast,first-touch,lru", ratios="1:0,4:1,1:1")
    assert len(sweep.cells) == 7
    opts = SweepOptions(cache=str(tmp_path / "c.sqlite"))
    seen = []

    def interrupt_after_three(rec):
        seen.append(rec.key)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_cells(sweep.cells, sweep.store, opts, on_record=interrupt_after_three)
    assert [r.key for r in sweep.store.load()] == seen == [c.key for c in sweep.cells[:3]]
    again = run_cells(sweep.cells, sweep.store, opts)
    assert [r.key for r in again] == [c.key for c in sweep.cells[3:]]  # nothing redone
    recs = sweep.store.load()
    assert sorted(r.key for r in recs) == sorted(c.key for c in sweep.cells)  # nothing lost, no duplicates
    assert run_cells(sweep.cells, sweep.store, opts) == []
    by = {(r.formulation, r.budget): r for r in recs}
    assert by[("lru", "1:0")].status == "infeasible" and by[("lru", "1:0")].min_budget_bytes > 0
    ok = [r for r in recs if r.status == "ok"]
    assert len(ok) == 5 and all(r.simulated and r.measured_seconds is None for r in ok)
    for r in ok:
        assert r.predicted_seconds > 0 and r.peak_fast_bytes <= (r.budget_bytes or r.peak_live_bytes)
        assert r.environment["torch"] and r.timestamp and r.num_kernels > 100
        assert r.sync_bytes_to_fast + r.async_bytes_to_fast == r.bytes_to_fast
    assert by[("lru", "4:1")].predicted_seconds > by[("all-fast", None)].predicted_seconds


def test_plan_statistics_agree_with_the_validator(tmp_path):
    w = workload("resnet50", "test")
    graph, cm, _ = profile_workload(w, "sim:nvme", str(tmp_path / "c.sqlite"))
    for formulation in ("all-fast", "first-touch", "lru"):
        p = make_plan(graph, cm, "4:1", formulation)
        rep = validate(p, graph)
        m = move_stats(p, graph)
        assert m["sync_bytes_to_fast"] + m["async_bytes_to_fast"] == rep.bytes_to_fast
        assert m["sync_bytes_to_slow"] + m["async_bytes_to_slow"] == rep.bytes_to_slow
        assert sum(v for k, v in m.items() if "moves" in k) == rep.moves
        io = kernel_io(p, graph)
        # staged access: every operand is in fast memory when its kernel runs
        assert io["kernel_input_bytes_fast"] == io["kernel_input_bytes"] > 0
        assert io["kernel_output_bytes_fast"] == io["kernel_output_bytes"] > 0
        if formulation == "all-fast":
            assert io["kernel_input_bytes_kept"] == io["kernel_input_bytes"]
        else:  # what was prefetched for a use is not counted as kept
            assert io["kernel_input_bytes_kept"] < io["kernel_input_bytes"]
    # direct access: operands read in place from slow memory are not fast
    graph, cm, _ = profile_workload(w, "sim:optane", str(tmp_path / "c.sqlite"))
    slow = kernel_io(make_plan(graph, cm, "1:0", "all-slow"), graph)
    some = kernel_io(make_plan(graph, cm, "1:1", "first-touch"), graph)
    assert slow["kernel_input_bytes_fast"] < some["kernel_input_bytes_fast"] < some["kernel_input_bytes"]


def test_gpu_needs_cuda_or_a_sim_spec(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ValueError, match="cuda\\+host needs a CUDA GPU"):
        bench.gpu(str(tmp_path))
    assert bench.gpu(str(tmp_path), memory="sim:pcie-host", models="resnet50").cells  # planned and simulated


def test_bench_test_runs_end_to_end(tmp_path):
    """The artifact's Test Run from the command line: profile, execute on cpu+file, record, plot."""
    out = tmp_path / "results"
    ratio = feasible_ratio(str(tmp_path / "c.sqlite"), ("synchronous", "first-touch"))
    r = subprocess.run([sys.executable, "-m", "autotm.cli", "bench", "test", "--out", str(out), "--ratios", ratio,
                        "--formulations", "all-fast,synchronous,first-touch", "--iterations", "2", "--verify",
                        "--time-limit", "20", "--cache", str(tmp_path / "c.sqlite")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = ResultsStore(out / "test.jsonl").load()
    assert [(x.formulation, x.budget, x.status) for x in recs] == [
        ("all-fast", None, "ok"), ("synchronous", ratio, "ok"), ("first-touch", ratio, "ok")]
    for x in recs:
        assert not x.simulated and x.memory_system == "cpu+file" and x.identical is True
        assert x.measured_seconds > 0 and len(x.iteration_seconds) == 2 and x.predicted_seconds > 0
    for name in ("fig7-speedup", "fig9-costs", "fig11-error"):
        png = out / f"{name}-test-cpu-file.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (out / f"{name}-test-cpu-file.svg").read_text()[:1000]
