"""Budgets a test can use on any CPU."""


def feasible_ratio(cache: str, formulations) -> str:
    """4:1 where every formulation plans at it on this CPU, else the largest ratio (two
    decimals) at which they do: the kernels' workspaces, which decide it, depend on the
    algorithms oneDNN picks for the CPU (4:1 was infeasible on an AVX2-only EPYC). The
    profile lands in `cache`, which the bench then reuses."""
    import math

    from autotm.ir.budget import parse_budget
    from autotm.planner import smallest_feasible_budget
    from autotm.profile import profile_workload
    from autotm.zoo import workload

    g, cm, _ = profile_workload(workload("resnet50", "test"), "cpu+file", cache)
    peak = smallest_feasible_budget(g, cm, "all-fast").bytes
    need = max(smallest_feasible_budget(g, cm, f).bytes for f in formulations)
    if parse_budget("4:1", peak) >= need:
        return "4:1"
    return f"{math.floor((peak / need - 1) * 100) / 100}:1"
