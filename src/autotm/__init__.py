"""autotm: automatic tensor movement between fast and slow memory for PyTorch training.

The pipeline: capture -> TrainingGraph -> profile -> CostModel -> plan -> validate ->
execute -> RunReport. See README.md.
"""

from .frontend.capture import capture
from .errors import AutotmError, CaptureError, GraphError, InfeasibleBudget, ReplayError
from .ir.graph import Kernel, Role, Tensor, TrainingGraph, check
from .interpret.replay import Replay, TrainingState, replay_step


def __getattr__(name):
    # the heavier stages load on first use, so `import autotm` stays quick
    if name == "compile":
        from .api import compile

        return compile
    if name == "plan_graph":
        from .planner import plan

        return plan
    if name == "profile_graph":
        from .profile.profiler import profile

        return profile
    if name == "simulate_plan":
        from .checks.simulate import simulate

        return simulate
    if name == "validate_plan":
        from .checks.validate import validate

        return validate
    raise AttributeError(f"module 'autotm' has no attribute {name!r}")

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
