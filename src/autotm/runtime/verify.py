"""Check a captured iteration against eager PyTorch: loss, gradients, weights, optimizer state.

Tensors are compared by a digest of their bytes, with -0.0 folded into +0.0: equal digests
mean torch.equal holds (a fresh SGD momentum buffer starts at +0.0 + grad where torch.optim
clones the gradient, which differs only in the sign of an exact zero). Digests let the
eager run be freed before the replay runs, so a 580M-parameter model is verified in
roughly the memory of one training run.

On a GPU (`device`), both eager PyTorch and the session run on that GPU under
:func:`deterministic` settings and are compared bit for bit first. A tensor that is not
bit-identical is then compared within a stated tolerance (GPU_RTOL, GPU_ATOL), and the
result says which tensors needed it (`Verification.approximate`) and which kernels had no
deterministic implementation (`Verification.nondeterministic`). Expected causes: the graph
is captured on the CPU, so on the GPU it may run other kernels than eager PyTorch there
(the native CUDA batch norm where eager may pick cuDNN's; Adam's update as separate
kernels where eager fuses addcdiv, whose CUDA kernel may contract a multiply-add).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from dataclasses import dataclass, field

import torch

from ..ir.graph import TrainingGraph
from ..interpret.replay import Replay, TrainingState, replay_step
from ..frontend.workloads import eager_training
from ..zoo import Workload


def digest(t: torch.Tensor) -> str:
    t = t.detach()
    if t.is_floating_point():
        t = t + 0.0  # -0.0 + 0.0 == +0.0
    t = t.contiguous().cpu()
    # SHA-256 (first 128 bits): x86's SHA instructions make it 2.2x blake2b's speed here,
    # and hashing was half of a verified run of the demo's model outside its iterations
    return hashlib.sha256(t.view(torch.uint8).numpy() if t.dim() else t.reshape(1).view(torch.uint8).numpy()
                          ).hexdigest()[:32] + f"{tuple(t.shape)}{t.dtype}"


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Parameters, buffers and optimizer state by state key."""
    out = {f"param:{n}": p for n, p in model.named_parameters()}
    out.update({f"buffer:{n}": b for n, b in model.named_buffers()})
    for n, p in model.named_parameters():
        for s, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"opt:{n}:{s}"] = v
    return out


def state_digests(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    return {k: digest(v) for k, v in state_tensors(model, optimizer).items()}


# ---- GPU runs: deterministic settings, and the tolerance when bits differ anyway

GPU_RTOL = 1e-3
GPU_ATOL = 1e-6
"""A device run's tensor that is not bit-identical to eager PyTorch's still matches when
max|a - b| <= GPU_ATOL + GPU_RTOL * max|b| over the tensor (b: eager's value; a norm-wise
test, so elements near zero do not fail it alone). NaN and infinity must sit in the same
places; integer tensors must be equal."""

CUBLAS_WORKSPACE_CONFIG = ":4096:8"


@contextlib.contextmanager
def deterministic():
    """Deterministic GPU kernels: ``torch.use_deterministic_algorithms(True, warn_only=True)``,
    ``cudnn.deterministic = True``, ``cudnn.benchmark = False``; previous settings restored
    on exit. CUBLAS_WORKSPACE_CONFIG is set to ":4096:8" if unset, which only takes effect
    before cuBLAS first runs in the process (benchmarks/gpu_check.sh sets it before Python
    starts). Yields a list that, on exit, holds the warnings of kernels met inside that have
    no deterministic implementation (their results may differ from run to run)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    cudnn = torch.backends.cudnn
    prev = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn.deterministic, cudnn.benchmark)
    met: list[str] = []
    torch.use_deterministic_algorithms(True, warn_only=True)
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield met
            finally:
                for w in caught:
                    text = str(w.message)
                    if "deterministic" in text:
                        met.append(text.split("\n")[0][:200])
                    else:  # not ours: pass it on
                        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                met[:] = sorted(set(met))
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
        cudnn.deterministic, cudnn.benchmark = prev[2], prev[3]


def within_tolerance(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` matches eager's `b` within GPU_RTOL and GPU_ATOL (see there)."""
    a, b = a.detach().to("cpu"), b.detach().to("cpu")
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    fin = torch.isfinite(b)
    if not torch.equal(fin, torch.isfinite(a)) or not torch.equal(a.isnan(), b.isnan()):
        return False
    inf = b.isinf()
    if not torch.equal(a[inf], b[inf]):
        return False
    if not fin.any():
        return True
    return bool((a[fin] - b[fin]).abs().max() <= GPU_ATOL + GPU_RTOL * b[fin].abs().max())


@dataclass
class Verification:
    graph: TrainingGraph
    eager_losses: list[float]
    replay_losses: list[float]
    identical_per_iteration: list[bool]  # loss and every gradient, bit for bit
    state_identical: bool
    mismatches: list[str] = field(default_factory=list)  # what differs (beyond the tolerance, on a GPU)
    # GPU runs: bit for bit or within the tolerance, and what needed the tolerance
    matched_per_iteration: list[bool] | None = None
    state_matched: bool | None = None
    approximate: list[str] = field(default_factory=list)
    tolerance: tuple[float, float] | None = None  # (rtol, atol) when values were kept to compare
    nondeterministic: list[str] = field(default_factory=list)
    device: str = "cpu"

    @property
    def identical(self) -> bool:
        return all(self.identical_per_iteration) and self.state_identical

    @property
    def matched(self) -> bool:
        """Bit-identical, or (GPU runs) within the stated tolerance."""
        per_iter = self.identical_per_iteration if self.matched_per_iteration is None else self.matched_per_iteration
        state = self.state_identical if self.state_matched is None else self.state_matched
        return all(per_iter) and state

    @property
    def comparison(self) -> str:
        if self.identical:
            return "bit-identical"
        if self.matched and self.tolerance is not None:
            return (f"within tolerance (rtol={self.tolerance[0]:g}, atol={self.tolerance[1]:g}); "
                    f"{len(self.approximate)} tensors not bit-identical")
        return "differs"

    def meta(self) -> dict:
        """For a run report's meta."""
        return {"verification": self.comparison, "bit_identical": self.identical, "matched": self.matched,
                "tolerance": list(self.tolerance) if self.tolerance else None,
                "approximate": self.approximate[:20], "nondeterministic": self.nondeterministic,
                "verified_on": self.device}


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
    """Digests of what eager PyTorch computed: per-iteration loss and gradients, final state.

    On a GPU (`device`) the values are kept too (on the host), for the tolerance test:
    ``values = {"loss": [...], "gradients": [{name: tensor}], "state": {key: tensor}}``."""

    workload: Workload
    seed: int
    losses: list[str]
    loss_values: list[float]
    gradients: list[dict[str, str]]
    state: dict[str, str]
    device: str = "cpu"
    values: dict | None = None


def eager_reference(w: Workload, iterations: int = 3, *, seed: int = 0, device=None) -> EagerReference:
    """Eager PyTorch's results for `w`; on a GPU `device`, under :func:`deterministic`."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cpu":
        eager = eager_training(w, iterations, seed=seed, digest=digest)
        return EagerReference(w, seed, [digest(x) for x in eager.losses], [float(x) for x in eager.losses],
                              eager.gradients, state_digests(eager.model, eager.optimizer))
    with deterministic():
        eager = eager_training(w, iterations, seed=seed, device=dev,
                               digest=lambda g: (digest(g), g.detach().to("cpu", copy=True)))
        state = {k: v.detach().to("cpu", copy=True) for k, v in state_tensors(eager.model, eager.optimizer).items()}
    values = {"loss": [x.detach().to("cpu") for x in eager.losses],
              "gradients": [{n: v for n, (_, v) in it.items()} for it in eager.gradients], "state": state}
    return EagerReference(w, seed, [digest(x) for x in eager.losses], [float(x) for x in eager.losses],
                          [{n: d for n, (d, _) in it.items()} for it in eager.gradients],
                          {k: digest(v) for k, v in state.items()}, device=str(dev), values=values)


def verify_replay(w: Workload, iterations: int = 3, *, seed: int = 0, session_factory=ReplaySession,
                  graph: TrainingGraph | None = None, reference: EagerReference | None = None,
                  device=None) -> Verification:
    """Train `w` eagerly and through a session (default: the plain replay interpreter;
    `session_factory(graph, model, optimizer)` may build an executor session instead);
    compare loss, gradients, weights, buffers and optimizer state bit for bit.

    `device`: where the session's kernels run (a cuda+host session: its fast device). On
    a GPU, eager PyTorch runs there too (a `reference` computed elsewhere is not used),
    both under :func:`deterministic`, and what is not bit-identical is compared within
    the tolerance (module docstring)."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cpu":
        return _verify(w, iterations, seed, session_factory, graph, reference, dev)
    with deterministic() as nondeterministic:
        if reference is None or reference.device != str(dev):
            reference = eager_reference(w, iterations, seed=seed, device=dev)
        v = _verify(w, iterations, seed, session_factory, graph, reference, dev)
    v.nondeterministic = list(nondeterministic)
    return v


def _verify(w, iterations, seed, session_factory, graph, reference, dev) -> Verification:
    ref = reference or eager_reference(w, iterations, seed=seed)
    if ref.workload != w or ref.seed != seed or len(ref.losses) < iterations:
        raise ValueError("the eager reference was computed for another workload, seed or fewer iterations")
    eager_losses, eager_loss_values, eager_grads = ref.losses, ref.loss_values, ref.gradients
    eager_state = ref.state
    vals = ref.values  # None on the CPU: bit for bit only

    model = w.build_model(seed=seed)
    opt = w.make_optimizer(model.parameters())
    if graph is None:
        from ..frontend.capture import capture

        graph = capture(model, w.loss_fn(), opt, w.make_batch(seed=seed), name=w.name)
    session = session_factory(graph, model, opt)
    per_iter, matched, losses, mismatches, approximate = [], [], [], [], []

    def close(name: str, got: torch.Tensor, want: torch.Tensor | None) -> bool:
        ok = want is not None and within_tolerance(got, want)
        if ok:
            approximate.append(name)
        return ok

    try:
        for i in range(iterations):
            r = session.step(w.make_batch(seed=seed + i), keep_gradients=True)
            losses.append(float(r.loss))
            same = digest(r.loss) == eager_losses[i]
            ok = same or (vals is not None and close(f"iteration {i + 1}: loss", r.loss, vals["loss"][i]))
            if not ok:
                mismatches.append(f"iteration {i + 1}: loss {float(r.loss)!r} != {eager_loss_values[i]!r}")
            bad = sorted(n for n, g in r.gradients.items() if digest(g) != eager_grads[i].get(n))
            far = [n for n in bad if vals is None
                   or not close(f"iteration {i + 1}: gradient {n}", r.gradients[n], vals["gradients"][i].get(n))]
            if bad or set(r.gradients) != set(eager_grads[i]):
                same = False
            if far or set(r.gradients) != set(eager_grads[i]):
                ok = False
                mismatches.append(f"iteration {i + 1}: gradients differ for {', '.join(far[:5]) or 'a parameter set mismatch'}")
            per_iter.append(same)
            matched.append(ok)
            del r
        session.write_back(model, opt)
    finally:
        session.close()
    replay_tensors = state_tensors(model, opt)
    replay_state = {k: digest(v) for k, v in replay_tensors.items()}
    state_mismatch = sorted(k for k in eager_state if replay_state.get(k) != eager_state[k])
    state_far = [k for k in state_mismatch if vals is None or k not in replay_tensors
                 or not close(f"after {iterations} iterations: {k}", replay_tensors[k], vals["state"].get(k))]
    mismatches += [f"after {iterations} iterations: {k} differs" for k in state_far[:10]]
    return Verification(graph, eager_loss_values, losses, per_iter, not state_mismatch, mismatches,
                        matched_per_iteration=matched, state_matched=not state_far, approximate=approximate,
                        tolerance=(GPU_RTOL, GPU_ATOL) if vals is not None else None, device=str(dev))
