"""What a profile did: ProfileStats (measured, from the cache, seconds by part), and the
progress callback's type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .pace import PaceCheck

Progress = Callable[[int, int, str], None]  # (done, total, what)


@dataclass
class ProfileStats:
    measured: int = 0  # kernel placements timed in this run
    cache_hits: int = 0  # kernel placements found in the cache
    move_samples_measured: int = 0
    move_samples_cached: int = 0
    unique_kernels: int = 0
    total_kernels: int = 0
    seconds: float = 0.0
    cache_path: str = ""
    cache_rebuilt: str | None = None
    iterations: int = 0  # in-situ replay iterations run
    simulated_from: str | None = None  # the tier spec of a sim:<spec> cost model
    overhead_measured: bool = False  # the executor's overheads were measured (autotm.runtime.overhead)
    pace: PaceCheck | None = None  # the machine's pace now and when the cache was filled
    # wall seconds by part of the profile: "pace", "moves", "kernels" (in-situ iterations),
    # "wake" (kernels after a blocking move), "overhead" (the executor's, autotm.runtime.overhead)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    waited_seconds: float = 0.0  # waiting for another process measuring into the same cache

    def add_seconds(self, part: str, seconds: float) -> None:
        self.stage_seconds[part] = self.stage_seconds.get(part, 0.0) + seconds

    @property
    def nothing_new(self) -> bool:
        return (self.measured == 0 and self.move_samples_measured == 0 and self.iterations == 0
                and not self.overhead_measured)

    def message(self) -> str:
        if self.simulated_from:
            return f"simulated: roofline from tier spec {self.simulated_from} (nothing measured but the peak FLOP/s)"
        if self.nothing_new:
            return (f"nothing new measured: {self.cache_hits} kernel timings and "
                    f"{self.move_samples_cached} move samples from the cache")
        return (f"measured {self.measured} kernel timings and {self.move_samples_measured} move samples "
                f"in {self.iterations} replay iterations ({self.cache_hits} kernel timings from the cache)"
                + (", and the executor's overheads" if self.overhead_measured else "")
                + f" in {self.seconds:.1f} s")
