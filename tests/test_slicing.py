"""Slicing and round-robin placement (the pure function the workers use)."""

import pytest

from p3kv import _p3

pytestmark = pytest.mark.unit


def slices(count, size=50_000, servers=3, rr=0):
    return _p3.slice_key(count, size, servers, rr)


@pytest.mark.parametrize("count,expected_counts", [
    (1, [1]),
    (50_000, [50_000]),
    (50_001, [50_000, 1]),
    (120_001, [50_000, 50_000, 20_001]),
])
def test_slice_sizes(count, expected_counts):
    got, rr = slices(count)
    assert [s[2] for s in got] == expected_counts
    assert [s[1] for s in got] == [i * 50_000 for i in range(len(expected_counts))]
    assert [s[0] for s in got] == list(range(len(expected_counts)))
    assert rr == len(expected_counts)


def test_many_slices_cover_the_array_exactly():
    got, _ = slices(2_359_296, servers=4)  # resnet50's largest array
    assert sum(s[2] for s in got) == 2_359_296
    assert max(s[2] for s in got) <= 50_000
    assert [s[3] for s in got] == [i % 4 for i in range(len(got))]


def test_round_robin_counter_runs_across_small_keys():
    # Twelve keys smaller than a slice still spread evenly over three servers.
    rr, owners = 0, []
    for _ in range(12):
        got, rr = slices(64, servers=3, rr=rr)
        owners.append(got[0][3])
    assert owners == [0, 1, 2] * 4


def test_empty_array_has_no_slices():
    assert slices(0) == ([], 0)
