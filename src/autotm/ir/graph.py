"""TrainingGraph: one training iteration as kernels over tensors (storages).

Kernels are positions 0..K-1 in execution order. A tensor is one storage: a view is an
alias of its storage, not a tensor of its own. Planners, the profiler and the executor
read this structure and never the fx graph it was built from.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import GraphError


class Role(str, enum.Enum):
    WEIGHT = "weight"  # a parameter, as read by forward and backward
    BUFFER = "buffer"  # module state that is not a parameter (BatchNorm running stats)
    OPTIMIZER_STATE = "optimizer_state"  # momentum buffers, Adam moments, step counts
    SCALAR = "scalar"  # per-iteration optimizer scalars (Adam bias corrections)
    CONSTANT = "constant"  # tensors the model closes over
    INPUT = "input"  # the batch: inputs and targets
    ACTIVATION = "activation"  # produced by the forward pass
    GRADIENT = "gradient"  # produced by the backward pass
    UPDATE = "update"  # temporaries of the optimizer update
    OUTPUT = "output"  # the loss


# Roles whose tensors exist before the first kernel (graph inputs).
INPUT_ROLES = frozenset({Role.WEIGHT, Role.BUFFER, Role.OPTIMIZER_STATE, Role.SCALAR, Role.CONSTANT, Role.INPUT})


@dataclass(frozen=True)
class Tensor:
    """One storage. Sizes in bytes; `live` is the inclusive kernel range it occupies memory."""

    id: int
    name: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]  # of the value that created the storage
    stride: tuple[int, ...]
    role: Role
    producer: int | None  # kernel index, None for graph inputs
    users: tuple[int, ...]  # kernels that read it (through any view), in order, no repeats
    live: tuple[int, int]  # first and last kernel at which it is resident
    is_graph_output: bool = False  # its value leaves the iteration (loss, new weights, new state)
    state_key: str | None = None  # for inputs and their updates: "param:fc.weight", "opt:fc.weight:exp_avg"


@dataclass(frozen=True)
class Kernel:
    """One ATen op call."""

    index: int
    op: str  # e.g. "aten.convolution.default"
    inputs: tuple[int, ...]  # tensor ids read, in argument order, no repeats
    outputs: tuple[int, ...]  # tensor ids created
    signature: str  # op + shapes + strides + dtypes + every non-tensor argument
    flops: int  # from torch's flop formulas; elementwise ops count one per output element
    bytes_touched: int  # bytes of every operand as the kernel sees it (views, not whole storages)
    module: str  # the nn.Module the op came from ("" when unknown)
    phase: str  # "forward", "backward" or "optimizer"
    node: str = field(default="", compare=False)  # name of its fx node
    pieces: int = 1  # > 1: runs in pieces over its flat index (ir/split.py)


@dataclass(frozen=True, eq=False)
class TrainingGraph:
    """Kernels in execution order and the tensors they read and write.

    `program` holds what is needed to run the iteration (the fx graph and the maps from
    values to tensors); it is for interpreters (replay, executor, profiler) only.
    """

    name: str
    kernels: tuple[Kernel, ...]
    tensors: tuple[Tensor, ...]
    parameters: int  # number of trainable scalar parameters
    program: Any = field(repr=False)
    capture_seconds: float = 0.0
    fake: bool = False
    splittable: frozenset[int] = frozenset()  # kernels that may run in pieces (ir/split.py)

    # ---- liveness -------------------------------------------------------------------
    @cached_property
    def live_bytes(self) -> np.ndarray:
        """Bytes resident at each kernel: every tensor whose live range covers it."""
        delta = np.zeros(len(self.kernels) + 1, dtype=np.int64)
        for t in self.tensors:
            a, b = t.live
            delta[a] += t.nbytes
            delta[b + 1] -= t.nbytes
        return np.cumsum(delta[:-1])

    @property
    def peak_live_bytes(self) -> int:
        return int(self.live_bytes.max()) if len(self.kernels) else 0

    @property
    def peak_kernel(self) -> int:
        return int(self.live_bytes.argmax()) if len(self.kernels) else 0

    def live_set(self, k: int) -> list[int]:
        """Ids of the tensors resident at kernel k."""
        return [t.id for t in self.tensors if t.live[0] <= k <= t.live[1]]

    def live_bytes_by_role(self, k: int | None = None) -> dict[str, int]:
        """Bytes resident at kernel k (default: the peak), split by role."""
        k = self.peak_kernel if k is None else k
        out: dict[str, int] = {}
        for t in self.tensors:
            if t.live[0] <= k <= t.live[1]:
                out[t.role.value] = out.get(t.role.value, 0) + t.nbytes
        return out

    def bytes_by_role(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.role.value] = out.get(t.role.value, 0) + t.nbytes
        return out

    @cached_property
    def fingerprint(self) -> str:
        """A hash of everything a plan depends on: kernels, their operands and tensor sizes
        (not how kernels are split: a plan records that itself, Plan.split)."""
        h = hashlib.sha256()
        for k in self.kernels:
            h.update(f"{k.signature}|{k.inputs}|{k.outputs};".encode())
        for t in self.tensors:
            h.update(f"{t.nbytes}|{t.live}|{t.role.value};".encode())
        return h.hexdigest()[:16]

    @cached_property
    def unique_signatures(self) -> int:
        return len({k.signature for k in self.kernels})

    def summary(self) -> dict[str, Any]:
        """The facts `autotm graph` prints, as plain JSON-able data."""
        return {
            "name": self.name,
            "kernels": len(self.kernels),
            "unique_kernels": self.unique_signatures,
            "tensors": len(self.tensors),
            "parameters": self.parameters,
            "peak_live_bytes": self.peak_live_bytes,
            "peak_kernel": self.peak_kernel,
            "peak_live_bytes_by_role": self.live_bytes_by_role(),
            "total_bytes_by_role": self.bytes_by_role(),
            "flops": int(sum(k.flops for k in self.kernels)),
            "splittable_kernels": len(self.splittable),  # (may run in pieces: ir/split.py)
            "capture_seconds": round(self.capture_seconds, 3),
            "fake": self.fake,
        }


def check(graph: TrainingGraph) -> None:
    """Check the graph's invariants, in the spirit of torch.fx's Graph.lint().

    Raises GraphError naming the kernel, the tensor and the likely cause.
    """
    n = len(graph.kernels)
    ids = [t.id for t in graph.tensors]
    if ids != list(range(len(ids))):
        raise GraphError("tensor ids must be 0..T-1 in order")
    for i, k in enumerate(graph.kernels):
        if k.index != i:
            raise GraphError(f"kernel {i} ({k.op}) carries index {k.index}")
        for tid in k.inputs:
            t = graph.tensors[tid]
            if t.producer is not None and t.producer >= i:
                raise GraphError(
                    f"kernel {i} ({k.op}) reads tensor {tid} ({t.name}) before its producer, kernel {t.producer}"
                )
            if not (t.live[0] <= i <= t.live[1]):
                raise GraphError(f"kernel {i} ({k.op}) reads tensor {tid} ({t.name}) outside its live range {t.live}")
        for tid in k.outputs:
            if graph.tensors[tid].producer != i:
                raise GraphError(f"kernel {i} ({k.op}) writes tensor {tid}, whose producer is recorded as another kernel")
    for t in graph.tensors:
        if t.nbytes < 0:
            raise GraphError(f"tensor {t.id} ({t.name}) has negative size {t.nbytes}")
        if (t.producer is None and t.role not in INPUT_ROLES) or (
            t.producer is not None and t.role in (Role.SCALAR, Role.CONSTANT, Role.INPUT)
        ):
            raise GraphError(f"tensor {t.id} ({t.name}) has role {t.role.value} but producer {t.producer}")
        if list(t.users) != sorted(set(t.users)):
            raise GraphError(f"tensor {t.id} ({t.name}) users are not ordered and unique: {t.users}")
        a, b = t.live
        if not (0 <= a <= b < max(n, 1)):
            raise GraphError(f"tensor {t.id} ({t.name}) has live range {t.live} outside 0..{n - 1}")
        if t.producer is not None and a != t.producer:
            raise GraphError(f"tensor {t.id} ({t.name}) is live from {a} but produced at {t.producer}")
        if t.users and b < t.users[-1]:
            raise GraphError(f"tensor {t.id} ({t.name}) dies at {b} before its last user {t.users[-1]}")
        if t.is_graph_output and b != n - 1:
            raise GraphError(f"graph output {t.id} ({t.name}) must stay live to the last kernel")
