"""capture(): one training iteration (forward, backward, optimizer update) as a TrainingGraph.

How: AOTAutograd exports the functionalized joint forward+backward graph at ATen level
(parameters, buffers and the batch in; loss, updated buffers and gradients out), traced
once (joint_export.py). make_fx then traces that graph followed by the optimizer's
functional update into one fx graph, always on fake tensors, so nothing the size of the
workload is allocated. A pass over the fx graph groups values into storages (views are
aliases), numbers the kernels, and computes users and live ranges.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch import nn

from ..errors import CaptureError
from ..ir.graph import Kernel, Role, Tensor, TrainingGraph, check
from .grad_clipping import GradClip
from .joint_export import export_joint
from .module_names import annotate_modules, module_of, recording_module_spans
from .optim_lowering import OptimizerLowering, derived, lower_optimizer, used_names
from .rnn import distinct_bias_gradients, train_rnn_layers
from .split_probe import with_splittable

# Ops that return an alias of an input although their schema does not say so (unsafe_split:
# the C++ GRU cell's unsafe_chunk, whose chunks it then writes in place).
_ALIASING_OPS = {torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default,
                 torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_split_with_sizes.default,
                 torch.ops.aten.unsafe_chunk.default}


@dataclass
class Program:
    """What an interpreter needs to run the captured iteration. Not for planners."""

    gm: fx.GraphModule
    kernel_nodes: list[fx.Node]
    node_tensor: dict[fx.Node, int]  # every tensor-valued node (or view tuple) -> tensor id
    base_node: dict[int, fx.Node]  # tensor id -> node whose value is the storage's own value
    kernel_outputs: list[list[tuple[int, int | None]]]  # per kernel: (tensor id, index in tuple or None)
    free_after: list[list[int]]  # per kernel: tensor ids whose last use it is
    input_keys: list[tuple[str, int]]  # (state key, tensor id) for every graph input, in order
    output_keys: dict[str, int]  # state key -> tensor id of its value after the iteration
    gradient_of: dict[str, int]  # parameter name -> tensor id of its gradient
    gradient_view: dict[str, tuple]  # parameter name -> (shape, stride, offset) of the gradient in its storage
    constants: dict[int, torch.Tensor]  # tensor id -> value of a get_attr constant
    lowering: OptimizerLowering
    param_groups: dict[str, int]  # parameter name -> optimizer group index
    param_names: list[str]
    buffer_names: list[str]
    batch_size: int = 0
    # kernel arguments that hold a hyperparameter-derived number (optim_lowering.derived):
    # (kernel index, argument position or keyword, param group, derived name)
    hyper_args: list[tuple[int, int | str, int, str]] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    # interpret.replay.reuse_table's result, made once: the validator, planners and
    # interpreters all read it (tens of ms on a 1,000-kernel graph each time)
    reuse: tuple[Any, ...] | None = field(default=None, repr=False)


class _LossOf(nn.Module):
    """model + loss as one module, so AOTAutograd can export the joint graph.

    A tied tensor (one Parameter under several names, GPT-2's lm_head.weight and wte.weight)
    is exported as one graph input under its first name, every name reading it: the traced
    autograd then sums its gradients in the order they arrive, as eager's does. (Exported
    under each name, its gradients would be summed per name first, in another order.)
    """

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.tied = {a: c for a, c in _aliases(model.named_parameters(remove_duplicate=False)).items() if a != c}
        self.tied_buffers = {a: c for a, c in _aliases(model.named_buffers(remove_duplicate=False)).items() if a != c}

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):  # noqa: ARG002
        return super().named_parameters(prefix, recurse, remove_duplicate=True)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):  # noqa: ARG002
        return super().named_buffers(prefix, recurse, remove_duplicate=True)

    def forward(self, *batch):
        if self.tied or self.tied_buffers:
            # the aliases read the (traced) value their first name holds now
            from torch.func import functional_call

            m = self.model
            # (by attribute: while exporting, each first name holds a traced tensor, not a Parameter)
            values = {a: functools.reduce(getattr, c.split("."), m)
                      for a, c in {**self.tied, **self.tied_buffers}.items()}
            pred = functional_call(m, values, tuple(batch[:-1]), tie_weights=False, strict=False)
        else:
            pred = self.model(*batch[:-1])
        return (self.loss_fn(pred, batch[-1]),)


# Ops whose Python decomposition (torch._decomp, used while tracing) is not what eager runs
# on the CPU: dropout became native_dropout (a bool mask times a scale rounded in double)
# where eager's C++ kernel draws a float mask with bernoulli_, divides it by 1 - p and
# multiplies. LSTM: eager's C++ kernel runs oneDNN's fused mkldnn_rnn_layer per layer (and
# mkldnn_rnn_layer_backward, see rnn.py) where torch._decomp unrolls it into per-timestep
# kernels (or, when the input needs no gradient, calls the fused op in inference mode,
# without the workspace its backward needs). GRU and RNN: the decompositions add kernels
# eager does not run (a cat; sums over broadcast dimensions).
_PYTHON_DECOMPOSED = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
                      "lstm", "gru", "rnn_tanh", "rnn_relu")


@contextlib.contextmanager
def _decompose_as_eager():
    """Export decomposes every op that has a composite (CompositeImplicitAutograd) kernel,
    also where eager PyTorch runs a fused one: SiLU's and Mish's backward became 5-8
    pointwise kernels (not bit-identical) where eager calls aten.silu_backward. While we
    export, an op is decomposed where eager's autograd would decompose it (the rule
    torch.compile's functionalization uses), and by its C++ composite kernel, as eager does
    (_PYTHON_DECOMPOSED)."""
    try:
        from torch._subclasses import functional_tensor as ft

        export_rule = ft._can_decompose_fast
    except (ImportError, AttributeError):  # an older torch: export's own rule
        yield
        return

    def eager_rule(func, export, pre_dispatch):
        return export_rule(func, False if not pre_dispatch else export, pre_dispatch)

    keys = (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd)
    removed = []
    for name in _PYTHON_DECOMPOSED:
        packet = getattr(torch.ops.aten, name, None)
        for op in [getattr(packet, o) for o in packet.overloads()] if packet is not None else ():
            for key in keys:
                if key in op.py_kernels:
                    removed.append((op, key, op.py_kernels.pop(key)))
                    op._dispatch_cache.clear()
    ft._can_decompose_fast = eager_rule
    try:
        with distinct_bias_gradients():
            yield
    finally:
        ft._can_decompose_fast = export_rule
        for op, key, fn in removed:
            op.py_kernels[key] = fn
            op._dispatch_cache.clear()


@dataclass(frozen=True)
class _ModelParameters:
    alias: dict[str, str]  # every name of a parameter -> the name the graph carries it under
    groups: dict[str, int]  # trainable parameter (carried name) -> its optimizer group


def _aliases(named) -> dict[str, str]:
    """name -> the first name of the same tensor (tied weights share one)."""
    first: dict[int, str] = {}
    out = {}
    for n, t in named:
        out[n] = first.setdefault(id(t), n)
    return out


def _model_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> _ModelParameters:
    """Which parameters train and in which optimizer group; refuse what eager would do otherwise.

    Frozen parameters (requires_grad=False) are carried unchanged, in the optimizer or not (eager's
    optimizer skips a parameter without a gradient). A trainable parameter missing from the
    optimizer is refused: eager would accumulate a .grad for it every step that autotm never makes.
    """
    alias = _aliases(model.named_parameters(remove_duplicate=False))
    by_id = {id(p): n for n, p in model.named_parameters()}
    groups: dict[str, int] = {}
    for gi, g in enumerate(optimizer.param_groups):
        for p in g["params"]:
            if id(p) not in by_id:
                raise CaptureError(f"optimizer group {gi} holds a tensor of shape {list(p.shape)} that is not a "
                                   "parameter of the model")
            if p.requires_grad:
                groups[by_id[id(p)]] = gi
    missing = [n for n, p in model.named_parameters() if p.requires_grad and n not in groups]
    if missing:
        raise CaptureError(f"trainable parameters in no optimizer group: {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''}; freeze them (requires_grad_(False)) or add them "
                           "to the optimizer")
    return _ModelParameters(alias=alias, groups=groups)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _check_batch(batch) -> tuple[torch.Tensor, ...]:
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise CaptureError("example_batch must be a tuple (inputs..., target) of at least two tensors")
    for i, b in enumerate(batch):
        if not isinstance(b, torch.Tensor):
            raise CaptureError(f"example_batch[{i}] is a {type(b).__name__}, not a tensor")
    return tuple(batch)


def _failing_op_and_module(exc: BaseException, model: nn.Module) -> tuple[str, str]:
    """Walk the traceback for the innermost ATen op being dispatched and nn.Module running."""
    names = {id(m): (n or type(m).__name__) for n, m in model.named_modules()}
    op, module = "", ""
    tb = exc.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_locals
        for key in ("func", "op", "func_overload"):
            v = f.get(key)
            if isinstance(v, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                op = str(v)
        s = f.get("self")
        if isinstance(s, nn.Module) and id(s) in names:
            module = f"{names[id(s)]} ({type(s).__name__})"
        tb = tb.tb_next
    if not op:
        # fake tensors raise for data-dependent ops with the op in the message
        for word in str(exc).replace("(", " ").replace(")", " ").split():
            if word.startswith("aten."):
                op = word.rstrip(".,:")
                break
    return op or "an unknown op", module or "an unknown module"


def capture(
    model: nn.Module,
    loss_fn,
    optimizer: torch.optim.Optimizer,
    example_batch: Sequence[torch.Tensor],
    *,
    name: str = "model",
    clip: GradClip | None = None,
) -> TrainingGraph:
    """Capture one training iteration of `model` as a TrainingGraph.

    Args:
        model: the network; `model(*example_batch[:-1])` gives the prediction.
        loss_fn: `loss_fn(prediction, example_batch[-1])` gives a scalar loss.
        optimizer: a torch.optim.SGD, Adam or AdamW over the model's parameters.
        example_batch: (inputs..., target). Real tensors, or fake tensors (from a
            FakeTensorMode the model was also built in) to capture without allocating.
        clip: gradient clipping between backward and update (`clip_grad_norm_` or
            `clip_grad_value_` over `model.parameters()`, as eager's loop would call it).

    Returns:
        The TrainingGraph; `graph.program` runs it (see autotm.replay).

    Example:
        >>> g = autotm.capture(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1, momentum=0.9), (x, y))
        >>> g.peak_live_bytes
    """
    t0 = time.perf_counter()
    batch = _check_batch(example_batch)
    lowering = lower_optimizer(optimizer)
    model_params = _model_parameters(model, optimizer)
    param_groups = model_params.groups
    buffer_alias = _aliases(model.named_buffers(remove_duplicate=False))
    named_params = list(model.named_parameters())
    fake = any(_is_fake(t) for t in batch) or any(_is_fake(p) for _, p in named_params)

    wrapper = _LossOf(model, loss_fn)
    try:
        with _decompose_as_eager(), recording_module_spans(wrapper) as spans:
            joint, sig = export_joint(wrapper, list(batch))
        annotate_modules(joint, spans)
    except CaptureError:
        raise
    except Exception as e:  # any op that tracing cannot handle
        if "did not receive a gradient" in str(e):
            raise CaptureError("a trainable parameter does not reach the loss (torch's export needs a gradient for "
                               "each): freeze it with requires_grad_(False)") from e
        op, module = _failing_op_and_module(e, model)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(f"cannot capture op {op} in module {module}: {first}") from e

    # Map the joint graph's outputs to their meaning.
    out_names = [a.name if isinstance(a, fx.Node) else None for a in next(iter(reversed(joint.graph.nodes))).args[0]]
    strip = lambda s: s[len("model."):] if s.startswith("model.") else s  # noqa: E731
    mutated = {o: strip(b) for o, b in sig.buffers_to_mutate.items()}
    grads_of = {o: strip(p) for o, p in sig.backward_signature.gradients_to_parameters.items()}
    loss_name = sig.user_outputs[0]
    # Tied parameters (one tensor under several names) are exported once, under their first name.
    sig_names = [strip(p) for p in sig.parameters]
    unknown = [n for n in sig_names if n not in model_params.alias]
    if unknown:
        raise CaptureError(f"the traced model reads parameters the model does not list: {', '.join(unknown[:5])}")
    sig_params = list(dict.fromkeys(model_params.alias[n] for n in sig_names))
    sig_buffer_names = [strip(b) for b in sig.buffers]
    sig_buffers = list(dict.fromkeys(buffer_alias.get(b, b) for b in sig_buffer_names))
    shared_mutated = sorted({b for b in mutated.values() if buffer_alias.get(b, b) != b
                             or sum(buffer_alias.get(x, x) == b for x in sig_buffer_names) > 1})
    if shared_mutated:
        raise CaptureError(f"a buffer registered under several names is updated by the forward: {shared_mutated[0]}")
    grad_parts: dict[str, list[str]] = {}
    for o, n in grads_of.items():
        grad_parts.setdefault(model_params.alias[n], []).append(o)
    doubled = [n for n, parts in grad_parts.items() if len(parts) > 1]
    if doubled:  # (_LossOf exports a tied tensor once)
        raise CaptureError(f"parameter {doubled[0]} has {len(grad_parts[doubled[0]])} gradients in the export")
    # (export refuses a trainable parameter the loss does not reach; should one come without a
    # gradient all the same, eager's optimizer skips it, as here)
    param_groups = {n: gi for n, gi in param_groups.items() if n in grad_parts}
    trainable = [n for n in sig_params if n in param_groups]

    state_model = dict(model.named_parameters())
    state_model.update(dict(model.named_buffers()))
    slots = {n: lowering.state_slots(param_groups[n]) for n in trainable}
    n_scalar_groups = len(optimizer.param_groups)

    # Inputs of the combined trace, flattened; keys say what each one is.
    input_keys: list[str] = []
    inputs: list[torch.Tensor] = []
    for n in sig_params:
        input_keys.append(f"param:{n}")
        inputs.append(state_model[n].detach())
    for b in sig_buffers:
        input_keys.append(f"buffer:{b}")
        inputs.append(state_model[b].detach())
    opt_state = optimizer.state
    for n in trainable:
        p = state_model[n]
        st = lowering.initial_state(param_groups[n], p, opt_state.get(p, {}))
        if fake:
            st = {k: _as_fake_like(v, p) for k, v in st.items()}
        for s in slots[n]:
            input_keys.append(f"opt:{n}:{s}")
            inputs.append(st[s])
    for gi in range(n_scalar_groups):
        for s, v in lowering.scalars(gi, 1.0).items():
            input_keys.append(f"scalar:{gi}:{s}")
            inputs.append(_as_fake_like(v, batch[0]) if fake else v)
    for i, b in enumerate(batch):
        input_keys.append(f"batch:{i}")
        inputs.append(b)

    n_p, n_b = len(sig_params), len(sig_buffers)
    # clip_grad_norm_(model.parameters()) takes the gradients in the model's parameter order
    clip_order = [n for n, _ in named_params if n in param_groups]
    param_at = {n: i for i, n in enumerate(sig_params)}
    buffer_at = {b: i for i, b in enumerate(sig_buffers)}
    # traced with odd stand-in hyperparameters, so that the kernel arguments derived from
    # them can be found (and rebound at every step when the optimizer's values change)
    traced = lowering.with_sentinels()

    def iteration(*flat):
        params = flat[:n_p]
        buffers = flat[n_p:n_p + n_b]
        pos = n_p + n_b
        states = {}
        for n in trainable:
            states[n] = dict(zip(slots[n], flat[pos:pos + len(slots[n])]))
            pos += len(slots[n])
        scalars = []
        for gi in range(n_scalar_groups):
            k = len(lowering.scalar_slots(gi))
            scalars.append(dict(zip(lowering.scalar_slots(gi), flat[pos:pos + k])))
            pos += k
        user = flat[pos:]
        outs = fx.Interpreter(joint).run(*[params[param_at[model_params.alias[n]]] for n in sig_names],
                     *[buffers[buffer_at[buffer_alias.get(b, b)]] for b in sig_buffer_names], *user)
        by_name = dict(zip(out_names, outs))
        loss = by_name[loss_name]
        new_buffers = {mutated[o]: by_name[o] for o in out_names if o in mutated}
        grads = {n: by_name[parts[0]] for n, parts in grad_parts.items()}
        if clip is not None:  # (eager's .grad after the clip is what the optimizer reads)
            grads = dict(zip(clip_order, clip.apply([grads[n] for n in clip_order],
                                                    [params[param_at[n]] for n in clip_order])))
        new_params, new_states = [], []
        for n in trainable:
            gi = param_groups[n]
            np_, ns = traced.update(gi, params[param_at[n]], grads[n], states[n], scalars[gi])
            new_params.append(np_)
            new_states.append([ns[s] for s in slots[n]])
        flat_states = [t for st in new_states for t in st]
        # read-only state (frozen parameters, buffers the forward does not write) comes out
        # as it went in: carried between iterations like the rest, never overwritten
        frozen_params = [params[param_at[n]] for n in sig_params if n not in param_groups]
        all_buffers = [new_buffers.get(b, buffers[buffer_at[b]]) for b in sig_buffers]
        return (loss, *new_params, *frozen_params, *all_buffers, *flat_states, *[grads[n] for n in trainable])

    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with fx.traceback.preserve_node_meta():
            gm = make_fx(iteration, tracing_mode="real" if fake else "fake")(*inputs)
    except Exception as e:
        op, module = _failing_op_and_module(e, model)
        raise CaptureError(f"cannot capture the optimizer update ({op}): {e}") from e

    # Output keys, and drop the gradients from the outputs (they die inside the optimizer).
    out_node = next(iter(reversed(gm.graph.nodes)))
    flat_out = list(out_node.args[0])
    loss_node = flat_out[0]
    cursor = 1
    out_key_nodes: dict[str, fx.Node] = {"loss": loss_node}
    for n in trainable + [n for n in sig_params if n not in param_groups]:
        out_key_nodes[f"param:{n}"] = flat_out[cursor]
        cursor += 1
    for b in sig_buffers:
        out_key_nodes[f"buffer:{b}"] = flat_out[cursor]
        cursor += 1
    for n in trainable:
        for s in slots[n]:
            out_key_nodes[f"opt:{n}:{s}"] = flat_out[cursor]
            cursor += 1
    grad_nodes = {n: flat_out[cursor + i] for i, n in enumerate(trainable)}
    out_node.args = (tuple(out_key_nodes.values()),)
    gm.graph.eliminate_dead_code()
    train_rnn_layers(gm)
    hyper_nodes = _bind_hyperparameters(gm, traced, lowering, {param_groups[n] for n in trainable})
    gm.recompile()

    graph = _build(gm, input_keys, out_key_nodes, grad_nodes, lowering, param_groups, sig_params, sig_buffers,
                   name=name, fake=fake, t0=t0, batch_size=int(batch[0].shape[0]) if batch[0].dim() else 0,
                   parameters=sum(state_model[n].numel() for n in sig_params))
    index = {node: k for k, node in enumerate(graph.program.kernel_nodes)}
    graph.program.hyper_args = [(index[nd], where, gi, nm) for nd, where, gi, nm in hyper_nodes]
    check(graph)
    return with_splittable(graph)


def _bind_hyperparameters(gm: fx.GraphModule, traced: OptimizerLowering, lowering: OptimizerLowering,
                          groups_used: set[int]) -> list[tuple[fx.Node, int | str, int, str]]:
    """Find the kernel arguments that hold a number derived from `traced`'s stand-in
    hyperparameters, put the real ones (`lowering`'s) there, and return where they are:
    (node, argument position or keyword, group, derived name)."""
    by_value: dict[float, tuple[int, str]] = {}
    for gi in groups_used:
        d = derived(traced.groups[gi])
        for nm in used_names(traced.kind, traced.groups[gi]):
            if d[nm] in by_value:
                raise CaptureError(f"optimizer hyperparameters: stand-in values collide ({nm} of group {gi})")
            by_value[d[nm]] = (gi, nm)
    found: list[tuple[fx.Node, int | str, int, str]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        places = [(i, a) for i, a in enumerate(node.args)] + list(node.kwargs.items())
        for where, a in places:
            if type(a) is float and a in by_value:
                gi, nm = by_value[a]
                found.append((node, where, gi, nm))
    seen = {(gi, nm) for _, _, gi, nm in found}
    missing = sorted(set(by_value.values()) - seen)
    if missing:  # the trace transformed a value: rebinding could not follow it
        gi, nm = missing[0]
        raise CaptureError(f"optimizer hyperparameter {nm} of param group {gi} was not found in the traced update")
    for node, where, gi, nm in found:
        value = derived(lowering.groups[gi])[nm]
        if isinstance(where, int):
            node.update_arg(where, value)
        else:
            node.update_kwarg(where, value)
    return found


def _as_fake_like(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor made outside a FakeTensorMode, converted into the mode `like` lives in."""
    if _is_fake(v):
        return v
    mode = like.fake_mode
    return mode.from_tensor(v)


def _is_view(node: fx.Node) -> bool:
    t = node.target
    if t in _ALIASING_OPS:
        return True
    if isinstance(t, torch._ops.OpOverload):
        rets = t._schema.returns
        return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
    return False


def _storage_key(v) -> int | None:
    if isinstance(v, torch.Tensor):
        return v.untyped_storage()._cdata
    return None


def _fmt(a) -> str:
    if isinstance(a, fx.Node):
        a = a.meta.get("val")
    if isinstance(a, torch.Tensor):
        dt = str(a.dtype).replace("torch.", "")
        off = f"+{a.storage_offset()}" if a.storage_offset() else ""
        return f"{dt}{list(a.shape)}/{list(a.stride())}{off}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    return repr(a)


def _signature(node: fx.Node) -> str:
    parts = [_fmt(a) for a in node.args] + [f"{k}={_fmt(v)}" for k, v in sorted(node.kwargs.items())]
    return f"{node.target}({', '.join(parts)})"


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def _flops(node: fx.Node) -> int:
    from torch.utils.flop_counter import flop_registry

    out = node.meta.get("val")
    packet = getattr(node.target, "overloadpacket", None)
    if packet in flop_registry:
        try:
            args = fx.node.map_aggregate(node.args, _val)
            kwargs = fx.node.map_aggregate(node.kwargs, _val)
            return int(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:
            pass
    # elementwise and reductions: one operation per element of the largest operand
    sizes = [v.numel() for v in _tensors(out)]
    sizes += [_val(a).numel() for a in node.all_input_nodes if isinstance(_val(a), torch.Tensor)]
    return int(max(sizes, default=0))


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


def _build(gm, input_keys, out_key_nodes, grad_nodes, lowering, param_groups, sig_params, sig_buffers, *,
           name, fake, t0, batch_size, parameters) -> TrainingGraph:
    """Group fx values into storages, number kernels, compute users and live ranges."""
    nodes = list(gm.graph.nodes)
    storage_of_key: dict[int, int] = {}  # storage identity -> tensor id
    node_tensor: dict[fx.Node, int] = {}
    base_node: dict[int, fx.Node] = {}
    info: list[dict] = []  # per tensor id: name, nbytes, dtype, shape, stride, role, producer, key
    constants: dict[int, torch.Tensor] = {}
    kernel_nodes: list[fx.Node] = []
    kernel_outputs: list[list[tuple[int, int | None]]] = []
    kernel_inputs: list[list[int]] = []

    def new_tensor(v: torch.Tensor, nm: str, role, producer, key=None) -> int:
        tid = len(info)
        sk = _storage_key(v)
        if sk in storage_of_key:
            raise CaptureError(f"value {nm} reuses the storage of tensor {info[storage_of_key[sk]]['name']}: an in-place op survived functionalization")
        storage_of_key[sk] = tid
        st = v.untyped_storage()
        info.append(dict(name=nm, nbytes=int(st.nbytes()), dtype=str(v.dtype).replace("torch.", ""),
                         shape=tuple(int(s) for s in v.shape), stride=tuple(int(s) for s in v.stride()),
                         role=role, producer=producer, key=key))
        return tid

    input_role = {"param": Role.WEIGHT, "buffer": Role.BUFFER, "opt": Role.OPTIMIZER_STATE,
                  "scalar": Role.SCALAR, "batch": Role.INPUT}
    placeholder_i = 0
    for node in nodes:
        if node.op == "placeholder":
            key = input_keys[placeholder_i]
            placeholder_i += 1
            tid = new_tensor(node.meta["val"], key, input_role[key.split(":")[0]], None, key)
            node_tensor[node] = tid
            base_node[tid] = node
        elif node.op == "get_attr":
            v = getattr(gm, node.target)
            if isinstance(v, torch.Tensor):
                tid = new_tensor(node.meta.get("val", v), f"constant:{node.target}", Role.CONSTANT, None, f"constant:{node.target}")
                node_tensor[node] = tid
                base_node[tid] = node
                constants[tid] = v
        elif node.op == "call_function":
            val = node.meta.get("val")
            if node.target is operator.getitem:
                parent = node.args[0]
                if parent in node_tensor:  # an element of a view tuple (split); kernel tuples are not in the map
                    node_tensor[node] = node_tensor[parent]
                continue  # kernel outputs are registered with their kernel
            if _is_view(node):
                src = [a for a in node.all_input_nodes if a in node_tensor]
                if not src:
                    raise CaptureError(f"view {node.name} ({node.target}) of an unknown tensor")
                tid = node_tensor[src[0]]
                if isinstance(val, torch.Tensor) and _storage_key(val) in storage_of_key and storage_of_key[_storage_key(val)] != tid:
                    tid = storage_of_key[_storage_key(val)]
                node_tensor[node] = tid
                continue
            if not isinstance(node.target, torch._ops.OpOverload):
                raise CaptureError(f"unexpected call {node.target} in the captured graph ({module_of(node)})")
            k = len(kernel_nodes)
            kernel_nodes.append(node)
            ins: list[int] = []
            for a in node.all_input_nodes:
                if a in node_tensor and node_tensor[a] not in ins:
                    ins.append(node_tensor[a])
            kernel_inputs.append(ins)
            outs: list[tuple[int, int | None]] = []
            if isinstance(val, torch.Tensor):
                tid = new_tensor(val, node.name, None, k)
                node_tensor[node] = tid
                base_node[tid] = node
                outs.append((tid, None))
            elif isinstance(val, (tuple, list)):
                getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
                for i, v in enumerate(val):
                    if not isinstance(v, torch.Tensor):
                        continue
                    g = getitems.get(i)
                    same = [j for j in range(i) if isinstance(val[j], torch.Tensor)
                            and _storage_key(val[j]) == _storage_key(v)]
                    if same:  # one tensor returned twice (mkldnn_rnn_layer_backward's bias gradient)
                        tid = next(t for t, j in outs if j == same[0])
                    else:
                        tid = new_tensor(v, g.name if g is not None else f"{node.name}[{i}]", None, k)
                        outs.append((tid, i))
                    if g is not None:
                        node_tensor[g] = tid
                        base_node.setdefault(tid, g)
            kernel_outputs.append(outs)

    n_k = len(kernel_nodes)
    users: list[list[int]] = [[] for _ in info]
    for k, ins in enumerate(kernel_inputs):
        for tid in ins:
            users[tid].append(k)

    # Phases, by position: forward up to the loss, backward up to the last gradient.
    loss_tid = node_tensor[out_key_nodes["loss"]]
    loss_k = info[loss_tid]["producer"]
    grad_tids = {n: node_tensor[g] for n, g in grad_nodes.items()}
    last_grad_k = max((info[t]["producer"] or 0) for t in grad_tids.values()) if grad_tids else loss_k
    output_tids: dict[str, int] = {key: node_tensor[nd] for key, nd in out_key_nodes.items()}
    out_role = {"param": Role.WEIGHT, "buffer": Role.BUFFER, "opt": Role.OPTIMIZER_STATE, "loss": Role.OUTPUT}
    role_of_output = {tid: out_role[key.split(":")[0]] for key, tid in output_tids.items()}
    key_of_output = {tid: key for key, tid in output_tids.items()}

    def phase(k: int) -> str:
        return "forward" if k <= loss_k else ("backward" if k <= last_grad_k else "optimizer")

    tensors: list[Tensor] = []
    free_after: list[list[int]] = [[] for _ in range(n_k)]
    last_k = max(n_k - 1, 0)
    for tid, d in enumerate(info):
        u = users[tid]
        is_out = tid in role_of_output
        first = d["producer"] if d["producer"] is not None else 0
        last = last_k if is_out else max([first] + u)
        role = d["role"]
        if role is None:
            role = role_of_output.get(tid) or {"forward": Role.ACTIVATION, "backward": Role.GRADIENT,
                                              "optimizer": Role.UPDATE}[phase(d["producer"])]
        if not is_out and n_k:
            free_after[last].append(tid)
        tensors.append(Tensor(id=tid, name=d["name"], nbytes=d["nbytes"], dtype=d["dtype"], shape=d["shape"],
                              stride=d["stride"], role=role, producer=d["producer"], users=tuple(u),
                              live=(first, last), is_graph_output=is_out,
                              state_key=d["key"] or key_of_output.get(tid)))

    kernels = []
    for k, node in enumerate(kernel_nodes):
        touched = sum(v.numel() * v.element_size() for a in node.all_input_nodes for v in _tensors(_val(a)))
        touched += sum(v.numel() * v.element_size() for v in _tensors(node.meta.get("val")))
        kernels.append(Kernel(index=k, op=str(node.target), inputs=tuple(kernel_inputs[k]),
                              outputs=tuple(t for t, _ in kernel_outputs[k]), signature=_signature(node),
                              flops=_flops(node), bytes_touched=int(touched), module=module_of(node),
                              phase=phase(k), node=node.name))

    program = Program(gm=gm, kernel_nodes=kernel_nodes, node_tensor=node_tensor, base_node=base_node,
                      kernel_outputs=kernel_outputs, free_after=free_after,
                      input_keys=[(key, node_tensor[n]) for key, n in zip(input_keys, [n for n in nodes if n.op == "placeholder"])],
                      output_keys=output_tids, gradient_of=grad_tids,
                      gradient_view={n: (tuple(g.meta["val"].shape), tuple(g.meta["val"].stride()),
                                         g.meta["val"].storage_offset()) for n, g in grad_nodes.items()}, constants=constants, lowering=lowering,
                      param_groups=param_groups, param_names=list(sig_params), buffer_names=list(sig_buffers),
                      batch_size=batch_size)
    return TrainingGraph(name=name, kernels=tuple(kernels), tensors=tuple(tensors), parameters=int(parameters),
                         program=program, capture_seconds=time.perf_counter() - t0, fake=fake)

