"""An optimizer update written over the parameter it consumes (torch.optim's in-place
updates, the executor's Reuse) holds one storage: the validator, the staged planners'
floors and capacity, and the executor's byte account count it once, and training at the
lower floor this gives is bit-identical to eager."""

import numpy as np
import pytest
import torch
from torch import nn

from autotm.checks.validate import validate
from autotm.frontend.capture import capture
from autotm.interpret.replay import in_place_inputs
from autotm.ir.plan import all_fast_plan
from autotm.planner import plan, smallest_feasible_budget
from autotm.planner.floor import in_place_bytes, tightest_staged_plan
from autotm.profile import profile
from eager_twin import train_twins

OPTIMIZERS = {
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
}


def wide_model():
    """One wide layer whose weight (2 MiB) outweighs every activation: its update, not the
    forward or backward, sets the smallest budget when each tensor counts apart."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 8))


def batches(n=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 256, generator=g), torch.randint(0, 8, (2,), generator=g)) for _ in range(n)]


def captured(optimizer: str):
    m = wide_model()
    return capture(m, nn.CrossEntropyLoss(), OPTIMIZERS[optimizer](m), batches()[0])


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_update_over_its_parameter_is_counted_once(optimizer, tmp_path):
    g = captured(optimizer)
    over = in_place_inputs(g)
    big = g.tensors[next(t.id for t in g.tensors if t.state_key == "param:0.weight")].nbytes
    # the parameter's last update is written over the parameter (or the value it replaces)
    updates = [k for k, t in enumerate(over) if t is not None and g.kernels[k].phase == "optimizer"
               and g.tensors[t].nbytes == big]
    assert updates
    apart = validate(all_fast_plan(g), g, in_place=False).fast_bytes
    once = validate(all_fast_plan(g), g).fast_bytes
    shared = in_place_bytes(g)
    assert np.array_equal(apart - once, shared)
    assert all(shared[k] == big for k in updates)
    # the staged floor drops by what the update shares, and planning there validates
    cm = profile(g, "sim:nvme", str(tmp_path / "c.sqlite"))
    floor = smallest_feasible_budget(g, cm, "synchronous").bytes
    apart_floor = int(validate(tightest_staged_plan(g), g, in_place=False).fast_bytes.max())
    assert floor < apart_floor
    for formulation in ("synchronous", "lru", "first-touch"):
        p = plan(g, cm, "min", formulation, time_limit=20)
        validate(p, g, budget_bytes=p.budget_bytes)
        assert p.meta.peak_fast_bytes <= p.budget_bytes < apart_floor


def test_counting_apart_rejects_what_counting_once_accepts(tmp_path):
    g = captured("sgd-momentum")
    cm = profile(g, "sim:nvme", str(tmp_path / "c.sqlite"))
    p = plan(g, cm, "min", "synchronous", time_limit=20)
    from autotm.ir.plan import PlanError

    with pytest.raises(PlanError, match="over budget"):
        validate(p, g, budget_bytes=p.budget_bytes, in_place=False)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_at_the_shared_floor_is_bit_identical_to_eager(optimizer):
    """The executor's byte account raises BudgetExceeded past the budget: a run at a budget
    under what the update needs counted apart shows that it holds the two in one storage."""
    apart_floor = int(validate(tightest_staged_plan(captured(optimizer)), captured(optimizer),
                               in_place=False).fast_bytes.max())
    run = train_twins(wide_model(), OPTIMIZERS[optimizer], nn.CrossEntropyLoss(), batches(), budget="min")
    assert run.mismatches == []
    assert run.budget_bytes < apart_floor
    assert run.bytes_to_slow > 0
