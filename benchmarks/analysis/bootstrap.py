"""Confidence intervals for a system's throughput and for the ratio of two systems', from every rank's timed
iterations of a few repeated jobs: a hierarchical (two-level) percentile bootstrap.

The independent units are the jobs: a job's iterations share its start-up, its placement on the cores and what
else ran on the machine meanwhile, and in synchronous training all ranks wait for the same slowest push, so
iterations within a job and ranks within an iteration are not independent samples. Each resample therefore draws
the jobs with replacement, then, within each drawn job, its iterations with replacement (every rank's time of a
drawn iteration together). scipy.stats.bootstrap resamples one level of independent observations only: over the
pooled iterations it would ignore how much whole jobs differ and give intervals that are too narrow; over the
jobs alone (3 values per system) it would throw away the iterations. So this is a few lines of numpy.

The statistic is the median iteration time over all ranks and iterations, as the points tables use (robust to the
odd iteration a neighbour on the machine slowed); throughput is the samples of one iteration of all workers over
it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 5000


@dataclasses.dataclass(frozen=True)
class Estimate:
    value: float  # the statistic on the data as measured
    low: float  # the percentile interval's ends
    high: float

    def excludes(self, x: float) -> bool:
        return not self.low <= x <= self.high


def stack_jobs(jobs: Sequence[np.ndarray]) -> np.ndarray:
    """(jobs, iterations, ranks) from per-job (iterations, ranks) arrays, cut to the fewest iterations and ranks
    any job has (a job that lost a rank's last iteration must not shift the others' columns)."""
    if not jobs:
        raise ValueError("no jobs to bootstrap")
    iterations = min(np.shape(j)[0] for j in jobs)
    ranks = min(np.shape(j)[1] for j in jobs)
    if iterations == 0 or ranks == 0:
        raise ValueError("a job without timed iterations")
    return np.stack([np.asarray(j, dtype=float)[:iterations, :ranks] for j in jobs])


def resampled_medians(jobs: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The median iteration time of `resamples` hierarchical resamples (jobs, then iterations within each)."""
    data = stack_jobs(jobs)
    n_jobs, n_iterations, _ = data.shape
    picked_jobs = rng.integers(n_jobs, size=(resamples, n_jobs))
    picked_iterations = rng.integers(n_iterations, size=(resamples, n_jobs, n_iterations))
    drawn = data[picked_jobs[:, :, None], picked_iterations]  # (resamples, jobs, iterations, ranks)
    return np.median(drawn.reshape(resamples, -1), axis=1)


def _interval(value: float, replicates: np.ndarray, level: float) -> Estimate:
    low, high = np.percentile(replicates, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return Estimate(float(value), float(low), float(high))


def throughput(jobs: Sequence[np.ndarray], samples_per_iteration: float, *, resamples: int = RESAMPLES,
               level: float = LEVEL, seed: int = 0) -> Estimate:
    """Samples per second of all workers: `samples_per_iteration` over the median iteration time, with its CI."""
    rng = np.random.default_rng(seed)
    value = samples_per_iteration / float(np.median(stack_jobs(jobs)))
    return _interval(value, samples_per_iteration / resampled_medians(jobs, resamples, rng), level)


def ratio(jobs_a: Sequence[np.ndarray], jobs_b: Sequence[np.ndarray], samples_a: float, samples_b: float, *,
          resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """Throughput of a over throughput of b, with its CI: a and b resampled independently (separate jobs)."""
    rng = np.random.default_rng(seed)
    value = (samples_a / float(np.median(stack_jobs(jobs_a)))) / (samples_b / float(np.median(stack_jobs(jobs_b))))
    replicates = (samples_a / resampled_medians(jobs_a, resamples, rng)) / (
        samples_b / resampled_medians(jobs_b, resamples, rng))
    return _interval(value, replicates, level)
