"""Bandwidth of the cpu+file tier against plain direct I/O on the same directory.

For each size, in one run, interleaved, many repeats (median reported):

* plain write / read: one O_DIRECT ``pwrite`` / ``preadv`` of a page-aligned, already
  touched buffer to/from a file in the same directory: the physical limit here (the
  calling thread sleeps in the kernel until the device is done; the tier's moves, sync
  ones too, go through Linux AIO and poll for the completion for up to 1 ms first,
  which can make a small move a little faster than the bare call);
* tier sync write / read: ``to_slow(t)`` / ``to_fast(h)``;
* tier async write / read: ``start_to_slow(t).wait()`` / ``start_to_fast(h).wait()``
  with no kernel to overlap, so the cost of starting and collecting a move is fully
  exposed. The tier's async engine is Linux AIO where available (io_submit on this
  thread, io_getevents in wait); the same through the fallback I/O thread
  (``async_io="thread"``) is the last column, and its bare hand-off is printed on its own.

Fairness (all measured on this machine's shared virtual disk):

* The variant order is shuffled every round, so drift hits all variants alike.
* Two placements of the tensor, each a row of its own:
  - ``arena``: what the executor moves when the plan has an arena layout (every planned
    cpu+file run): large blocks start on a page (planner.large_block_alignment), so the
    tensor is the plain write buffer itself, and a read lands in a page-aligned
    destination (``to_fast(h, into=slot)``), as a prefetch lands in its arena slot;
  - ``heap``: a tensor of PyTorch's CPU allocator (a run without a layout): 64-byte
    aligned, not 4096, so the tensor is a view 64 bytes into the plain write buffer and
    the tier writes one page more; reads land in memory from PyTorch's allocator
    (glibc keeps freed blocks, as in a run: keep_freed_memory).
* Writes: plain I/O and the tier write the same physical pages. Write speed from two
  different buffers of one size differed by up to 45 %, either way between runs: a
  property of the buffer's memory, not of the code.
* Reads: plain I/O reads into two touched buffers of its own, alternating by round, and
  the faster median counts (one buffer of a pair read 1.5x slower than the other in
  several runs, whichever was made first). The ``arena`` reads land in the same two
  buffers, by the same rounds (the same physical pages again); the ``heap`` reads in
  the tier's own buffers, so their ratio is, if anything, low.
* Steady state: one untimed warm-up round per size (the tier's arena extent and its
  recycled read buffer exist afterwards, as from a training run's second iteration).
  Each round frees its handle; the next write reuses the extent, as plain I/O
  overwrites its file.

    python benchmarks/file_tier_bandwidth.py [--dir DIR] [--sizes-mib 1 16 64 256]
                                             [--repeats 15]
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import time

import torch

from autotm.tiers.host_heap import keep_freed_memory
from autotm.tiers.base import PAGE, IOWorker
from autotm.tiers.file_tier import FileMemorySystem

HUGE_PAGE_MIN = 4 << 20


def plain_file(directory: str) -> int:
    path = os.path.join(directory, "plain")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    os.unlink(path)
    return fd


def page_buffer(nbytes: int, fill: bytes | None = None) -> mmap.mmap:
    """A touched, page-aligned buffer, advised to huge pages like the tier's."""
    buf = mmap.mmap(-1, nbytes)
    if nbytes >= HUGE_PAGE_MIN:
        buf.madvise(mmap.MADV_HUGEPAGE)
    buf.write(fill if fill is not None else bytes(nbytes))
    return buf


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(ms: FileMemorySystem, fd: int, mib: int, repeats: int,
            rng: random.Random, ms_thread: FileMemorySystem) -> dict[str, float]:
    """Median GB/s of each variant for one size."""
    n = mib << 20
    src = page_buffer(n + PAGE, os.urandom(1 << 20) * mib + bytes(PAGE))
    heap_t = torch.frombuffer(src, dtype=torch.uint8, offset=64, count=n)
    arena_t = torch.frombuffer(src, dtype=torch.uint8, count=n)
    plain_src = memoryview(src)[:n]
    plain_dst = [memoryview(page_buffer(n)), memoryview(page_buffer(n))]
    slots = [torch.frombuffer(d, dtype=torch.uint8, count=n) for d in plain_dst]
    times: dict[str, list[float]] = {
        k + d: [] for k in ("p", "s", "a", "S", "A", "t") for d in ("w", "r")}

    def plain(res: dict, i: int) -> None:
        res["pw"] = timed(lambda: os.pwrite(fd, plain_src, 0))
        res["pr"] = timed(lambda: os.preadv(fd, [plain_dst[i]], 0))

    def tier(res: dict, tag: str, sync: bool, arena: bool, i: int = 0,
             m: FileMemorySystem = ms) -> None:
        box = {}
        t, into = (arena_t, slots[i]) if arena else (heap_t, None)
        if sync:
            res[tag + "w"] = timed(lambda: box.update(h=m.to_slow(0, t)))
            res[tag + "r"] = timed(lambda: box.update(x=m.to_fast(box["h"], into=into)))
        else:
            res[tag + "w"] = timed(lambda: box.update(h=m.start_to_slow(0, t).wait()))
            res[tag + "r"] = timed(lambda: box.update(x=m.start_to_fast(box["h"], into=into).wait()))
        ok = torch.equal(box.pop("x"), t)
        m.free_slow(box["h"])
        assert ok, "a round trip through the tier changed the bytes"

    for r in range(repeats + 1):  # round 0: warm-up
        res: dict[str, float] = {}
        i = r % 2
        # tags: S / A sync / async in the arena, s / a on the heap, t the I/O thread
        variants = [lambda res=res, i=i: plain(res, i),
                    lambda res=res, i=i: tier(res, "S", True, True, i),
                    lambda res=res, i=i: tier(res, "A", False, True, i),
                    lambda res=res: tier(res, "s", True, False), lambda res=res: tier(res, "a", False, False),
                    lambda res=res: tier(res, "t", False, False, 0, ms_thread)]
        rng.shuffle(variants)
        for v in variants:
            v()
        if r:
            for k, v in res.items():
                times[k].append(v)
    assert bytes(plain_dst[0][:4096]) == bytes(plain_src[:4096])
    return {k: n / statistics.median(v) / 1e9 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="slow directory (default: as the tier's)")
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=15,
                    help="rounds for the largest sizes; small sizes get more (up to 200)")
    args = ap.parse_args()
    rng = random.Random(0)
    keep_freed_memory()  # as the executor and the profiler run

    with FileMemorySystem(args.dir) as ms, FileMemorySystem(args.dir, async_io="thread") as ms_thread:
        if not ms.direct_io:
            raise SystemExit(f"O_DIRECT is refused in {ms.directory}: nothing to compare")
        fd = plain_file(ms.directory)
        rows = []
        t_start = time.perf_counter()
        for mib in args.sizes_mib:
            repeats = max(args.repeats, min(200, args.repeats * 64 // mib))
            gbs = measure(ms, fd, mib, repeats, rng, ms_thread)
            for d, name in (("w", "write"), ("r", "read")):
                rows.append((mib, repeats, "arena", name, gbs["p" + d], gbs["S" + d], gbs["A" + d], None))
                rows.append((mib, repeats, "heap", name, gbs["p" + d], gbs["s" + d], gbs["a" + d], gbs["t" + d]))
        os.close(fd)
        elapsed = time.perf_counter() - t_start

        worker = IOWorker("handoff-probe")
        hand = sorted(timed(lambda: worker.submit(lambda: None).wait()) for _ in range(1000))
        worker.close()

    print(f"slow directory: {os.path.dirname(ms.directory)} (O_DIRECT, async engine "
          f"{ms.async_engine})   "
          f"medians over the rounds shown   {elapsed:.0f} s")
    print("arena: a page-aligned tensor, read into a slot of its own (a planned run's arena); "
          "heap: a tensor 64 bytes into a page, read into the tier's buffer (a run without a layout)")
    print(f"{'size':>8} {'rounds':>6} {'tensor':>6} {'dir':>6} {'plain GB/s':>11} {'sync GB/s':>10} "
          f"{'ratio':>6} {'async GB/s':>11} {'ratio':>6} {'async-thread':>13} {'ratio':>6}")
    for mib, repeats, where, d, plain, sync, asyn, thr in rows:
        thread = f"{thr:>13.2f} {thr / plain:>6.2f}" if thr is not None else f"{'':>13} {'':>6}"
        print(f"{mib:>5}MiB {repeats:>6} {where:>6} {d:>6} {plain:>11.2f} {sync:>10.2f} "
              f"{sync / plain:>6.2f} {asyn:>11.2f} {asyn / plain:>6.2f} {thread}")
    print(f"fallback engine (I/O thread): hand-off of an empty job, to the worker and back: median "
          f"{hand[len(hand) // 2] * 1e6:.0f} us, 90th percentile "
          f"{hand[len(hand) * 9 // 10] * 1e6:.0f} us")


if __name__ == "__main__":
    main()
