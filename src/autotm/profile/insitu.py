"""The in-situ interpreter: ProfilingReplay runs iterations of the graph on real tensors
and times each kernel where it runs, with the operands, caches and allocator state the
executor will give it.

- warm-up: the first time a signature is met in this process, one untimed functional call
  (lazy initialization, e.g. oneDNN primitives, is not counted), and that occurrence gives
  no sample (the warm-up left its operands in the CPU caches, which the iteration would not);
- a sample is the time of the replay's own call of the kernel's op, its operands already
  built (with `OperandBuilder`, as the executor builds them; that work goes to the
  position before, below). Every occurrence of a signature gives one sample; the profile
  repeats the replay in three windows, one after each phase of the move rounds, so that a
  signature's samples come from iterations seconds to a minute apart, until each
  signature is final (`timing.insitu_done`). Occurrences at different places differ
  systematically (cache state), so they are averaged, and repeats (iterations) are
  reduced by the median (`timing.insitu_estimate`);
- the interpreter's work after kernel k until the next kernel's call starts (freeing the
  tensors that die at k: returning large blocks to the OS is not free; building the next
  kernel's operands, views re-derived) depends on the position, not the signature: it
  is sampled per position in the same iterations (at least one full iteration per
  graph), cached per graph, and its median is added to ``kernel_seconds[k]``.

Repeated timings (direct access, `timing.time_call`): a placement's time is the in-situ
all-fast time times (repeated placement time / repeated all-fast time), both repeated
times the call alone (its operands built once before the repeats, as the in-situ samples
leave the building out). Slow input operands are copied to the slow tier and read
through `slow_view`; slow outputs are written there after the call (as the executor
does). The calls are functional (`node.target(*args)`), never the replay's in-place reuse
path, so repeating a kernel changes nothing; the RNG state is restored around warm-up and
repeated calls so random kernels (dropout) produce the values the replay would.

Workspace: the call right after a kernel's warm-up (not timed) runs with every CPU
allocation counted (`cpu_arena.kernel_footprint`, the arena extension; without it, no
workspace is known): the peak of the bytes alive at once minus the bytes still alive
after it (its outputs) is what the kernel needs beyond its tensors, cached per signature.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..interpret.replay import Replay
from ..ir.costmodel import operand_tensors
from ..ir.graph import TrainingGraph
from ..tiers import cpu_arena
from .timing import time_call


def _cuda_mark():
    """A CUDA event recorded now on the current stream, with timing."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _settle(lists) -> None:
    """Replace (start, end) CUDA event pairs in `lists` by their seconds."""
    for xs in lists:
        for i, x in enumerate(xs):
            if isinstance(x, tuple):
                xs[i] = x[0].elapsed_time(x[1]) / 1e3


class ProfilingReplay(Replay):
    """Runs iterations of the graph and times kernels where they run.

    - In situ (every access model): each kernel whose signature still needs samples is
      timed where it runs (the replay's own call of its op, its operands built before the
      clock starts); the first call of a signature in this process is preceded by an
      untimed warm-up call and gives no sample. `samples[signature]` collects them; the
      time from the end of kernel k to the start of the next one's call (its operands
      built) goes to `position_samples[k]`.
    - Repeated (direct access): `batch_jobs[k]` lists placements timed with `time_call`
      on the real operands the first time kernel k is met (slow operands moved there for
      the timing); `record(k, key, seconds, n)` stores each result.
    - On a GPU (the memory system's fast device), a launch returns before the kernel runs:
      a sample is the time between CUDA events recorded on the stream around the call
      (the gap after kernel k likewise), read once the iteration is done.
    """

    def __init__(self, graph: TrainingGraph, memory, batch_jobs: dict[int, list[tuple]], record: Callable,
                 need: set[str], samples: dict[str, list[list[float]]],
                 record_workspace: Callable[[str, int], None] | None = None):
        super().__init__(graph, device=memory.fast_device)
        self.record_workspace = record_workspace
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.memory = memory
        self.batch_jobs = batch_jobs  # kernel index -> [(placement or None, cache placement key)]
        self.record = record
        self.need = need  # signatures that still need in-situ samples
        self.samples = samples
        self.warm: set[str] = set()
        self._open: tuple[int, float] | None = None
        self._closed: int | None = None  # the position whose sample before_kernel just took
        self.last_needed = len(graph.kernels) - 1
        self.position_samples: list[list[float]] = [[] for _ in graph.kernels]
        self.iteration = -1
        self._group: dict[str, int] = {}
        self.full = False  # run the whole iteration (position samples are missing)

    def run_kernel(self, k: int) -> None:
        jobs = self.batch_jobs.pop(k, None)
        if jobs:
            self._time_kernel(k, jobs)
        sig = self.graph.kernels[k].signature
        if sig not in self.need:
            super().run_kernel(k)
            return
        if sig not in self.warm:
            self.warm.add(sig)
            rng = torch.get_rng_state()
            cuda_rng = torch.cuda.get_rng_state(self.device) if self.cuda else None
            args, kwargs = self.operands(k)
            self.program.kernel_nodes[k].target(*args, **kwargs)  # functional: no input reused
            del args, kwargs
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self.device)
            # no sample right after the warm-up: it left the operands in the CPU caches;
            # that call's allocations give the kernel's workspace (CPU: the arena
            # allocator counts them; peak bytes alive at once minus what stays, its outputs)
            fp = None
            if self.record_workspace is not None and not self.cuda:
                fp = cpu_arena.kernel_footprint(lambda: super(ProfilingReplay, self).run_kernel(k))
            if fp is None:
                super().run_kernel(k)
            else:
                self.record_workspace(sig, max(0, fp[0] - fp[1]))
            return
        if self.cuda:  # events around the launch; settled into seconds after the iteration
            t0 = _cuda_mark()
            super().run_kernel(k)
            dt = (t0, _cuda_mark())
        else:
            # the call alone (its operands' building goes to the position before: operands())
            args, kwargs = self.operands(k)
            t0 = time.perf_counter()
            out = self.call_kernel(k, args, kwargs)
            dt = time.perf_counter() - t0
            del args, kwargs
            self.store_outputs(k, out)
        groups = self.samples.setdefault(sig, [])
        if self._group.get(sig) != self.iteration:  # one group of samples per iteration
            self._group[sig] = self.iteration
            groups.append([])
        groups[-1].append(dt)

    def after_kernel(self, k: int) -> None:
        # from here to the start of the next kernel's call: the interpreter's work after
        # kernel k (freeing the tensors that die there, building the next kernel's
        # operands), a cost of the position, not the signature
        self._open = (k, _cuda_mark() if self.cuda else time.perf_counter())

    def _close(self) -> None:
        if self._open is not None:
            k, t0 = self._open
            self.position_samples[k].append((t0, _cuda_mark()) if self.cuda else time.perf_counter() - t0)
            self._open = None
            self._closed = k

    def operands(self, k: int):
        # building kernel k's operands (re-deriving its views) is work of the position
        # before it, between kernel calls; the executor does the same work the same way
        # (OperandBuilder); left out of every sample, it would be missing from the
        # prediction (benchmarks/HISTORY.md, "Notes moved from the code")
        closed, self._closed = self._closed, None
        if closed != k - 1 or self.cuda:  # (None: no position sample just taken)
            return super().operands(k)
        t0 = time.perf_counter()
        out = super().operands(k)
        self.position_samples[closed][-1] += time.perf_counter() - t0
        return out

    def stop(self, k: int) -> bool:
        return k > self.last_needed  # nothing from here on needs timing: end the iteration

    def stopped(self, k: int) -> dict[int, torch.Tensor]:
        self._close()  # the position before k ends here, as before_kernel(k) would end it
        return super().stopped(k)

    def before_kernel(self, k: int) -> None:
        self._close()

    def run(self, inputs, keep=()):
        """One iteration, up to the last kernel that still needs timing."""
        self.iteration += 1
        ks = self.graph.kernels
        self.last_needed = len(ks) - 1 if self.full else max(
            [k for k in range(len(ks)) if ks[k].signature in self.need] + list(self.batch_jobs) + [-1])
        self._open = None
        try:
            return super().run(inputs, keep)
        finally:
            self._close()
            if self.cuda:
                torch.cuda.synchronize(self.device)
                _settle([g for groups in self.samples.values() for g in groups])
                _settle(self.position_samples)

    def _time_kernel(self, k: int, jobs: list[tuple]) -> None:
        kern = self.graph.kernels[k]
        operands = operand_tensors(kern.inputs, kern.outputs)
        outputs = set(kern.outputs)
        target = self.program.kernel_nodes[k].target
        outs = self.program.kernel_outputs[k]
        mem = self.memory
        env = self.env
        rng = torch.get_rng_state()
        try:
            for placement, key in jobs:
                slow_handles = []
                fast_values = {}  # the storages a slow placement swaps out of env, put back after
                try:
                    slow_out = []
                    if placement is not None:
                        for tid, where in zip(operands, placement):
                            if where != "slow":
                                continue
                            if tid in outputs:
                                slow_out.append(tid)
                            else:
                                h = mem.to_slow(tid, self.storage_value(tid))
                                slow_handles.append(h)
                                view = mem.slow_view(h)
                                if view is None:
                                    raise ValueError(f"{mem.name} has no direct access to slow memory")
                                fast_values[tid] = env[tid]
                                env[tid] = view
                    # the call alone, as the in-situ samples time it: the operands are built
                    # once (as the interpreter builds them, views over the slow copies; not
                    # self.operands, which times the building into the position before k)
                    args, kwargs = Replay.operands(self, k)

                    def fn(args=args, kwargs=kwargs, slow_out=slow_out):
                        out = target(*args, **kwargs)
                        if slow_out:  # the executor writes slow outputs after the kernel
                            for tid, i in outs:
                                if tid in slow_out:
                                    mem.free_slow(mem.to_slow(tid, out if i is None else out[i]))
                        return out
                    seconds, samples = time_call(fn)
                    del fn, args, kwargs
                finally:
                    env.update(fast_values)
                    for h in slow_handles:
                        mem.free_slow(h)
                self.record(k, key, seconds, samples)
        finally:
            torch.set_rng_state(rng)



def synthetic_inputs(graph: TrainingGraph, seed: int = 0) -> dict[int, torch.Tensor]:
    """Stand-in values for every graph input (timing does not depend on them): small
    positive floats, zero integers (valid class indices), False booleans."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for _key, tid in graph.program.input_keys:
        t = graph.tensors[tid]
        dtype = getattr(torch, t.dtype)
        item = torch.empty((), dtype=dtype).element_size()
        flat = torch.zeros(max(t.nbytes // item, 1), dtype=dtype)
        if dtype.is_floating_point:
            flat.uniform_(0.01, 0.1, generator=gen)
        out[tid] = flat.as_strided(t.shape, t.stride)
    return out

