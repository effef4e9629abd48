"""Training state a user touches between compiled steps (issue 35, 32.4): each change takes
effect exactly as in eager PyTorch, or the next step refuses it naming what changed. Every
test compiles a small MLP at a budget where the plan keeps some weights in slow memory and
others in fast memory, and compares with an eager copy from the same seed, bit for bit."""

import pytest
import torch
from torch import nn

import autotm
from autotm.errors import StateChanged

BUDGET = 200_000  # bytes: the synchronous plan keeps 0.weight and 2.weight slow, the rest fast


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def residency(step) -> dict[str, str]:
    """state key of every carried graph input -> "fast" or "slow", as the plan starts it."""
    g = step.graph
    return {g.tensors[tp.id].state_key: tp.initial for tp in step.plan.tensors
            if g.tensors[tp.id].producer is None and g.tensors[tp.id].state_key
            and g.tensors[tp.id].state_key.split(":")[0] in ("param", "opt")}


def compiled(model, opt, **kw):
    step = autotm.compile(model, nn.CrossEntropyLoss(), opt, batches(1)[0], memory="cpu+file", budget=BUDGET,
                          formulation="synchronous", **kw)
    res = residency(step)
    params = {k: v for k, v in res.items() if k.startswith("param:")}
    assert "slow" in params.values() and "fast" in params.values(), params
    return step


def eager_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def assert_same_training(eager, eager_opt, model, opt):
    """Parameters and optimizer state equal bit for bit (optimizer.state_dict() first)."""
    se, sc = eager_opt.state_dict(), opt.state_dict()
    assert se["param_groups"] == sc["param_groups"]
    assert se["state"].keys() == sc["state"].keys()
    for i in se["state"]:
        assert se["state"][i].keys() == sc["state"][i].keys(), i
        for slot, v in se["state"][i].items():
            assert torch.equal(v, sc["state"][i][slot]), (i, slot)
    for (n, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), n


def run_both(make_opt, change, steps=4):
    """Train eager and compiled side by side, calling change(opt, scheduler, i) on both before step i."""
    eager, model = net(), net()
    eager_opt, opt = make_opt(eager), make_opt(model)
    step = compiled(model, opt)
    try:
        state = {}
        for i, (x, y) in enumerate(batches(steps)):
            change(eager_opt, i, state.setdefault("eager", {}))
            change(opt, i, state.setdefault("compiled", {}))
            expected = eager_step(eager, eager_opt, x, y)
            assert torch.equal(step(x, y), expected), i
        assert_same_training(eager, eager_opt, model, opt)
    finally:
        step.close()


def two_groups(model, cls, **kw):
    ps = list(model.parameters())
    return cls([{"params": ps[:4]}, {"params": ps[4:], "lr": 0.02}], **kw)


@pytest.mark.parametrize("make_opt", [
    lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
    lambda m: two_groups(m, torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True),
    lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=1e-2),
    lambda m: two_groups(m, torch.optim.AdamW, lr=1e-3, weight_decay=1e-2, amsgrad=True),
], ids=["sgd-wd", "sgd-nesterov-2groups", "adam-wd", "adamw-amsgrad-2groups"])
def test_scheduler_and_hand_edits_take_effect_as_in_eager(make_opt):
    def change(opt, i, st):
        if i == 0:
            st["sched"] = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return
        st["sched"].step()  # lr: a scheduler between steps (its step() after the optimizer's, as usual)
        g = opt.param_groups[-1]
        if i == 2:  # and hand edits of every rebindable value
            g["lr"] = 0.013
            g["weight_decay"] = 0.07 if g["weight_decay"] else 0
            if "momentum" in g:
                g["momentum"] = 0.5
            else:
                g["betas"] = (0.8, 0.95)
                g["eps"] = 1e-6
    run_both(make_opt, change)
