"""Profile: a graph's kernels and a memory system's moves measured into a CostModel.

- profiler: `profile()`, the orchestrator;
- environment: the cache key's environment part; timing: the sampling rules;
- insitu: the in-situ interpreter (kernels timed where they run); wake: kernels after a
  blocking move; moves: move measurement and fits; calibrate: the executor-overhead hook;
- roofline: the `sim:<spec>` model over a hypothetical tier spec (specs/);
- cache: the SQLite cache; pace: the CPU's pace checked; stats: what a profile did;
- workloads: capture a zoo workload and profile it.
"""

from .calibrate import MeasureOverhead
from .environment import cpu_model, environment
from .profiler import profile
from .roofline import TierSpec, cost_model_from_spec, load_spec, spec_names
from .stats import ProfileStats, Progress
from .workloads import capture_real, profile_workload

__all__ = ["MeasureOverhead", "ProfileStats", "Progress", "TierSpec", "capture_real", "cost_model_from_spec",
           "cpu_model", "environment", "load_spec", "profile", "profile_workload", "spec_names"]
