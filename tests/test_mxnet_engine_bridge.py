"""The engine bridge (cpp/mxnet/engine_bridge.cc) in 2-worker x 1-server MXNet jobs (tests/scripts/engine_cases.py):

- `out` another handle of the gradient's memory (a reshape, a slice of all of it, a detached handle, rows of the same
  array apart from it) is one engine variable: the pushpull completes with the sum, as MXNet's dist_sync does
  with the same script, instead of waiting for itself forever. `out` overlapping only part of the gradient is
  refused with the bridge's message, which reaches Python whole, and the workers stay in step.
- A push MXNet skips because its gradient's producing operation failed still counts: the script that catches the
  error and trains on gets the same sums on both workers in every later step, not sums of two iterations.

Every job runs under the launcher's --timeout and a subprocess timeout; every exit code is checked.
"""

from __future__ import annotations

import json
import os

import pytest
from harness import SCRIPTS, run_job

pytestmark = pytest.mark.mxnet
pytest.importorskip("mxnet")

SCRIPT = os.path.join(SCRIPTS, "engine_cases.py")
WORKERS, SERVERS = 2, 1
JOB_TIMEOUT = 60  # seconds the launcher gives a job; the subprocess gets a little more
SUM = [[3.0] * 3] * 2  # key 0 is 2 x 3; worker r pushes r + 1
OVERLAP_MESSAGE = ("p3kv: pushpull of key 0: out overlaps part of the gradient (it starts 12 bytes after it, and "
                   "each is 24 bytes): pass the gradient itself as out (in place), or an array apart from it. Zeros "
                   "were pushed for this worker so that the workers stay at the same iteration")


def job(mode: str, kvstore: str = "p3", check: bool = True) -> tuple[str, dict, int]:
    """Runs engine_cases.py MODE KVSTORE; returns the output, {(case, rank) or (step, rank): result} and the exit
    code (checked to be 0 with `check`)."""
    result = run_job(WORKERS, SERVERS, [SCRIPT, mode, kvstore], timeout=JOB_TIMEOUT + 30,
                     launcher_args=["--kvstore", kvstore, "--timeout", str(JOB_TIMEOUT)])
    if check:
        assert result.returncode == 0, result.stdout[-6000:]  # 124: the launcher's timeout (a hang)
    results = {}
    for line in result.stdout.splitlines():
        if "RESULT " in line:
            r = json.loads(line.split("RESULT ", 1)[1])
            results[(r.get("step", r["case"]), r["rank"])] = r
    return result.stdout, results, result.returncode


@pytest.fixture(scope="module")
def alias_jobs():
    return {kvstore: job("alias", kvstore)[1] for kvstore in ("p3", "dist_sync")}


IN_PLACE = ["reshape", "slice of all", "detached handle"]


def test_out_aliasing_the_gradient_completes_with_the_sum_as_dist_sync(alias_jobs):
    ours, theirs = alias_jobs["p3"], alias_jobs["dist_sync"]
    for rank in range(WORKERS):
        for case in IN_PLACE:
            assert ours[(case, rank)].get("grad") == SUM, ours[(case, rank)]
            assert ours[(case, rank)]["grad"] == theirs[(case, rank)]["grad"], (case, rank)
        apart = ours[("rows apart", rank)]
        assert apart.get("out") == SUM == theirs[("rows apart", rank)]["out"], apart
        # (dist_sync also writes the sum into the gradient; P3 leaves the gradient as it was pushed.)
        assert apart["grad"] == [[rank + 1.0] * 3] * 2, apart


def test_out_overlapping_part_of_the_gradient_is_refused_whole_and_workers_stay_in_step(alias_jobs):
    ours = alias_jobs["p3"]
    for rank in range(WORKERS):
        # The bridge's message reaches Python as the MXNetError's whole text: nothing cut, nothing added.
        assert ours[("rows overlapping", rank)].get("error") == OVERLAP_MESSAGE, ours[("rows overlapping", rank)]
        assert ours[("after", rank)].get("out") == SUM, ours[("after", rank)]


def test_a_push_mxnet_skips_keeps_the_workers_in_step():
    output, results, returncode = job("skip", check=False)
    steps = sorted({step for step, _ in results})
    for step in steps:  # first the sums (out of phase, they show which iterations were mixed), then the exit
        # Worker r pushes (r + 1) * (step + 1); at step 2 worker 1 has no gradient (its producer failed) and
        # contributes zeros.
        expected = 1 * 3 if step == 2 else 3 * (step + 1)
        for rank in range(WORKERS):
            r = results.get((step, rank), {"out": None, "error": None})
            assert r["out"] == [[float(expected)] * 3] * 2, (step, [results.get((step, w)) for w in range(WORKERS)])
            failed = step == 2 and rank == 1
            assert (r["error"] is not None) == failed, r
            if failed:  # MXNet's own error, raised where the script waited
                assert "scale parameter in gaussian has to be positive" in r["error"], r
    assert returncode == 0 and steps == list(range(6)), output[-6000:]
    assert "key 0: MXNet skipped this push because an operation it depends on failed" in output, output[-6000:]
