"""The compatibility suite: models nobody on this project wrote (tests/compat_models.py),
compiled for cpu+file at 2:1 (or just over the smallest feasible budget where a tiny model's
ratio falls under one kernel's operands), 3 steps against an eager copy, bit for bit: losses,
the RNG state after each step, parameters, buffers, optimizer state. And the captured
forward and backward run eager's ATen ops (no fused kernel decomposed).

torchvision and transformers come with the `models` extra (`make test` installs it); where
one is missing its models skip, saying so.
"""

import importlib.util

import pytest
import torch

from compat_models import MODELS
from eager_twin import captured_ops, eager_ops, train_twins

NEEDS = {name: ("transformers" if name in ("gpt2", "bert", "llama", "t5") else
                None if name == "lstm" else "torchvision") for name in MODELS}
BIT_IDENTICAL = [n for n in MODELS if n != "lstm"]
# the planner's default 60 s (half for the first solve) ran out on the 1-layer LSTM's plan
# with the machine shared by three test runs; the suite tests results, not solve time
SOLVER_SECONDS = 240


def _build(name):
    package = NEEDS[name]
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[models]')")
    torch.manual_seed(0)
    return MODELS[name]()


@pytest.mark.parametrize("name", BIT_IDENTICAL)
def test_compiled_training_is_bit_identical_to_eager(name):
    model, make_optimizer, loss_fn, batches = _build(name)
    ops = eager_ops(model, loss_fn, batches[0])
    run = train_twins(model, make_optimizer, loss_fn, batches, budget="2:1", time_limit=SOLVER_SECONDS)
    assert run.mismatches == []
    assert run.bytes_to_slow > 0  # the plan moved tensors: the tiers were exercised
    assert captured_ops(run.graph) == ops


def test_lstm_differs_from_eager_only_where_eager_runs_onednn():
    """Eager's CPU LSTM is oneDNN's fused mkldnn_rnn_layer (and its backward); autotm runs
    torch._decomp's per-timestep decomposition of it (mm, sigmoid, tanh, mul, add), since
    export refuses the fused op's backward (one tensor for two biases' gradients). The
    forward rounds alike here (the losses are equal); the gradients do not: the weights
    drift from eager's in the last bits. This test pins that difference down."""
    model, make_optimizer, loss_fn, batches = _build("lstm")
    ops = eager_ops(model, loss_fn, batches[0])
    assert {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"} <= ops
    run = train_twins(model, make_optimizer, loss_fn, batches, budget="2:1", time_limit=SOLVER_SECONDS)
    assert not [m for m in run.mismatches if m.startswith(("loss", "global RNG"))]
    drifted = {m.split("'")[1].split(".")[0] for m in run.mismatches if m.startswith("state_dict")}
    assert drifted and drifted <= {"emb", "lstm", "head"}
    for m in run.mismatches:
        if "max |diff|" in m:
            assert float(m.rsplit(" ", 1)[1].rstrip(")")) < 1e-5, m
