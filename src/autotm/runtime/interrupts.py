"""A Ctrl-C guard for iterations: the interrupt takes effect between kernels."""

from __future__ import annotations

import signal
import threading
from typing import Any, Literal


class CtrlCBetweenKernels:
    """Within an iteration a Ctrl-C takes effect before the next kernel (or after the last):
    one landing between an I/O completion and its bookkeeping left a move the cleanup
    waited for forever, or a slow extent nobody freed. A second Ctrl-C interrupts at once.
    Only on the main thread, and only over Python's default handler.

    `finish_from`: a Ctrl-C at or after that kernel lets the iteration finish (the caller
    raises once it has taken the new state; Executor.run_iteration)."""

    def __init__(self, finish_from: int | None = None) -> None:
        self.hit = False
        self._old: Any = None
        self.finish_from = finish_from

    def __enter__(self) -> "CtrlCBetweenKernels":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False
