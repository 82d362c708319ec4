"""The arithmetic of the test jobs' own workers (tests/scripts/failure_worker.py): what they push must stay float32
and their expected sums exact for as long as a job can run, or a fast machine fails a test for the script's sake.

A job at full speed on an idle machine passed iteration 32768 within about ten seconds; there worker 1's gradient
turned float64 (numpy 1.x's value-based casting of a Python int of 2^16 or more), the push was refused, the job
failed, and the scheduler's exit cut tests/test_hostile.py's slow frame 8.7 s after it began: a 'deadline' that
was no deadline at all.
"""

import importlib.util
import os

import numpy as np
import pytest
from harness import SCRIPTS

pytestmark = pytest.mark.unit


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


failure_worker = load("failure_worker")


@pytest.mark.parametrize("iteration", [1, 2**15 - 1, 2**15, 2**16, 2**20])
@pytest.mark.parametrize("size", [2, 4])
def test_failure_worker_pushes_float32_and_sums_exactly_past_iteration_32768(size, iteration):
    assert failure_worker.exact(size, iteration)
    grads = [failure_worker.gradient(rank, iteration) for rank in range(size)]
    assert all(g.dtype == np.float32 for g in grads), [g.dtype for g in grads]
    total = np.zeros(failure_worker.SIZE, np.float32)
    for g in grads:
        total += g  # in float32, as the servers sum
    expected = failure_worker.expected_sum(size, iteration)
    assert expected.dtype == np.float32
    assert np.array_equal(total, expected)
    exact = [iteration * size * (size + 1) // 2 + size * i for i in (0, failure_worker.SIZE - 1)]
    assert [int(total[0]), int(total[-1])] == exact


def test_failure_worker_stops_where_float32_would_round():
    size = 2
    last = (failure_worker.EXACT - 1 - size * (failure_worker.SIZE - 1)) // 3
    assert failure_worker.exact(size, last) and not failure_worker.exact(size, last + 1)
