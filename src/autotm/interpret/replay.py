"""Replay: run a captured TrainingGraph on real tensors, kernel by kernel (no memory tiers).

`Replay` is the one kernel loop the executor and the profiler's replays build on (its
hook tree is drawn in its docstring): it walks kernels in order, materializes each operand
from its storage (views are re-derived from the storage's current value, so a storage can
be swapped for a moved copy), runs the ATen op, and frees every tensor after its last use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.fx as fx

from ..errors import AutotmError, ReplayError
from ..ir.graph import Role, TrainingGraph


def _out_overload(op: torch._ops.OpOverload):
    """The out= overload taking the same arguments as the functional `op`, if any."""
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        outs = [a for a in args if a.is_out]
        if len(outs) == 1 and [(a.name, str(a.type)) for a in args if not a.is_out] == want:
            return cand, outs[0].name
    return None


def inplace_overload(op):
    """The in-place form of a functional ATen op (aten.relu.default -> aten.relu_.default)
    taking the same arguments, or None."""
    try:
        name = op._schema.name.split("::")[1]
        packet = getattr(torch.ops.aten, name + "_")
        cand = getattr(packet, op._overloadname)
    except (AttributeError, IndexError, RuntimeError):
        return None
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    got = [(a.name, str(a.type)) for a in cand._schema.arguments]
    return cand if want == got and cand._schema.arguments and cand._schema.arguments[0].is_write else None


def _layout(v) -> tuple | None:
    if not isinstance(v, torch.Tensor):
        return None
    return (tuple(v.shape), tuple(v.stride()), v.storage_offset(), v.dtype)


def run_device(device) -> torch.device | None:
    """The device a replay moves a CPU-captured graph to: None for the CPU (run as captured)."""
    if device is None:
        return None
    device = torch.device(device)
    return None if device.type == "cpu" else device


def _const(v):
    return lambda: v


class OperandBuilder:
    """Turns fx arguments into argument builders, once per interpreter.

    Rather than walking a node's arguments (fx's map_arg) on every call, each argument
    becomes a closure that fetches a storage's current value from `env` (or re-derives a
    view from it), so a kernel call costs a few Python calls per operand. The
    replay, the profiler and the executor build a kernel's operands with it alike: the
    profiler times that work as the executor does it.
    """

    def __init__(self, program, env: dict, storage_value, device: torch.device | None = None):
        self.p = program
        self.env = env
        self.storage_value = storage_value
        self.device = device  # not None: a CPU-captured graph runs there (factory ops' device=)
        self.getters: dict[fx.Node, object] = {}

    def node(self, node: fx.Node):
        g = self.getters.get(node)
        if g is not None:
            return g
        p = self.p
        tid = p.node_tensor.get(node)
        if tid is None:
            def g():
                raise ReplayError(f"node {node.name} has no tensor")
        elif p.base_node.get(tid) is node:
            env, sv = self.env, self.storage_value

            def g():
                try:
                    return env[tid]
                except KeyError:
                    return sv(tid)  # slow view (direct access) or a ReplayError naming the tensor
        else:  # a view: re-derived from the storage's current value on every use
            target = node.target
            args, kwargs = self.args(node.args), self.kwargs(node.kwargs)
            if kwargs is None:
                def g():
                    return target(*args())
            else:
                def g():
                    return target(*args(), **kwargs())
        self.getters[node] = g
        return g

    def value(self, a):
        """(dynamic, value or builder) for one argument."""
        if isinstance(a, fx.Node):
            return True, self.node(a)
        if isinstance(a, (list, tuple)):
            parts = [self.value(x) for x in a]
            if not any(d for d, _ in parts):
                return False, a
            fns = [f if d else _const(f) for d, f in parts]
            if isinstance(a, list):
                return True, lambda: [f() for f in fns]
            return True, lambda: tuple([f() for f in fns])
        if isinstance(a, (dict, slice)):
            holder = []
            fx.node.map_arg(a, holder.append)
            if holder:
                return True, lambda: fx.node.map_arg(a, lambda n: self.node(n)())
        if self.device is not None and isinstance(a, torch.device):
            return False, self.device
        return False, a

    def args(self, args: tuple):
        parts = [self.value(x) for x in args]
        dyn = [(i, f) for i, (d, f) in enumerate(parts) if d]
        if not dyn:
            const = tuple(args)
            return lambda: const
        if len(dyn) == len(parts):
            fns = [f for _, f in dyn]
            return lambda: [f() for f in fns]
        base = [f for _, f in parts]

        def build():
            a = base.copy()
            for i, f in dyn:
                a[i] = f()
            return a
        return build

    def kwargs(self, kwargs: dict):
        """None when there are no keyword arguments."""
        if not kwargs:
            return None
        parts = {k: self.value(v) for k, v in kwargs.items()}
        dyn = [(k, f) for k, (d, f) in parts.items() if d]
        base = {k: f for k, (_, f) in parts.items()}
        if not dyn:
            return lambda: base

        def build():
            kw = dict(base)
            for k, f in dyn:
                kw[k] = f()
            return kw
        return build


_NOT_OURS = frozenset({Role.INPUT, Role.CONSTANT})


@dataclass(frozen=True)
class Reuse:
    """Kernel k may write its output into the storage of an input that dies at k
    (`reuse_table`): the same values, one allocation saved.

    `out_op` is the op's out= overload, `out_arg` its out argument's name; `shape` and
    `stride` lay the output over the dying input's storage (its base value may be shaped
    otherwise). `inplace` is the op's in-place form (relu_) when that input is the op's
    first argument: the same kernel, and for some ops several times faster than out=.
    """

    out_op: Any
    tensor: int  # the dying input
    out_arg: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    inplace: Any = None

    def call(self, storage: torch.Tensor, args, kwargs: dict):
        """The kernel's op on `args`, its output written over `storage` (the dying input's
        current value). The replay, the profiler's replay and the executor all call it."""
        if self.inplace is not None:
            return self.inplace(*args, **kwargs)
        return self.out_op(*args, **kwargs, **{self.out_arg: storage.as_strided(self.shape, self.stride, 0)})


def reuse_table(graph: TrainingGraph) -> list[Reuse | None]:
    """Per kernel, a `Reuse` when its output may be written into the storage of an input
    that dies at this kernel, as torch.optim's in-place updates do; else None.

    Only pointwise ops with one output qualify, never into the caller's batch or a
    constant, and only when the input is read exactly as the output is laid out and covers
    its whole storage; the values computed are the same (an out= call runs the same
    kernel), only an allocation is saved.
    """
    p = graph.program
    cached = getattr(p, "reuse", None)
    if cached is not None and len(cached) == len(p.kernel_nodes):
        return _apart_in_pieces(graph, cached)
    table: list[Reuse | None] = []
    for k, node in enumerate(p.kernel_nodes):
        entry = None
        out = node.meta.get("val")
        op = node.target
        if isinstance(out, torch.Tensor) and torch.Tag.pointwise in getattr(op, "tags", ()):
            dying = set(p.free_after[k])
            want = _layout(out)
            by_tid: dict[int, set] = {}
            for a in node.all_input_nodes:
                tid = p.node_tensor.get(a)
                if tid is not None:
                    by_tid.setdefault(tid, set()).add(_layout(a.meta.get("val")))
            out_tid = p.kernel_outputs[k][0][0]
            for tid, layouts in by_tid.items():
                t = graph.tensors[tid]
                # (never the caller's batch, nor a constant the graph reads again next step)
                if (tid in dying and not t.is_graph_output and t.role not in _NOT_OURS
                        and layouts == {want} and want[2] == 0
                        and t.nbytes == graph.tensors[out_tid].nbytes
                        and out.numel() * out.element_size() == t.nbytes):
                    ov = _out_overload(op)
                    if ov is not None:
                        first = node.args[0] if node.args else None
                        inplace = (inplace_overload(op) if isinstance(first, fx.Node)
                                   and p.node_tensor.get(first) == tid else None)
                        entry = Reuse(ov[0], tid, ov[1], want[0], want[1], inplace)
                    break
        table.append(entry)
    if hasattr(p, "reuse"):
        p.reuse = tuple(table)
    return _apart_in_pieces(graph, table)


def _apart_in_pieces(graph: TrainingGraph, table: Sequence[Reuse | None]) -> list[Reuse | None]:
    """A kernel that runs in pieces (ir/split.py) makes its output apart from its inputs,
    which may be in slow memory (the table is cached on the program, which split and
    unsplit graphs share)."""
    return [None if graph.kernels[k].pieces > 1 else r for k, r in enumerate(table)]


def in_place_inputs(graph: TrainingGraph) -> tuple[int | None, ...]:
    """Per kernel, the input whose storage its one output takes (`reuse_table`), else None.

    Where that input is in fast memory while the kernel runs and the output is made there,
    the executor holds the two in one storage: the validator and the staged planner count
    those bytes once, as the executor's byte account does. Graphs without a captured
    program (hand-built, loaded from JSON) have none."""
    p = getattr(graph, "program", None)
    if p is None or not hasattr(p, "kernel_nodes"):
        return (None,) * len(graph.kernels)
    try:
        table = reuse_table(graph)
    except Exception:  # a graph whose nodes lack the metadata: no reuse known
        return (None,) * len(graph.kernels)
    return tuple(r.tensor if r is not None and len(p.kernel_outputs[k]) == 1 else None
                 for k, r in enumerate(table))


class Replay:
    """The interpreter over a TrainingGraph: the one kernel loop the profiler's replays and
    the executor build on. Subclasses override the hooks below, never the loop.

    The hook tree of one `run(inputs, keep)`::

        run(inputs, keep)
        ├── begin(inputs)                  the inputs and constants put in place
        ├── for each kernel k in order:
        │   ├── stop(k) -> bool            True: end the iteration cleanly before k
        │   ├── before_kernel(k)           (the executor's moves, the profiler's clocks)
        │   ├── execute_kernel(k)          a failure re-raised naming the kernel
        │   │   └── run_kernel(k)
        │   │       ├── operands(k)        args and kwargs, views re-derived
        │   │       ├── call_kernel(k, args, kwargs)   the op (output reuse: Reuse)
        │   │       └── store_outputs(k, out)
        │   ├── after_kernel(k)            before k's dead tensors are freed
        │   └── free(tid)                  each tensor whose live range ends at k
        └── finish() -> outputs            graph outputs and kept tensors, by tensor id

    A stopped run (stop(k) True) calls `stopped(k)` instead of `finish` and returns what it
    returns (here: nothing, the env cleared).

    Graph inputs passed to `run` may be overwritten: an input whose last use is a
    pointwise kernel lends its storage to that kernel's output.

    `device`: run the (CPU-captured) graph's kernels on this device (e.g. a GPU): the
    inputs must be there, and kernels that create tensors create them there. None or
    the CPU: as captured.
    """

    def __init__(self, graph: TrainingGraph, device=None):
        self.graph = graph
        self.program = graph.program
        self.device = run_device(device)
        self.env: dict[int, torch.Tensor] = {}  # one dict for the interpreter's life: the builders read it
        self.reuse = reuse_table(graph)
        self.keep: set[int] = set()
        self._builders: list[tuple] | None = None  # per kernel (args, kwargs or None), on first use

    # ---- operands --------------------------------------------------------------------
    def storage_value(self, tid: int) -> torch.Tensor:
        try:
            return self.env[tid]
        except KeyError:
            t = self.graph.tensors[tid]
            raise ReplayError(f"tensor {tid} ({t.name}) is not available; was it freed or never provided?") from None

    def operand_builders(self) -> list[tuple]:
        """Per kernel, (args builder, kwargs builder or None): compiled on first use, read
        `self.env` when called. The replay, the profiler and the executor all use these."""
        if self._builders is None:
            b = OperandBuilder(self.program, self.env, self.storage_value, self.device)
            self._builders = [(b.args(n.args), b.kwargs(n.kwargs)) for n in self.program.kernel_nodes]
        return self._builders

    def rebuild_operands(self, kernels: Iterable[int]) -> None:
        """Build these kernels' argument builders again from their nodes (whose constant
        arguments changed: a rebound hyperparameter)."""
        builders = self.operand_builders()
        b = OperandBuilder(self.program, self.env, self.storage_value, self.device)
        for k in kernels:
            n = self.program.kernel_nodes[k]
            builders[k] = (b.args(n.args), b.kwargs(n.kwargs))

    def operands(self, k: int) -> tuple[list | tuple, dict]:
        """Kernel k's args and kwargs, its tensor operands materialized (views re-derived
        from their storages' current values)."""
        args, kwargs = self.operand_builders()[k]
        return args(), (kwargs() if kwargs is not None else {})

    # ---- one kernel ------------------------------------------------------------------
    def run_kernel(self, k: int) -> None:
        args, kwargs = self.operands(k)
        self.store_outputs(k, self.call_kernel(k, args, kwargs))

    def call_kernel(self, k: int, args, kwargs: dict):
        """Kernel k's op on `args` (its output into a dying input's storage where it can)."""
        reuse = self.reuse[k]
        if reuse is not None and reuse.tensor not in self.keep and reuse.tensor in self.env:
            return reuse.call(self.env[reuse.tensor], args, kwargs)
        return self.program.kernel_nodes[k].target(*args, **kwargs)

    def store_outputs(self, k: int, out) -> None:
        for tid, i in self.program.kernel_outputs[k]:
            self.env[tid] = out if i is None else out[i]

    def execute_kernel(self, k: int) -> None:
        """run_kernel(k), with a failure re-raised naming the kernel, its op and module."""
        try:
            self.run_kernel(k)
        except AutotmError:
            raise
        except Exception as e:
            kern = self.graph.kernels[k]
            raise ReplayError(f"while executing kernel {k} {kern.op} ({kern.module or 'no module'}): {e}") from e

    # ---- hooks -----------------------------------------------------------------------
    def begin(self, inputs: Mapping[int, torch.Tensor]) -> None:
        """Hook: put the graph inputs and constants where the kernels read them."""
        self.env.clear()
        self.env.update(inputs)
        for tid, value in self.program.constants.items():
            self.env.setdefault(tid, value if self.device is None else value.to(self.device))

    def stop(self, k: int) -> bool:
        """Hook: True ends the iteration before kernel k, without raising (the profiler's
        replays stop once nothing after k needs timing)."""
        return False

    def before_kernel(self, k: int) -> None:
        """Hook: runs before kernel k (the executor moves tensors here)."""

    def after_kernel(self, k: int) -> None:
        """Hook: runs after kernel k, before its dead tensors are freed."""

    def free(self, tid: int) -> None:
        """Hook: `tid`'s live range ended at the kernel just run (kept tensors stay)."""
        if tid not in self.keep:
            self.env.pop(tid, None)

    def finish(self) -> dict[int, torch.Tensor]:
        """Hook: the graph outputs and the kept tensors, by tensor id, after the last kernel."""
        wanted = set(self.program.output_keys.values()) | self.keep
        out = {tid: self.env[tid] for tid in wanted if tid in self.env}
        self.env.clear()
        return out

    def stopped(self, k: int) -> dict[int, torch.Tensor]:
        """Hook: what a run stopped before kernel k returns (nothing: the outputs were not made)."""
        self.env.clear()
        return {}

    # ---- the iteration ---------------------------------------------------------------
    def run(self, inputs: Mapping[int, torch.Tensor], keep: Iterable[int] = ()) -> dict[int, torch.Tensor]:
        """Run every kernel once (the hook tree in the class doc). `inputs` maps input
        tensor ids to values. Returns `finish()`: the graph outputs and the tensors listed
        in `keep`, by tensor id."""
        self.keep = set(keep)
        self.begin(inputs)
        frees = self.program.free_after
        for k in range(len(self.program.kernel_nodes)):
            if self.stop(k):
                return self.stopped(k)
            self.before_kernel(k)
            self.execute_kernel(k)
            self.after_kernel(k)
            for tid in frees[k]:
                self.free(tid)
        return self.finish()


@dataclass
class StepResult:
    loss: torch.Tensor
    gradients: dict[str, torch.Tensor]  # parameter name -> gradient (empty unless asked for)


class TrainingState:
    """The values a training loop carries between iterations, keyed like the graph's inputs.

    Keys: "param:NAME", "buffer:NAME", "opt:NAME:SLOT". Built from a model and optimizer,
    and written back into them with `write_back` so `model.state_dict()` sees the result.
    """

    def __init__(self, graph: TrainingGraph, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        p = graph.program
        self.graph = graph
        named = dict(model.named_parameters())
        named.update(dict(model.named_buffers()))
        self.values: dict[str, torch.Tensor] = {}
        for n in p.param_names:
            self.values[f"param:{n}"] = named[n].detach().clone()
        for b in p.buffer_names:
            self.values[f"buffer:{b}"] = named[b].detach().clone()
        for n, gi in p.param_groups.items():  # the parameters the optimizer updates
            st = p.lowering.initial_state(gi, named[n], optimizer.state.get(named[n], {}))
            for s in p.lowering.state_slots(gi):
                self.values[f"opt:{n}:{s}"] = st[s].detach().clone()
        self.steps = {gi: self._step_of(gi) for gi in range(len(p.lowering.groups))}
        self.hypers = p.lowering.groups  # the hyperparameters this iteration's scalars use

    def _step_of(self, gi: int) -> float:
        p = self.graph.program
        steps = {float(self.values[f"opt:{n}:step"]) for n, g in p.param_groups.items()
                 if g == gi and f"opt:{n}:step" in self.values}
        if len(steps) > 1:
            raise ReplayError(f"parameters of optimizer group {gi} are at different step counts {sorted(steps)}")
        return steps.pop() if steps else 0.0

    def inputs(self, batch: tuple[torch.Tensor, ...], values: Mapping | None = None) -> dict:
        """Graph inputs by tensor id: carried values (from `values`, default our own), this
        iteration's optimizer scalars, and the batch."""
        values = self.values if values is None else values
        p = self.graph.program
        scalars = {}
        for gi in range(len(p.lowering.groups)):
            for s, v in p.lowering.scalars(gi, self.steps[gi] + 1, self.hypers[gi]).items():
                scalars[f"scalar:{gi}:{s}"] = v
        out = {}
        for key, tid in p.input_keys:
            if key.startswith("batch:"):
                out[tid] = batch[int(key.split(":")[1])]
            elif key.startswith("scalar:"):
                out[tid] = scalars[key]
            else:
                out[tid] = values[key]
        return out

    def update(self, outputs: Mapping[int, torch.Tensor]) -> torch.Tensor:
        p = self.graph.program
        for key, tid in p.output_keys.items():
            if key != "loss":
                self.values[key] = outputs[tid]
        for gi in self.steps:
            self.steps[gi] += 1
        return outputs[p.output_keys["loss"]]

    def write_back(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Copy the carried values into the model's tensors and the optimizer's state."""
        p = self.graph.program
        named = dict(model.named_parameters())
        named.update(dict(model.named_buffers()))
        with torch.no_grad():
            for key, v in self.values.items():
                kind, rest = key.split(":", 1)
                if kind in ("param", "buffer"):
                    named[rest].copy_(v)
            for n, gi in p.param_groups.items():
                for s in p.lowering.state_slots(gi):
                    v = self.values[f"opt:{n}:{s}"]
                    # state computed on another device (a GPU run) goes where its parameter is
                    optimizer.state[named[n]][s] = v.clone() if v.device == named[n].device else v.to(named[n].device)


def check_batch(graph: TrainingGraph, batch) -> tuple[torch.Tensor, ...]:
    """A batch must match the captured one in count, shapes and dtypes."""
    p = graph.program
    expected = [graph.tensors[tid] for key, tid in p.input_keys if key.startswith("batch:")]
    if not isinstance(batch, (tuple, list)) or len(batch) != len(expected):
        raise ReplayError(f"expected a batch of {len(expected)} tensors (inputs..., target), got {type(batch).__name__} of {len(batch) if isinstance(batch, (tuple, list)) else 1}")
    for i, (b, t) in enumerate(zip(batch, expected)):
        if tuple(b.shape) != t.shape or str(b.dtype).replace("torch.", "") != t.dtype:
            raise ReplayError(f"batch[{i}] is {str(b.dtype).replace('torch.', '')}{list(b.shape)} but the graph was captured with {t.dtype}{list(t.shape)}")
    return tuple(batch)


def replay_step(graph: TrainingGraph, state: TrainingState, batch, *, keep_gradients: bool = False,
                interpreter: Replay | None = None) -> StepResult:
    """One training iteration through the interpreter; updates `state` in place."""
    batch = check_batch(graph, batch)
    interp = interpreter or Replay(graph)
    keep = set(graph.program.gradient_of.values()) if keep_gradients else set()
    out = interp.run(state.inputs(batch), keep=keep)
    grads = {}
    if keep_gradients:
        for n, tid in graph.program.gradient_of.items():
            shape, stride, offset = graph.program.gradient_view[n]
            grads[n] = out[tid].as_strided(shape, stride, offset)
    loss = state.update(out)
    return StepResult(loss=loss, gradients=grads)
