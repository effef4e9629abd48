"""autotm: automatic tensor movement between fast and slow memory for PyTorch training.

The pipeline: capture -> TrainingGraph -> profile -> CostModel -> plan -> validate ->
execute -> RunReport. See README.md.
"""

from typing import Any

from .errors import AutotmError, CaptureError, GraphError, InfeasibleBudget, ReplayError

# Every other name loads on first use, so `import autotm` (and `import autotm.ir`) loads no torch.
_LAZY = {
    "capture": ("frontend.capture", "capture"),
    "Kernel": ("ir.graph", "Kernel"),
    "Role": ("ir.graph", "Role"),
    "Tensor": ("ir.graph", "Tensor"),
    "TrainingGraph": ("ir.graph", "TrainingGraph"),
    "check": ("ir.graph", "check"),
    "Replay": ("interpret.replay", "Replay"),
    "TrainingState": ("interpret.replay", "TrainingState"),
    "replay_step": ("interpret.replay", "replay_step"),
    "compile": ("api", "compile"),
    "plan_graph": ("planner", "plan"),
    "profile_graph": ("api", "profile_graph"),
    "simulate_plan": ("checks.simulate", "simulate"),
    "validate_plan": ("checks.validate", "validate"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'autotm' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attr)


__version__ = "0.1.0"

__all__ = [
    "AutotmError",
    "CaptureError",
    "GraphError",
    "InfeasibleBudget",
    "Kernel",
    "Replay",
    "ReplayError",
    "Role",
    "Tensor",
    "TrainingGraph",
    "TrainingState",
    "capture",
    "compile",
    "plan_graph",
    "profile_graph",
    "simulate_plan",
    "validate_plan",
    "check",
    "replay_step",
]
