"""The confidence intervals on the ratios the README and docs show (benchmarks/analysis/bench_stats.ratio_ci)."""

import random

import pytest

from benchmarks.analysis.bench_stats import ratio_ci

pytestmark = pytest.mark.unit


def runs(mean: float, rng: random.Random, repeats: int = 3, iterations: int = 20, jitter: float = 0.05):
    return [[rng.gauss(mean, jitter) for _ in range(iterations)] for _ in range(repeats)]


def test_a_clear_difference_gives_an_interval_that_excludes_one():
    rng = random.Random(1)
    fast, slow = runs(1.0, rng), runs(1.2, rng)  # seconds per iteration: fast is 1.2x the throughput
    ratio, low, high = ratio_ci(fast, slow)
    assert low < ratio < high
    assert 1.0 < low and high < 1.3 and ratio == pytest.approx(1.2, rel=0.03)
    inverse = ratio_ci(slow, fast)
    assert inverse[0] == pytest.approx(1 / ratio) and inverse[2] < 1.0


def test_the_same_system_gives_an_interval_around_one_and_the_same_rows_the_same_interval():
    same = runs(1.0, random.Random(2))
    ratio, low, high = ratio_ci(same, same)
    assert ratio == 1.0 and low < 1.0 < high
    assert ratio_ci(same, same) == (ratio, low, high)  # seeded


def test_the_interval_reflects_the_spread_between_repeats_not_only_within_them():
    # Every iteration alike within a run, the runs far apart: an iid bootstrap over the pooled iterations would
    # be narrow; the repeats' spread must show.
    b = [[1.0] * 20, [1.2] * 20, [1.4] * 20]
    a = [[1.0] * 20] * 3
    ratio, low, high = ratio_ci(a, b)
    assert ratio == pytest.approx(1.2) and low <= 1.0 + 1e-9 and high >= 1.4 - 1e-9


def test_runs_of_different_lengths_and_missing_runs():
    rng = random.Random(3)
    a = runs(1.0, rng)
    b = runs(1.1, rng)
    b[2] = b[2][:7]
    ratio, low, high = ratio_ci(a, b, resamples=300)
    assert 1.0 < low < ratio < high
    with pytest.raises(ValueError):
        ratio_ci([], b)
