"""The results store: one JSON Lines record per benchmark run (a "cell" of a sweep).

A `Record` holds what the figures need (the original AutoTM's per-run fields, reference
§5.1) plus the memory system, whether the time was measured or simulated, the
environment and the commit. `ResultsStore` appends records durably (flush + fsync per
record, so an interrupted sweep loses nothing it finished) and reads them back; a sweep
run again skips every cell whose key is already stored with a final status.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError

log = logging.getLogger("autotm.results")

# Statuses a cell does not need to be run again for; "error" cells are retried.
FINAL_STATUSES = ("ok", "infeasible", "unsupported")

EXPERIMENTS = ("conventional", "case-study", "large", "gpu", "test")


@dataclass
class Record:
    """One run: a workload planned (and, on real hardware, executed) with one formulation
    at one budget on one memory system. Bytes are ints, times float seconds."""

    experiment: str  # conventional, case-study, large, gpu, test
    workload: str  # e.g. resnet50_batchsize_2_image_64
    model: str
    preset: str | None
    batch: int
    image: int
    memory_system: str  # cpu+file, sim:optane, cuda+host, ...
    access: str  # staged or direct
    simulated: bool  # True: predicted only (a sim: spec); False: executed and timed
    formulation: str  # static, synchronous, asynchronous, first-touch, lru, all-fast, all-slow, save-on-cpu
    budget: str | None  # the budget as requested: "4:1", "185GB", or None (all-fast, all-slow, save-on-cpu)
    ratio: str | None  # slow:fast ratio when the budget is one, e.g. "4:1"
    budget_bytes: int | None  # the fast budget the planner worked with
    pin_params: bool = False
    window: int | None = None  # async window of the asynchronous ILP
    time_limit: float | None = None  # solver time limit

    status: str = "ok"  # ok, infeasible, unsupported, error
    message: str = ""  # why it is infeasible / unsupported / failed
    min_budget_bytes: int | None = None  # infeasible: the smallest feasible budget, when known

    predicted_seconds: float | None = None  # simulator's iteration time for the plan
    measured_seconds: float | None = None  # median measured iteration time; None when simulated
    iteration_seconds: list[float] = field(default_factory=list)
    oracle_seconds: float | None = None  # sum of the profiled all-fast kernel times (no memory limit, no moves)
    solve_seconds: float | None = None
    plan_seconds: float | None = None
    gap: float | None = None
    solver_status: str | None = None

    peak_fast_bytes: int | None = None  # measured when executed, else planned
    arena_bytes: int | None = None  # the plan's static layout of fast memory (fragmentation included)
    plan_warning: str = ""  # e.g. the arena did not fit the budget
    peak_live_bytes: int | None = None  # the all-fast footprint of the iteration
    bytes_to_slow: int | None = None  # per iteration
    bytes_to_fast: int | None = None
    moves: int | None = None  # copies: prefetches and evicts
    sync_moves_to_slow: int = 0
    sync_moves_to_fast: int = 0
    async_moves_to_slow: int = 0
    async_moves_to_fast: int = 0
    sync_bytes_to_slow: int = 0
    sync_bytes_to_fast: int = 0
    async_bytes_to_slow: int = 0
    async_bytes_to_fast: int = 0

    num_kernels: int | None = None
    # Kernel IO residency (the original's bytes_dram_input_tensors & co.), summed over
    # kernels: operand bytes, those in fast memory while the kernel ran, and those that
    # were kept there since their previous use or production (not brought back by a move).
    kernel_input_bytes: int | None = None
    kernel_output_bytes: int | None = None
    kernel_input_bytes_fast: int | None = None
    kernel_output_bytes_fast: int | None = None
    kernel_input_bytes_kept: int | None = None

    identical: bool | None = None  # bit-identical to eager PyTorch; None when not verified
    peak_rss_bytes: int | None = None
    peak_allocated_bytes: int | None = None  # GPU
    peak_reserved_bytes: int | None = None  # GPU

    environment: dict = field(default_factory=dict)
    commit: str | None = None
    timestamp: str = ""

    # ---- identity of the cell ---------------------------------------------------------------
    @property
    def key(self) -> tuple:
        return cell_key(self.experiment, self.workload, self.memory_system, self.formulation, self.budget,
                        self.pin_params)

    @property
    def seconds(self) -> float | None:
        """The iteration time the figures use: measured when executed, else predicted."""
        return self.measured_seconds if self.measured_seconds is not None else self.predicted_seconds

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"), default=_jsonable)

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def cell_key(experiment: str, workload: str, memory_system: str, formulation: str, budget: str | None,
             pin_params: bool) -> tuple:
    """What makes two runs the same cell of a sweep."""
    return (experiment, workload, memory_system, formulation, budget or "-", bool(pin_params))


def _jsonable(x: Any):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


class ResultsStore:
    """Records of one experiment in a JSON Lines file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def append(self, record: Record) -> None:
        """Write one record and make it durable before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_partial_line()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _drop_partial_line(self) -> None:
        """A write cut off by a kill leaves a line without its newline: remove it, so the
        next record starts a line of its own."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            cut = data.rfind(b"\n") + 1
            log.warning("%s: dropping a truncated last line (%d bytes) left by an interrupted write",
                        self.path, len(data) - cut)
            f.truncate(cut)

    def load(self) -> list[Record]:
        """Every record in file order. A truncated last line (an interrupted write) is
        skipped with a warning; a malformed line elsewhere is an error."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").split("\n")
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(Record.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                if i == len(lines) - 1:  # no newline after it: the write was cut off
                    log.warning("%s: skipping a truncated last line (%s)", self.path, e)
                    continue
                raise InputError(f"{self.path}:{i + 1}: not a results record: {e}") from None
        return out

    def latest(self) -> list[Record]:
        """One record per cell: the last one written."""
        by_key: dict[tuple, Record] = {}
        for r in self.load():
            by_key.pop(r.key, None)
            by_key[r.key] = r
        return list(by_key.values())

    def done_keys(self) -> set[tuple]:
        """Cells that need not run again (final status)."""
        return {r.key for r in self.latest() if r.status in FINAL_STATUSES}


def store_for(out_dir: str | os.PathLike, experiment: str) -> ResultsStore:
    """The store of `experiment` in the results folder: OUT/<experiment>.jsonl."""
    return ResultsStore(Path(out_dir) / f"{experiment}.jsonl")


def load_records(paths: Iterable[str | os.PathLike]) -> list[Record]:
    out: list[Record] = []
    for p in paths:
        out += ResultsStore(p).latest()
    return out


def environment() -> dict:
    """Where the numbers came from."""
    import torch

    from ..profile.environment import cpu_model

    return {
        "torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "hostname": socket.gethostname(),
        "platform": sys.platform,
    }


def git_commit() -> str | None:
    """The commit of the autotm source tree ("<sha>+dirty" with local changes), if it is a git checkout."""
    here = Path(__file__).resolve().parent.parent  # the autotm package
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
