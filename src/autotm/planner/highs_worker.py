"""HiGHS in a process of its own, so that a time limit holds (ilp.solve_model).

HiGHS 1.16 checks its time limit between the steps of its root node, and one step,
central rounding (a line search from the analytic centre, each point propagated over the
conflict pool), ran 47 s without a check on densenet264 cpu 8:1's asynchronous model for
a 9.5 s limit (gdb: HighsPrimalHeuristics::linesearchRounding -> tryRoundedPoint ->
HighsDomain::propagate); no option turns the analytic centre off, and neither the
interrupt callback nor Ctrl-C reaches it. Large models are solved here instead: the
planner kills the process at the limit (and a grace for the start-up), and what the
solver reported by then, its improving solutions and its dual bound, is the result.

Before HiGHS, from the start it was given, the worker runs rins() (a relaxation induced
neighbourhood search) with a share of the limit: on these models HiGHS reaches its own
such search only after its root node, tens of seconds in.

As a script it imports numpy and highspy only (not autotm, not torch): it reads one
pickled request on stdin and writes pickled messages to the file descriptor named in
argv[1] (HiGHS's own output goes to stderr); argv[2] is the planner's process id, whose
end it does not outlive (die_with_parent). It writes:
  ("solution", objective, x)   each improving solution
  ("bound", dual bound)        at most once a second
  ("done", status name, objective, dual bound, primal solution status, x or None)
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

# rins() first, with this share of the time limit (its LP half of it, its sub-MIP the rest)
RINS_SHARE = 0.4
# ... and from a reference point (improve_start): the plan that fits is found there or not at all
REFERENCE_SHARE = 0.6
# the worker's exit status when the planner process is gone (die_with_parent)
ORPHANED = 3
OPTIONS = ("time_limit", "mip_rel_gap", "primal_feasibility_tolerance", "mip_feasibility_tolerance", "threads",
           "output_flag")


@dataclass
class Info:
    """The fields of highspy's HighsInfo that the planner reads."""
    objective_function_value: float = float("inf")
    mip_dual_bound: float = float("-inf")
    primal_solution_status: int = 0  # 2: feasible


def model_arrays(lp: Any) -> dict[str, Any]:
    """lp's model as row-wise arrays: what the worker, rins() and feasible() read."""
    a = lp.a_matrix_
    start, index, value = (np.asarray(a.start_, dtype=np.int64), np.asarray(a.index_, dtype=np.int32),
                           np.asarray(a.value_, dtype=float))
    if a.format_.name != "kRowwise":  # column-wise (a model read from a file): transpose
        cols = np.repeat(np.arange(lp.num_col_, dtype=np.int32), np.diff(start))
        order = np.lexsort((cols, index))
        index, value, rows = cols[order], value[order], index[order]
        start = np.searchsorted(rows, np.arange(lp.num_row_ + 1))
    return dict(
        n=int(lp.num_col_), m=int(lp.num_row_), offset=float(lp.offset_),
        cost=np.asarray(lp.col_cost_, dtype=float), lower=np.asarray(lp.col_lower_, dtype=float),
        upper=np.asarray(lp.col_upper_, dtype=float), row_lower=np.asarray(lp.row_lower_, dtype=float),
        row_upper=np.asarray(lp.row_upper_, dtype=float),
        integer=np.asarray([int(v) != 0 for v in lp.integrality_], dtype=bool),
        start=np.asarray(start, dtype=np.int32), index=index, value=value)


def request(h: Any, lp: Any, x0: np.ndarray | None, rins_share: float = RINS_SHARE,
            reference: np.ndarray | None = None) -> dict[str, Any]:
    """What the worker needs: the model as row-wise arrays, h's options, the start, the
    reference point (improve_start), and the share of the time limit that the search
    around them may take before HiGHS runs from its result."""
    return dict(model_arrays(lp), options={name: h.getOptionValue(name)[1] for name in OPTIONS},
                rins_share=float(rins_share), x0=None if x0 is None else np.asarray(x0, dtype=float),
                reference=None if reference is None else np.asarray(reference, dtype=float))


def feasible(model: dict[str, Any], x: np.ndarray, tol: float = 1e-6) -> bool:
    """Does x satisfy the bounds, rows and integrality of `model` (model_arrays)?"""
    x = np.asarray(x, dtype=float)
    rows = np.repeat(np.arange(model["m"]), np.diff(model["start"]))
    act = np.bincount(rows, weights=model["value"] * x[model["index"]], minlength=model["m"])
    ints = model["integer"]
    return bool(np.all(act >= model["row_lower"] - tol) and np.all(act <= model["row_upper"] + tol)
                and np.all(x >= model["lower"] - tol) and np.all(x <= model["upper"] + tol)
                and np.all(np.abs(x[ints] - np.round(x[ints])) <= tol))


def improve_start(highspy: Any, req: dict[str, Any], time_limit: float,
                  send: Callable[[np.ndarray], None] | None = None) -> np.ndarray | None:
    """The start HiGHS should run from: rins() around req's reference point if it has one
    (a plan that may break rows: the arena's re-solve for a lower budget starts from the
    plan that fragmented), else around its start; whichever of that and the start is
    cheaper and feasible. `send(x)` is told of a better start found."""
    x0: np.ndarray | None = req["x0"]
    ref: np.ndarray | None = req["reference"]
    base = ref if ref is not None else x0
    if base is None or time_limit <= 0 or not req["integer"].any():
        return x0
    x = rins(highspy, req, base, time_limit)
    if x is None or (x0 is not None and not cheaper(req["cost"], x, x0)):
        return x0
    if send is not None:
        send(x)
    return x


def run_isolated(highspy: Any, req: dict[str, Any], deadline: float,
                 verbose: bool = False) -> tuple[np.ndarray | None, Info, Any]:
    """Solve `req` in a worker process, killed after `deadline` seconds if still running.

    Returns (x or None, Info, HighsModelStatus): x the best solution reported (by our
    costs: HiGHS can report a better objective than getSolution() returns, _run);
    kTimeLimit when killed.

    The calling thread waits here until the worker has ended (killed if need be): on
    Linux the worker dies when the thread that started it ends (die_with_parent), so
    only when this process dies."""
    r, w = os.pipe()
    err = None if verbose else tempfile.TemporaryFile()  # (for the message, should it fail)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(w), str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(w,))
    os.close(w)
    state: dict[str, Any] = dict(best=None, best_cost=np.inf, bound=float("-inf"), done=None, killed=False)
    cost = req["cost"]

    def read() -> None:
        with os.fdopen(r, "rb") as f:
            while True:
                try:
                    msg = pickle.load(f)
                except (EOFError, pickle.UnpicklingError, OSError):
                    return
                if msg[0] == "solution":
                    x = msg[2]
                    if float(cost @ x) < state["best_cost"]:
                        state["best"], state["best_cost"] = x, float(cost @ x)
                elif msg[0] == "bound":
                    state["bound"] = max(state["bound"], msg[1])
                elif msg[0] == "done":
                    state["done"] = msg
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            assert proc.stdin is not None  # (stdin=PIPE)
            pickle.dump(req, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            proc.wait(timeout=max(0.0, deadline))
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            state["killed"] = True
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    done = state["done"]
    tail = ""
    if err is not None:
        err.seek(0)
        tail = err.read()[-2000:].decode(errors="replace").strip()
        err.close()
    if done is None and not state["killed"]:
        raise RuntimeError(f"the HiGHS worker process failed (exit status {proc.returncode})"
                           + (f": {tail.splitlines()[-1]}" if tail else ""))
    if done is None:  # killed (or died): what it reported by then
        x = state["best"]
        info = Info(objective_function_value=state["best_cost"] + req["offset"], mip_dual_bound=state["bound"],
                    primal_solution_status=2 if x is not None else 0)
        return x, info, highspy.HighsModelStatus.kTimeLimit
    _, status, objective, bound, primal_status, x = done
    if x is not None and state["best"] is not None and cheaper(cost, state["best"], x):
        x = state["best"]
    return x, Info(objective, bound, primal_status), getattr(highspy.HighsModelStatus, status)


def _highs(highspy: Any, req: dict[str, Any], time_limit: float, lower: np.ndarray | None = None,
           upper: np.ndarray | None = None, integer: bool = True) -> Any:
    """A Highs object holding req's model (its bounds replaced by lower/upper if given;
    the LP relaxation when not integer), with req's options and this time limit."""
    h = highspy.Highs()
    for name, value in req["options"].items():
        h.setOptionValue(name, value)
    h.setOptionValue("time_limit", float(time_limit))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_, lp.offset_ = req["n"], req["m"], req["offset"]
    lp.col_cost_ = req["cost"]
    lp.col_lower_ = req["lower"] if lower is None else lower
    lp.col_upper_ = req["upper"] if upper is None else upper
    lp.row_lower_, lp.row_upper_ = req["row_lower"], req["row_upper"]
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in req["integer"]]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = req["n"], req["m"]
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = req["start"], req["index"], req["value"]
    if h.passModel(lp) == highspy.HighsStatus.kError:
        sys.exit("HiGHS rejected the model (passModel)")
    return h


def set_start(highspy: Any, h: Any, x: np.ndarray) -> None:
    """Give h the solution x to start from (HiGHS keeps it as its incumbent if feasible)."""
    sol = highspy.HighsSolution()
    sol.col_value = list(x)
    sol.value_valid = True
    h.setSolution(sol)


def cheaper(cost: np.ndarray, x: np.ndarray, y: np.ndarray) -> bool:
    """Whether x costs less than y by more than rounding (relative 1e-12)."""
    cx, cy = float(cost @ x), float(cost @ y)
    return cx < cy - 1e-12 * max(1.0, abs(cy))


def rins(highspy: Any, req: dict[str, Any], x0: np.ndarray, time_limit: float) -> np.ndarray | None:
    """Relaxation induced neighbourhood search (Danna, Rothberg, Le Pape 2005) from x0:
    solve the LP relaxation, fix every integer column on which it agrees with x0, and
    solve the small MIP left, from x0. A better solution than x0, or None. x0 may break
    rows: then any solution of the small MIP is returned (the LP's agreement with x0
    keeps it close to x0).

    HiGHS runs the same search itself, but only after its root node's cut rounds and
    central rounding: on densenet264 cpu 8:1's asynchronous model (copies charged in full,
    25k binaries) its sub-MIP found 2.440 s at 42.8 s from a 3.179 s start; this finds
    2.471 s in 4.5 s (LP 2.0 s, 3.7k integer columns left free)."""
    t0 = time.monotonic()
    x0_feasible = feasible(req, x0)
    h = _highs(highspy, req, time_limit / 2, integer=False)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    agree = req["integer"] & (np.abs(np.asarray(h.getSolution().col_value) - x0) <= 1e-6)
    if (agree.all() and x0_feasible) or not agree.any():  # x0 solves the relaxation, or nothing to fix
        return None
    lower, upper = req["lower"].copy(), req["upper"].copy()
    lower[agree] = upper[agree] = np.round(x0[agree])
    h = _highs(highspy, req, max(0.1, time_limit - (time.monotonic() - t0)), lower, upper)
    if x0_feasible:
        set_start(highspy, h, x0)
    h.run()
    if h.getInfo().primal_solution_status != 2:
        return None
    x = np.asarray(h.getSolution().col_value, dtype=float)
    return x if not x0_feasible or cheaper(req["cost"], x, x0) else None


def die_with_parent(parent: int) -> None:
    """End this process when the planner process `parent` ends, however it ends (SIGKILL
    included): HiGHS would otherwise run on, a CPU busy, until its time limit, which it
    can overrun by tens of seconds (the module's docstring).

    On Linux the kernel sends SIGKILL (PR_SET_PDEATHSIG) when the thread that started this
    process ends: run_isolated's, which waits for the worker, so when the planner dies.
    Had the planner died before that was set, no signal would come: the parent process is
    then another already (init or a subreaper), and this process exits at once. Elsewhere,
    or where prctl fails, watch_parent polls for the same change."""
    if not _pdeathsig():
        watch_parent(parent)
    if os.getppid() != parent:
        os._exit(ORPHANED)


def _pdeathsig() -> bool:
    """SIGKILL to this process when its parent thread ends (Linux's prctl); whether set."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl in this C library
        return False


def watch_parent(parent: int, interval: float = 0.2) -> threading.Thread:
    """A daemon thread that ends this process (os._exit(ORPHANED)) once its parent is no
    longer `parent`: a process whose parent died is re-parented (to init, a subreaper or
    launchd). highspy's run() releases the GIL while HiGHS solves (a Python thread ticked
    every 50 ms through a 3 s solve in the main thread), so the thread runs throughout.
    (On Windows a parent's death does not change getppid(); run_isolated is POSIX-only,
    pass_fds.)"""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(ORPHANED)
    t = threading.Thread(target=watch, name="autotm-parent-watch", daemon=True)
    t.start()
    return t


def _solve(req: dict[str, Any], out: IO[bytes]) -> None:
    import highspy

    lock = threading.Lock()  # HiGHS calls back from its worker threads
    last = [0.0]

    def send(msg: tuple[Any, ...]) -> None:
        with lock:
            pickle.dump(msg, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()

    t0 = time.monotonic()
    limit = float(req["options"]["time_limit"])
    x0 = improve_start(highspy, req, req["rins_share"] * limit,
                       lambda x: send(("solution", float(req["cost"] @ x + req["offset"]), x)))
    h = _highs(highspy, req, max(0.1, limit - (time.monotonic() - t0)))
    if x0 is not None:
        set_start(highspy, h, x0)

    def improving(e: Any) -> None:
        d = e.data_out
        send(("solution", float(d.objective_function_value), np.array(d.mip_solution, dtype=float)))

    def progress(e: Any) -> None:
        if time.monotonic() - last[0] >= 1.0:
            last[0] = time.monotonic()
            send(("bound", float(e.data_out.mip_dual_bound)))
    h.cbMipImprovingSolution.subscribe(improving)
    h.cbMipInterrupt.subscribe(progress)
    h.run()
    info = h.getInfo()
    feasible = info.primal_solution_status == 2
    x = np.asarray(h.getSolution().col_value, dtype=float) if feasible else None
    send(("done", h.getModelStatus().name, float(info.objective_function_value), float(info.mip_dual_bound),
          int(info.primal_solution_status), x))


if __name__ == "__main__":
    die_with_parent(int(sys.argv[2]))
    out = os.fdopen(int(sys.argv[1]), "wb")
    os.dup2(2, 1)  # HiGHS prints on stdout: keep it off the messages and the parent's output
    _solve(pickle.load(sys.stdin.buffer), out)
    out.close()
