"""One measurement in a fresh Python process: what the benchmarks that need a clean process
(glibc's heap, the CPU allocator, RSS) share.

The child runs the benchmark's own script in its measuring mode and ends with one line
"RESULT <json>" (emit); the parent reads the last such line (run_child). A child that
fails, is killed or runs out of time raises ChildFailed with a one-line reason, and the
benchmark prints it and goes on with its other cases.
"""

from __future__ import annotations

import json
import subprocess
import sys

PREFIX = "RESULT "


class ChildFailed(RuntimeError):
    """A child gave no result: `str()` is one line; `stderr` holds the end of its stderr."""

    def __init__(self, why: str, stderr: str = ""):
        super().__init__(why)
        self.stderr = stderr


def emit(result: dict) -> None:
    """The child's result, as the last line the parent reads."""
    print(PREFIX + json.dumps(result), flush=True)


def run_child(script: str, args: list[str], timeout: float | None = None) -> dict:
    """`python script *args` in a fresh process; the dict its last RESULT line holds."""
    try:
        r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ChildFailed(f"did not finish within {timeout:.0f} s") from e
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(PREFIX)]
    if r.returncode != 0 or not lines:
        why = ("killed (out of memory?)" if r.returncode in (-9, 137)
               else (r.stderr.strip().splitlines() or ["no output"])[-1])
        raise ChildFailed(f"failed (exit {r.returncode}): {why}", r.stderr[-3000:])
    return json.loads(lines[-1][len(PREFIX):])
