"""oneDNN's fused LSTM layer (what eager PyTorch runs on the CPU), kept fused in the capture.

Eager's C++ `lstm` calls `mkldnn_rnn_layer` once per layer and direction, and autograd
calls `mkldnn_rnn_layer_backward` once for its backward. Two things stand between that
and a captured graph:
- the backward returns one tensor as the gradient of both biases (bias_ih, bias_hh), and
  export names each gradient by the node that makes it: it refuses two parameters with one
  (`len(gradients_to_parameters) != len(backward_output_names)`).
- the forward runs oneDNN's training primitive, which returns the workspace (what the
  forward keeps for the backward), only while autograd is enabled, and the profiler replays
  under no_grad; the op's meta function gives that workspace zero bytes, where the real
  kernel's is sized by oneDNN.
The captured graph therefore calls `autotm::mkldnn_rnn_layer_train`, which is
mkldnn_rnn_layer with autograd enabled (its inputs never require a gradient in a replay:
nothing is recorded), and carries the workspace's real size.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx as fx

_FORWARD = torch.ops.aten.mkldnn_rnn_layer.default
_BACKWARD = torch.ops.aten.mkldnn_rnn_layer_backward.default



def _layer_train(*args):
    with torch.enable_grad():
        return _FORWARD(*args)


# (the registration lasts as long as the Library object: this module's)
_LIB = torch.library.Library("autotm", "FRAGMENT")
_LIB.define("mkldnn_rnn_layer_train(Tensor input, Tensor weight0, Tensor weight1, Tensor weight2, Tensor weight3, "
            "Tensor hx_, Tensor cx_, bool reverse, int[] batch_sizes, int mode, int hidden_size, int num_layers, "
            "bool has_biases, bool bidirectional, bool batch_first, bool train) -> (Tensor, Tensor, Tensor, Tensor)")
_LIB.impl("mkldnn_rnn_layer_train", _layer_train, "CPU")
TRAIN = torch.ops.autotm.mkldnn_rnn_layer_train.default


def _layer_backward(*args, **kwargs):
    """The backward with a copy (a clone: exact) of the bias gradient for the second bias,
    as eager's AccumulateGrad copies a gradient it cannot take over."""
    with torch._C._AutoDispatchBelowAutograd():
        out = _BACKWARD(*args, **kwargs)
    return (*out[:4], out[4].clone(), *out[5:])


@contextlib.contextmanager
def distinct_bias_gradients():
    """While exporting: the second bias's gradient is a node of its own."""
    key = torch._C.DispatchKey.Autograd
    if key in _BACKWARD.py_kernels:  # (someone else's override: leave it)
        yield
        return
    _BACKWARD.py_kernels[key] = _layer_backward
    _BACKWARD._dispatch_cache.clear()
    try:
        yield
    finally:
        _BACKWARD.py_kernels.pop(key, None)
        _BACKWARD._dispatch_cache.clear()


def _real_workspace_bytes(node: fx.Node, cache: dict) -> int:
    """The workspace bytes of the real kernel for this call: it runs once on zeros (real
    ones, also in a fake capture: the size is oneDNN's to say)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def real(a):
        v = a.meta.get("val") if isinstance(a, fx.Node) else a
        if isinstance(v, torch.Tensor):
            return torch.zeros(v.shape, dtype=v.dtype)
        if isinstance(v, (list, tuple)):
            return type(v)(real(x) for x in v)
        return v

    key = str([_shape(a) for a in node.args])
    if key not in cache:
        with unset_fake_temporarily():
            cache[key] = int(TRAIN(*[real(a) for a in node.args])[3].untyped_storage().nbytes())
    return cache[key]


def _shape(a):
    v = a.meta.get("val") if isinstance(a, fx.Node) else a
    return (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else repr(v)


def train_rnn_layers(gm: fx.GraphModule) -> None:
    """Make every training-mode mkldnn_rnn_layer call mkldnn_rnn_layer_train, its workspace
    (output 3) the real kernel's size in the traced values, so that the graph plans its bytes."""
    cache: dict = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _FORWARD or node.args[-1] is not True:
            continue
        node.target = TRAIN
        val = list(node.meta["val"])
        ws = val[3]
        n = _real_workspace_bytes(node, cache)
        if ws.untyped_storage().nbytes() == n:
            continue
        with ws.fake_mode:
            sized = torch.empty(n, dtype=ws.dtype)
        val[3] = sized
        node.meta["val"] = tuple(val)
        for u in node.users:
            if u.args[1] == 3:
                u.meta["val"] = sized
