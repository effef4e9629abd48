"""simulate(): the predicted time of a plan, replayed event by event against a cost model.

This module is THE definition of a plan's predicted iteration time. It walks the plan
timeline of `autotm.plan` with `autotm.validate.PlanReplay` (so a plan the validator
rejects is rejected here too) and charges, with c = cost_model:

    T = T_in + sum_k [ S_k + R_k + H_k + max(K_k, A_k, K_k + I_k) + u_k W_k ] + T_out

    S_k  = sum over sync moves m at k of c.move_seconds(m.nbytes, dir(m), "sync")
           dir(evict) = "to_slow", dir(prefetch) = "to_fast", drop costs 0
    H_k  = sum over async moves m at k of c.async_host_seconds(m.nbytes, dir(m))
           (the issuing thread's own part of each async copy: the issue, and collecting
           its completion after the kernel; serial, so no kernel overlaps it)
    K_k  = c.kernel_time(k, placement_k)
           placement_k: per unique operand of k (kernel.inputs + kernel.outputs order)
           "slow" if the timeline has it in slow memory while k runs (direct access),
           else "fast"; staged access: the all-fast time
    A_k  = c.async_seconds(async moves m at k)
         = sum_m c.async_marginal_seconds(m.nbytes, dir(m))
           + max_m [c.move_seconds(m.nbytes, dir(m), "async") - marginal_m]
           (the copies at one kernel together overlap kernel k; with c.async_overlap
           (Linux AIO) they are in flight together: one's whole time shows and each other
           adds its marginal, what a second copy of its size added to the first in the
           profile (mode "pair"; ~0 for small writes, the whole copy from ~256 KiB here);
           else they run one after another and A_k is the plain sum of their times)
    I_k  = c.async_interference_seconds(async moves m at k)
         = sum_m g(dir(m)) marginal_m + g* max_m [full_m - marginal_m]
           the compute kernel k loses while its copies are in flight: with slowdown s
           (c.copy_interference) it does 1 / (1 + s) of its work per second then, so a
           copy of A seconds costs it g A = s / (1 + s) A; if K (1 + s) <= A the kernel
           ends inside the copy and A_k alone counts (max of the three); g* is the larger
           direction's g
    u_k  = 1 if kernel k starts after the compute thread waited idle on the slow tier:
           a sync copy at k (S_k > 0), or an async copy m at k - 1 with
           c.move_seconds(m.nbytes, dir(m), "async") > K_{k-1} (CostModel.woken); else 0
    W_k  = c.wake_seconds[k]: what kernels k and k + 1 lose then (0 where not profiled)
    R_k  = (staged access, a kernel that runs in pieces, ir/split.py) sum over its inputs
           in slow memory of c.move_seconds(nbytes, "to_fast", "sync"), or one such read
           per stored row of each strided block of a matmul (ir.split.piece_read_seconds):
           the pieces' reads
           (counted in sync_move_seconds; they do not count as a wake: u_k is as above),
           and for its output written to slow memory piece by piece (initial "slow")
           c.move_seconds(nbytes, "to_slow", "sync") (ir.split.piece_write_seconds)
    T_in = sum over graph inputs that start slow and are not carried between iterations
           (the batch, per-iteration scalars) of c.move_seconds(nbytes, "to_slow", "sync")
           (the executor writes them to slow memory when it places the inputs)
    T_out = carry and return moves after the last kernel (see Executor.run_iteration):
           for every graph output whose matching graph input starts slow and which has
           no slow copy at the end: c.move_seconds(nbytes, "to_slow", "sync");
           for every other graph output that is not in fast memory at the end:
           c.move_seconds(nbytes, "to_fast", "sync")

`Simulation.kernel_seconds[k]` is max(K_k, A_k, K_k + I_k), the effective time of kernel k with its
overlapping copies; `wake_seconds` is sum_k u_k W_k; `sync_move_seconds` is sum_k S_k + T_in + T_out; `async_host_seconds`
is sum_k H_k (sync_move_seconds includes sum_k R_k). `fast_bytes[k]` is
the fast-tier bytes while kernel k runs (the validator's step-3 value).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.costmodel import CostModel, operand_tensors
from ..ir.graph import TrainingGraph
from ..ir.plan import Plan, PlanError, plan_graph
from ..ir.split import piece_read_seconds, piece_write_seconds
from .validate import Move, PlanReplay

_DIRECTION = {"evict": "to_slow", "prefetch": "to_fast"}


@dataclass(frozen=True, eq=False)
class Simulation:
    predicted_seconds: float
    kernel_seconds: np.ndarray  # effective per kernel: max(kernel time, async copies overlapping it)
    sync_move_seconds: float  # every sync move, including input placement and carry moves
    fast_bytes: np.ndarray  # per kernel, while it runs (int64)
    peak_fast_bytes: int
    simulated: bool  # the cost model came from a hypothetical tier spec
    async_move_seconds: float = 0.0  # every async copy (hidden behind kernels where they are longer)
    async_host_seconds: float = 0.0  # the issuing thread's own time for the async copies (H_k)
    wake_seconds: float = 0.0  # kernels slowed after the thread waited idle on the slow tier (u_k W_k)


def _move_seconds(cm: CostModel, m: Move, mode: str) -> float:
    d = _DIRECTION.get(m.action.kind)
    return 0.0 if d is None else cm.move_seconds(m.nbytes, d, mode)


def _end_state(plan: Plan, graph: TrainingGraph) -> tuple[list[bool], list[bool]]:
    """Per tensor: (fast copy after the last kernel, slow copy after the last kernel),
    from its initial tier and its actions (meaningful for tensors live at the end)."""
    fast = [True] * len(graph.tensors)
    slow = [False] * len(graph.tensors)
    for tp in plan.tensors:
        f, s = tp.initial == "fast", tp.initial == "slow"
        for a in tp.actions:
            if a.kind == "prefetch":
                f = True
            elif a.kind == "evict":
                s = True
                f = f and a.keep_fast
            else:
                f = False
        fast[tp.id], slow[tp.id] = f, s
    return fast, slow


def simulate(plan: Plan, graph: TrainingGraph, cost_model: CostModel) -> Simulation:
    """Predict one iteration of `plan` on `graph` with `cost_model` (formula: module doc).

    Raises PlanError if the plan breaks a rule of the timeline or the cost model was made
    for another graph or access model.
    """
    cm = cost_model
    if cm.graph_fingerprint != graph.fingerprint:
        raise PlanError(f"cost model was made for graph fingerprint {cm.graph_fingerprint}, "
                        f"not {graph.fingerprint} ({graph.name})")
    if len(cm.kernel_seconds) != len(graph.kernels):
        raise PlanError(f"cost model has {len(cm.kernel_seconds)} kernels, graph has {len(graph.kernels)}")
    direct = plan.access == "direct"
    if direct and cm.access != "direct":
        raise PlanError(f"plan is for direct access but the cost model ({cm.memory_system}) is {cm.access}")
    n = len(graph.kernels)
    graph = plan_graph(plan, graph)
    replay = PlanReplay(plan, graph, budget_bytes=None)
    eff = np.zeros(n)
    fast = np.zeros(n, dtype=np.int64)
    sync_total = 0.0
    async_total = 0.0
    host_total = 0.0
    wake_total = 0.0
    wake = cm.wake(n)
    copies_before: list[tuple[int, str]] = []  # the async copies over the previous kernel
    initial = {tp.id: tp.initial for tp in plan.tensors}
    p = graph.program

    # T_in: non-carried inputs that start slow are written there when placed
    carried = set(p.output_keys) if p is not None else set()
    if p is not None:
        for key, tid in p.input_keys:
            if initial.get(tid) == "slow" and key not in carried:
                sync_total += cm.move_seconds(graph.tensors[tid].nbytes, "to_slow", "sync")

    for step in replay:
        k = step.kernel
        s = sum(_move_seconds(cm, m, "sync") for m in step.sync_moves)
        if not direct and step.slow_operands:  # a split kernel reads these piece by piece
            s_reads = sum(piece_read_seconds(graph, k, t, cm) for t in step.slow_operands)
            sync_total += s_reads
        if step.born_slow:  # (staged: the split kernel writes its output there piece by piece)
            sync_total += piece_write_seconds(graph, k, cm)
        copies = [(m.nbytes, _DIRECTION[m.action.kind]) for m in step.async_moves if m.action.kind in _DIRECTION]
        a = cm.async_seconds(copies)
        slowed = cm.async_interference_seconds(copies) if copies else 0.0
        host_total += sum(cm.async_host_seconds(nb, d) for nb, d in copies)
        placement = None
        if direct and step.slow_operands:
            kern = graph.kernels[k]
            slow = set(step.slow_operands)
            placement = tuple("slow" if t in slow else "fast" for t in operand_tensors(kern.inputs, kern.outputs))
        kt = cm.kernel_time(k, placement)
        eff[k] = max(kt, a, kt + slowed)
        if cm.woken(k, s > 0.0, copies_before):
            wake_total += wake[k]
        copies_before = copies
        sync_total += s
        async_total += a
        fast[k] = step.fast_bytes

    # T_out: carry moves and outputs to return from slow memory
    if p is not None and n:
        end_fast, end_slow = _end_state(plan, graph)
        slow_inputs = {key for key, tid in p.input_keys if initial.get(tid) == "slow"}
        for key, tid in p.output_keys.items():
            nb = graph.tensors[tid].nbytes
            if key in slow_inputs:
                if not end_slow[tid]:
                    sync_total += cm.move_seconds(nb, "to_slow", "sync")
            elif not end_fast[tid]:
                sync_total += cm.move_seconds(nb, "to_fast", "sync")

    sim = Simulation(predicted_seconds=float(eff.sum() + sync_total + host_total + wake_total), kernel_seconds=eff,
                     sync_move_seconds=float(sync_total), fast_bytes=fast,
                     peak_fast_bytes=int(fast.max()) if n else 0, simulated=cm.simulated,
                     async_move_seconds=float(async_total), async_host_seconds=float(host_total),
                     wake_seconds=float(wake_total))
    return sim
