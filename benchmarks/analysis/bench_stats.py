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


def ratio_ci(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]], *, resamples: int = 2000,
             confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """System a's throughput over system b's (b's median seconds per iteration over a's, every iteration of every
    repeat pooled) and its bootstrap confidence interval: (ratio, low, high).

    The bootstrap is hierarchical, because iterations of one run are not independent of each other: each
    resample draws the repeats with replacement, then the iterations within each drawn repeat, for each system
    separately (their repeats were interleaved, not paired). With few repeats the interval is still mostly the
    spread between them, which is the variation a rerun would see. Seeded: the same rows give the same interval.
    (Written with numpy rather than scipy.stats.bootstrap, which resamples one flat sample, not repeats and then
    iterations.)"""
    import numpy as np

    rng = np.random.default_rng(seed)
    a = [np.asarray(r, dtype=float) for r in a_runs if len(r)]
    b = [np.asarray(r, dtype=float) for r in b_runs if len(r)]
    if not a or not b:
        raise ValueError("no iterations")

    def medians(runs: list) -> np.ndarray:
        if len({len(r) for r in runs}) == 1:  # the usual case, all at once: (resamples, repeats, iterations)
            table = np.stack(runs)
            chosen = rng.integers(len(runs), size=(resamples, len(runs), 1))
            drawn = table[chosen, rng.integers(table.shape[1], size=(resamples, len(runs), table.shape[1]))]
            return np.median(drawn.reshape(resamples, -1), axis=1)
        out = np.empty(resamples)
        for i in range(resamples):
            chosen = rng.integers(len(runs), size=len(runs))
            out[i] = np.median(np.concatenate([rng.choice(runs[c], size=len(runs[c])) for c in chosen]))
        return out

    ratios = medians(b) / medians(a)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    ratio = float(np.median(np.concatenate(b)) / np.median(np.concatenate(a)))
    return ratio, float(low), float(high)
