"""Real multi-process P3 jobs on loopback: aggregation correctness, identical workers, no pull requests,
exactly one broadcast per slice per worker per iteration, and the pluggable per-slice update function."""

import json
import os

import numpy as np
import pytest
from harness import SCRIPTS, run_job

pytestmark = pytest.mark.integration

SLICE = "1000"
ITERATIONS = 3  # agg_worker.ITERATIONS


def _job(tmp_path, workers, servers, extra_env=None):
    env = {"P3_TEST_OUT": str(tmp_path), "P3_SLICE_SIZE": SLICE}
    env.update(extra_env or {})
    result = run_job(workers, servers, [os.path.join(SCRIPTS, "agg_worker.py")], env=env,
                     server_script="test_server.py")
    assert result.returncode == 0, result.stdout
    workers_out = [json.load(open(tmp_path / f"worker{r}.json")) for r in range(workers)]
    servers_out = [json.load(open(tmp_path / f"server{r}.json")) for r in range(servers)]
    arrays = [dict(np.load(tmp_path / f"worker{r}.npz")) for r in range(workers)]
    return workers_out, servers_out, arrays


@pytest.mark.parametrize("workers,servers", [(1, 1), (2, 2), (4, 3), (2, 3), (4, 1)])
def test_aggregation_matches_numpy_and_protocol_has_no_pull(tmp_path, workers, servers):
    # agg_worker asserts every broadcast sum (float32/float64/float16, several iterations) against numpy.
    workers_out, servers_out, arrays = _job(tmp_path, workers, servers)
    assert sorted(w["rank"] for w in workers_out) == list(range(workers))

    # Every worker ends with bit-identical buffers.
    for other in arrays[1:]:
        assert other.keys() == arrays[0].keys()
        for k in arrays[0]:
            assert np.array_equal(other[k], arrays[0][k]), k

    slices = workers_out[0]["slices"]
    n_slices = sum(len(s) for s in slices.values())
    # Slices of all keys spread round-robin with one counter, so every server owns some.
    owners = [s[3] for k in slices for s in slices[k]]
    assert owners == [i % servers for i in range(n_slices)]

    for w in workers_out:
        sent = {c: n for c, n in w["counters"]["sent"].items() if n}
        received = {c: n for c, n in w["counters"]["received"].items() if n}
        # A worker only ever says hello, init, push and bye to servers (and talks to the scheduler):
        # no message asks for a value. Values arrive as unrequested broadcasts, one per slice and round.
        assert set(sent) <= {"HELLO", "INIT", "PUSH", "BYE", "REGISTER", "FINISH"}, sent
        assert sent["PUSH"] == n_slices * ITERATIONS
        assert sent["INIT"] == n_slices
        assert received.get("BROADCAST") == n_slices * (ITERATIONS + 1), received
        assert "ERROR" not in received

    total_broadcasts = sum(s["counters"]["sent"]["BROADCAST"] for s in servers_out)
    assert total_broadcasts == n_slices * workers * (ITERATIONS + 1)
    assert sum(s["counters"]["received"]["PUSH"] for s in servers_out) == n_slices * workers * ITERATIONS
    for s in servers_out:
        assert s["counters"]["rejected_frames"] == 0


def test_per_slice_update_function_runs_sgd_on_servers(tmp_path):
    # The servers run value -= 0.5 * sum per slice; agg_worker checks the weights it gets back each iteration.
    _, servers_out, arrays = _job(tmp_path, 2, 2, {"P3_TEST_UPDATER": "sgd:0.5", "P3_TEST_LR": "0.5"})
    for k in arrays[0]:
        assert np.array_equal(arrays[0][k], arrays[1][k])
    # The weights moved: they are no longer worker 0's initial value.
    assert not np.array_equal(arrays[0]["many"], (np.arange(7345) % 5).astype("float32"))
