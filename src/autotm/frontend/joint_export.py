"""export_joint(): AOTAutograd's joint forward+backward export of a module, traced once.

torch's aot_export_module(trace_joint=True) traces the joint graph on fake tensors and then
traces it a second time, flattened (no tangents, no pytree in or out), with make_fx on the
caller's tensors: on real parameters that second trace runs the whole forward and backward
for real, with autograd recording, and makes a fake-tensor mode per value (half or more of
capture's seconds; resnet50 at the cpu preset peaked 3 GB above the model). capture()
traces the graph once more anyway, with the optimizer's update, so the second trace bought
nothing: here the first trace's graph is flattened in place instead (its output tuple of
(forward outputs, gradient per input) becomes one flat tuple without the gradients no input
needs). The ops, their order and the signature are those aot_export_module returns, less
the dead nodes its second trace adds (unused detaches and getitems, which capture's dead
code elimination removes), and so is the check that every parameter that needs a gradient
receives one.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn


def export_joint(mod: nn.Module, args: list[torch.Tensor]) -> tuple[fx.GraphModule, Any]:
    """What `aot_export_module(mod, args, trace_joint=True, output_loss_index=0)` returns:
    (the flattened joint graph, its GraphSignature). `mod` returns a tuple whose first
    element is the scalar loss. On a torch whose internals differ, aot_export_module itself."""
    from torch._functorch import aot_autograd as aa

    internals = _internals(aa)
    if internals is None:
        return _export_twice(mod, args)
    create_functional_call, export_function, create_graph_signature = internals

    named_parameters = dict(mod.named_parameters(remove_duplicate=False))
    named_buffers = dict(mod.named_buffers(remove_duplicate=False))
    flat, spec = pytree.tree_flatten({**named_parameters, **named_buffers})
    functional_call = create_functional_call(mod, spec, len(flat), store_orig_mod=True)
    n_outs: list[int] = []

    def fn_to_trace(*a):  # (aot_export_module's checks on the outputs, loss index 0)
        out = functional_call(*a)
        if isinstance(out, torch.Tensor):
            out = (out,)
        if not isinstance(out, (tuple, list)):
            raise RuntimeError(f"Expected forward output to be either a tensor or a list/tuple of tensors. "
                               f"found {type(out)}")
        for i, o in enumerate(out):
            if o.requires_grad and i != 0:
                raise RuntimeError(f"Found an output of the forward that requires gradients, that was not the "
                                   f"scalar loss (output {i})")
        if not out[0].requires_grad:
            raise RuntimeError("The output at index 0 was marked as the loss, but it does not require gradients")
        if out[0].numel() != 1:
            raise RuntimeError(f"We require the output marked as the loss (at index 0) to be a scalar, but it has "
                               f"shape {out[0].shape}")
        n_outs.append(len(out))
        return out

    full_args = [*flat, *args]
    fx_g, metadata, in_spec, out_spec = export_function(fn_to_trace, tuple(full_args), num_params_buffers=len(flat),
                                                        no_tangents=True, trace_joint=True)
    if not _flatten(fx_g, full_args):
        return _export_twice(mod, args)
    sig = create_graph_signature(fx_g, metadata, in_spec, out_spec,
                                 user_args_flat=pytree.arg_tree_leaves(*args), params_and_buffers_flat=flat,
                                 param_names=list(named_parameters), buffer_names=list(named_buffers),
                                 trace_joint=True, num_user_fw_outs=n_outs[-1], loss_index=0)
    return fx_g, sig


def _export_twice(mod: nn.Module, args: list[torch.Tensor]) -> tuple[fx.GraphModule, Any]:
    from torch._functorch.aot_autograd import aot_export_module

    gm, sig = aot_export_module(mod, args, trace_joint=True, output_loss_index=0)
    return cast(fx.GraphModule, gm), sig


def _internals(aa):
    """torch's private pieces this needs, or None where this torch lacks them as expected."""
    try:
        from torch._functorch._aot_autograd.input_output_analysis import create_graph_signature

        create_functional_call = aa.create_functional_call
        export_function = aa._aot_export_function
        wanted = {"num_params_buffers", "no_tangents", "trace_joint"}
        if not wanted <= set(inspect.signature(export_function).parameters):
            return None
        if "store_orig_mod" not in inspect.signature(create_functional_call).parameters:
            return None
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    return create_functional_call, export_function, create_graph_signature


def _flatten(fx_g: fx.GraphModule, full_args: list) -> bool:
    """Make fx_g take the inputs flat (no tangents) and return (*forward outputs, *gradients
    of the inputs that need one), as aot_export_module's second trace does. False where
    the graph is not of the shape that trace expects (nothing changed then)."""
    in_spec, out_spec = getattr(fx_g, "_in_spec", None), getattr(fx_g, "_out_spec", None)
    if in_spec is None or out_spec is None:
        return False
    placeholders = [n for n in fx_g.graph.nodes if n.op == "placeholder"]
    out = next(iter(reversed(fx_g.graph.nodes)))
    try:
        primals, tangents = pytree.tree_unflatten(placeholders, in_spec)
        fw_outs, gradients = pytree.tree_unflatten(list(out.args[0]), out_spec)
    except (ValueError, TypeError):
        return False
    if len(primals) != len(full_args) or any(t.users for t in tangents):
        return False
    if len(gradients) != len(full_args):
        raise AssertionError(f"len(gradients)={len(gradients)} != len(args)={len(full_args)}")
    kept = []
    for a, grad in zip(full_args, gradients):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            if grad is None:
                raise AssertionError("Found a parameter that did not receive a gradient.")
            kept.append(grad)
        elif grad is not None:
            raise AssertionError(f"expected grad to be None for non-tensor or non-requires_grad input, got {grad}")
    fx_g.graph.set_codegen(fx.graph.CodeGen())
    out.args = (tuple([*fw_outs, *kept]),)
    for t in tangents:
        fx_g.graph.erase_node(t)
    fx_g.recompile()
    return True
