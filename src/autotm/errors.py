"""Errors autotm raises on purpose. The CLI prints these as one line (no traceback)."""


class AutotmError(Exception):
    """Base class: a problem the user can act on."""


class GraphError(AutotmError):
    """A TrainingGraph breaks one of its invariants."""


class CaptureError(AutotmError):
    """The training iteration could not be captured (names the op and the module)."""


class ReplayError(AutotmError):
    """A kernel failed while a captured graph was being run."""


class InfeasibleBudget(AutotmError, ValueError):
    """No plan of one planner fits the budget. `minimum` is the smallest budget at which
    that planner finds a plan (planner/floor.py), and planning there succeeds."""

    def __init__(self, budget: int, minimum: int, where: str, planner: str | None = None, *, exact: bool = True):
        self.budget, self.minimum, self.where, self.planner = int(budget), int(minimum), where, planner
        self.exact = exact  # False: a lower bound, known before the profile measured the workspaces
        of = f"{planner} " if planner else ""
        tail = (f"the smallest feasible budget{' for ' + planner if planner else ''} is {self.minimum:,} bytes "
                f"(--budget min plans there)" if exact else
                "the smallest feasible budget is at least that (found before profiling: the kernels' "
                "workspaces may add to it; --budget min plans at it)")
        super().__init__(f"no {of}plan fits a fast budget of {self.budget:,} bytes: {where} needs at least "
                         f"{self.minimum:,} bytes ({self.minimum / 2**20:.1f} MiB) in fast memory at once; {tail}")


class StateChanged(AutotmError):
    """Training state was changed between compiled steps in a way the compiled step cannot
    follow exactly (names what changed: a hyperparameter, a parameter, the mode)."""
