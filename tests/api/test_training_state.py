"""Training state a user touches between compiled steps (issue 35, 32.4): each change takes
effect exactly as in eager PyTorch, or the next step refuses it naming what changed. Every
test compiles a small MLP at a budget where the plan keeps some weights in slow memory and
others in fast memory, and compares with an eager copy from the same seed, bit for bit."""

import copy
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import autotm
from autotm.errors import ReplayError, StateChanged
from autotm.errors import SessionFailed

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


def test_edits_between_steps_take_effect_as_in_eager(tmp_path):
    """load_state_dict on the model and the optimizer, in-place edits and replaced tensors,
    for weights planned fast and slow."""
    eager, model = net(), net()
    make = lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)  # noqa: E731
    eager_opt, opt = make(eager), make(model)
    step = compiled(model, opt)
    res = residency(step)
    slow = next(k[len("param:"):] for k, v in res.items() if k.startswith("param:") and v == "slow")
    fast = next(k[len("param:"):] for k, v in res.items() if k.startswith("param:") and v == "fast")
    data = batches(6)
    try:
        def both(fn):
            fn(eager, eager_opt)
            fn(model, opt)

        for i, (x, y) in enumerate(data):
            if i == 1:  # a checkpoint of another run loaded into both
                other = net()
                with torch.no_grad():
                    for p_ in other.parameters():
                        p_.mul_(0.9)
                sd = other.state_dict()
                both(lambda m, o, sd=sd: m.load_state_dict(sd))
            if i == 2:  # in-place edits after state_dict(): of a slow weight and a fast one
                def edit(m, o):
                    m.state_dict()
                    with torch.no_grad():
                        m.get_parameter(slow).mul_(0.5)
                        m.get_parameter(fast).add_(0.25)
                both(edit)
            if i == 3:  # the optimizer's own checkpoint, from the eager run, loaded into both
                osd = copy.deepcopy(eager_opt.state_dict())
                both(lambda m, o, osd=osd: o.load_state_dict(copy.deepcopy(osd)))  # (each its own tensors)
            if i == 4:  # a fast weight assigned a new tensor; an edit of a fast one, no state_dict() first
                def assign(m, o):
                    with torch.no_grad():
                        m.get_parameter(fast).data = m.get_parameter(fast).detach() * 2
                        m.get_parameter("4.bias").sub_(0.1)
                both(assign)
            if i == 5:  # a forward pass outside the compiled step (validation) sees the current weights
                with torch.no_grad():
                    assert torch.equal(model(x), eager(x))
            expected = eager_step(eager, eager_opt, x, y)
            assert torch.equal(step(x, y), expected), i
        assert_same_training(eager, eager_opt, model, opt)
    finally:
        step.close()


def test_changes_a_compiled_step_cannot_follow_are_refused_by_name():
    eager, model = net(), net()
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)  # noqa: E731
    eager_opt, opt = make(eager), make(model)
    step = compiled(model, opt)
    slow = next(k[len("param:"):] for k, v in residency(step).items() if k.startswith("param:") and v == "slow")
    data = batches(3)
    x, y = data[0]
    assert torch.equal(step(x, y), eager_step(eager, eager_opt, x, y))
    g = opt.param_groups[0]
    refused = [
        (lambda: model.eval(), lambda: model.train(), "module the model .*eval mode"),
        (lambda: model[2].eval(), lambda: model[2].train(), "module 2 .*eval mode"),
        (lambda: model[0].weight.requires_grad_(False), lambda: model[0].weight.requires_grad_(True),
         "parameter 0.weight: requires_grad"),
        (lambda: g.update(momentum=0.0), lambda: g.update(momentum=0.9), "group 0: momentum changed"),
        (lambda: g.update(nesterov=True), lambda: g.update(nesterov=False), "group 0: nesterov"),
        (lambda: g.update(dampening=0.1), lambda: g.update(dampening=0), "group 0: dampening"),
        (lambda: g.update(weight_decay=0.1), lambda: g.update(weight_decay=0), "group 0: weight_decay"),
        (lambda: g.update(maximize=True), lambda: g.update(maximize=False), "group 0: maximize"),
        (lambda: opt.add_param_group({"params": [nn.Parameter(torch.zeros(3))]}), lambda: opt.param_groups.pop(),
         "2 param groups now, 1 when compiled"),
    ]
    for change, undo, match in refused:
        change()
        with pytest.raises(StateChanged, match=match):
            step(*data[1])
        undo()
    # an in-place edit of a slow weight whose copy in the model is a step old
    with torch.no_grad():
        model.get_parameter(slow).mul_(0.5)
    with pytest.raises(StateChanged, match=f"{slow} was changed between steps, but the plan keeps it in slow memory"):
        step(*data[1])
    with torch.no_grad():
        model.get_parameter(slow).mul_(2.0)  # (the refused edit stays out of the run: nothing was taken)
    model.load_state_dict(model.state_dict())  # (and the model's copy is current again: a no-op edit)
    for x, y in data[1:]:  # refused changes left the run as it was
        assert torch.equal(step(x, y), eager_step(eager, eager_opt, x, y))
    assert_same_training(eager, eager_opt, model, opt)
    step.close()
    with pytest.raises(SessionFailed, match="closed"):
        step(*data[0])


def _fail_at(step, k, exc):
    """Make kernel k of the compiled step raise `exc` (a fault injected into the executor)."""
    ex = step.session.executor
    kc = ex.kernels[k]

    fired = []

    def boom(*a, **kw):
        if fired:  # (once)
            return kc.target(*a, **kw)
        fired.append(k)
        if exc is KeyboardInterrupt:  # a real Ctrl-C, delivered while kernel k runs
            os.kill(os.getpid(), signal.SIGINT)
            return kc.target(*a, **kw)
        raise exc("injected fault")
    ex.kernels[k] = dataclasses.replace(kc, target=boom, reuse=None)


@pytest.mark.parametrize("where", ["forward", "update"])
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_failed_or_interrupted_step_leaves_the_last_completed_state_or_refuses(where, exc):
    # (Python's Ctrl-C handler, also when the suite runs in a background job that ignores SIGINT)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _fail_and_go_on(where, exc)
    finally:
        signal.signal(signal.SIGINT, old_handler)


def _fail_and_go_on(where, exc):
    eager, model = net(), net()
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)  # noqa: E731
    eager_opt, opt = make(eager), make(model)
    step = compiled(model, opt)
    data = batches(4)
    try:
        for x, y in data[:2]:
            assert torch.equal(step(x, y), eager_step(eager, eager_opt, x, y))
        ex = step.session.executor
        k = 0 if where == "forward" else len(step.graph.kernels) - 1
        assert (k < ex.first_overwrite) == (where == "forward")
        _fail_at(step, k, exc)
        with pytest.raises(KeyboardInterrupt if exc is KeyboardInterrupt else ReplayError):
            step(*data[2])
        if where == "update" and exc is RuntimeError:
            # the update had begun overwriting the weights: no state to give, and it says so
            with pytest.raises(SessionFailed, match="step 3 failed .* load a checkpoint"):
                model.state_dict()
            with pytest.raises(SessionFailed, match="step 3 failed"):
                opt.state_dict()
            with pytest.raises(SessionFailed, match="step 3 failed"):
                step(*data[2])
            return
        if where == "update":  # Ctrl-C once the update had begun: the step was finished first
            eager_step(eager, eager_opt, *data[2])
        assert_same_training(eager, eager_opt, model, opt)  # (optimizer.state_dict() first)
        for x, y in data[3:]:  # and training goes on from there
            assert torch.equal(step(x, y), eager_step(eager, eager_opt, x, y))
        assert_same_training(eager, eager_opt, model, opt)
    finally:
        step.close()


CHECKPOINTING_CHILD = textwrap.dedent("""
    import sys, torch
    from torch import nn
    import autotm
    from test_training_state import BUDGET, batches, net

    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    step = autotm.compile(model, nn.CrossEntropyLoss(), opt, batches(1)[0], memory="cpu+file", budget=BUDGET,
                          formulation="synchronous")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    data = batches(6)
    for x, y in data[:3]:
        step(x, y)
        sched.step()
    # (the optimizer's state first: the order that used to lose slow-resident momentum)
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), "model": model.state_dict()}, sys.argv[1])
    print("SAVED", flush=True)
    while True:  # training on until killed
        for x, y in data[3:]:
            step(x, y)
""")


def test_checkpoint_survives_sigkill_and_resumes_eagers_trajectory(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    script = tmp_path / "child.py"
    script.write_text(CHECKPOINTING_CHILD)
    # tests/, where its helpers are
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(__file__))] + sys.path))
    p = subprocess.Popen([sys.executable, str(script), str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("SAVED"), (line, p.stderr.read() if p.poll() is not None else "")
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # resumed here, a new process, from the checkpoint
    saved = torch.load(ckpt)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    step = compiled(model, opt)
    # eager, uninterrupted
    eager = net()
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    eager_sched = torch.optim.lr_scheduler.StepLR(eager_opt, step_size=1, gamma=0.7)
    data = batches(6)
    try:
        for x, y in data[:3]:
            eager_step(eager, eager_opt, x, y)
            eager_sched.step()
        for x, y in data[3:]:
            assert torch.equal(step(x, y), eager_step(eager, eager_opt, x, y))
            sched.step()
            eager_sched.step()
        assert_same_training(eager, eager_opt, model, opt)
    finally:
        step.close()
