"""profile(): in-situ kernel timing on cpu+file, the SQLite cache (resume after a kill,
corrupt files, versions, recache), signatures, move fits, and sim:<spec> rooflines."""

from __future__ import annotations

import signal
import statistics
import sqlite3
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn

from autotm.ir.costmodel import CostModel, MoveCost
from autotm.ir.plan import all_fast_plan, evict_all_activations_plan
from autotm.profile.environment import environment
from autotm.profile.moves import MOVE_PHASES, _fit_move, _isotonic, _matmul_seconds, _move_cost, _while_computing, \
    move_rounds
from autotm.profile.pace import PaceWarning
from autotm.profile.profiler import profile
from autotm.profile.roofline import cost_model_from_spec, load_spec, spec_names
from autotm.profile.timing import MIN_BATCH_S, time_call
from autotm.runtime.overhead import measure_executor_overhead
from autotm.profile.cache import SCHEMA_VERSION, CacheWarning, ProfileCache, environment_key
from autotm.checks.simulate import simulate
from autotm.tiers import make_memory_system
from autotm.checks.validate import PlanReplay
from children import sigint_default, stop

SMALL_MOVES = dict(move_sizes=(64 * 1024, 1024 * 1024), move_repeats=2)


# Two convolutions that differ only in padding, two matmuls that differ only in the
# stride of their weight (w2 is used transposed). Source text, so the kill test's child
# process builds the very same graph.
TINY_SOURCE = textwrap.dedent('''
    import torch
    from torch import nn
    from autotm.frontend.capture import capture
    from autotm.interpret.replay import TrainingState

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(3, 4, 3, padding=2)
            self.w1 = nn.Parameter(torch.randn(16, 8) * 0.1)
            self.w2 = nn.Parameter(torch.randn(8, 16) * 0.1)

        def forward(self, x):
            h = torch.relu(self.c1(x)).mean((2, 3)) + torch.relu(self.c2(x)).mean((2, 3))
            z = h.repeat(1, 4)
            return z @ self.w1 + z @ self.w2.t()

    def tiny_graph():
        torch.manual_seed(0)
        m = Tiny()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        batch = (torch.randn(2, 3, 8, 8), torch.tensor([1, 3]))
        g = capture(m, nn.CrossEntropyLoss(), opt, batch, name="tiny")
        return g, TrainingState(g, m, opt).inputs(batch)
''')


def tiny_graph():
    ns: dict = {}
    exec(TINY_SOURCE, ns)
    return ns["tiny_graph"]()


@pytest.fixture(scope="module")
def tiny():
    return tiny_graph()


@pytest.fixture(scope="module")
def memory():
    with make_memory_system("cpu+file") as ms:
        yield ms


def unique_keys(g) -> int:
    return len({k.signature for k in g.kernels})


# ---- the timing rule ----------------------------------------------------------------------

def test_time_call_batches_short_calls_and_takes_the_median():
    calls = []
    seconds, samples = time_call(lambda: calls.append(1))
    assert 3 <= samples and seconds < MIN_BATCH_S
    assert len(calls) > samples * 10  # short calls were repeated in batches
    a = torch.randn(256, 256)
    seconds, samples = time_call(lambda: a @ a)
    assert 0 < seconds < 1


def test_wake_seconds_pool_each_signatures_excess_over_its_positions():
    # kernels a b a b c: a is 10 us slower cold, b 4 us slower as the second kernel after a
    # move; per position the warm times differ (a at 100 and 120 us) and one position's
    # samples are noise, which the median over a signature's positions rejects
    from autotm.profile.wake import wake_seconds

    sigs = ["a", "b", "a", "b", "c"]
    g = SimpleNamespace(kernels=[SimpleNamespace(signature=s) for s in sigs])
    warm = [100e-6, 50e-6, 120e-6, 50e-6, 30e-6]
    cold = [w + (10e-6 if s == "a" else 0.0) for w, s in zip(warm, sigs)]
    second = [w + (4e-6 if s == "b" else 0.0) for w, s in zip(warm, sigs)]
    cold[4] -= 5e-6  # c: faster cold (noise): no negative excess
    samples = {"cold": [[c, c * 1.01, c] for c in cold], "second": [[x] * 3 for x in second],
               "warm": [[w] * 3 for w in warm]}
    W = wake_seconds(g, samples)
    # W_k = cold excess of sig(k) + second excess of sig(k + 1)
    assert W == pytest.approx([10e-6 + 4e-6, 0.0, 10e-6 + 4e-6, 0.0, 0.0], abs=1e-12)


def test_in_situ_rule():
    from autotm.profile.timing import LONG_KERNEL_S, MAX_ITERATIONS, insitu_done, insitu_estimate

    assert not insitu_done([], 0, 0)
    assert not insitu_done([[1e-3, 1e-3]], 0, 0)  # too few samples
    assert insitu_done([[1e-3, 1e-3, 1e-3]], 0, 0)  # three occurrences in one iteration
    assert not insitu_done([[1e-3], [1e-3], [2e-3], [2e-3]], 2, 3 - MAX_ITERATIONS + 1)  # not stable
    assert insitu_done([[1e-3], [1e-3], [1.01e-3]], 2, 2 - MAX_ITERATIONS + 1)  # stable
    assert insitu_done([[LONG_KERNEL_S]], 0, 0)  # one sample of a long kernel is enough
    assert insitu_done([[1e-3]], 0, MAX_ITERATIONS - 1)  # out of iterations: what there is
    # occurrences are averaged within an iteration, iterations reduced by the median
    assert insitu_estimate([[1.0, 3.0], [2.0, 2.0], [10.0, 10.0]]) == 2.0


def test_move_fit_recovers_latency_and_bandwidth():
    pts = [(n, 1e-4 + n / 2e9) for n in (65536, 262144, 1 << 20, 1 << 22, 1 << 24) for _ in range(3)]
    fit = _fit_move(pts)
    assert fit.latency_s == pytest.approx(1e-4, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-6)
    # negative intercept in the data: clamped to zero latency, never negative
    fit = _fit_move([(n, max(n / 1e9 - 1e-5, 1e-7)) for n in (1 << 20, 1 << 22, 1 << 24)])
    assert fit.latency_s == 0.0 and fit.bandwidth_bytes_per_s > 0


@given(st.lists(st.tuples(st.floats(1e-6, 1.0), st.integers(1, 9)), min_size=1, max_size=12))
@settings(max_examples=200, deadline=None)
def test_isotonic_fit_is_the_closest_non_decreasing_sequence(yw):
    y, w = [a for a, _ in yw], [b for _, b in yw]
    fit = _isotonic(y, w)
    assert len(fit) == len(y)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(fit, fit[1:]))
    # pooling keeps the weighted sum; a sorted input is returned as it is
    assert sum(f * x for f, x in zip(fit, w)) == pytest.approx(sum(a * x for a, x in zip(y, w)), rel=1e-9)
    assert _isotonic(sorted(y), w) == pytest.approx(sorted(y), rel=1e-12)
    # no non-decreasing sequence that only moves one value is closer (a local optimality check)
    cost = sum(x * (f - a) ** 2 for f, a, x in zip(fit, y, w))
    for i in range(len(fit)):
        for d in (-1e-3, 1e-3):
            alt = list(fit)
            alt[i] += d
            if all(a <= b for a, b in zip(alt, alt[1:])):
                assert sum(x * (f - a) ** 2 for f, a, x in zip(alt, y, w)) >= cost - 1e-12


def test_one_slow_small_size_does_not_raise_the_larger_ones():
    # 4 KiB samples slowed by the copy before them (300 us) against ~100-200 us at 16-256 KiB
    pts = [(4096, 300e-6), (16384, 120e-6), (65536, 130e-6), (262144, 200e-6), (1 << 20, 500e-6)]
    cost = _move_cost([p for p in pts for _ in range(5)])
    med = dict(cost.points)
    assert med[4096] == med[16384] == med[65536] == pytest.approx((300 + 120 + 130) / 3 * 1e-6)
    assert med[262144] == pytest.approx(200e-6) and med[1 << 20] == pytest.approx(500e-6)


# ---- a real model on cpu+file -------------------------------------------------------------

def test_profile_times_every_kernel_then_hits_the_cache(tiny, memory, tmp_path):
    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    cm, st = profile(g, memory, path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert isinstance(cm, CostModel) and not cm.simulated
    assert cm.memory_system == "cpu+file" and cm.access == "staged" and cm.placement_seconds == {}
    assert cm.graph_fingerprint == g.fingerprint
    assert len(cm.kernel_seconds) == len(g.kernels) and all(s > 0 for s in cm.kernel_seconds)
    assert st.measured == unique_keys(g) == st.unique_kernels and st.cache_hits == 0
    assert st.total_kernels == len(g.kernels) > st.unique_kernels
    # 8 samples (64 KiB is small: 6 rounds, 1 MiB 2) of sync, async, host (an async move's
    # own time on this thread), the slowdown of computation under an async copy and, with
    # AIO, two async copies issued together (pair), each way
    assert len(move_rounds(SMALL_MOVES["move_sizes"], SMALL_MOVES["move_repeats"])) == 8
    aio = memory.async_engine == "aio"
    samples = 8 * 2 * (5 if aio else 4)
    assert st.move_samples_measured == samples
    modes = ("sync", "async", "host") + (("pair",) if aio else ())
    assert set(cm.moves) == {(d, m) for d in ("to_slow", "to_fast") for m in modes}
    for mc in cm.moves.values():
        assert mc.latency_s >= 0 and mc.bandwidth_bytes_per_s > 0
    for d in ("to_slow", "to_fast"):  # what a second copy adds: at least nothing, at most itself
        assert 0 <= cm.async_marginal_seconds(1 << 20, d) <= cm.move_seconds(1 << 20, d, "async")
    assert cm.async_host_seconds(1 << 20, "to_fast") > 0 and cm.async_host_seconds(0, "to_fast") == 0
    assert set(cm.copy_interference) == {"to_slow", "to_fast"}
    assert all(s >= 0 for s in cm.copy_interference.values())
    # a kernel's time: its signature's time (timed once) + the interpreter's work after it there
    with ProfileCache(path) as db:
        rows = db.kernel_times(db.environment(environment("cpu+file", None, memory.async_engine)))
    # (the cache also holds the executor-overhead calibration graph's kernels: autotm.overhead)
    sigs = {k.signature for k in g.kernels}
    assert len([key for key in rows if key[0] in sigs]) == unique_keys(g)
    for k, s in zip(g.kernels, cm.kernel_seconds):
        assert s >= rows[(k.signature, "fast")] > 0
    # the simulated all-fast plan is the sum of the kernel times
    assert simulate(all_fast_plan(g), g, cm).predicted_seconds == pytest.approx(sum(cm.kernel_seconds))
    # each kernel timed after a blocking move (cpu+file's moves leave the thread idle)
    assert len(cm.wake_seconds) == len(g.kernels) and all(0 <= w < 1 for w in cm.wake_seconds)

    cm2, st2 = profile(g, memory, path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st2.nothing_new and "nothing new" in st2.message()
    assert st2.measured == 0 and st2.cache_hits == unique_keys(g) and st2.move_samples_cached == samples
    assert cm2 == cm

    cm3, st3 = profile(g, memory, path, inputs=inputs, return_stats=True, recache=True, **SMALL_MOVES)
    assert st3.measured == unique_keys(g) and st3.move_samples_measured == samples
    assert CostModel.from_json(cm3.to_json()) == cm3


def test_wake_costs_are_kept_per_signature_for_every_graph(tiny, memory, tmp_path):
    # a graph whose signatures are all known (here: the same kernels, its per-graph samples
    # gone, as another graph of the same layers meets the cache) runs no wake iterations:
    # one in-situ iteration for its positions, the wake costs its signatures had
    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    cm, st = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    assert st.stage_seconds["wake"] > 0
    with ProfileCache(path) as db:
        excess = db.wake_excess(db.environment(environment("cpu+file", None, memory.async_engine)))
    assert {k.signature for k in g.kernels} <= set(excess)
    con = sqlite3.connect(str(path))
    con.execute("DELETE FROM positions")  # the graph's own samples, wake samples included
    con.commit()
    con.close()
    cm2, st2 = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    assert st2.measured == 0 and st2.iterations == 1 and "wake" not in st2.stage_seconds
    assert cm2.wake_seconds == cm.wake_seconds


@pytest.fixture(scope="module")
def overhead_profiles(tiny, memory, tmp_path_factory):
    """tiny profiled into a fresh cache without the executor's overheads, then with them
    but without the calibration at hand, then with it (measuring them)."""
    g, inputs = tiny
    path = tmp_path_factory.mktemp("overhead") / "c.sqlite"
    bare = profile(g, memory, path, inputs=inputs, executor_overhead=False, **SMALL_MOVES)
    unmeasured = profile(g, memory, path, inputs=inputs, **SMALL_MOVES)
    cm, st = profile(g, memory, path, inputs=inputs, return_stats=True, measure_overhead=measure_executor_overhead,
                     **SMALL_MOVES)
    return SimpleNamespace(path=path, bare=bare, unmeasured=unmeasured, cm=cm, st=st)


def test_the_executors_overhead_is_measured_once_and_added_to_every_move(tiny, memory, overhead_profiles):
    g, inputs = tiny
    path, bare, cm, st = overhead_profiles.path, overhead_profiles.bare, overhead_profiles.cm, overhead_profiles.st
    assert bare.executor_overhead == {}
    # without the calibration (the runtime's, passed in), an uncached overhead is left out
    unmeasured = overhead_profiles.unmeasured
    assert unmeasured.executor_overhead == {} and unmeasured == bare
    assert st.overhead_measured and not st.nothing_new and "executor's overheads" in st.message()
    o = cm.executor_overhead
    assert set(o) == {"kernel_s", "sync_move_s", "async_move_s"} and o["async_move_s"] == o["sync_move_s"]
    # measured differences of medians, kept at 0 or more (on a loaded machine they can be
    # 0: their size is test_the_executors_overhead_is_tens_of_microseconds_a_sync_move's)
    assert o["sync_move_s"] >= 0 and o["kernel_s"] >= 0
    assert cm.kernel_seconds == pytest.approx([s + o["kernel_s"] for s in bare.kernel_seconds], rel=1e-12)
    for d in ("to_slow", "to_fast"):
        for n in (4096, 200_000, 1 << 20, 8 << 20):
            assert cm.move_seconds(n, d, "sync") == pytest.approx(bare.move_seconds(n, d, "sync") + o["sync_move_s"])
            assert cm.async_host_seconds(n, d) == pytest.approx(bare.async_host_seconds(n, d) + o["async_move_s"])
            assert cm.move_seconds(n, d, "async") == bare.move_seconds(n, d, "async")
    # an evict-all sync plan's prediction: one sync_move_s more per evict and prefetch
    plan = evict_all_activations_plan(g, "sync")
    n_moves = sum(m.action.kind in ("evict", "prefetch") for step in PlanReplay(plan, g, budget_bytes=None)
                  for m in step.sync_moves)
    assert n_moves > 0
    assert simulate(plan, g, cm).predicted_seconds == pytest.approx(
        simulate(plan, g, bare).predicted_seconds + n_moves * o["sync_move_s"] + len(g.kernels) * o["kernel_s"])
    assert CostModel.from_json(cm.to_json()) == cm
    # measured once per environment: cached (used without the calibration at hand), and
    # measured again only with recache
    again, st2 = profile(g, memory, path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st2.nothing_new and not st2.overhead_measured and again == cm
    _, st3 = profile(g, memory, path, inputs=inputs, return_stats=True, recache=True,
                     measure_overhead=measure_executor_overhead, **SMALL_MOVES)
    assert st3.overhead_measured


@pytest.mark.timing
def test_the_executors_overhead_is_tens_of_microseconds_a_sync_move(overhead_profiles):
    # a sync move's work in the executor outside the tier's call and the kernels (freeing
    # its slow copy when the tensor dies, RSS checks with an arena): tens of us, never nothing
    o = overhead_profiles.cm.executor_overhead
    assert 0 < o["sync_move_s"] < 1e-3 and 0 <= o["kernel_s"] < 1e-4


class ManyViews(nn.Module):
    """A stack of 96 columns, each a chain of five views: re-deriving them (the stack's
    operands) takes several times the stack's own call."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(96, 96)

    def forward(self, x):
        h = self.lin(x)
        return torch.stack([h[:, i].unsqueeze(0).squeeze(0).unsqueeze(1).squeeze(1) for i in range(96)], 1)


@pytest.fixture(scope="module")
def many_views():
    """ManyViews captured, its stack kernel's index, and the median time every interpreter
    takes to build that kernel's operands (its 96 views re-derived)."""
    from autotm.frontend.capture import capture
    from autotm.interpret.replay import Replay, TrainingState

    torch.manual_seed(0)
    m = ManyViews()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    batch = (torch.randn(4, 96), torch.tensor([1, 3, 5, 7]))
    g = capture(m, nn.CrossEntropyLoss(), opt, batch, name="many_views")
    (k,) = [kern.index for kern in g.kernels if kern.op == "aten.stack.default"]
    assert k > 0

    class BuildTimes(Replay):
        seconds: list = []

        def operands(self, j):
            t0 = time.perf_counter()
            out = super().operands(j)
            if j == k:
                self.seconds.append(time.perf_counter() - t0)
            return out

    state = TrainingState(g, m, opt)
    for _ in range(15):
        BuildTimes(g).run(state.inputs(batch))
    return SimpleNamespace(g=g, m=m, opt=opt, batch=batch, state=state, k=k,
                           build=float(np.median(BuildTimes.seconds)))


@pytest.mark.timing
def test_building_operands_is_timed_between_kernels_by_the_profiler_and_the_executor(memory, many_views, tmp_path):
    from autotm.runtime.session import ExecutorSession

    mv = many_views
    g, m, opt, batch, state, k, build = mv.g, mv.m, mv.opt, mv.batch, mv.state, mv.k, mv.build
    path = tmp_path / "c.sqlite"
    cm = profile(g, memory, path, inputs=state.inputs(batch), executor_overhead=False, **SMALL_MOVES)
    with ProfileCache(path) as db:
        env = db.environment(environment("cpu+file", None, memory.async_engine))
        call = db.kernel_times(env)[(g.kernels[k].signature, "fast")]
        before = float(np.median(db.position_samples(env, g.fingerprint)[k - 1]))
    # the call's sample holds the stack alone; the building is the position before it's
    assert call < build / 3
    assert before > build / 2
    assert cm.kernel_seconds[k - 1] > build / 2

    # the executor's kernel times are the calls alone too; its iteration holds the building
    s = ExecutorSession(g, all_fast_plan(g), memory, m, opt)
    try:
        for _ in range(8):
            s.step(batch)
        per_kernel = np.median(np.stack(s.kernel_seconds[1:]), axis=0)
        outside = np.median([t - ks.sum() for t, ks in zip(s.iteration_seconds[1:], s.kernel_seconds[1:])])
    finally:
        s.close()
    assert per_kernel[k] < build / 3
    assert outside > build / 2


@pytest.fixture(scope="module")
def stack_repeats(many_views, tmp_path_factory):
    """ManyViews profiled on cpu+mmap (direct access): the stack kernel's repeated timings
    in the cache, by placement key."""
    mv = many_views
    path = tmp_path_factory.mktemp("repeats") / "c.sqlite"
    with make_memory_system("cpu+mmap") as ms:
        profile(mv.g, ms, path, inputs=mv.state.inputs(mv.batch), executor_overhead=False, **SMALL_MOVES)
        with ProfileCache(path) as db:
            times = db.kernel_times(db.environment(environment("cpu+mmap", None, ms.async_engine)))
    sig = mv.g.kernels[mv.k].signature
    return {key: t for (s, key), t in times.items() if s == sig and key.startswith("batch:")}


def test_direct_access_repeats_every_placement_of_a_kernel(stack_repeats):
    repeated = stack_repeats
    assert "batch:fast" in repeated and len(repeated) == 4  # all-fast and 3 placements of 2 operands
    assert all(t > 0 for t in repeated.values())


@pytest.mark.timing
def test_direct_access_repeats_time_the_call_alone(many_views, stack_repeats):
    # a placement's time is the in-situ call scaled by (repeated placement / repeated
    # all-fast): repeats that held the operands' building too would dilute the slowdown
    assert all(t < many_views.build / 3 for t in stack_repeats.values()), (stack_repeats, many_views.build)


def test_move_rounds_are_spread_over_the_profile(tiny, memory, tmp_path):
    # (a slow spell of the disk in one phase must not take every round with it)
    g, inputs = tiny
    seen = []
    profile(g, memory, tmp_path / "c.sqlite", inputs=inputs, progress=lambda d, t, what: seen.append(what),
            executor_overhead=False, **SMALL_MOVES)
    moves = [i for i, w in enumerate(seen) if w.startswith("move ")]
    kernels = [i for i, w in enumerate(seen) if w.startswith("aten.")]
    window = [[i for i, w in enumerate(seen) if w == f"kernels in situ, window {p}"] for p in range(MOVE_PHASES)]
    rounds = move_rounds(SMALL_MOVES["move_sizes"], SMALL_MOVES["move_repeats"])
    assert len(moves) == len(rounds) and kernels and all(window)
    # the rounds of phase p, then the kernels' in-situ iterations of window p
    ends = np.cumsum([sum(1 for _, r in rounds if r % MOVE_PHASES == p) for p in range(MOVE_PHASES)])
    assert 0 < ends[0] < ends[1] < ends[2] == len(rounds)
    for p in range(MOVE_PHASES):
        assert moves[ends[p] - 1] < min(window[p])
        if p + 1 < MOVE_PHASES:
            assert max(window[p]) < moves[ends[p]]
    # estimates final only in the last window: every kernel's samples span the profile
    assert min(kernels) > moves[-1] and min(kernels) > max(window[1])


def test_profile_without_inputs_uses_synthetic_values(tiny, memory, tmp_path):
    g, _ = tiny
    cm = profile(g, memory, tmp_path / "c.sqlite", **SMALL_MOVES)
    assert all(s > 0 for s in cm.kernel_seconds)


def test_signatures_differing_only_in_stride_or_padding_are_separate_entries(tiny, memory, tmp_path):
    g, inputs = tiny
    convs = [k.signature for k in g.kernels if k.op == "aten.convolution.default"]
    assert len(convs) == 2 and convs[0] != convs[1]
    assert convs[0].replace("[1, 1]", "[P]", 1) != convs[0]  # padding appears in the signature
    mms = sorted({k.signature for k in g.kernels if k.op == "aten.mm.default"
                  and "float32[2, 16]/[16, 1], float32[16, 8]" in k.signature})
    assert len(mms) == 2 and mms[0].split("/")[:2] == mms[1].split("/")[:2]  # same shapes, other strides
    path = tmp_path / "c.sqlite"
    profile(g, memory, path, inputs=inputs, **SMALL_MOVES)
    with ProfileCache(path) as db:
        env = db.environment(environment("cpu+file", None, memory.async_engine))
        rows = db.kernel_times(env)
    for sig in convs + mms:
        assert (sig, "fast") in rows


# ---- the cache: kill and resume, corruption, versions -------------------------------------

CHILD = TINY_SOURCE + textwrap.dedent('''
    import sys, time
    from autotm.profile.environment import environment
    from autotm.profile.profiler import profile
    from autotm.profile.cache import environment_key
    from autotm.tiers import make_memory_system
    g, inputs = tiny_graph()
    ms = make_memory_system("cpu+file")
    print("env", environment_key(environment("cpu+file", None, ms.async_engine)), flush=True)

    def progress(done, total, what):
        if what.startswith("aten."):  # a kernel's estimate final (not a move, not an iteration)
            print("kernel", done, total, flush=True)
            time.sleep(0.1)

    profile(g, ms, sys.argv[1], inputs=inputs, progress=progress,
            move_sizes=(65536, 1048576), move_repeats=2)
    print("finished", flush=True)
''')


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_profiler_resumes_without_losing_measurements(tiny, tmp_path, sig):
    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    seen, env_key = 0, None
    try:
        for line in proc.stdout:
            if line.startswith("env"):
                env_key = line.split()[1]
            if line.startswith("kernel"):
                seen += 1
                if seen == 3:
                    proc.send_signal(sig)
                    break
            assert not line.startswith("finished")
        proc.wait(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode != 0
    with make_memory_system("cpu+file") as ms:
        assert env_key == environment_key(environment("cpu+file", None, ms.async_engine))
    with ProfileCache(path) as db:
        done = db.kernel_times(env_key)
    assert len(done) >= 3
    cm, st = profile(g, "cpu+file", path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st.cache_hits == len(done) and st.measured == unique_keys(g) - len(done)
    # every move phase was done before the kernels' estimates became final (the last window)
    assert st.move_samples_measured == 0
    assert all(s > 0 for s in cm.kernel_seconds)


def test_corrupt_cache_file_warns_and_is_rebuilt(tiny, memory, tmp_path):
    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database\x00" * 400)
    with pytest.warns(CacheWarning, match="unusable"):
        cm, st = profile(g, memory, path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st.cache_rebuilt and st.measured == unique_keys(g)
    assert list(tmp_path.glob("c.sqlite.broken-*"))  # the bad file is kept aside
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is fine
        # (a change of the machine's load between the two profiles is not the file's fault:
        # test_a_cache_filled_on_a_loaded_machine_warns_when_reused is about that warning)
        warnings.simplefilter("ignore", PaceWarning)
        _, st2 = profile(g, memory, path, inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st2.nothing_new


def test_truncated_cache_file_warns_and_is_rebuilt(tmp_path):
    path = tmp_path / "c.sqlite"
    with ProfileCache(path) as db:
        env = db.environment({"x": 1})
        for i in range(200):
            db.put_kernel(env, f"sig{i}" * 20, "fast", 1e-3, 3)
    data = path.read_bytes()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"c.sqlite{suffix}").unlink(missing_ok=True)
    path.write_bytes(data[: len(data) // 2] + b"\xff" * 512)
    with pytest.warns(CacheWarning):
        db = ProfileCache(path)
    env = db.environment({"x": 1})
    assert db.kernel_times(env) == {}
    db.put_kernel(env, "s", "fast", 2.0, 3)
    assert db.kernel_times(env) == {("s", "fast"): 2.0}
    db.close()


def test_foreign_version_and_foreign_database_are_rebuilt(tmp_path):
    path = tmp_path / "c.sqlite"
    with ProfileCache(path) as db:
        env = db.environment({"x": 1})
        db.put_kernel(env, "s", "fast", 1.0, 3)
        db._db.execute("UPDATE meta SET value='999' WHERE name='schema_version'")
    with pytest.warns(CacheWarning, match="schema version 999"):
        db = ProfileCache(path)
    assert db.kernel_times(env) == {}  # never stale data from another version
    db.close()
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE foo (a)")
    con.commit()
    con.close()
    with pytest.warns(CacheWarning, match="not an autotm profile cache"):
        ProfileCache(other).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ProfileCache(path) as db:
            assert db._db.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()[0] == str(
                SCHEMA_VERSION)


def test_default_cache_path_is_overridable(monkeypatch, tmp_path):
    from autotm.profile.cache import default_cache_path

    monkeypatch.setenv("AUTOTM_CACHE_DIR", str(tmp_path))
    assert default_cache_path() == tmp_path / "profile.sqlite"


# ---- direct access: every placement ---------------------------------------------------------

def test_direct_access_profiles_every_placement(tiny, tmp_path):
    g, inputs = tiny
    with make_memory_system("cpu+mmap") as ms:
        cm = profile(g, ms, tmp_path / "c.sqlite", inputs=inputs, **SMALL_MOVES)
    assert cm.access == "direct"
    for k, kern in enumerate(g.kernels):
        n = len(dict.fromkeys(kern.inputs + kern.outputs))
        table = cm.placement_seconds[k]
        if n <= 4:
            assert len(table) == 2 ** n - 1
        assert all(len(p) == n and "slow" in p and s > 0 for p, s in table.items())
        assert cm.kernel_time(k, ("slow",) * n) > 0
        assert cm.kernel_time(k, ("fast",) * n) == cm.kernel_seconds[k]


# ---- sim:<spec> rooflines on a fake-captured graph -------------------------------------------

@pytest.fixture(scope="module")
def fake_vgg():
    from autotm.frontend.workloads import capture_workload
    from autotm.zoo import workload

    return capture_workload(workload("vgg19", "test"), fake=True)


def test_shipped_specs_load():
    assert {"optane", "cxl", "nvme", "pcie-host"} <= set(spec_names())
    opt = load_spec("sim:optane")
    assert opt.access == "direct"
    assert opt.moves[("to_fast", "sync")] == MoveCost(0.0, 29e9)
    assert opt.moves[("to_slow", "sync")] == MoveCost(0.0, 12e9)
    assert opt.moves[("to_fast", "async")] == MoveCost(0.0, 2e9)
    assert opt.moves[("to_slow", "async")] == MoveCost(0.0, 2.5e9)
    assert load_spec("nvme").access == "staged" and load_spec("pcie-host").access == "staged"
    assert load_spec("cxl").access == "direct"
    with pytest.raises(ValueError, match="unknown tier spec"):
        load_spec("sim:nope")


def test_roofline_numbers_on_a_fake_captured_graph(fake_vgg):
    g = fake_vgg
    assert g.fake
    peak = 1e11
    cm = cost_model_from_spec(g, "optane", peak_flops=peak)
    assert cm.simulated and cm.access == "direct" and cm.memory_system == "sim:optane"
    assert cm.move_seconds(12_000_000, "to_slow", "sync") == pytest.approx(1e-3)
    # the first convolution: x [16,3,32,32], w [64,3,3,3], b [64] -> y [16,64,32,32]; compute-bound
    conv = next(k for k in g.kernels if k.op == "aten.convolution.default")
    x, w, b = 16 * 3 * 32 * 32 * 4, 64 * 27 * 4, 64 * 4
    y = 16 * 64 * 32 * 32 * 4
    assert conv.flops == 2 * 16 * 64 * 32 * 32 * 27
    assert cm.kernel_seconds[conv.index] == pytest.approx(conv.flops / peak + 80e-9)
    # a ReLU: memory-bound, read + write at DRAM bandwidth; with its input in PMM: read at 30 GB/s
    relu = next(k for k in g.kernels if k.op == "aten.relu.default")
    nb = g.tensors[relu.outputs[0]].nbytes
    assert nb == y
    assert cm.kernel_seconds[relu.index] == pytest.approx(nb / 100e9 + nb / 100e9 + 80e-9)
    assert cm.kernel_time(relu.index, ("slow", "fast")) == pytest.approx(nb / 30e9 + nb / 100e9 + 380e-9)
    assert cm.kernel_time(relu.index, ("fast", "slow")) == pytest.approx(nb / 100e9 + nb / 10e9 + 380e-9)
    assert cm.kernel_time(relu.index, ("slow", "slow")) == pytest.approx(nb / 30e9 + nb / 10e9 + 300e-9)
    # a compute-bound kernel barely notices where its operands are
    assert cm.kernel_time(conv.index, ("slow", "fast", "fast", "fast")) == pytest.approx(
        max(conv.flops / peak, x / 30e9 + (w + b) / 100e9 + y / 100e9) + 380e-9)
    # staged spec: no placements
    nv = cost_model_from_spec(g, "nvme", peak_flops=peak)
    assert nv.access == "staged" and nv.placement_seconds == {} and nv.simulated
    sim = simulate(all_fast_plan(g, "sim:nvme"), g, nv)
    assert sim.simulated and sim.predicted_seconds == pytest.approx(sum(nv.kernel_seconds))


def test_profile_sim_measures_this_machines_peak_once(fake_vgg, tmp_path):
    path = tmp_path / "c.sqlite"
    cm, st = profile(fake_vgg, "sim:optane", path, return_stats=True)
    peak = cm.environment["peak_flops"]
    assert cm.simulated and peak > 1e8
    cm2 = profile(fake_vgg, "sim:optane", path)
    assert cm2.environment["peak_flops"] == peak  # from the cache
    with pytest.raises(ValueError, match="fake"):
        profile(fake_vgg, "cpu+file", path)


def test_workspace_is_profiled_cached_and_planned_around(memory, tmp_path):
    # convolution (oneDNN reorders) and its backward allocate temporaries of about their
    # output's size: fast memory the plan must leave free while they run
    from autotm.frontend.capture import capture
    from autotm.planner import plan
    from autotm.interpret.replay import TrainingState
    from autotm.tiers import cpu_arena
    from autotm.checks.validate import validate

    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                      nn.Flatten(), nn.Linear(32 * 32 * 32, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    batch = (torch.randn(4, 16, 32, 32), torch.tensor([1, 3, 0, 2]))
    g = capture(m, nn.CrossEntropyLoss(), opt, batch, name="convs")
    inputs = TrainingState(g, m, opt).inputs(batch)
    cm = profile(g, memory, tmp_path / "c.sqlite", inputs=inputs, **SMALL_MOVES)
    ws = cm.workspace(len(g.kernels))
    convs = [k.index for k in g.kernels if k.op.startswith("aten.convolution")]
    assert len(cm.workspace_bytes) == len(g.kernels) and (ws >= 0).all()
    assert all(ws[k] > 0 for k in convs)
    assert max(ws[k] for k in convs) >= 4 * 32 * 32 * 32 * 4 // 2  # about an activation's size
    again, st = profile(g, memory, tmp_path / "c.sqlite", inputs=inputs, return_stats=True, **SMALL_MOVES)
    assert st.nothing_new and again.workspace_bytes == cm.workspace_bytes
    # the plan leaves each kernel's workspace free in the budget
    p = plan(g, cm, "1:3", "synchronous", time_limit=20, arena=False)
    rep = validate(p, g, reserved_bytes=ws)
    assert (rep.fast_bytes + ws).max() <= p.budget_bytes
    assert p.meta.peak_fast_with_workspace_bytes <= p.budget_bytes


# ---- the machine's pace: a cache filled on a loaded machine is flagged -----------------------

def _busy(seconds: float) -> list[subprocess.Popen]:
    """Processes that load every core with torch matmuls (the load a test run or a
    benchmark beside the profile puts on the machine) for `seconds`."""
    code = textwrap.dedent(f"""
        import time, torch
        a = torch.ones(512, 512)
        end = time.time() + {seconds}
        while time.time() < end:
            torch.mm(a, a)
    """)
    import os

    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2 * (os.cpu_count() or 1))]


def test_a_cache_whose_pace_differs_far_from_now_warns_when_reused(tiny, memory, tmp_path):
    # the functional half of the test below, at any load: the cached pace is set 1,000x
    # slower (then faster) than the one measured, beyond what any load here makes of it
    from autotm.profile.pace import PACE_VALUE

    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    _, st = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    env_key = environment("cpu+file", None, memory.async_engine)
    for factor, word in ((1000.0, "slower"), (1 / 1000.0, "faster")):
        with ProfileCache(path) as db:
            db.put_value(db.environment(env_key), PACE_VALUE, st.pace.now_s * factor)
        with pytest.warns(PaceWarning, match=f"{word} than now.*--recache"):
            _, again = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False,
                               **SMALL_MOVES)
        assert again.nothing_new and again.pace.mismatched, (factor, again.pace)


@pytest.mark.timing
def test_a_cache_filled_on_a_loaded_machine_warns_when_reused(tiny, memory, tmp_path):
    from autotm.profile.pace import PACE_VALUE, pace_probe_seconds

    g, inputs = tiny
    path = tmp_path / "c.sqlite"
    quiet = pace_probe_seconds()
    busy = _busy(120)
    try:
        time.sleep(1.0)  # the load running
        loaded = pace_probe_seconds()
        _, st = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    assert loaded > 2 * quiet, (loaded, quiet)  # the load is real
    assert st.pace is not None and st.pace.cached_s is None and not st.nothing_new
    with ProfileCache(path) as db:
        env = db.environment(environment("cpu+file", None, memory.async_engine))
        stored = db.value(env, PACE_VALUE)
    assert stored == st.pace.now_s and stored > 1.5 * quiet

    # reused on the quiet machine: nothing measured, and the user is told why to distrust it
    with pytest.warns(PaceWarning, match="slower than now.*--recache"):
        _, st2 = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    assert st2.nothing_new and st2.pace.mismatched and st2.pace.ratio > 1.5

    # --recache measures again and the cache takes the pace of now: no warning after it
    profile(g, memory, path, inputs=inputs, recache=True, executor_overhead=False, **SMALL_MOVES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaceWarning)
        _, st3 = profile(g, memory, path, inputs=inputs, return_stats=True, executor_overhead=False, **SMALL_MOVES)
    assert st3.nothing_new and not st3.pace.mismatched


def test_pace_check_flags_a_ratio_beyond_the_tolerance_either_way():
    from autotm.profile.pace import PACE_TOLERANCE, PaceCheck

    assert PaceCheck(now_s=0.01, cached_s=None).ratio is None
    assert not PaceCheck(now_s=0.01, cached_s=None).mismatched
    assert not PaceCheck(now_s=0.01, cached_s=0.01 * PACE_TOLERANCE * 0.99).mismatched
    slow_then = PaceCheck(now_s=0.01, cached_s=0.01 * PACE_TOLERANCE * 1.01)
    assert slow_then.mismatched and "slower than now" in slow_then.describe()
    fast_then = PaceCheck(now_s=0.01 * PACE_TOLERANCE * 1.01, cached_s=0.01)
    assert fast_then.mismatched and "faster than now" in fast_then.describe()


@pytest.mark.timing
def test_an_async_move_timed_while_computing_is_not_rounded_up_to_the_computation(memory):
    # an AIO completion is stamped when this thread collects it, at its next poll; timed
    # between whole 192x192 matmuls (80-140 us) a 64 KiB write's flight came out 3.5-5.6x
    # what polling it without computing gives
    load = torch.randn(192, 192)
    mm = _matmul_seconds(load)
    t = torch.randint(0, 255, (64 << 10,), dtype=torch.uint8)

    def spin():
        pending = memory.start_to_slow(-1, t)
        issued = time.perf_counter()
        while not pending.done():
            pass
        h = pending.wait()
        return h, (pending.finished_at or time.perf_counter()) - issued

    polled, computing = [], []
    for _ in range(15):
        h, f = spin()
        memory.free_slow(h)
        polled.append(f)
        h, f, host, slowdown = _while_computing(lambda: memory.start_to_slow(-1, t), load, mm)
        memory.free_slow(h)
        computing.append(f)
        assert host > 0
    ratio = statistics.median(computing) / statistics.median(polled)
    assert 0.5 < ratio < 1.6, (ratio, statistics.median(computing), statistics.median(polled), mm)


@pytest.mark.timing
def test_two_async_moves_issued_together_are_timed_until_both_are_done(memory):
    # the "pair" samples: what a second copy at one kernel adds (CostModel.async_marginal_seconds)
    load = torch.randn(192, 192)
    mm = _matmul_seconds(load)
    a = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
    b = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
    one, two = [], []
    for _ in range(7):
        h, f, _, _ = _while_computing(lambda: memory.start_to_slow(-1, a), load, mm)
        memory.free_slow(h)
        one.append(f)
        hs, f, host, _ = _while_computing(lambda: [memory.start_to_slow(-1, a), memory.start_to_slow(-2, b)], load, mm)
        two.append(f)
        assert isinstance(hs, list) and len(hs) == 2 and host > 0
        back, _, _, _ = _while_computing(lambda hs=hs: [memory.start_to_fast(h) for h in hs], load, mm)
        assert torch.equal(back[0].view(torch.uint8).flatten(), a) and torch.equal(back[1].view(torch.uint8).flatten(), b)
        del back
        for h in hs:
            memory.free_slow(h)
    # both copies in the clock: never much less than one alone
    assert statistics.median(two) >= 0.7 * statistics.median(one), (two, one)
