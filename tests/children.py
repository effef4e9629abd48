"""For tests that interrupt a child process with SIGINT."""

import signal


def sigint_default() -> None:
    """Popen(preexec_fn=...): SIGINT back to its default in the child. A suite started from a
    background job inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    handler, so the child would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(p) -> None:
    """In a test's `finally`: kill the child if it is still running (a child left writing
    would outlive the suite)."""
    if p.poll() is None:
        p.kill()
        p.wait()
