"""Every zoo model at the `test` preset: the captured iteration replays bit for bit like eager PyTorch."""

import pytest

from autotm.ir.graph import check
from autotm.runtime.verify import verify_replay
from autotm.zoo import MODELS, workload


@pytest.mark.parametrize("model", MODELS)
def test_zoo_model_replays_bit_identically_over_three_iterations(model):
    r = verify_replay(workload(model, "test"), iterations=3)
    check(r.graph)
    assert r.identical, r.mismatches
    assert len(r.replay_losses) == 3
    # the loss moves: the optimizer really updated the weights between iterations
    assert len(set(r.replay_losses)) > 1
