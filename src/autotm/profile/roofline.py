"""The roofline `sim:` model: a CostModel of a graph on a hypothetical memory system read
from a tier spec (`profile/specs/*.toml`). It needs no real tensors (fake-captured graphs
work); the only measurement is this machine's peak FLOP/s where the spec gives none, and
the cost model is labelled ``simulated=True``."""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from ..errors import InputError
from ..ir.costmodel import DIRECTIONS, MOVE_MODES, CostModel, MoveCost, operand_tensors
from ..ir.graph import TrainingGraph
from .cache import ProfileCache, open_cache
from .environment import environment
from .stats import ProfileStats
from .timing import placements, time_call

SPEC_DIR = Path(__file__).with_name("specs")
_G = 1e9


@dataclass(frozen=True)
class TierSpec:
    """A hypothetical memory system read from a TOML spec (see autotm/specs/*.toml)."""

    name: str
    description: str
    access: str  # "staged" | "direct"
    fast_read_bw: float  # bytes/s a kernel reads from fast memory
    fast_write_bw: float
    slow_read_bw: float
    slow_write_bw: float
    fast_latency_s: float
    slow_latency_s: float
    moves: dict[tuple[str, str], MoveCost]
    peak_flops: float | None  # None: this machine's measured peak
    source: str = ""
    extra: dict = field(default_factory=dict)


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def load_spec(spec: str | os.PathLike) -> TierSpec:
    """A tier spec by name ("optane", "sim:optane") or path to a TOML file."""
    s = str(spec)
    if s.startswith("sim:"):
        s = s[4:]
    path = Path(s)
    if not (path.suffix == ".toml" and path.exists()):
        path = SPEC_DIR / f"{s}.toml"
        if not path.exists():
            raise InputError(f"unknown tier spec {s!r}; shipped specs: {', '.join(spec_names())} "
                             "(or pass a path to a .toml file)")
    try:
        d = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"tier spec {path} is not valid TOML: {e}") from None
    try:
        fast, slow, mv = d["fast"], d["slow"], d["moves"]
        moves = {}
        for direction in DIRECTIONS:
            for mode in MOVE_MODES:
                m = mv[direction][mode]
                moves[(direction, mode)] = MoveCost(float(m.get("latency_us", 0.0)) * 1e-6,
                                                    float(m["bandwidth_gbps"]) * _G)
        access = d["access"]
        if access not in ("staged", "direct"):
            raise InputError(f"access must be 'staged' or 'direct', got {access!r}")
        peak = d.get("compute", {}).get("peak_gflops")
        return TierSpec(
            name=d.get("name", path.stem), description=d.get("description", ""), access=access,
            fast_read_bw=float(fast["read_gbps"]) * _G, fast_write_bw=float(fast["write_gbps"]) * _G,
            slow_read_bw=float(slow["read_gbps"]) * _G, slow_write_bw=float(slow["write_gbps"]) * _G,
            fast_latency_s=float(fast.get("latency_ns", 0.0)) * 1e-9,
            slow_latency_s=float(slow.get("latency_ns", 0.0)) * 1e-9,
            moves=moves, peak_flops=None if peak is None else float(peak) * _G,
            source=d.get("source", ""), extra={"path": str(path)})
    except KeyError as e:
        raise InputError(f"tier spec {path} is missing {e}") from None


def measure_peak_flops(cache: ProfileCache | str | os.PathLike | None = None, *, recache: bool = False,
                       size: int = 1024) -> float:
    """This machine's float32 matmul FLOP/s (a size x size matmul, median), cached."""
    db, owned = open_cache(cache)
    try:
        env = db.environment({k: v for k, v in environment("compute").items()})
        if not recache:
            v = db.value(env, "peak_flops")
            if v is not None:
                return v
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        seconds, _ = time_call(lambda: torch.mm(a, b), min_samples=5)
        flops = 2.0 * size ** 3 / seconds
        db.put_value(env, "peak_flops", flops)
        return flops
    finally:
        if owned:
            db.close()


def operand_bytes(graph: TrainingGraph, k: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes kernel k reads from each input tensor and writes to each output tensor, as the
    kernel sees them (views, not whole storages; capped at the storage's size)."""
    kern = graph.kernels[k]
    reads: dict[int, int] = {}
    writes: dict[int, int] = {t: graph.tensors[t].nbytes for t in kern.outputs}
    p = graph.program
    if p is not None and getattr(p, "kernel_nodes", None):
        node = p.kernel_nodes[k]
        for a in node.all_input_nodes:
            tid = p.node_tensor.get(a)
            v = a.meta.get("val")
            if tid is None:
                continue
            vals = v if isinstance(v, (list, tuple)) else [v]
            nb = sum(x.numel() * x.element_size() for x in vals if isinstance(x, torch.Tensor))
            reads[tid] = reads.get(tid, 0) + nb
        out = node.meta.get("val")
        for tid, i in p.kernel_outputs[k]:
            v = out if i is None else out[i]
            if isinstance(v, torch.Tensor):
                writes[tid] = v.numel() * v.element_size()
    for t in kern.inputs:
        reads[t] = min(reads.get(t, graph.tensors[t].nbytes), graph.tensors[t].nbytes)
    for t in kern.outputs:
        writes[t] = min(writes[t], graph.tensors[t].nbytes)
    return reads, writes


def roofline_seconds(flops: float, reads: Mapping[int, int], writes: Mapping[int, int],
                     placement: Mapping[int, str], spec: TierSpec, peak_flops: float) -> float:
    """max(flops / peak, sum over operands of bytes / bandwidth of its tier), plus the
    access latency of each tier the kernel touches."""
    mem = 0.0
    tiers = set()
    for tid, nb in reads.items():
        slow = placement.get(tid) == "slow"
        tiers.add(slow)
        mem += nb / (spec.slow_read_bw if slow else spec.fast_read_bw)
    for tid, nb in writes.items():
        slow = placement.get(tid) == "slow"
        tiers.add(slow)
        mem += nb / (spec.slow_write_bw if slow else spec.fast_write_bw)
    lat = sum(spec.slow_latency_s if s else spec.fast_latency_s for s in tiers)
    return max(flops / peak_flops, mem) + lat


def cost_model_from_spec(graph: TrainingGraph, spec: str | os.PathLike | TierSpec, *,
                         cache: ProfileCache | str | os.PathLike | None = None,
                         peak_flops: float | None = None) -> CostModel:
    """A roofline CostModel of `graph` on the hypothetical memory system `spec`.

    Kernel time = max(kernel.flops / peak_flops, sum over operands of bytes / bandwidth
    of the tier the operand is in) + the latency of each tier touched. Peak FLOP/s: the
    argument, else the spec's, else this machine's measured peak (cached).
    """
    spec = spec if isinstance(spec, TierSpec) else load_spec(spec)
    if peak_flops is None:
        peak_flops = spec.peak_flops if spec.peak_flops is not None else measure_peak_flops(cache)
    kernel_seconds = []
    placement_seconds: dict[int, dict[tuple[str, ...], float]] = {}
    for k, kern in enumerate(graph.kernels):
        reads, writes = operand_bytes(graph, k)
        kernel_seconds.append(roofline_seconds(kern.flops, reads, writes, {}, spec, peak_flops))
        if spec.access == "direct":
            ops = operand_tensors(kern.inputs, kern.outputs)
            table = {}
            for p in placements(len(ops)):
                table[p] = roofline_seconds(kern.flops, reads, writes, dict(zip(ops, p)), spec, peak_flops)
            placement_seconds[k] = table
    env = {"spec": spec.name, "spec_path": spec.extra.get("path", ""), "peak_flops": peak_flops,
           "description": spec.description}
    return CostModel(graph_fingerprint=graph.fingerprint, memory_system=f"sim:{spec.name}", access=spec.access,
                     kernel_seconds=tuple(kernel_seconds), placement_seconds=placement_seconds,
                     moves=dict(spec.moves), simulated=True, environment=env)


def profile_sim(graph, name, cache, *, recache):
    t0 = time.perf_counter()
    spec = load_spec(name)
    peak = spec.peak_flops if spec.peak_flops is not None else measure_peak_flops(cache, recache=recache)
    cm = cost_model_from_spec(graph, spec, peak_flops=peak)
    stats = ProfileStats(unique_kernels=graph.unique_signatures, total_kernels=len(graph.kernels),
                         seconds=time.perf_counter() - t0, simulated_from=spec.extra.get("path", spec.name))
    return cm, stats

