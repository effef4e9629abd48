"""autotm.compile: a training loop on cpu+file under a budget, bit for bit like eager PyTorch."""

import torch
from torch import nn

import autotm
from eager_twin import eager_step


def net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 16 * 16, 10))


def test_compiled_training_matches_eager_and_updates_the_model(tmp_path):
    data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(4)]
    eager, model = net(), net()
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    stages = []
    step = autotm.compile(model, loss_fn, opt, data[0], memory="cpu+file", budget="2:3",
                          formulation="synchronous", cache=str(tmp_path / "cache.sqlite"),
                          progress=lambda stage, done, total, what: stages.append(stage))
    try:
        # progress: every stage in order (the profile's measurements as they go), then "done"
        assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == [
            "capture", "profile", "plan", "session", "done"]
        assert stages.count("profile") > 1
        assert set(step.stage_seconds) == {"capture", "profile", "plan", "session"}
        assert step.profile_stats.measured > 0 and step.profile_stats.stage_seconds["kernels"] > 0
        assert step.plan.meta.budget_bytes < step.graph.peak_live_bytes
        assert step.plan.meta.bytes_to_slow > 0
        for x, y in data:
            expected = eager_step(eager, loss_fn, eager_opt, (x, y))
            assert torch.equal(step(x, y), expected)
        for (n, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), n
        for p_e, p in zip(eager.parameters(), model.parameters()):
            assert torch.equal(eager_opt.state[p_e]["momentum_buffer"], opt.state[p]["momentum_buffer"])
        assert step.report().peak_fast_bytes <= step.plan.meta.budget_bytes
    finally:
        step.close()
