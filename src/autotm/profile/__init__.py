"""Profile: a graph's kernels and a memory system's moves measured into a CostModel
(profiler), kept in a SQLite cache (cache), with the CPU's pace checked (pace); or a
roofline over a hypothetical tier spec (specs/)."""

from .profiler import capture_real, cost_model_from_spec, cpu_model, environment, load_spec, profile, \
    profile_workload

__all__ = ["capture_real", "cost_model_from_spec", "cpu_model", "environment", "load_spec", "profile",
           "profile_workload"]
