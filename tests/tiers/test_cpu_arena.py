"""The CPU arena allocator (tiers/cpu_arena.py): tensors at planned offsets, never shared bytes."""

import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autotm.tiers import cpu_arena

MIB = 1 << 20


def test_the_allocator_builds_where_there_is_a_toolchain():
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    if (shutil.which("c++") or shutil.which("g++")) and headers:
        assert cpu_arena.load() is not None, cpu_arena.load.reason


@pytest.fixture
def arena():
    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    with cpu_arena.CpuArena(16 * MIB) as a:
        yield a


def test_kernel_outputs_land_at_their_expected_offsets(arena):
    x, w = torch.randn(2, 8, 16, 16), torch.randn(8, 8, 3, 3)
    want = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    nb = want.untyped_storage().nbytes()
    arena.expect([(nb, 4096, 0), (x.nbytes, 8 * MIB, 0)])
    y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    z = x + 1
    arena.done()
    assert arena.offset_of(y) == 4096 and arena.offset_of(z) == 8 * MIB
    assert torch.equal(y, want) and torch.equal(z, x + 1)
    after = x * 2  # nothing expected: the heap
    assert arena.offset_of(after) == -1


def test_a_range_in_use_is_never_handed_out_again(arena):
    a = arena.take(0, 1000, 4096)
    assert a is not None and a.numel() == 1000
    assert arena.take(2048, 100) is None  # overlaps a's reserved page
    arena.expect([(4096, 0, 0)])
    b = torch.empty(1024, dtype=torch.float32)  # same size, but the range is busy: the heap
    arena.done()
    assert arena.offset_of(b) == -1
    del a
    assert arena.take(2048, 100) is not None  # free again once a's storage died


def test_skip_lets_earlier_allocations_of_the_size_pass(arena):
    arena.expect([(4096, 0, 1)])
    first = torch.empty(1024)
    second = torch.empty(1024)
    arena.done()
    assert arena.offset_of(first) == -1 and arena.offset_of(second) == 0
    sizes = [n for n, _ in arena.allocations()]
    assert sizes == [4096, 4096]


def test_temporaries_take_free_pages_but_never_an_expected_range(arena):
    arena.expect([(MIB, 0, 0)], temporaries=MIB)
    tmp = torch.empty(2 * MIB, dtype=torch.uint8)  # not expected: a free page-aligned range past [0, 1 MiB)
    out = torch.empty(MIB, dtype=torch.uint8)
    arena.done()
    off = arena.offset_of(tmp)
    assert off >= MIB and off % 4096 == 0
    assert arena.offset_of(out) == 0


def test_an_output_sized_allocation_with_a_busy_slot_is_no_temporary(arena):
    # the slot [0, 1 MiB) is busy: an allocation of that size may be the output itself,
    # which outlives the kernel, so it goes to the heap, not to the arena's free pages
    # (where it would hold bytes the layout gives to later tensors)
    busy = arena.take(0, MIB)
    arena.expect([(MIB, 0, 0)], temporaries=MIB)
    out = torch.empty(MIB, dtype=torch.uint8)
    arena.done()
    assert arena.offset_of(out) == -1
    del busy
    # a known temporary of the output's size (skip) may use free pages; the output its slot
    arena.expect([(MIB, 0, 1)], temporaries=MIB)
    tmp = torch.empty(MIB, dtype=torch.uint8)
    out = torch.empty(MIB, dtype=torch.uint8)
    arena.done()
    assert arena.offset_of(tmp) >= MIB and arena.offset_of(out) == 0


def test_kernel_footprint_counts_temporaries_apart_from_outputs():
    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    x = torch.randn(64, 64)
    before = torch.randn(256, 256)  # allocated before the window: its free does not count there

    def kernel():
        nonlocal before
        tmp = torch.empty(1 << 18)  # 1 MiB temporary
        tmp.fill_(1.0)
        before = None
        return x + tmp[: x.numel()].view_as(x)

    peak, kept = cpu_arena.kernel_footprint(kernel)
    assert kept == x.nbytes  # the result
    assert peak - kept >= MIB  # the temporary, alive at once with nothing else freed first
    peak, kept = cpu_arena.kernel_footprint(lambda: x + 1)
    assert kept == x.nbytes and peak - kept < 1024  # (the scalar 1, wrapped in a tensor)


def test_a_closed_arena_keeps_its_live_tensors():
    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    a = cpu_arena.CpuArena(MIB)
    a.expect([(4096, 0, 0)])
    t = torch.arange(1024, dtype=torch.float32)
    a.done()
    a.close()
    assert torch.equal(t, torch.arange(1024, dtype=torch.float32))  # still mapped
    u = torch.arange(1024, dtype=torch.float32)  # and allocation goes on, from the heap
    assert torch.equal(t, u)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 63), st.integers(1, 16)), min_size=1, max_size=60))
def test_take_hands_out_exactly_the_free_ranges(ops):
    """Random takes and frees against a model of the live ranges (in 4 KiB units)."""
    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    page = 4096
    with cpu_arena.CpuArena(64 * page) as arena:
        live: list[tuple[int, int, torch.Tensor]] = []
        for take, start, length in ops:
            if take or not live:
                end = start + length
                free = end <= 64 and all(e <= start or end <= s for s, e, _ in live)
                t = arena.take(start * page, length * page)
                assert (t is not None) == free, (start, end, [(s, e) for s, e, _ in live])
                if t is not None:
                    t.fill_(len(live) % 251)
                    live.append((start, end, t))
                del t  # the model's list holds the only reference
            else:
                live.pop(start % len(live))
        for _, _, t in live:  # nothing was written over
            assert t.min() == t.max()


def test_arena_and_arena_like_memory_start_on_a_huge_page(arena, tmp_path):
    """Direct I/O runs ~1.5x faster on huge pages: the arena and the profiler's stand-in for
    its slots (arena_like) both start on a 2 MiB boundary, and a cpu+file round trip into
    arena_like memory returns the bytes unchanged."""
    from autotm.tiers import make_memory_system

    slot = arena.take(0, 4096)
    assert slot is not None and slot.data_ptr() % cpu_arena.HUGE_PAGE == 0
    n = 3 * MIB + 4096
    src = cpu_arena.arena_like(n).copy_(torch.randint(0, 255, (n,), dtype=torch.uint8))
    assert src.data_ptr() % cpu_arena.HUGE_PAGE == 0 and src.untyped_storage().nbytes() == n
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as ms:
        h = ms.to_slow(0, src)
        length, pad = ms.read_span(h)
        assert pad == 0  # page-aligned source: the read may go straight into a slot
        dst = cpu_arena.arena_like(n, length)
        back = ms.to_fast(h, into=dst)
        assert back.data_ptr() == dst.data_ptr() and torch.equal(back, src)
        ms.free_slow(h)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_load():
    """torch waits forever on the lock file of a build that was killed mid-way; the loader
    removes it under its own flock (which dies with its holder)."""
    import subprocess
    import sys

    from torch.utils.cpp_extension import _get_build_directory

    if cpu_arena.load() is None:
        pytest.skip(f"no C++ toolchain here: {cpu_arena.load.reason}")
    lock = Path(_get_build_directory("autotm_cpu_arena", False)) / "lock"
    lock.touch()  # what a build killed with SIGTERM or SIGKILL leaves
    r = subprocess.run([sys.executable, "-c", "from autotm.tiers import cpu_arena; "
                        "assert cpu_arena.load() is not None, cpu_arena.load.reason"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "stale build lock" in r.stderr and not lock.exists()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_trim_gives_back_whole_free_huge_pages_from_the_top_and_keeps_live_blocks(arena):
    # 16 MiB: a live block at [6 MiB, 7 MiB), the rest touched and free
    rest = arena.take(0, 16 * MIB)
    rest.fill_(1)
    del rest
    live = arena.take(6 * MIB, MIB)
    live.fill_(7)
    before = _rss()
    # at least 3 MiB: two huge pages from the top, [12, 16) MiB
    assert arena.trim(3 * MIB) == 4 * MIB
    assert before - _rss() >= 3 * MIB
    # all the rest: [0, 6) and [8, 12) MiB (pages given back already are not counted
    # again); the huge page [6, 8) holds the live block
    assert arena.trim() == 10 * MIB
    assert arena.trim() == 0  # nothing resident is left to give back
    assert bool((live == 7).all())
    again = arena.take(0, 4 * MIB)  # trimmed pages come back zeroed
    assert int(again.max()) == 0
    again.fill_(3)
    del again
    # handed out since, [0, 4) MiB is resident again: the next trim gives it back
    before = _rss()
    assert arena.trim() == 4 * MIB
    assert before - _rss() >= 3 * MIB


def test_trim_counts_no_page_above_the_highest_block_ever_handed_out(arena):
    assert arena.trim() == 0  # nothing touched yet
    block = arena.take(0, MIB)
    block.fill_(1)
    assert arena.trim() == 0  # its huge page holds a live block
    del block
    assert arena.trim() == 2 * MIB  # that one page, not the 14 MiB above it never touched


def test_a_pool_serves_large_allocations_lowest_first_and_leaves_small_ones_to_the_heap(arena):
    x = torch.randn(256, 512)
    want = x @ x.T
    with cpu_arena.CpuArena(16 * MIB) as pool:
        with pool.as_pool(64 << 10):
            a = torch.empty(MIB, dtype=torch.uint8)
            b = torch.empty(MIB, dtype=torch.uint8)
            small = torch.empty(1024, dtype=torch.uint8)
            assert (pool.offset_of(a), pool.offset_of(b), pool.offset_of(small)) == (0, MIB, -1)
            del a
            c = torch.empty(MIB // 2, dtype=torch.uint8)  # the lowest free range: a's
            assert pool.offset_of(c) == 0
            assert pool.offset_of(torch.empty(32 * MIB, dtype=torch.uint8)) == -1  # no room: the heap
            y = x @ x.T  # a kernel's output in the pool
            assert pool.offset_of(y) >= 0 and torch.equal(y, want)
            # what an expected slot does not take goes to the pool, the slot's size to the slot
            arena.expect([(4096, 0, 0)])
            in_slot = torch.empty(1024)
            missed = torch.empty(MIB, dtype=torch.uint8)
            arena.done()
            assert arena.offset_of(in_slot) == 0 and pool.offset_of(missed) >= 0
            assert pool.stats()[4] >= 5  # (the process's count of pooled allocations)
        assert pool.offset_of(torch.empty(MIB, dtype=torch.uint8)) == -1  # outside: the heap
        del b, c, y, missed
        assert pool.stats()[0] == 0  # every block given back
