"""autotm: automatic tensor movement between fast and slow memory for PyTorch training.

The pipeline: capture -> TrainingGraph -> profile -> CostModel -> plan -> validate ->
execute -> RunReport. See README.md.
"""

from .capture import capture
from .errors import AutotmError, CaptureError, GraphError, ReplayError
from .graph import Kernel, Role, Tensor, TrainingGraph, check
from .replay import Replay, TrainingState, replay_step

__version__ = "0.1.0"

__all__ = [
    "AutotmError",
    "CaptureError",
    "GraphError",
    "Kernel",
    "Replay",
    "ReplayError",
    "Role",
    "Tensor",
    "TrainingGraph",
    "TrainingState",
    "capture",
    "check",
    "replay_step",
]
