"""Statistics of repeated runs: median and interquartile range over every timed iteration of every repeat, and
the spread of the per-repeat medians (how much one run differs from the next)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile), linear interpolation between order statistics."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclasses.dataclass(frozen=True)
class Spread:
    """Seconds per iteration of one point over all its repeats."""

    n: int  # repeats (runs) that reported
    iterations: int
    median_s: float
    q1_s: float
    q3_s: float
    run_median_min_s: float
    run_median_max_s: float

    def throughput(self, samples_per_iteration: float) -> tuple[float, float, float]:
        """(median, low, high) throughput: the quartiles of time turned into rates (q3 is the low rate)."""
        return (samples_per_iteration / self.median_s, samples_per_iteration / self.q3_s,
                samples_per_iteration / self.q1_s)


def spread(runs: Sequence[Sequence[float]]) -> Spread:
    """`runs`: each repeat's timed iterations (seconds)."""
    runs = [list(r) for r in runs if r]
    if not runs:
        raise ValueError("no iterations")
    every = [t for r in runs for t in r]
    q1, median, q3 = quartiles(every)
    medians = [statistics.median(r) for r in runs]
    return Spread(len(runs), len(every), median, q1, q3, min(medians), max(medians))

