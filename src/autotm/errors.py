"""Errors autotm raises on purpose: one AutotmError per problem a user can cause and act on.
The CLI prints these as one line (no traceback); any other exception is a bug and shows
its traceback. Each module that raises one re-exports it where it was defined before."""


class AutotmError(Exception):
    """Base class: a problem the user can act on."""


class InputError(AutotmError, ValueError):
    """A value the user gave is not valid (model, preset, size, budget, formulation, memory
    system, tier spec, option, file); the message names it and the valid choices."""


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


class PlanError(AutotmError):
    """A plan is malformed, made for another graph, or breaks a rule of the timeline."""


class SolverTimeout(AutotmError, TimeoutError):
    """The solver found no plan within its time limit."""


class TierError(AutotmError):
    """A memory tier cannot do what was asked (slow directory unusable, disk or capacity
    full, unsupported machine, misuse of a handle). The message says what to change."""


class BudgetExceeded(AutotmError):
    """The runtime held more fast-tier bytes than the budget allows."""


class SessionFailed(AutotmError):
    """An iteration of this session failed or was interrupted: it has nothing to report."""


class NothingToPlot(AutotmError, ValueError):
    """The records hold no finished run a figure needs."""
