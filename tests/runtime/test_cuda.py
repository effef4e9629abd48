"""cuda+host: GPU memory + pinned host memory.

Tests marked `needs_cuda` skip where torch.cuda.is_available() is False (with that reason);
they are the GPU checks benchmarks/gpu_check.sh runs on a GPU machine. The rest run
everywhere: the pinned pool's bookkeeping, the refusal without a GPU, and the device
plumbing of the replay and the executor (a CPU-captured graph run on the `meta` device,
where a kernel that still created its tensors on the CPU would fail).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autotm.tiers import TierError, make_memory_system
from autotm.tiers.base import storage_bytes
from autotm.tiers.cuda_tier import NO_CUDA, PinnedPool, size_class

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
MiB = 1 << 20


def host_pool(capacity=None) -> PinnedPool:
    return PinnedPool(lambda n: torch.empty(n, dtype=torch.uint8), capacity)


# ------------------------------------------------------------------ everywhere (no GPU)

def test_size_classes():
    assert size_class(0) == 0
    assert size_class(1) == size_class(4096) == 4096
    assert size_class(4097) == 8192
    assert size_class(3 * MiB) == 4 * MiB
    assert size_class(4 * MiB) == 4 * MiB


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 200_000)), max_size=40))
def test_pinned_pool_accounting(ops):
    """Random takes and gives: the bytes in use are those of the live buffers, a freed
    buffer is reused for its class before anything is allocated, and every buffer is big
    enough."""
    pool = host_pool()
    live = []
    free_by_class: dict[int, int] = {}
    for give, n in ops:
        if give and live:
            buf = live.pop(n % len(live))
            pool.give(buf)
            free_by_class[buf.size] = free_by_class.get(buf.size, 0) + 1
            continue
        before = pool.allocations
        buf = pool.take(n)
        assert buf.size == size_class(n) and buf.data.numel() >= n
        if free_by_class.get(buf.size):
            assert pool.allocations == before  # reused, not allocated
            free_by_class[buf.size] -= 1
        else:
            assert pool.allocations == before + 1
        live.append(buf)
        assert pool.in_use_bytes == sum(b.size for b in live)
        assert pool.cached_bytes == sum(c * k for c, k in free_by_class.items())
    assert pool.held_bytes == pool.in_use_bytes + pool.cached_bytes


def test_pinned_pool_capacity_and_fences():
    pool = host_pool(capacity=3 * MiB)
    a = pool.take(MiB)
    b = pool.take(2 * MiB - 5)  # class 2 MiB
    with pytest.raises(TierError, match="slow tier capacity exceeded"):
        pool.take(1)
    a.fences[7] = "event"  # a copy on stream 7 used it: the next writer must wait for it
    pool.give(a)
    again = pool.take(MiB)
    assert again is a and again.fences == {7: "event"}
    pool.give(again)
    pool.give(b)
    assert pool.in_use_bytes == 0 and pool.cached_bytes == 3 * MiB
    assert {x.size for x in pool.clear()} == {MiB, 2 * MiB}
    assert pool.held_bytes == 0


def test_pinned_pool_allocation_failure_is_a_tier_error():
    def refuse(n):
        raise RuntimeError("CUDA error: out of memory")

    pool = PinnedPool(refuse)
    with pytest.raises(TierError, match="cannot allocate 4096 bytes of pinned host memory"):
        pool.take(10)
    assert pool.in_use_bytes == 0


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without a GPU")
def test_cuda_host_refused_without_gpu():
    with pytest.raises(TierError) as e:
        make_memory_system("cuda+host")
    assert str(e.value) == NO_CUDA == "cuda+host needs a CUDA GPU; torch.cuda.is_available() is False"


def meta_inputs(graph) -> dict[int, torch.Tensor]:
    out = {}
    for _, tid in graph.program.input_keys:
        t = graph.tensors[tid]
        out[tid] = torch.empty_strided(t.shape, t.stride, dtype=getattr(torch, t.dtype), device="meta")
    return out


@pytest.fixture(scope="module")
def transformer_graph():
    """The test transformer creates tensors in the graph (arange, ones with device=cpu)."""
    from autotm.frontend.workloads import capture_workload
    from autotm.zoo import workload

    return capture_workload(workload("transformer", "test"), fake=True)


def test_replay_runs_a_cpu_graph_on_another_device(transformer_graph):
    from autotm.errors import ReplayError
    from autotm.interpret.replay import Replay

    g = transformer_graph
    assert any(isinstance(v, torch.device) for n in g.program.kernel_nodes for v in n.kwargs.values())

    class Devices(Replay):  # the device of every kernel output
        def store_outputs(self, k, out):
            made.update(v.device.type for v in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(v, torch.Tensor))
            super().store_outputs(k, out)
    made: set[str] = set()
    out = Devices(g, device="meta").run(meta_inputs(g))
    assert out and all(v.device.type == "meta" for v in out.values())
    assert made == {"meta"}  # factory ops too
    loss = out[g.program.output_keys["loss"]]
    assert loss.shape == () and loss.dtype == torch.float32
    # as captured, factory ops make CPU tensors (masked_fill's operand here), which a GPU's
    # kernels then refuse; the meta device lets in-place kernels mix them, so this looks
    # at the outputs
    made.clear()
    Devices(g).run(meta_inputs(g))
    assert "cpu" in made
    functional = Replay(g)
    functional.reuse = [None] * len(functional.reuse)  # no in-place or out= calls
    with pytest.raises(ReplayError, match="masked_fill.*device"):  # the kernel named
        functional.run(meta_inputs(g))


def test_executor_runs_on_the_memory_systems_fast_device(transformer_graph, tmp_path):
    """The executor takes its device from memory.fast_device: CPU inputs are moved there
    and factory ops create their tensors there (here the meta device stands in for a GPU)."""
    from autotm.runtime.executor import Executor
    from autotm.ir.plan import all_fast_plan

    g = transformer_graph
    inputs = {tid: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) for tid, v in meta_inputs(g).items()}
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as ms:
        ms.fast_device = torch.device("meta")
        ex = Executor(g, all_fast_plan(g, memory_system="cpu+file"), ms)
        assert ex.trim_memory is False
        out = ex.run_iteration(inputs)
    assert out and all(v.device.type == "meta" for v in out.values())


def test_profile_environment_names_the_device():
    from autotm.profile.environment import cpu_model, environment

    assert environment("cpu+file") == environment("cpu+file", torch.device("cpu"))
    assert environment("cpu+file")["device"] == cpu_model()
    if CUDA:
        env = environment("cuda+host", torch.device("cuda", 0))
        assert env["device"] == torch.cuda.get_device_name(0) and env["cuda"] == torch.version.cuda


# -------------------------------------------------------------------------- on a GPU

@pytest.fixture
def gpu(tmp_path):
    with make_memory_system("cuda+host") as ms:
        yield ms


def random_bits(shape, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    item = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * item,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape).to(device)


def cases(device):
    base = random_bits((6, 10, 7), torch.float32, 1, device)
    return {
        "float32": random_bits((3, 5, 7), torch.float32, 2, device),
        "int64": random_bits((17, 3), torch.int64, 4, device),
        "transposed": base.transpose(0, 2),
        "strided-slice": base[1:5:2, ::3, 2:],
        "0-dim": torch.tensor(-0.0, dtype=torch.float64, device=device),
        "empty": torch.empty(0, 3, device=device),
        "odd-bytes": random_bits((12345,), torch.uint8, 6, device),
        "bfloat16": random_bits((33, 33), torch.bfloat16, 7, device),
        "8MiB": random_bits((2 * MiB,), torch.float32, 8, device),
    }


def assert_same(x, t):
    assert (x.dtype, x.shape, x.stride(), x.storage_offset()) == (t.dtype, t.shape, t.stride(), t.storage_offset())
    assert x.untyped_storage().nbytes() == t.untyped_storage().nbytes()
    assert torch.equal(storage_bytes(x).cpu(), storage_bytes(t).cpu())


@needs_cuda
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_round_trip_bit_for_bit(gpu, mode):
    for name, t in {**cases(gpu.fast_device), **{"host-" + k: v for k, v in cases("cpu").items()}}.items():
        if mode == "sync":
            h = gpu.to_slow(1, t)
            back = gpu.to_fast(h)
        else:
            h = gpu.start_to_slow(1, t).wait()
            back = gpu.start_to_fast(h).wait()
        assert back.device == gpu.fast_device, name
        assert_same(back, t)
        assert gpu.slow_bytes_in_use() == size_class(t.untyped_storage().nbytes())
        gpu.free_slow(h)
        assert gpu.slow_bytes_in_use() == 0
    with pytest.raises(TierError, match="not live"):
        gpu.free_slow(h)


@needs_cuda
def test_async_copies_are_ordered_with_the_compute_stream(gpu):
    """The evict starts after the kernel that produced the tensor; the prefetched tensor is
    read only after its copy landed; a buffer freed while its read is in flight is not
    overwritten before that read (fences). Big tensors and long kernels make any missing
    ordering show up as wrong values."""
    dev = gpu.fast_device
    n = 64 * MiB // 4
    load = torch.randn(4096, 4096, device=dev)
    for round_ in range(3):
        x = torch.empty(n, device=dev)
        torch.mm(load, load)  # keep the stream busy so a copy that does not wait reads garbage
        x.fill_(round_ + 1.0)
        p = gpu.start_to_slow(0, x)
        for _ in range(4):
            torch.mm(load, load)  # the kernel the copy overlaps
        h = p.wait()
        x.fill_(-1.0)  # after the wait: ordered after the copy
        q = gpu.start_to_fast(h)
        gpu.free_slow(h)  # its read is in flight on the copy stream
        y = random_bits((n,), torch.float32, round_, dev)
        # takes the freed buffer, on the compute stream: it must wait for the read's fence
        h2 = gpu.to_slow(1, y)
        back = q.wait()
        assert torch.equal(back, torch.full((n,), round_ + 1.0, device=dev))
        assert torch.equal(gpu.to_fast(h2), y)
        gpu.free_slow(h2)
    gpu.synchronize()
    assert gpu.slow_bytes_in_use() == 0 and gpu.pinned_bytes() >= 64 * MiB


@needs_cuda
def test_cuda_host_declares_device_timed_moves(gpu):
    # the profiler reads the flag (no host move fits, no executor overhead), never the method
    from autotm.tiers import Capabilities

    assert gpu.capabilities == Capabilities(device_timed_moves=True) and gpu.async_engine is None
    assert hasattr(gpu, "move_seconds") and not hasattr(gpu, "read_span") and not gpu.idle_sync_moves


@needs_cuda
def test_move_timing_with_events(gpu):
    got = gpu.move_seconds(torch.zeros(4 * MiB, dtype=torch.uint8))
    assert set(got) == {(d, m) for d in ("to_slow", "to_fast") for m in ("sync", "async")}
    assert all(0 < s < 1 for s in got.values()), got
    assert gpu.slow_bytes_in_use() == 0


@needs_cuda
def test_fast_capacity_caps_the_allocator(tmp_path):
    with make_memory_system("cuda+host", fast_capacity_bytes=256 * MiB) as ms:
        torch.cuda.empty_cache()
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(512 * MiB, dtype=torch.uint8, device=ms.fast_device)
    torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")  # restored on close


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    from autotm.profile.workloads import profile_workload
    from autotm.zoo import workload

    w = workload("vgg19", "test")
    cache = str(tmp_path_factory.mktemp("cache") / "profile.sqlite")
    graph, cm, stats = profile_workload(w, "cuda+host", cache)
    return w, graph, cm, stats


@needs_cuda
def test_profile_on_the_gpu(profiled):
    _, graph, cm, stats = profiled
    assert cm.memory_system == "cuda+host" and cm.access == "staged" and not cm.simulated
    assert cm.environment["device"] == torch.cuda.get_device_name()
    assert all(s > 0 for s in cm.kernel_seconds) and len(cm.kernel_seconds) == len(graph.kernels)
    assert stats.measured > 0
    for (d, m), c in cm.moves.items():
        assert c.bandwidth_bytes_per_s > 1e8, (d, m, c)  # PCIe or better, measured with events


@needs_cuda
@pytest.mark.parametrize("formulation", ["all-fast", "lru", "first-touch", "synchronous", "asynchronous"])
def test_plans_run_on_the_gpu_and_match_eager(profiled, formulation):
    from autotm.api import run_workload
    from autotm.planner import plan

    w, graph, cm, _ = profiled
    p = plan(graph, cm, None if formulation == "all-fast" else "1:2", formulation, time_limit=20)
    with make_memory_system("cuda+host") as ms:
        r = run_workload(w, graph, cm, p, ms, iterations=2, verify=True)
    meta = r.report.meta
    assert meta["verification"] in ("bit-identical",) or meta["verification"].startswith("within tolerance"), (
        meta, r.mismatches)
    assert meta["peak_reserved_bytes"] >= meta["peak_allocated_bytes"] > 0
    if formulation != "all-fast":
        assert r.report.peak_fast_bytes <= p.budget_bytes
    if formulation in ("lru", "synchronous", "asynchronous"):  # 2/3 of the peak: something leaves the GPU
        assert r.report.bytes_to_slow > 0
    if formulation == "asynchronous":
        assert any(m.mode == "async" for m in r.report.moves) or p.meta.moves == 0


@needs_cuda
def test_vgg_is_bit_identical_to_eager_on_the_gpu(profiled):
    """No batch norm, SGD: the graph runs the kernels eager PyTorch runs."""
    from autotm.api import run_workload
    from autotm.planner import plan

    w, graph, cm, _ = profiled
    p = plan(graph, cm, "1:2", "synchronous", time_limit=20)
    with make_memory_system("cuda+host") as ms:
        r = run_workload(w, graph, cm, p, ms, iterations=2, verify=True)
    assert r.identical, (r.report.meta, r.mismatches)


@needs_cuda
def test_save_on_cpu_baseline():
    from autotm.runtime.gpu_baselines import run_save_on_cpu
    from autotm.zoo import workload

    d = run_save_on_cpu(workload("vgg19", "test"), iterations=2, verify=True)
    assert set(d) == {"measured_seconds", "iteration_seconds", "peak_allocated_bytes", "peak_reserved_bytes",
                      "identical"}
    assert d["identical"] is True
    assert d["measured_seconds"] > 0 and len(d["iteration_seconds"]) == 2
    assert d["peak_reserved_bytes"] >= d["peak_allocated_bytes"] > 0
