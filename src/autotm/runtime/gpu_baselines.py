"""GPU baselines that are not plans: PyTorch's own activation offloading.

``run_save_on_cpu`` trains a workload eagerly on the GPU inside
``torch.autograd.graph.save_on_cpu(pin_memory=True)``: every tensor autograd saves for
the backward pass is copied to pinned host memory in the forward pass and back in the
backward pass (the weights, gradients and optimizer state stay on the GPU). It is the
paper's Figure 12 comparison brought to PyTorch: offloading without a plan.

Timing matches the executor's: each iteration starts with the batch on the host and ends
when the GPU is done (the batch's copy to the GPU is inside the iteration), and the
reported time is the median over iterations after the first (which pays for cuDNN and
cuBLAS set-up and the first pinned allocations), the first alone when there is one.
"""

from __future__ import annotations

import statistics
import time

import torch

from .verify import deterministic, digest, state_digests
from ..errors import InputError


def _require_cuda(device) -> torch.device:
    if not torch.cuda.is_available():
        raise InputError("save-on-cpu is a GPU baseline: torch.cuda.is_available() is False")
    dev = torch.device(device)
    if dev.type != "cuda":
        raise InputError(f"save-on-cpu runs on a CUDA device, not {dev}")
    return dev


def _train(w, iterations: int, dev: torch.device, *, seed: int, offload: bool):
    """Eager training on `dev`: (iteration seconds, losses, model, optimizer)."""
    model = w.build_model(seed=seed, device=dev)
    opt = w.make_optimizer(model.parameters())
    loss_fn = w.loss_fn()
    times, losses = [], []
    for i in range(iterations):
        x, y = w.make_batch(seed=seed + i)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        if offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()  # the saved tensors come back from the host here
        opt.step()
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
        del x, y, loss
    return times, losses, model, opt


def run_save_on_cpu(w, iterations: int = 3, verify: bool = False, *, device="cuda", seed: int = 0) -> dict:
    """Train `w` for `iterations` on the GPU with saved activations offloaded to pinned host
    memory (``torch.autograd.graph.save_on_cpu(pin_memory=True)``).

    Returns ``{"measured_seconds", "iteration_seconds", "peak_allocated_bytes",
    "peak_reserved_bytes", "identical"}``: the median iteration time (after the first),
    every iteration's time, the CUDA caching allocator's peaks over the timed run, and with
    `verify` whether a second run under deterministic settings gives bit for bit the loss,
    weights, buffers and optimizer state of plain eager training without offloading (None
    without `verify`)."""
    dev = _require_cuda(device)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    try:
        times, losses, model, opt = _train(w, iterations, dev, seed=seed, offload=True)
        peak_allocated = int(torch.cuda.max_memory_allocated(dev))
        peak_reserved = int(torch.cuda.max_memory_reserved(dev))
        del losses, model, opt
        identical = None
        if verify:
            identical = _same_as_eager(w, iterations, dev, seed)
    finally:
        torch.cuda.empty_cache()  # the next run starts from an empty allocator
    measured = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"measured_seconds": float(measured), "iteration_seconds": [float(t) for t in times],
            "peak_allocated_bytes": peak_allocated, "peak_reserved_bytes": peak_reserved,
            "identical": identical}


def _same_as_eager(w, iterations: int, dev: torch.device, seed: int) -> bool:
    """Offloading moves bytes and nothing else: plain eager and save-on-cpu agree bit for bit."""
    results = []
    with deterministic():
        for offload in (False, True):
            _, losses, model, opt = _train(w, iterations, dev, seed=seed, offload=offload)
            results.append(([digest(x) for x in losses], state_digests(model, opt)))
            del losses, model, opt
            torch.cuda.empty_cache()
    return results[0] == results[1]
