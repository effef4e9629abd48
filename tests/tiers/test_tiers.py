"""Memory tiers: bit-exact round trips (sync and async), direct I/O that really leaves
DRAM, cleanup (close, Ctrl-C), clear errors, and the NUMA refusal on a one-node machine."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import mmap
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from autotm.errors import AutotmError
from autotm.tiers import MemorySystem, SlowHandle, TensorLayout, TierError, make_memory_system
from autotm.tiers import file_tier
from autotm.tiers.base import PAGE, storage_bytes
from autotm.tiers.file_tier import FileMemorySystem
from autotm.tiers.mmap_tier import MmapMemorySystem
from autotm.tiers.numa_tier import NumaMemorySystem, memory_nodes, parse_node_list
from children import sigint_default, stop

MiB = 1 << 20
DIRECT_SYSTEMS = ["cpu+file", "cpu+mmap"]  # the ones that work on any machine


@pytest.fixture(params=DIRECT_SYSTEMS)
def ms(request, tmp_path):
    with make_memory_system(request.param, slow_dir=str(tmp_path)) as system:
        yield system


def random_bits(shape, dtype, seed=0):
    """A tensor with random *bits* (NaNs with payloads, subnormals, -0.0 included)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def assert_same(x: torch.Tensor, t: torch.Tensor) -> None:
    """Same dtype, layout and storage bytes, bit for bit."""
    assert x.dtype == t.dtype
    assert x.shape == t.shape
    assert x.stride() == t.stride()
    assert x.storage_offset() == t.storage_offset()
    assert x.untyped_storage().nbytes() == t.untyped_storage().nbytes()
    assert x.device == t.device
    assert torch.equal(storage_bytes(x), storage_bytes(t))


def cases():
    base = random_bits((6, 10, 7), torch.float32, 1)
    return {
        "float32": random_bits((3, 5, 7), torch.float32, 2),
        "float64": random_bits((1000,), torch.float64, 3),
        "int64": random_bits((17, 3), torch.int64, 4),
        "bool": random_bits((4099,), torch.bool, 5),
        "transposed": base.transpose(0, 2),
        "strided-slice": base[1:5:2, ::3, 2:],  # storage offset and gaps
        "0-dim": torch.tensor(-0.0, dtype=torch.float64),
        "0-dim-view": base[3, 4, 5],
        "empty": torch.empty(0, 3),
        "odd-bytes": random_bits((12345,), torch.uint8, 6),  # not a multiple of 4096
        "bfloat16": random_bits((33, 33), torch.bfloat16, 7),
    }


@pytest.mark.parametrize("nbytes", [3 * PAGE, 5 * PAGE + 123, 10 * MiB + 4])
def test_a_tensor_written_to_the_file_range_by_range_reads_back_whole_and_in_ranges(tmp_path, nbytes):
    """How a kernel in pieces writes its output to slow memory (runtime/pieces.py): ranges
    starting on pages, the last one short, in any order; whole reads and range reads give
    the bits back, and a range off a page is refused."""
    from autotm.tiers.ranges import bounce_buffer

    want = random_bits((nbytes,), torch.uint8, 8)
    step = 2 * PAGE if nbytes < MiB else MiB
    ranges = [(a, min(a + step, nbytes)) for a in range(0, nbytes, step)]
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as memory:
        h = memory.empty_slow(7, TensorLayout.of(want))
        buf = bounce_buffer(step)
        for a, b in reversed(ranges):
            torch.frombuffer(buf, dtype=torch.uint8, count=b - a).copy_(want[a:b])
            memory.write_range(h, a, buf, b - a)
        assert_same(memory.to_fast(h), want)
        assert_same(memory.start_to_fast(h).wait(), want)
        for a, b in ranges[::2]:
            assert torch.equal(memory.read_range(h, a, b, buf), want[a:b])
        with pytest.raises(TierError, match="page-aligned"):
            memory.write_range(h, 100, buf, 10)
        with pytest.raises(TierError, match="page-aligned"):
            memory.write_range(h, 0, buf, nbytes + 1)
        memory.free_slow(h)
        with contextlib.suppress(BufferError):
            buf.close()
    with make_memory_system("cpu+mmap", slow_dir=str(tmp_path)) as memory:
        with pytest.raises(TierError, match="cannot write part"):
            memory.empty_slow(7, TensorLayout.of(want))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("case", list(cases()))
def test_round_trip_bit_for_bit(ms, mode, case):
    t = cases()[case]
    before = storage_bytes(t).clone()
    if mode == "sync":
        h = ms.to_slow(7, t)
        x = ms.to_fast(h)
    else:
        h = ms.start_to_slow(7, t).wait()
        x = ms.start_to_fast(h).wait()
    assert isinstance(h, SlowHandle) and h.key == 7
    assert h.layout == TensorLayout.of(t)
    assert_same(x, t)
    assert torch.equal(storage_bytes(t), before)  # the source is untouched
    assert x.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or t.numel() == 0
    ms.free_slow(h)
    assert ms.slow_bytes_in_use() == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_round_trip_64mib(ms, mode):
    t = random_bits((16 * MiB,), torch.float32, 9)  # 64 MiB
    if mode == "sync":
        h = ms.to_slow(1, t)
        assert ms.slow_bytes_in_use() >= 64 * MiB
        x = ms.to_fast(h)
    else:
        h = ms.start_to_slow(1, t).wait()
        x = ms.start_to_fast(h).wait()
    assert_same(x, t)
    ms.free_slow(h)


def test_many_handles_interleaved(ms):
    """Allocation and reuse of slow space keep every tensor intact."""
    ts = [random_bits((n,), torch.float32, n) for n in (1, 1000, 5000, 70000, 3, 300000)]
    hs = [ms.to_slow(i, t) for i, t in enumerate(ts)]
    for i in (1, 3, 4):
        ms.free_slow(hs[i])
    more = [random_bits((n,), torch.int64, n) for n in (900, 20000, 2)]
    hs2 = [ms.start_to_slow(10 + i, t) for i, t in enumerate(more)]
    hs2 = [p.wait() for p in hs2]
    for i in (0, 2, 5):
        assert_same(ms.to_fast(hs[i]), ts[i])
    pend = [ms.start_to_fast(h) for h in hs2]
    for p, t in zip(pend, more):
        assert_same(p.wait(), t)
    for h in [hs[0], hs[2], hs[5], *hs2]:
        ms.free_slow(h)
    assert ms.slow_bytes_in_use() == 0


def test_handle_misuse(ms):
    h = ms.to_slow(3, torch.ones(10))
    ms.free_slow(h)
    with pytest.raises(TierError, match="not live"):
        ms.to_fast(h)
    with pytest.raises(TierError, match="not live|already freed"):
        ms.free_slow(h)


def test_free_refused_while_async_read_runs(tmp_path):
    with FileMemorySystem(str(tmp_path)) as ms:
        h = ms.to_slow(0, torch.zeros(32 * MiB // 4))
        pending = [ms.start_to_fast(h) for _ in range(3)]  # about 50 ms of reading
        with pytest.raises(TierError, match="still running"):
            ms.free_slow(h)
        for p in pending:
            assert torch.equal(p.wait(), torch.zeros(32 * MiB // 4))
        ms.free_slow(h)


def test_async_error_is_reraised_by_wait(tmp_path):
    with FileMemorySystem(str(tmp_path), slow_capacity_bytes=MiB) as ms:
        p = ms.start_to_slow(0, torch.zeros(2 * MiB, dtype=torch.uint8))
        with pytest.raises(TierError, match="capacity"):
            p.wait()
        with pytest.raises(TierError, match="moves CPU tensors|strided"):
            ms.start_to_slow(1, torch.zeros(3).to_sparse()).wait()
        # a tensor found unmovable once its write is queued: the write ends, its extent is freed
        lazy = torch.ones(4096, dtype=torch.complex64).conj()
        with pytest.raises(TierError, match="conjugate"):
            ms.start_to_slow(2, lazy).wait()
        assert ms.slow_bytes_in_use() == 0


def test_closed_system(tmp_path):
    ms = make_memory_system("cpu+file", slow_dir=str(tmp_path))
    h = ms.to_slow(0, torch.ones(3))
    ms.close()
    ms.close()  # idempotent
    with pytest.raises(TierError, match="closed"):
        ms.to_fast(h)
    with pytest.raises(TierError, match="closed"):
        ms.start_to_slow(0, torch.ones(3))


# ---------------------------------------------------------------- cpu+file specifics


def resident_pages(fd: int, length: int) -> int:
    """Pages of the file behind `fd` in the page cache (mincore on a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-length // mmap.PAGESIZE)
    m = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        anchor = ctypes.c_char.from_buffer(m)
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(length), vec)
        del anchor
        assert rc == 0, os.strerror(ctypes.get_errno())
        return sum(v & 1 for v in vec)
    finally:
        m.close()


def test_file_tier_uses_o_direct_and_data_leaves_dram(tmp_path):
    # Control: a buffered write leaves its pages in the page cache, and the probe sees it.
    ctl = os.open(tmp_path / "control", os.O_RDWR | os.O_CREAT)
    os.write(ctl, os.urandom(MiB))
    assert resident_pages(ctl, MiB) == MiB // mmap.PAGESIZE
    os.close(ctl)

    with FileMemorySystem(str(tmp_path)) as ms:
        if not ms.direct_io:
            pytest.skip(f"{tmp_path} refuses O_DIRECT")
        assert fcntl.fcntl(ms.fileno(), fcntl.F_GETFL) & os.O_DIRECT
        t = random_bits((16 * MiB,), torch.uint8)
        h = ms.to_slow(0, t)
        assert resident_pages(ms.fileno(), ms.arena_bytes()) == 0
        assert_same(ms.to_fast(h), t)
        assert resident_pages(ms.fileno(), ms.arena_bytes()) == 0


def test_file_tier_buffered_fallback_drops_page_cache(tmp_path):
    with FileMemorySystem(str(tmp_path), direct_io=False) as ms:
        assert not ms.direct_io
        assert not fcntl.fcntl(ms.fileno(), fcntl.F_GETFL) & os.O_DIRECT
        t = random_bits((4 * MiB + 5,), torch.uint8)
        h = ms.start_to_slow(0, t).wait()
        assert resident_pages(ms.fileno(), ms.arena_bytes()) == 0
        assert_same(ms.to_fast(h), t)


def test_file_tier_falls_back_with_one_warning_where_o_direct_is_refused(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(file_tier.os, "open", no_direct)
    with pytest.warns(RuntimeWarning, match="refuses direct I/O") as record:
        ms = FileMemorySystem(str(tmp_path))
    monkeypatch.undo()
    with ms:
        assert len(record) == 1 and not ms.direct_io
        t = random_bits((3000,), torch.int64)
        assert_same(ms.to_fast(ms.to_slow(0, t)), t)
    monkeypatch.setattr(file_tier.os, "open", no_direct)
    with pytest.raises(TierError, match="refuses direct I/O"):
        FileMemorySystem(str(tmp_path), direct_io=True)


def test_file_tier_writes_to_disk_reuses_space_and_cleans_up(tmp_path):
    ms = FileMemorySystem(str(tmp_path))
    d = ms.directory
    assert os.path.dirname(d) == str(tmp_path) and os.path.isdir(d)
    t = random_bits((8 * MiB + 100,), torch.uint8)
    h = ms.to_slow(0, t)
    st = os.fstat(ms.fileno())
    assert st.st_nlink == 0  # unlinked at once: nothing can be left behind on disk
    assert st.st_blocks * 512 >= 8 * MiB + 100  # the bytes are on the disk
    assert ms.slow_bytes_in_use() == h.nbytes >= 8 * MiB + 100
    size = ms.arena_bytes()
    ms.free_slow(h)
    h = ms.to_slow(1, t)  # reuses the freed extent
    assert ms.arena_bytes() == size
    x = ms.to_fast(h)
    fd, links = ms.fileno(), os.listdir("/proc/self/fd")
    ms.close()
    assert not os.path.exists(d)
    for name in os.listdir("/proc/self/fd"):
        try:
            assert not os.readlink(f"/proc/self/fd/{name}").startswith(d)
        except FileNotFoundError:
            pass
    assert_same(x, t)  # fast tensors outlive the system
    assert fd is not None and links


@pytest.mark.parametrize("engine", ["aio", "thread"])
def test_async_engines_many_moves_in_flight(tmp_path, engine):
    """More moves in flight than the AIO ring holds, of odd sizes and offsets, all back
    bit for bit; the engine is the one asked for."""
    with FileMemorySystem(str(tmp_path), async_io=engine) as ms:
        assert ms.async_engine == engine
        ts = [random_bits((1 + 4099 * i % 70000,), torch.uint8) for i in range(300)]
        views = [t[i % 7:] for i, t in enumerate(ts)]
        hs = [p.wait() for p in [ms.start_to_slow(i, v) for i, v in enumerate(views)]]
        pend = [ms.start_to_fast(h) for h in hs]
        with pytest.raises(TierError, match="still running"):
            ms.free_slow(hs[-1])
        for v, p in zip(views, pend):
            assert_same(p.wait(), v)
        assert p.done() and p.finished_at is not None
        for h in hs:
            ms.free_slow(h)
        assert ms.slow_bytes_in_use() == 0


@pytest.mark.parametrize("pages", [3, 80])  # under and over SMALL_READ_BYTES
@pytest.mark.parametrize("engine", ["aio", "thread"])
def test_async_read_of_a_truncated_slow_file_is_a_clear_error(tmp_path, engine, pages):
    """A short asynchronous read (the file cut under the tier) is finished as a plain read,
    which says why it stops; a copy written after the cut still comes back bit for bit."""
    with FileMemorySystem(str(tmp_path), async_io=engine) as ms:
        a = random_bits((pages * PAGE + 5,), torch.uint8)
        ha = ms.start_to_slow(0, a[5:]).wait()
        os.ftruncate(ms.fileno(), ha.location.offset + PAGE)  # the copy's last pages are gone
        with pytest.raises(TierError, match="shorter than expected"):
            ms.start_to_fast(ha).wait()
        gc.collect()
        b = random_bits((pages * PAGE,), torch.uint8)
        hb = ms.start_to_slow(1, b).wait()
        assert_same(ms.start_to_fast(hb).wait(), b)
        assert_same(ms.start_to_fast(hb).wait(), b)  # the failed read's buffer, recycled


def test_sync_moves_through_aio_read_a_truncated_file_clearly(tmp_path):
    """With AIO, sync moves are queued and polled for: a short sync read (the file cut
    under the tier) is finished as a plain read, which says why it stops."""
    with FileMemorySystem(str(tmp_path)) as ms:
        assert ms.async_engine == "aio"
        a = random_bits((80 * PAGE,), torch.uint8)
        ha = ms.to_slow(0, a)
        os.ftruncate(ms.fileno(), ha.location.offset + PAGE)
        with pytest.raises(TierError, match="shorter than expected"):
            ms.to_fast(ha)
        b = random_bits((3 * PAGE + 5,), torch.uint8, seed=1)
        hb = ms.to_slow(1, b[5:])  # written after the cut: the file grows again
        assert_same(ms.to_fast(hb), b[5:])


def test_ctrl_c_during_a_sync_move_through_aio_leaves_nothing_in_use(tmp_path, monkeypatch):
    """A Ctrl-C while a sync move waits for its completion: the transfer ends first (its
    memory is in use until then), a finished write's extent is freed, and the tier goes
    on working."""
    from autotm.tiers import linux_aio

    with FileMemorySystem(str(tmp_path)) as ms:
        t = random_bits((64 * PAGE,), torch.uint8)
        real_wait = linux_aio.AioContext.wait
        calls = []

        def interrupted_once(self, tokens, *args, **kw):
            calls.append(tokens)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return real_wait(self, tokens, *args, **kw)

        monkeypatch.setattr(linux_aio.AioContext, "wait", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            ms.to_slow(0, t)
        assert len(calls) == 2 and ms._aio.in_flight() == 0
        assert ms.slow_bytes_in_use() == 0
        monkeypatch.undo()
        h = ms.to_slow(1, t)
        assert_same(ms.to_fast(h), t)


def test_aio_context_reads_what_it_wrote(tmp_path):
    from autotm.tiers import linux_aio

    ctx = linux_aio.open_context(depth=4)
    assert ctx is not None  # Linux with AIO: the machines this project runs on
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        src = mmap.mmap(-1, 16 * PAGE)
        src.write(os.urandom(16 * PAGE))
        dst = mmap.mmap(-1, 16 * PAGE)
        a_src = ctypes.addressof(ctypes.c_char.from_buffer(src))
        a_dst = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        # 16 one-page writes through a 4-deep ring: submit waits for room
        toks = ctx.submit([(linux_aio.IOCB_CMD_PWRITE, fd, a_src + i * PAGE, PAGE, i * PAGE)
                           for i in range(16)])
        assert [r for r, _ in ctx.wait(toks)] == [PAGE] * 16
        toks = ctx.submit([(linux_aio.IOCB_CMD_PREAD, fd, a_dst, 16 * PAGE, 0)])
        assert ctx.wait(toks)[0][0] == 16 * PAGE and src[:] == dst[:]
        # an error is a result, not an exception: -EINVAL for an unaligned direct read
        toks = ctx.submit([(linux_aio.IOCB_CMD_PREAD, fd, a_dst + 1, PAGE, 0)])
        assert ctx.wait(toks)[0][0] < 0
        assert ctx.in_flight() == 0
    finally:
        assert ctx.close()
        os.close(fd)


def test_fast_read_buffers_are_recycled(tmp_path):
    with FileMemorySystem(str(tmp_path)) as ms:
        t = random_bits((MiB,), torch.uint8)
        h = ms.to_slow(0, t)
        x = ms.to_fast(h)
        ptr = x.untyped_storage().data_ptr()
        assert ms.cached_fast_bytes() == 0
        del x
        assert ms.cached_fast_bytes() > MiB
        y = ms.start_to_fast(h).wait()  # the asynchronous read takes the same buffer
        assert y.untyped_storage().data_ptr() == ptr and ms.cached_fast_bytes() == 0
        assert_same(y, t)
        y.add_(1)  # fast tensors are ordinary writable tensors
        assert_same(ms.to_fast(h), t)
        ms.release_cached()


def test_small_reads_share_pooled_buffers_that_release_cached_keeps(tmp_path):
    """Small reads are copied out of one-size buffers from a bounded pool, which is the
    tier's own working memory: not counted as cached fast bytes, kept by release_cached
    (the executor calls it before every kernel that moves when the budget leaves no
    headroom), given back by close."""
    from autotm.tiers.file_tier import SMALL_BUFFER_BYTES, SMALL_POOL_BYTES, SMALL_READ_BYTES

    with FileMemorySystem(str(tmp_path)) as ms:
        cache = ms._cache
        ts = [random_bits((n,), torch.uint8) for n in (100, 5000, 64 << 10, SMALL_READ_BYTES - 1)]
        hs = [ms.to_slow(i, t) for i, t in enumerate(ts)]
        for _ in range(2):
            for h, t in zip(hs, ts):
                for read in (lambda h=h: ms.to_fast(h), lambda h=h: ms.start_to_fast(h).wait()):
                    assert_same(read(), t)
                    ms.release_cached()
                    # one pooled buffer serves every small read, sync or asynchronous
                    assert len(cache._small) == 1 and ms.cached_fast_bytes() == 0
        assert len(cache._small[0]) == SMALL_BUFFER_BYTES
        # reads in flight at once take a buffer each; the idle ones kept are bounded
        pend = [ms.start_to_fast(hs[i % len(hs)]) for i in range(2 * SMALL_POOL_BYTES // SMALL_BUFFER_BYTES)]
        for i, p in enumerate(pend):
            assert_same(p.wait(), ts[i % len(ts)])
        assert len(cache._small) * SMALL_BUFFER_BYTES == SMALL_POOL_BYTES
        # a storage of SMALL_READ_BYTES is read into a buffer of its own, not the pool's
        big = random_bits((SMALL_READ_BYTES,), torch.uint8)
        x = ms.to_fast(ms.to_slow(9, big))
        assert_same(x, big)
        del x
        assert ms.cached_fast_bytes() > SMALL_READ_BYTES and len(cache._small) * SMALL_BUFFER_BYTES == SMALL_POOL_BYTES
    assert cache._small == [] and cache.cached_bytes == 0

@pytest.mark.parametrize("offset", [0, 64, 4000])
def test_read_back_tensors_keep_their_page_offset(tmp_path, offset):
    """A read-back storage holds exactly the original bytes, at the original page offset
    (so direct I/O reads it without a copy), and is an ordinary writable tensor."""
    with FileMemorySystem(str(tmp_path)) as ms:
        base = random_bits((offset + MiB,), torch.uint8)
        t = base[offset:]
        h = ms.to_slow(0, t)
        for x in (ms.to_fast(h), ms.start_to_fast(h).wait()):
            st = x.untyped_storage()
            assert st.nbytes() == base.untyped_storage().nbytes()
            assert st.data_ptr() % PAGE == base.untyped_storage().data_ptr() % PAGE
            assert_same(x, t)
            x.add_(1)  # fast tensors are ordinary writable tensors
            del x, st
        assert_same(ms.to_fast(h), t)
        ms.free_slow(h)


def test_capacity_exceeded(tmp_path):
    with make_memory_system("cpu+file", slow_dir=str(tmp_path),
                            slow_capacity_bytes=4 * MiB) as ms:
        h = ms.to_slow(0, torch.zeros(3 * MiB, dtype=torch.uint8))
        with pytest.raises(TierError, match=r"capacity exceeded: \d+ bytes in use"):
            ms.to_slow(1, torch.zeros(2 * MiB, dtype=torch.uint8))
        ms.free_slow(h)
        ms.free_slow(ms.to_slow(1, torch.zeros(2 * MiB, dtype=torch.uint8)))
    with make_memory_system("cpu+mmap", slow_dir=str(tmp_path),
                            slow_capacity_bytes=MiB) as ms:
        with pytest.raises(TierError, match="capacity exceeded"):
            ms.to_slow(0, torch.zeros(2 * MiB, dtype=torch.uint8))
        with pytest.raises(TierError, match="capacity exceeded"):
            ms.alloc_slow(torch.empty(2 * MiB, dtype=torch.uint8, device="meta"))
        assert ms.slow_bytes_in_use() == 0


@pytest.mark.parametrize("name", DIRECT_SYSTEMS)
def test_missing_and_unwritable_slow_dir(name, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(TierError, match="does not exist"):
        make_memory_system(name, slow_dir=str(missing))
    # Tests run as root, who may write into a chmod 0o500 directory; /proc/self is a
    # directory that nobody can create files in.
    with pytest.raises(TierError, match="not writable"):
        make_memory_system(name, slow_dir="/proc/self")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TierError, match="not a directory"):
        make_memory_system(name, slow_dir=str(tmp_path / "file"))
    assert issubclass(TierError, AutotmError)


def test_default_slow_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTM_SLOW_DIR", str(tmp_path))
    with make_memory_system("cpu+file") as ms:
        assert os.path.dirname(ms.directory) == str(tmp_path)
    monkeypatch.setenv("AUTOTM_SLOW_DIR", str(tmp_path / "missing"))
    with pytest.raises(TierError, match="AUTOTM_SLOW_DIR"):
        make_memory_system("cpu+file")


# --------------------------------------------- real mounts, in a private mount namespace


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(),
                                 reason="needs root and unshare -m to mount a private tmpfs")


def run_in_mount(tmp_path, mount_opts: str, code: str) -> str:
    """Run Python `code` (with `D` the mount point) with a tmpfs mounted at D only for it."""
    d = tmp_path / "mnt"
    d.mkdir()
    script = f"D = {str(d)!r}\n" + textwrap.dedent(code)
    cmd = (f"mount -t tmpfs -o {mount_opts} tmpfs {d} && "
           f"exec {sys.executable} -c \"$0\"")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd, script],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@needs_mount
def test_read_only_mount(tmp_path):
    out = run_in_mount(tmp_path, "ro,size=1m", """
        from autotm.tiers import make_memory_system, TierError
        for name in ("cpu+file", "cpu+mmap"):
            try:
                make_memory_system(name, slow_dir=D)
            except TierError as e:
                print(e)
    """)
    lines = out.splitlines()
    assert len(lines) == 2
    assert all("is not writable (creating a directory in it failed: Read-only file system)"
               in line for line in lines)


@needs_mount
def test_disk_full(tmp_path):
    out = run_in_mount(tmp_path, "size=2m", """
        import warnings, torch
        warnings.simplefilter("ignore")  # an old tmpfs refuses O_DIRECT: buffered fallback
        from autotm.tiers import make_memory_system, TierError
        for name in ("cpu+file", "cpu+mmap"):
            with make_memory_system(name, slow_dir=D) as ms:
                h = ms.to_slow(0, torch.ones(MiB := 1 << 20, dtype=torch.uint8))
                try:
                    ms.to_slow(1, torch.ones(2 * MiB, dtype=torch.uint8))
                except TierError as e:
                    print(e)
                assert torch.equal(ms.to_fast(h), torch.ones(MiB, dtype=torch.uint8))
                ms.free_slow(h)
    """)
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert all("is full (no space left on device)" in line for line in lines)


# ------------------------------------------------------------------------- Ctrl-C


CTRL_C_CHILD = """
import sys, time, torch
from autotm.tiers import make_memory_system
t = torch.ones(64 << 20, dtype=torch.uint8)
def loop(ms):
    print(ms.directory, flush=True)
    while True:
        h = ms.to_slow(0, t)
        h2 = ms.start_to_slow(1, t).wait()
        ms.free_slow(h)
        ms.free_slow(h2)
if sys.argv[1] == "with":
    with make_memory_system("cpu+file", slow_dir=sys.argv[2]) as ms:
        loop(ms)
else:
    loop(make_memory_system("cpu+file", slow_dir=sys.argv[2]))  # atexit cleans up
"""


@pytest.mark.parametrize("style", ["with", "bare"])
def test_ctrl_c_during_big_writes_leaves_nothing(tmp_path, style):
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, style, str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_default)
    try:
        slow_dir = child.stdout.readline().strip()
        assert slow_dir.startswith(str(tmp_path)), child.stderr.read()
        time.sleep(0.5)  # several 64 MiB writes, sync and async
        assert os.path.isdir(slow_dir)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    finally:
        stop(child)
    assert "KeyboardInterrupt" in err
    assert not os.path.exists(slow_dir)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------- direct access


def test_mmap_slow_view_is_in_place(tmp_path):
    with MmapMemorySystem(str(tmp_path)) as ms:
        assert ms.access == "direct"
        t = random_bits((40, 30), torch.float64).t()
        h = ms.to_slow(0, t)
        v = ms.slow_view(h)
        assert_same(v, t)
        v.fill_(1.0).add_(1.5)  # kernels writing slow memory in place
        assert torch.equal(ms.to_fast(h), torch.full_like(t, 2.5))
        assert_same(ms.slow_view(h), ms.to_fast(h))
        ms.free_slow(h)
        assert v.sum().item() == 2.5 * 1200  # views outlive the handle


def test_mmap_alloc_slow_for_kernel_output(tmp_path):
    with MmapMemorySystem(str(tmp_path)) as ms:
        a, b = torch.randn(64, 32), torch.randn(32, 48)
        like = torch.empty(64, 48, device="meta")
        h, out = ms.alloc_slow(like, key=5)
        assert h.key == 5 and out.shape == (64, 48) and out.stride() == (48, 1)
        torch.mm(a, b, out=out)
        assert torch.equal(ms.to_fast(h), torch.mm(a, b))
        h2, out2 = ms.alloc_slow(TensorLayout.of(torch.empty(4, 4).t()))
        assert out2.stride() == (1, 4) and torch.equal(out2, torch.zeros(4, 4))
        ms.free_slow(h)
        ms.free_slow(h2)


def test_staged_file_tier_has_no_direct_access(tmp_path):
    with FileMemorySystem(str(tmp_path)) as ms:
        assert ms.access == "staged" and ms.fast_device == torch.device("cpu")
        h = ms.to_slow(0, torch.ones(3))
        assert ms.slow_view(h) is None
        with pytest.raises(NotImplementedError, match="staged"):
            ms.alloc_slow(torch.empty(3))


def test_capabilities_are_declared_and_say_which_methods_a_system_has(tmp_path):
    """Capabilities: what a system offers beyond the interface. cpu+file reads into a
    caller's destination (read_span) and keeps a read cache; cpu+mmap declares nothing, and
    the methods behind the capabilities it lacks are absent or the no-op defaults."""
    from autotm.tiers import Capabilities

    with FileMemorySystem(str(tmp_path)) as ms:
        c = ms.capabilities
        assert c == Capabilities(read_into=True, read_cache=True, async_engine=ms.async_engine)
        assert ms.async_engine in ("aio", "thread") and hasattr(ms, "read_span")
        assert not c.device_timed_moves and getattr(ms, "move_seconds", None) is None
    with make_memory_system("cpu+mmap", slow_dir=str(tmp_path)) as ms:
        assert ms.capabilities == Capabilities()
        assert ms.async_engine is None and ms.cached_fast_bytes() == 0
        ms.release_cached()
        assert not hasattr(ms, "read_span") and getattr(ms, "move_seconds", None) is None
    # the flags behind read_span and move_seconds say exactly which systems define them (the
    # profiler reads the flags): read_span only cpu+file, move_seconds only cuda+host
    from autotm.tiers.cuda_tier import CudaHostMemorySystem

    systems = (FileMemorySystem, MmapMemorySystem, NumaMemorySystem, CudaHostMemorySystem)
    assert [c for c in systems if hasattr(c, "read_span")] == [FileMemorySystem]
    assert [c for c in systems if hasattr(c, "move_seconds")] == [CudaHostMemorySystem]
    assert [c for c in systems if c.idle_sync_moves] == [FileMemorySystem]


# --------------------------------------------------------------- numa and factory


def test_numa_refused_on_one_node_machine():
    nodes = memory_nodes()
    if len(nodes) >= 2:
        pytest.skip(f"this machine has memory nodes {nodes}")
    with pytest.raises(TierError) as e:
        make_memory_system("cpu+numa")
    listed = ", ".join(map(str, nodes))
    assert str(e.value) == (f"cpu+numa needs two or more NUMA memory nodes; this machine has "
                            f"node(s): {listed}")


def test_numa_node_topology_parsing(tmp_path):
    assert parse_node_list("0") == [0]
    assert parse_node_list("0-2,4\n") == [0, 1, 2, 4]
    (tmp_path / "has_memory").write_text("0\n")
    with pytest.raises(TierError, match=r"this machine has node\(s\): 0$"):
        NumaMemorySystem(sysfs=str(tmp_path))
    (tmp_path / "has_memory").write_text("0-1\n")
    (tmp_path / "has_cpu").write_text("0\n")
    assert memory_nodes(str(tmp_path)) == [0, 1]
    with pytest.raises(TierError, match="slow_node=3 is not a memory node"):
        NumaMemorySystem(slow_node=3, sysfs=str(tmp_path))


def test_factory_names():
    with pytest.raises(ValueError, match=r"cpu\+file, cpu\+mmap, cpu\+numa, cuda\+host"):
        make_memory_system("cpu+floppy")
    if not torch.cuda.is_available():
        with pytest.raises(TierError, match=r"cuda\+host needs a CUDA GPU; torch.cuda.is_available\(\) "
                                            r"is False"):
            make_memory_system("cuda+host")
    with pytest.raises(ValueError, match="fast_capacity_bytes is for cuda\\+host only"):
        make_memory_system("cpu+file", fast_capacity_bytes=1 << 20)
    with make_memory_system("cpu+file") as ms:
        assert isinstance(ms, MemorySystem) and ms.name == "cpu+file"


def mempolicy_of(address: int) -> tuple[int, int]:
    """(mode, node mask) of the page at `address`: get_mempolicy(MPOL_F_ADDR)."""
    import platform
    nr = {"x86_64": 239, "aarch64": 236}.get(platform.machine())
    if nr is None:
        pytest.skip("get_mempolicy system call number unknown here")
    libc = ctypes.CDLL(None, use_errno=True)
    mode, mask = ctypes.c_int(-1), (ctypes.c_ulong * 16)()
    rc = libc.syscall(ctypes.c_long(nr), ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64 + 1),
                      ctypes.c_void_p(address), ctypes.c_ulong(2))  # MPOL_F_ADDR
    assert rc == 0, os.strerror(ctypes.get_errno())
    return mode.value, mask[0]


@pytest.mark.parametrize("use_libnuma", [True, False])
def test_numa_binding_path_on_node_0(tmp_path, use_libnuma):
    """On a one-node machine, pretend there are two and bind slow memory to node 0: the
    allocation, mbind (libnuma or system call), moves and views all run for real."""
    from autotm.tiers.mmap_tier import region_address
    (tmp_path / "has_memory").write_text("0-1\n")
    (tmp_path / "has_cpu").write_text("1\n")
    with NumaMemorySystem(slow_node=0, sysfs=str(tmp_path), use_libnuma=use_libnuma) as ms:
        assert ms.access == "direct" and ms.slow_node == 0
        t = random_bits((300, 7), torch.float32).t()
        h = ms.start_to_slow(0, t).wait()
        assert mempolicy_of(region_address(h.location.mapping)) == (2, 0b1)  # MPOL_BIND {0}
        assert_same(ms.to_fast(h), t)
        assert_same(ms.slow_view(h), t)
        h2, out = ms.alloc_slow(torch.empty(5, 5, device="meta"))
        out.fill_(3)
        assert torch.equal(ms.start_to_fast(h2).wait(), torch.full((5, 5), 3.0))
        ms.free_slow(h)
        ms.free_slow(h2)
        assert ms.slow_bytes_in_use() == 0
        with pytest.raises(TierError, match="mbind to node 1 failed"):
            ms._binder.bind(region_address(h.location.mapping), 4096, 1)


def test_slow_dir_removed_underneath(tmp_path):
    t = random_bits((100000,), torch.float32)
    with FileMemorySystem(str(tmp_path)) as ms:  # the arena is already unlinked: unaffected
        h = ms.to_slow(0, t)
        shutil.rmtree(ms.directory)
        assert_same(ms.to_fast(h), t)
        assert_same(ms.to_fast(ms.to_slow(1, t)), t)
    with MmapMemorySystem(str(tmp_path)) as ms:  # one file per tensor: new ones fail clearly
        h = ms.to_slow(0, t)
        shutil.rmtree(ms.directory)
        assert_same(ms.to_fast(h), t)
        with pytest.raises(TierError, match="cannot create a file in slow directory .*No such "
                                            "file or directory"):
            ms.to_slow(1, t)
