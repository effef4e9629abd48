"""What the planner says about a plan (PlanMeta) and what its solver did (SolverStats),
as plain frozen data and JSON (a plan file's "meta" object)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class FamilyStats:
    """One constraint family of an ILP: its rows, nonzeros, and the seconds its function
    took to build them."""
    name: str
    rows: int
    nonzeros: int
    seconds: float


@dataclass(frozen=True)
class SolverStats:
    """One ILP solve: the model's size (per family too), the build and solve seconds, the
    solver's status, the returned plan's objective (predicted seconds), its gap to the
    solver's lower bound `bound` (None: no bound)."""
    variables: int = 0
    binaries: int = 0
    rows: int = 0
    nonzeros: int = 0
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    status: str = ""
    gap: float = 0.0
    objective: float = 0.0
    bound: float | None = None
    families: tuple[FamilyStats, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["families"] = [asdict(f) for f in self.families]
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> SolverStats:
        known = {f.name for f in fields(SolverStats)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["families"] = tuple(FamilyStats(**f) for f in d.get("families", ()))
        bound = kw.get("bound")
        kw["bound"] = None if bound is None or not math.isfinite(bound) else float(bound)
        return SolverStats(**kw)


@dataclass(frozen=True)
class PlanMeta:
    """A plan's details from plan(): how it was asked for (formulation, budgets), what it
    is predicted to cost (autotm.simulate) and hold (the validator's peaks and moves),
    its arena, how the solver got there (`solver`, None for baselines), and a warning
    when it does not keep to the budget. Every field has a default: plans made by hand,
    or read from files of older versions, carry what they have."""
    formulation: str = ""
    pin_params: bool = False
    budget_bytes: int | None = None  # the budget asked for, in bytes
    requested_budget_bytes: int | None = None  # (the same; older plan files name it so)
    solver_budget_bytes: int | None = None  # the budget the returned plan was solved for (less: the arena's re-solves)
    defrag_retries: int = 0  # re-solves before the returned plan
    predicted_seconds: float = 0.0
    peak_fast_bytes: int = 0
    peak_workspace_bytes: int = 0
    peak_fast_with_workspace_bytes: int = 0
    bytes_to_slow: int = 0
    bytes_to_fast: int = 0
    moves: int = 0
    simulated: bool = False  # the cost model is simulated, not measured
    arena_bytes: int | None = None
    fragmentation: float | None = None  # arena_bytes / peak of the laid-out blocks - 1
    arena_fits: bool | None = None
    fits_budget: bool | None = None
    polish: bool = False  # the plan came from one more solve from a plan that fitted
    warning: str | None = None
    plan_seconds: float = 0.0  # plan()'s whole time
    solve_seconds: float = 0.0  # the solver's, over every attempt
    gap: float = 0.0  # to bound_seconds
    status: str = ""  # the solver's, or "baseline"
    objective_seconds: float | None = None
    bound_seconds: float | None = None  # no plan of the formulation for the budget is predicted faster
    # each attempt: (budget solved for, arena bytes, fragmentation, predicted seconds)
    defrag_history: tuple[tuple[int, int, float, float], ...] = ()
    fallback: str | None = None
    window: int | None = None
    warm_start: str | None = None  # which plan the solver started from
    warm_start_kept: bool = False  # the solver returned something slower than its start: the start
    searched_near: str | None = None
    solver: SolverStats | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (not None), as JSON values."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name == "solver":
                v = v.to_json()
            elif f.name == "defrag_history":
                v = [list(a) for a in v]
            d[f.name] = v
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> PlanMeta:
        """From a plan file's meta object (keys this version does not know are ignored)."""
        known = {f.name for f in fields(PlanMeta)}
        kw = {k: v for k, v in d.items() if k in known}
        if isinstance(kw.get("solver"), dict):
            kw["solver"] = SolverStats.from_json(kw["solver"])
        if "defrag_history" in kw:
            kw["defrag_history"] = tuple(tuple(a) for a in kw["defrag_history"])
        return PlanMeta(**kw)


__all__ = ["FamilyStats", "SolverStats", "PlanMeta"]
