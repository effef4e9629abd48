"""export_joint(): torch's aot_export_module joint graph and signature, traced once instead of twice."""

from __future__ import annotations

import torch
from torch import nn

from autotm.frontend.capture import _LossOf
from autotm.frontend.joint_export import _export_twice, export_joint


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
                      nn.Flatten(), nn.Linear(8 * 6 * 6, 16), nn.SiLU(), nn.Linear(16, 5))
    m[0].bias.requires_grad_(False)  # a frozen parameter: no gradient output for it
    return m


def _batch():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 5, (4,), generator=g)]


def _ops(gm):  # (torch's second trace adds dead nodes, detaches and getitems, that capture's eliminate_dead_code removes)
    gm.graph.eliminate_dead_code()
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _by_position(gm, mapping):
    names = [getattr(a, "name", None) for a in next(iter(reversed(gm.graph.nodes))).args[0]]
    return {names.index(k): v for k, v in mapping.items()}


def test_same_graph_signature_and_values_as_aot_export_module():
    model, batch = _model(), _batch()
    wrapper = _LossOf(model, nn.CrossEntropyLoss())
    ours, sig = export_joint(wrapper, batch)
    theirs, ref = _export_twice(wrapper, batch)

    assert _ops(ours) == _ops(theirs) and len(_ops(ours)) > 20
    assert sig.parameters == ref.parameters and "model.0.bias" in sig.parameters
    assert sig.buffers == ref.buffers
    assert _by_position(ours, sig.buffers_to_mutate) == _by_position(theirs, ref.buffers_to_mutate) != {}
    grads, ref_grads = sig.backward_signature.gradients_to_parameters, ref.backward_signature.gradients_to_parameters
    assert _by_position(ours, grads) == _by_position(theirs, ref_grads)
    assert "model.0.bias" not in grads.values() and "model.0.weight" in grads.values()
    assert _by_position(ours, {sig.user_outputs[0]: "loss"}) == _by_position(theirs, {ref.user_outputs[0]: "loss"})

    # run on the real values: every output (loss, new running stats, gradients) bit for bit
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    inputs = [state[n[len("model."):]].detach() for n in [*sig.parameters, *sig.buffers]] + batch
    torch.manual_seed(2)
    out = ours(*inputs)
    torch.manual_seed(2)
    ref_out = theirs(*inputs)
    assert len(out) == len(ref_out)
    assert all(torch.equal(a, b) for a, b in zip(out, ref_out))
