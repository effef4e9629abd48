"""Which module each kernel came from: `Kernel.module`, which `autotm graph` and the
planner's errors print ("kernel 241 (aten.convolution_backward.default) in `layer4.0.conv2
(Conv2d)`").

AOTAutograd's trace records no module stack, but it numbers every forward op (`seq_nr`) and
gives a backward op the number of the forward op it differentiates. Hooks on the modules
note the numbers each module's forward spans during the trace; an op belongs to the
innermost module whose span holds its number. The span goes into the op's
`nn_module_stack` meta, which make_fx copies onto the ops traced from it
(fx.traceback.preserve_node_meta), where `module_of` reads it. An op autograd records no
node for (BatchNorm's `num_batches_tracked` add) carries the number of the op before it,
and so may be named after the module before its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn


@dataclass
class ModuleSpans:
    """(first seq_nr, one past the last, path, class name) of each module's forward in the
    latest pass over the model (the trace runs it more than once)."""

    spans: list[tuple[int, int, str, str]] = field(default_factory=list)


def _sequence_nr() -> int | None:
    get = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
    return get() if get is not None else None  # (a torch without it: modules stay unnamed)


@contextmanager
def recording_module_spans(root: nn.Module) -> Iterator[ModuleSpans]:
    """Hooks on root's submodules (root itself not named) while the trace runs."""
    out = ModuleSpans()
    open_: list[int | None] = []
    handles = []

    def pre(path):
        def hook(mod, args):
            if not open_ and path == "":  # a new pass over the model: the spans of the last one
                out.spans.clear()
            open_.append(_sequence_nr())
        return hook

    def post(path):
        def hook(mod, args, result):
            start = open_.pop() if open_ else None
            end = _sequence_nr()
            if path and start is not None and end is not None:
                out.spans.append((start, end, path, type(mod).__name__))
        return hook

    for path, mod in root.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(path)))
        handles.append(mod.register_forward_hook(post(path)))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def annotate_modules(gm: fx.GraphModule, spans: ModuleSpans) -> None:
    """Give each op of gm that has no module stack the innermost module whose span holds its
    seq_nr (ties: the one entered last)."""
    for node in gm.graph.nodes:
        s = node.meta.get("seq_nr")
        if node.op != "call_function" or node.meta.get("nn_module_stack") or not isinstance(s, int):
            continue
        best = None
        for start, end, path, kind in spans.spans:
            if start <= s < end and (best is None or (end - start, -start) < (best[1] - best[0], -best[0])):
                best = (start, end, path, kind)
        if best is not None:
            node.meta["nn_module_stack"] = {best[2]: (best[2], best[3])}


def module_of(node: fx.Node) -> str:
    """"layer1.0.conv1 (Conv2d)" for a node traced inside that module, "" when unknown."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, kind = list(stack.values())[-1]
    path = str(path)
    for prefix in ("L['self'].model.", "model.", "L['self'].", "self."):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    kind = getattr(kind, "__name__", str(kind)).split(".")[-1]
    return f"{path} ({kind})" if path and path != "model" else kind
