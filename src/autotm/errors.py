"""Errors autotm raises on purpose. The CLI prints these as one line (no traceback)."""


class AutotmError(Exception):
    """Base class: a problem the user can act on."""


class GraphError(AutotmError):
    """A TrainingGraph breaks one of its invariants."""


class CaptureError(AutotmError):
    """The training iteration could not be captured (names the op and the module)."""


class ReplayError(AutotmError):
    """A kernel failed while a captured graph was being run."""


class StateChanged(AutotmError):
    """Training state was changed between compiled steps in a way the compiled step cannot
    follow exactly (names what changed: a hyperparameter, a parameter, the mode)."""
