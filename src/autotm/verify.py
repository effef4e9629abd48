"""Check a captured iteration against eager PyTorch: loss, gradients, weights, optimizer state.

Tensors are compared by a digest of their bytes, with -0.0 folded into +0.0: equal digests
mean torch.equal holds (a fresh SGD momentum buffer starts at +0.0 + grad where torch.optim
clones the gradient, which differs only in the sign of an exact zero). Digests let the
eager run be freed before the replay runs, so a 580M-parameter model is verified in
roughly the memory of one training run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from .graph import TrainingGraph
from .replay import Replay, TrainingState, replay_step
from .workloads import capture_workload, eager_training
from .zoo import Workload


def digest(t: torch.Tensor) -> str:
    t = t.detach()
    if t.is_floating_point():
        t = t + 0.0  # -0.0 + 0.0 == +0.0
    t = t.contiguous().cpu()
    return hashlib.blake2b(t.view(torch.uint8).numpy() if t.dim() else t.reshape(1).view(torch.uint8).numpy(),
                           digest_size=16).hexdigest() + f"{tuple(t.shape)}{t.dtype}"


def state_digests(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    out = {f"param:{n}": digest(p) for n, p in model.named_parameters()}
    out.update({f"buffer:{n}": digest(b) for n, b in model.named_buffers()})
    for n, p in model.named_parameters():
        for s, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"opt:{n}:{s}"] = digest(v)
    return out


@dataclass
class Verification:
    graph: TrainingGraph
    eager_losses: list[float]
    replay_losses: list[float]
    identical_per_iteration: list[bool]  # loss and every gradient
    state_identical: bool
    mismatches: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(self.identical_per_iteration) and self.state_identical


class ReplaySession:
    """Training through the plain interpreter (no tiers)."""

    def __init__(self, graph: TrainingGraph, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.graph = graph
        self.state = TrainingState(graph, model, optimizer)
        self.interp = Replay(graph)

    def step(self, batch, *, keep_gradients: bool = False):
        return replay_step(self.graph, self.state, batch, keep_gradients=keep_gradients, interpreter=self.interp)

    def write_back(self, model, optimizer) -> None:
        self.state.write_back(model, optimizer)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class EagerReference:
    """Digests of what eager PyTorch computed: per-iteration loss and gradients, final state."""

    workload: Workload
    seed: int
    losses: list[str]
    loss_values: list[float]
    gradients: list[dict[str, str]]
    state: dict[str, str]


def eager_reference(w: Workload, iterations: int = 3, *, seed: int = 0) -> EagerReference:
    eager = eager_training(w, iterations, seed=seed, digest=digest)
    return EagerReference(w, seed, [digest(x) for x in eager.losses], [float(x) for x in eager.losses],
                          eager.gradients, state_digests(eager.model, eager.optimizer))


def verify_replay(w: Workload, iterations: int = 3, *, seed: int = 0, session_factory=ReplaySession,
                  graph: TrainingGraph | None = None, reference: EagerReference | None = None) -> Verification:
    """Train `w` eagerly and through a session (default: the plain replay interpreter;
    `session_factory(graph, model, optimizer)` may build an executor session instead);
    compare loss, gradients, weights, buffers and optimizer state bit for bit."""
    ref = reference or eager_reference(w, iterations, seed=seed)
    if ref.workload != w or ref.seed != seed or len(ref.losses) < iterations:
        raise ValueError("the eager reference was computed for another workload, seed or fewer iterations")
    eager_losses, eager_loss_values, eager_grads = ref.losses, ref.loss_values, ref.gradients
    eager_state = ref.state

    model = w.build_model(seed=seed)
    opt = w.make_optimizer(model.parameters())
    if graph is None:
        from .capture import capture

        graph = capture(model, w.loss_fn(), opt, w.make_batch(seed=seed), name=w.name)
    session = session_factory(graph, model, opt)
    per_iter, losses, mismatches = [], [], []
    try:
        for i in range(iterations):
            r = session.step(w.make_batch(seed=seed + i), keep_gradients=True)
            losses.append(float(r.loss))
            same = digest(r.loss) == eager_losses[i]
            if not same:
                mismatches.append(f"iteration {i + 1}: loss {float(r.loss)!r} != {eager_loss_values[i]!r}")
            bad = sorted(n for n, g in r.gradients.items() if digest(g) != eager_grads[i].get(n))
            if bad or set(r.gradients) != set(eager_grads[i]):
                same = False
                mismatches.append(f"iteration {i + 1}: gradients differ for {', '.join(bad[:5]) or 'a parameter set mismatch'}")
            per_iter.append(same)
            del r
        session.write_back(model, opt)
    finally:
        session.close()
    replay_state = state_digests(model, opt)
    state_mismatch = sorted(k for k in eager_state if replay_state.get(k) != eager_state[k])
    mismatches += [f"after {iterations} iterations: {k} differs" for k in state_mismatch[:10]]
    return Verification(graph, eager_loss_values, losses, per_iter, not state_mismatch, mismatches)
