"""validate(): an independent checker for plans, by replaying the timeline with byte counters.

The replay (`PlanReplay`) follows the timeline defined in `autotm.plan` step by step:
sync actions (evicts and drops, then prefetches), async starts, the kernel, async
completions, frees. It keeps each tensor's state in both tiers, raises PlanError at the
first rule a plan breaks, and yields one `KernelStep` per kernel, so the simulator can
reuse the same loop for timing. It knows nothing of any planner.

Cost: O(kernels + tensors + actions + operands); the per-tensor checks are done once
before the replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ..ir.graph import TrainingGraph
from ..ir.plan import ACCESS, KINDS, MODES, TIERS, Action, Plan, PlanError, check_plan_matches, plan_graph
from ..ir.split import born_slow_piece, piece_reads

# Tensor states in each tier.
_NO, _YES, _IN_FLIGHT = 0, 1, 2  # fast: absent / resident / async prefetch in flight
#                                   slow: absent / valid / async write in flight


@dataclass(frozen=True)
class Move:
    """One action of one tensor, with its size."""

    tensor: int
    action: Action
    nbytes: int


@dataclass(frozen=True)
class KernelStep:
    """What happened around kernel `kernel`, in timeline order, after it was checked."""

    kernel: int
    sync_moves: tuple[Move, ...]  # before the kernel: evicts and drops, then prefetches (plan order within each)
    async_moves: tuple[Move, ...]  # overlapping the kernel
    slow_operands: tuple[int, ...]  # tensors the kernel reads or writes in slow memory (direct access)
    fast_after_sync: int  # fast bytes after step 1
    fast_bytes: int  # fast bytes while the kernel runs (step 3), the kernel's peak
    born_slow: tuple[int, ...] = ()  # outputs it writes to slow memory piece by piece (staged access)


@dataclass(frozen=True)
class FastBlock:
    """One interval of fast residency of one tensor: the bytes it holds from step `start`
    to step `end` (inclusive), on the half-step clock 2k = kernel k after its sync moves,
    2k + 1 = while kernel k runs. A tensor evicted and prefetched again has several."""

    tensor: int
    start: int
    end: int
    nbytes: int


@dataclass(frozen=True, eq=False)
class ValidationReport:
    peak_fast_bytes: int
    fast_bytes: np.ndarray  # per kernel, at step 3 (int64)
    bytes_to_slow: int  # bytes written by evicts, and by kernels writing an output there piece by piece
    bytes_to_fast: int  # bytes copied by prefetches
    moves: int  # number of copies: prefetches and evicts (drops copy nothing)
    fast_blocks: tuple[FastBlock, ...] = ()  # by tensor, then start; the sum at any step is the fast bytes
    steps: tuple[KernelStep, ...] = ()  # one per kernel, in order: the moves the executor makes


def validate(plan: Plan, graph: TrainingGraph, *, budget_bytes: int | None = None,
             reserved_bytes: Iterable[int] | None = None, in_place: bool = True) -> ValidationReport:
    """Check `plan` against `graph`; raise PlanError at the first broken rule.

    `budget_bytes` overrides the plan's budget; a budget of None means unlimited.
    `reserved_bytes` (per kernel, optional): fast memory kernel k needs beyond the graph's
    tensors while it runs (its workspace, CostModel.workspace): resident bytes plus that
    must fit the budget at k.
    `in_place`: count once the bytes of an output written over an input that dies at its
    kernel, both in fast memory (replay.in_place_inputs), as the executor holds them;
    False counts the two apart (the staged planner with pinned tensors).
    """
    graph = plan_graph(plan, graph)
    replay = PlanReplay(plan, graph, budget_bytes=budget_bytes, reserved_bytes=reserved_bytes, in_place=in_place)
    fast = np.zeros(len(graph.kernels), dtype=np.int64)
    steps = tuple(replay)
    for step in steps:
        fast[step.kernel] = step.fast_bytes
    blocks = tuple(sorted(replay.fast_blocks, key=lambda b: (b.tensor, b.start)))
    if plan.arena_bytes is not None or any(tp.offsets for tp in plan.tensors):
        check_offsets(plan, graph, blocks)
    return ValidationReport(peak_fast_bytes=int(fast.max()) if len(fast) else 0, fast_bytes=fast,
                            bytes_to_slow=replay.bytes_to_slow, bytes_to_fast=replay.bytes_to_fast,
                            moves=replay.moves, fast_blocks=blocks, steps=steps)


def check_offsets(plan: Plan, graph: TrainingGraph, blocks: tuple[FastBlock, ...]) -> None:
    """Check the plan's arena: one offset per fast block of each tensor (in time order),
    every block inside [0, arena_bytes), and no two blocks resident at the same step
    overlapping in address. Raise PlanError otherwise."""
    import bisect

    if plan.arena_bytes is None:
        raise PlanError("plan gives arena offsets but no arena_bytes")
    by_tensor: dict[int, list[FastBlock]] = {}
    for b in blocks:
        by_tensor.setdefault(b.tensor, []).append(b)
    placed = []  # (start, end, offset, nbytes, tensor)
    for tp in plan.tensors:
        bs = by_tensor.get(tp.id, [])
        if len(tp.offsets) != len(bs):
            raise PlanError(f"tensor {tp.id} ({graph.tensors[tp.id].name}) has {len(bs)} fast residencies "
                            f"but {len(tp.offsets)} arena offsets")
        for b, off in zip(bs, tp.offsets):
            if not (isinstance(off, int) and 0 <= off and off + b.nbytes <= plan.arena_bytes):
                raise PlanError(f"tensor {tp.id} ({graph.tensors[tp.id].name}): block [{off}, {off} + {b.nbytes}) "
                                f"is outside the arena of {plan.arena_bytes} bytes")
            placed.append((b.start, b.end, off, b.nbytes, tp.id))
    # sweep the clock: at each step, the resident blocks sorted by offset must not overlap
    events = sorted([(s, 1, i) for i, (s, _, _, _, _) in enumerate(placed)]
                    + [(e + 1, 0, i) for i, (_, e, _, _, _) in enumerate(placed)])
    active: list[tuple[int, int, int]] = []  # (offset, end address, index)
    for _, is_start, i in events:
        s, e, off, nb, tid = placed[i]
        if not is_start:
            active.remove((off, off + nb, i))
            continue
        j = bisect.bisect_left(active, (off, off + nb, i))
        for other in active[max(0, j - 1):j + 1]:
            o_off, o_end, o_i = other
            if o_off < off + nb and off < o_end and not _written_over(placed[o_i], placed[i], graph):
                raise PlanError(f"arena collision: tensor {tid} at [{off}, {off + nb}) and tensor {placed[o_i][4]} "
                                f"at [{o_off}, {o_end}) are both in fast memory at step {max(s, placed[o_i][0])}")
        active.insert(j, (off, off + nb, i))


def _written_over(old: tuple[int, ...], new: tuple[int, ...], graph: TrainingGraph) -> bool:
    """Whether `new` (start, end, offset, nbytes, tensor) may share `old`'s bytes: an output of
    kernel k over an input that dies at k, same offset and size, overlapping only while k
    runs. The executor writes such outputs into the input's storage (in-place updates);
    where it cannot, the output's slot is still taken, and it goes elsewhere."""
    s = new[0]
    if s % 2 == 0 or old[1] != s or old[2:4] != new[2:4]:
        return False
    kern = graph.kernels[s // 2]
    return old[4] in kern.inputs and new[4] in kern.outputs


class PlanReplay:
    """Replay a plan on a graph. Iterate it to get one checked KernelStep per kernel.

    The counters (bytes_to_slow, bytes_to_fast, moves, peak_fast_bytes) are complete once
    the iteration has finished. Construction runs the per-tensor checks (plan matches the
    graph, every tensor listed once, action order and range, async overlap).
    """

    def __init__(self, plan: Plan, graph: TrainingGraph, *, budget_bytes: int | None = None,
                 reserved_bytes: Iterable[int] | None = None, in_place: bool = True) -> None:
        check_plan_matches(plan, graph)
        graph = plan_graph(plan, graph)
        self.plan = plan
        self.graph = graph
        self.budget = plan.budget_bytes if budget_bytes is None else budget_bytes
        self.reserved = None if reserved_bytes is None else [int(x) for x in reserved_bytes]
        if self.reserved is not None and len(self.reserved) != len(graph.kernels):
            raise PlanError(f"reserved bytes for {len(self.reserved)} kernels, the graph has {len(graph.kernels)}")
        if plan.access not in ACCESS:
            raise PlanError(f"plan access must be 'staged' or 'direct', got {plan.access!r}")
        self.staged = plan.access == "staged"
        # per kernel, the dying input whose storage its output takes (None: none); the
        # interpreter (torch) is imported only for graphs that carry a program
        self.in_place: tuple[int | None, ...] = (None,) * len(graph.kernels)
        if in_place and hasattr(getattr(graph, "program", None), "kernel_nodes"):
            from ..interpret.replay import in_place_inputs

            self.in_place = in_place_inputs(graph)
        self.bytes_to_slow = 0
        self.bytes_to_fast = 0
        self.moves = 0
        self.peak_fast_bytes = 0
        n = len(graph.kernels)
        self.initial_fast = [True] * len(graph.tensors)
        # Actions bucketed by kernel; sync ones split so evicts and drops come first.
        self._sync_release: list[list[Move]] = [[] for _ in range(n)]
        self._sync_prefetch: list[list[Move]] = [[] for _ in range(n)]
        self._async: list[list[Move]] = [[] for _ in range(n)]
        self._check_tensors()

    # ---- messages -----------------------------------------------------------------------
    def _t(self, tid: int) -> str:
        return f"tensor {tid} ({self.graph.tensors[tid].name})"

    def _k(self, k: int) -> str:
        if 0 <= k < len(self.graph.kernels):
            return f"kernel {k} ({self.graph.kernels[k].op})"
        return f"kernel {k} (no such kernel)"

    # ---- per-tensor checks, before the replay --------------------------------------------
    def _check_tensors(self) -> None:
        g = self.graph
        seen = [False] * len(g.tensors)
        for tp in self.plan.tensors:
            tid = tp.id
            if not (isinstance(tid, int) and 0 <= tid < len(g.tensors)):
                raise PlanError(f"plan lists tensor id {tid!r}, but graph {g.name} has tensors "
                                f"0..{len(g.tensors) - 1}")
            if seen[tid]:
                raise PlanError(f"plan lists {self._t(tid)} more than once")
            seen[tid] = True
            t = g.tensors[tid]
            if tp.initial not in TIERS:
                raise PlanError(f"{self._t(tid)}: initial tier must be 'fast' or 'slow', got {tp.initial!r}")
            if tp.initial == "slow" and self.staged and t.producer is not None \
                    and not born_slow_piece(g, t.producer):
                raise PlanError(
                    f"{self._t(tid)}: initial 'slow' is not allowed for a tensor produced by {self._k(t.producer)} "
                    f"under staged access: kernels write their outputs to fast memory (only a kernel that runs "
                    f"in pieces writes its one output to slow memory, a piece at a time)")
            self.initial_fast[tid] = tp.initial == "fast"
            first = t.live[0] if t.producer is None else t.producer + 1
            last = t.live[1]
            prev = None
            for i, a in enumerate(tp.actions):
                if a.kind not in KINDS:
                    raise PlanError(f"{self._t(tid)}: action {i} has unknown kind {a.kind!r} "
                                    f"(expected prefetch, evict or drop)")
                if a.mode not in MODES:
                    raise PlanError(f"{self._t(tid)}: action {i} ({a.kind}) has unknown mode {a.mode!r} "
                                    f"(expected sync or async)")
                if not (isinstance(a.at, int) and not isinstance(a.at, bool)):
                    raise PlanError(f"{self._t(tid)}: action {i} ({a.kind}) has a non-integer kernel index {a.at!r}")
                if a.keep_fast and a.kind != "evict":
                    raise PlanError(f"{self._t(tid)}: action {i} is a {a.kind} with keep_fast=True; "
                                    f"keep_fast applies to evict only")
                if prev is not None and a.at <= prev.at:
                    raise PlanError(
                        f"{self._t(tid)}: actions are not in increasing `at` order: action {i} ({a.kind} at kernel "
                        f"{a.at}) follows action {i - 1} ({prev.kind} at kernel {prev.at}); a tensor has at most one "
                        f"action per kernel")
                if a.at < first:
                    born = (f"produced by {self._k(t.producer)}; its first move can be at kernel {first}"
                            if t.producer is not None else f"a graph input, live from kernel {first}")
                    raise PlanError(f"{self._t(tid)}: {a.mode} {a.kind} at {self._k(a.at)} happens before the tensor "
                                    f"exists ({born})")
                if a.at > last:
                    raise PlanError(f"{self._t(tid)}: {a.mode} {a.kind} at {self._k(a.at)} happens after the tensor dies "
                                    f"(its live range ends at {self._k(last)})")
                m = Move(tid, a, t.nbytes)
                if a.mode == "async":
                    # (kernel a.at > producer cannot write the tensor, so only reads are left)
                    if tid in g.kernels[a.at].inputs:
                        raise PlanError(f"{self._t(tid)}: async {a.kind} at {self._k(a.at)} overlaps a kernel that "
                                        f"reads the tensor")
                    self._async[a.at].append(m)
                elif a.kind == "prefetch":
                    self._sync_prefetch[a.at].append(m)
                else:
                    self._sync_release[a.at].append(m)
                prev = a
        if not all(seen):
            missing = [i for i, s in enumerate(seen) if not s]
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise PlanError(f"plan does not list {self._t(missing[0])}{more}: every tensor must be listed exactly once")

    # ---- the replay -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[KernelStep]:
        g = self.graph
        self.bytes_to_slow = self.bytes_to_fast = self.moves = self.peak_fast_bytes = 0
        n_t = len(g.tensors)
        nbytes = [t.nbytes for t in g.tensors]
        fast = [_NO] * n_t
        slow = [_NO] * n_t
        written: list[str | None] = [None] * n_t  # why the tensor has a slow copy: a message fragment
        self._fast_set: set[int] = set()  # tensors holding fast bytes (resident or in flight)
        fast_set = self._fast_set
        self.fast_blocks: list[FastBlock] = []
        opened: dict[int, int] = {}  # tensor -> half-step its current fast block started

        def hold(tid: int, step: int) -> None:
            fast_set.add(tid)
            if nbytes[tid]:
                opened[tid] = step

        def release(tid: int, step: int) -> None:
            fast_set.discard(tid)
            start = opened.pop(tid, None)
            if start is not None and step >= start:  # (an input evicted before its first step held nothing)
                self.fast_blocks.append(FastBlock(tid, start, step, nbytes[tid]))

        # A move is checked and started (begin), then completes (land): a sync move lands
        # before the next one starts, an async one once its kernel has run. Each returns
        # the fast bytes it takes or frees; `step` is the half-step its fast block opens
        # (a prefetch's) or closes at (an evict's or a drop's).
        def begin(m: Move, k: int, step: int) -> int:
            tid, a = m.tensor, m.action
            if a.kind == "prefetch":
                self._check_prefetch(tid, k, fast, slow)
                fast[tid] = _IN_FLIGHT
                hold(tid, step)
                self.bytes_to_fast += nbytes[tid]
                self.moves += 1
                return nbytes[tid]
            if a.kind == "evict":
                self._check_evict(tid, k, fast, slow, written)
                slow[tid] = _IN_FLIGHT
                written[tid] = f"it was written there at {self._k(k)}"
                self.bytes_to_slow += nbytes[tid]
                self.moves += 1
            else:
                self._check_drop(tid, k, fast, slow)
            return 0

        def land(m: Move, step: int) -> int:
            tid, a = m.tensor, m.action
            if a.kind == "prefetch":
                fast[tid] = _YES
                return 0
            if a.kind == "evict":
                slow[tid] = _YES
            if a.kind == "drop" or not a.keep_fast:
                fast[tid] = _NO
                release(tid, step)
                return nbytes[tid]
            return 0

        inputs_at: dict[int, list[int]] = {}
        frees_at: dict[int, list[int]] = {}
        for t in g.tensors:
            if t.producer is None:
                inputs_at.setdefault(t.live[0], []).append(t.id)
            frees_at.setdefault(t.live[1], []).append(t.id)
        init_fast = self.initial_fast
        in_place = self.in_place
        taken_over: set[int] = set()  # dying inputs whose bytes an output of their last kernel holds
        budget = self.budget
        staged = self.staged
        # per kernel, the inputs it may read from slow memory under staged access: those of
        # a kernel that runs in pieces (ir/split.py)
        split_reads = piece_reads(self.graph)
        used = 0  # fast bytes now

        for k, kern in enumerate(g.kernels):
            # graph inputs appear in their initial tier
            for tid in inputs_at.get(k, ()):
                if init_fast[tid]:
                    fast[tid] = _YES
                    hold(tid, 2 * k)
                    used += nbytes[tid]
                else:
                    slow[tid] = _YES
                    written[tid] = "it started in slow memory"

            # (1) sync actions: evicts and drops, then prefetches; each completes before the next
            sync_moves = self._sync_release[k] + self._sync_prefetch[k]
            for m in sync_moves:
                used += begin(m, k, 2 * k)
                used -= land(m, 2 * k - 1)
            after_sync = used
            if budget is not None and used > budget:
                self._over_budget(k, used, f"before {self._k(k)} (after its sync moves)", nbytes)

            # (2) async actions start
            async_moves = self._async[k]
            for m in async_moves:
                used += begin(m, k, 2 * k + 1)

            # (3) the kernel runs; its outputs appear in their initial tier (staged access: one
            # written to slow memory piece by piece holds a piece of it while the kernel runs)
            born: list[int] = []
            for tid in kern.outputs:
                if init_fast[tid]:
                    fast[tid] = _YES
                    hold(tid, 2 * k + 1)
                    used += nbytes[tid]
                else:
                    slow[tid] = _YES
                    written[tid] = f"its producer {self._k(k)} wrote it there"
                    if staged:  # (written there piece by piece: a write to slow memory)
                        born.append(tid)
                        self.bytes_to_slow += nbytes[tid]
            piece = born_slow_piece(g, k) if born else 0
            used += piece
            over = in_place[k]
            if over is not None and fast[over] == _YES and init_fast[kern.outputs[0]]:
                # the output is written over the dying input's storage: its bytes, not more
                used -= nbytes[over]
                taken_over.add(over)
            if budget is not None and used > budget:
                self._over_budget(k, used, f"at {self._k(k)}", nbytes)
            if budget is not None and self.reserved is not None and used + self.reserved[k] > budget:
                self._over_budget(k, used, f"at {self._k(k)}, which needs {self.reserved[k]} bytes of workspace "
                                           f"besides", nbytes)
            at_kernel = used
            if used > self.peak_fast_bytes:
                self.peak_fast_bytes = used
            used -= piece
            slow_operands = []
            for verb, tids in (("reads", kern.inputs), ("writes", kern.outputs)):
                for tid in tids:
                    if fast[tid] == _YES or tid in born:
                        continue
                    where = ("its async prefetch is still in flight" if fast[tid] == _IN_FLIGHT
                             else "it is in slow memory")
                    if staged and verb == "reads" and tid in split_reads.get(k, ()) and fast[tid] == _NO \
                            and slow[tid] == _YES:
                        slow_operands.append(tid)  # (read piece by piece from its slow copy)
                        continue
                    if staged:
                        raise PlanError(f"{self._k(k)} {verb} {self._t(tid)}, which is not resident in fast memory "
                                        f"({where}; staged access needs every operand in fast memory)")
                    # (unreachable while the per-tensor rules hold: an async write at k never overlaps a
                    # reader of the tensor; kept, like the in-flight checks below, as a guard)
                    if slow[tid] != _YES:
                        raise PlanError(f"{self._k(k)} {verb} {self._t(tid)} in slow memory while its async write "
                                        f"is still in flight")
                    slow_operands.append(tid)

            # (4) async actions complete
            for m in async_moves:
                used -= land(m, 2 * k + 1)

            # (5) tensors whose live range ends here are freed in both tiers
            for tid in frees_at.get(k, ()):
                if fast[tid] != _NO:
                    release(tid, 2 * k + 1)
                    if tid not in taken_over:
                        used -= nbytes[tid]
                fast[tid] = _NO
                slow[tid] = _NO

            yield KernelStep(k, tuple(sync_moves), tuple(async_moves), tuple(slow_operands), after_sync, at_kernel,
                             tuple(born))

    # ---- rules for each action ------------------------------------------------------------
    def _check_prefetch(self, tid: int, k: int, fast: list[int], slow: list[int]) -> None:
        if slow[tid] == _IN_FLIGHT:
            raise PlanError(f"{self._t(tid)}: prefetch at {self._k(k)} before its async write to slow memory completes")
        if slow[tid] != _YES:
            raise PlanError(f"{self._t(tid)}: prefetch at {self._k(k)} without a valid slow copy "
                            f"(evict it to slow memory first)")
        if fast[tid] != _NO:
            raise PlanError(f"{self._t(tid)}: prefetch at {self._k(k)}, but the tensor is already in fast memory")

    def _check_evict(self, tid: int, k: int, fast: list[int], slow: list[int], written: list[str | None]) -> None:
        if fast[tid] != _YES:
            raise PlanError(f"{self._t(tid)}: evict at {self._k(k)}, but the tensor is not in fast memory")
        if slow[tid] != _NO:
            raise PlanError(f"{self._t(tid)}: second evict at {self._k(k)}: the tensor already has a slow copy "
                            f"({written[tid]}); a tensor is written to slow memory once, use drop")

    def _check_drop(self, tid: int, k: int, fast: list[int], slow: list[int]) -> None:
        if fast[tid] != _YES:
            raise PlanError(f"{self._t(tid)}: drop at {self._k(k)}, but the tensor is not in fast memory")
        if slow[tid] == _IN_FLIGHT:
            raise PlanError(f"{self._t(tid)}: drop at {self._k(k)} before its async write to slow memory completes")
        if slow[tid] != _YES:
            raise PlanError(f"{self._t(tid)}: drop at {self._k(k)} without a slow copy: the fast copy is its only "
                            f"copy (evict it instead)")

    def _over_budget(self, k: int, used: int, when: str, nbytes: list[int]) -> None:
        largest = sorted(self._fast_set, key=lambda tid: (-nbytes[tid], tid))[:3]
        names = ", ".join(f"{self._t(tid)}: {nbytes[tid]} bytes" for tid in largest)
        raise PlanError(f"fast memory over budget {when}: {used} bytes resident > budget {self.budget} bytes; "
                        f"largest resident: {names}")
