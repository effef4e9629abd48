"""Where each tensor could leave fast memory: its segments between uses (staged access).

Under staged access a tensor must be in fast memory at every kernel that uses it (its
producer and its readers). Between two consecutive uses a < b with b - a >= 2 lies a
*gap* whose interior a+1..b-1 it may spend in slow memory. A carried graph input (a
weight, buffer or optimizer state) may also start the iteration in slow memory (its
*initial* segment 0..u1-1), and the updated value that replaces it may leave fast memory
after its last use (its *final* segment u_m+1..K-1), so that the next iteration finds it
where this one started it. The batch, scalars, constants and the loss stay in fast memory
outside their uses, as do tensors too small to be worth moving.

A kernel that runs in pieces (ir/split.py) reads its inputs from slow memory piece by
piece where they are there: it is no use that needs them fast, so a segment may span it,
and a tensor whose last such uses follow its last use in fast memory gets a *tail*
segment up to them, after which it dies (no prefetch ends it). A carried input that only
such kernels read has one *streamed* segment instead, up to its last read: it may start
the iteration slow and stay there (its update replaces it). The output of a kernel that
may write it to slow memory piece by piece (ir.split.born_slow_piece) may be *born slow*
where its first segment starts right after its producer: absent there too, it is no use
that needs it fast either (its producer holds one piece of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Role, Tensor, TrainingGraph
from ..ir.split import born_slow_piece, piece_reads

CARRIED = ("param:", "buffer:", "opt:")
NO_PREFETCH = ("final", "tail", "streamed")  # segments that no use ends: nothing brings the tensor back
STARTS_SLOW = ("initial", "streamed")  # segments a carried input may start in slow memory


@dataclass(frozen=True)
class Segment:
    tensor: int
    kind: str  # "initial", "gap", "final", "tail" or "streamed"
    start: int  # first interior kernel
    end: int  # last interior kernel (end < start: empty interior)
    index: int  # position among the tensor's segments


@dataclass(frozen=True)
class TensorSegments:
    tensor: int
    nbytes: int
    uses: tuple[int, ...]
    segments: tuple[Segment, ...]
    carried_input: bool  # may start slow
    carried_output_of: int | None  # the input tensor whose tier this output must end in
    born: tuple[int, int] | None = None  # (producer, bytes it holds of t) where t may be born slow


def carried_pairs(graph: TrainingGraph) -> dict[int, int]:
    """Output tensor id -> input tensor id, for the state carried between iterations."""
    p = graph.program
    if p is None:  # a hand-built graph: nothing is carried between iterations
        return {}
    inputs = {key: tid for key, tid in p.input_keys}
    return {tid: inputs[key] for key, tid in p.output_keys.items() if key in inputs and key.startswith(CARRIED)}


def tensor_segments(graph: TrainingGraph, *, min_bytes: int = 0, pinned: frozenset[int] = frozenset(),
                    pairs: dict[int, int] | None = None) -> list[TensorSegments]:
    """The movable segments of every tensor that has any (others stay fast for life)."""
    if pairs is None:
        pairs = carried_pairs(graph)
    carried_inputs = set(pairs.values())
    n = len(graph.kernels)

    def may_start_slow(t: Tensor) -> bool:  # an input that gets an initial segment below
        return (t.id in carried_inputs and t.producer is None and t.id not in pinned and t.nbytes >= max(min_bytes, 1)
                and t.role in (Role.WEIGHT, Role.BUFFER, Role.OPTIMIZER_STATE) and bool(t.users))
    # an update may leave fast memory after its last use only if its input may start the
    # next iteration slow (ilp.py's steady-state row forces the rest fast): without such
    # an input its final segment would be movable in name only, and minimum_budget, which
    # counts every segment's interior as free, would promise a budget no plan fits
    slow_starts = {tid for tid in carried_inputs if may_start_slow(graph.tensors[tid])}
    reads_slow = piece_reads(graph)
    out = []
    for t in graph.tensors:
        if t.id in pinned or t.nbytes < max(min_bytes, 1):
            continue
        all_uses = sorted(set(t.users) | ({t.producer} if t.producer is not None else set()))
        if not all_uses:
            continue
        uses = [u for u in all_uses if t.id not in reads_slow.get(u, ())]
        if not uses and t.id in slow_starts:  # read in pieces only: it may stay slow for good
            out.append(TensorSegments(t.id, t.nbytes, tuple(all_uses), (Segment(t.id, "streamed", 0, all_uses[-1], 0),),
                                      carried_input=True, carried_output_of=pairs.get(t.id)))
            continue
        # (any other tensor only ever read in pieces keeps its first such use as one in fast memory)
        uses = uses or all_uses[:1]
        segs: list[Segment] = []
        if t.producer is None and t.id in carried_inputs and t.role in (Role.WEIGHT, Role.BUFFER, Role.OPTIMIZER_STATE):
            segs.append(Segment(t.id, "initial", 0, uses[0] - 1, len(segs)))
        for a, b in zip(uses, uses[1:]):
            if b - a >= 2:
                segs.append(Segment(t.id, "gap", a + 1, b - 1, len(segs)))
        if t.id in pairs and pairs[t.id] in slow_starts:
            segs.append(Segment(t.id, "final", uses[-1] + 1, n - 1, len(segs)))
        elif all_uses[-1] > uses[-1]:
            segs.append(Segment(t.id, "tail", uses[-1] + 1, all_uses[-1], len(segs)))
        if segs:
            k = t.producer
            piece = born_slow_piece(graph, k) if k is not None and segs[0].start == k + 1 else 0
            born = (k, piece) if k is not None and piece else None
            out.append(TensorSegments(t.id, t.nbytes, tuple(uses), tuple(segs),
                                      carried_input=any(s.kind == "initial" for s in segs),
                                      carried_output_of=pairs.get(t.id), born=born))
    return out

