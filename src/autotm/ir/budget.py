"""Fast-memory budgets: absolute bytes ("6GB", "512MiB", 123) or the paper's slow:fast ratios.

"min" is the smallest budget at which the planner finds a plan (planner/floor.py).
A ratio "r:1" (slow:fast) means fast = peak_live / (r + 1): "0:1" is all fast, "1:0" all
slow, and the paper's common ratios are 1:0, 8:1, 4:1, 1:1, 0:1.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ..errors import InputError

COMMON_RATIOS = ("1:0", "8:1", "4:1", "1:1", "0:1")

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_ratio(text: str) -> Fraction | None:
    """'4:1' -> 4 (slow per fast); '1:0' -> None meaning all slow (infinite ratio)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*", text)
    if not m:
        raise InputError(f"not a slow:fast ratio: {text!r} (expected e.g. 4:1)")
    slow, fast = Fraction(m.group(1)), Fraction(m.group(2))
    if slow == 0 and fast == 0:
        raise InputError("ratio 0:0 is meaningless")
    return None if fast == 0 else slow / fast


MINIMUM = "min"  # the smallest budget the planner finds a plan at (planner/floor.py)


def is_minimum(budget: object) -> bool:
    return isinstance(budget, str) and budget.strip().lower() == MINIMUM


def is_ratio(text: object) -> bool:
    return isinstance(text, str) and ":" in text


def parse_budget(budget: object, peak_live_bytes: int) -> int:
    """Bytes of fast memory for `budget`: an int, a size string or a slow:fast ratio."""
    if budget is None:
        raise InputError("a budget is needed: bytes (e.g. 6GB, 512MiB) or a slow:fast ratio (e.g. 4:1)")
    if isinstance(budget, bool):
        raise InputError(f"not a budget: {budget!r}")
    if is_minimum(budget):
        raise InputError("budget 'min' is the planner's smallest feasible budget: only plan() knows it")
    if isinstance(budget, int):
        if budget < 0:
            raise InputError(f"budget must be non-negative, got {budget}")
        return budget
    text = str(budget).strip()
    if is_ratio(text):
        r = parse_ratio(text)
        return 0 if r is None else int(Fraction(peak_live_bytes) / (r + 1))
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"not a budget: {text!r} (use bytes like 6GB, 512MiB, 1048576, a ratio like 4:1, or min)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
