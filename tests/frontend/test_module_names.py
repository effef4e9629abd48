"""Kernel.module: the module each kernel came from, forward and backward alike (the
backward op of a layer is named after the layer whose forward it differentiates)."""

import torch
from torch import nn

from autotm.frontend.capture import capture
from autotm.planner.floor import kernel_needs


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.conv(x))


def graph():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
    return capture(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), (x, y))


def test_forward_and_backward_kernels_name_their_module():
    g = graph()
    named = {(k.phase, k.op): k.module for k in g.kernels}
    assert named["forward", "aten.convolution.default"] == "0.conv (Conv2d)"
    assert named["backward", "aten.convolution_backward.default"] == "0.conv (Conv2d)"
    assert named["forward", "aten.relu.default"] == "0.act (ReLU)"
    assert named["backward", "aten.threshold_backward.default"] == "0.act (ReLU)"
    assert named["forward", "aten.addmm.default"] == "2 (Linear)"
    assert {k.module for k in g.kernels if k.phase == "backward" and k.op == "aten.mm.default"} == {"2 (Linear)"}
    assert named["forward", "aten.nll_loss_forward.default"] == "loss_fn (CrossEntropyLoss)"
    assert named["backward", "aten.nll_loss_backward.default"] == "loss_fn (CrossEntropyLoss)"
    # the update names its parameter instead (planner/floor.py's kernel_needs)
    assert {k.module for k in g.kernels if k.phase == "optimizer"} == {""}


def test_an_infeasibility_names_the_module_of_a_backward_kernel():
    g = graph()
    k = next(k.index for k in g.kernels if k.op == "aten.convolution_backward.default")
    assert "in `0.conv (Conv2d)`" in kernel_needs(g, k, 0)

