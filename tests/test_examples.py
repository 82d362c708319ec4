"""Scripts as users run them, through the real launcher: the Gluon drop-in example, both ways, and an MXNet
script that never imports p3kv but gets kvstore 'p3' from its command line."""

import glob
import json
import math
import os
import re

import pytest
from harness import ROOT, SCRIPTS, run_job

pytestmark = pytest.mark.mxnet

EXAMPLE = os.path.join(ROOT, "examples", "gluon_drop_in.py")
EXAMPLE_LINE = re.compile(r"^\[worker \d\] worker (\d)/2 kvstore=(\S+): ([\d.]+) samples/s, final loss ([\d.]+), "
                          r"weight checksum ([\d.]+)$", re.M)
UNMODIFIED_LINE = re.compile(r"^\[worker \d\] rank (\d)/2 kvstore (\S+) type=(\S+) accuracy=([\d.]+) "
                             r"checksum=([\d.]+)$", re.M)


def run_example(kvstore):
    """Runs the example in a 2 x 2 job; returns {rank: weight checksum}."""
    job = run_job(2, 2, [EXAMPLE, "--kvstore", kvstore, "--steps", "5", "--batch-size", "16"], timeout=120,
                  launcher_args=("--kvstore", kvstore, "--timeout", "100"))
    assert job.returncode == 0, job.stdout[-4000:]
    lines = EXAMPLE_LINE.findall(job.stdout)
    assert sorted(rank for rank, *_ in lines) == ["0", "1"], job.stdout[-4000:]
    assert {kind for _, kind, *_ in lines} == {kvstore}
    return {rank: float(checksum) for rank, *_, checksum in lines}


def test_gluon_example_runs_both_ways_and_p3_ends_with_dist_syncs_weights():
    p3, dist_sync = run_example("p3"), run_example("dist_sync")
    assert p3["0"] == p3["1"], f"p3 workers ended with different weights: {p3}"
    assert dist_sync["0"] == dist_sync["1"], f"dist_sync workers ended with different weights: {dist_sync}"
    assert math.isclose(p3["0"], dist_sync["0"], rel_tol=1e-6), f"p3 {p3} != dist_sync {dist_sync}"


@pytest.mark.parametrize("create_kv", [False, True], ids=["fit-kvstore-name", "kvstore-create"])
def test_unmodified_mxnet_script_runs_on_p3(tmp_path, create_kv):
    script = os.path.join(SCRIPTS, "unmodified_train.py")
    with open(script) as f:
        assert "p3kv" not in "".join(line for line in f if "import" in line), "the script must not import p3kv"
    trace = str(tmp_path / "trace")
    job = run_job(2, 2, [script, "--kv-store", "p3", "--num-epochs", "3", *(["--create-kv"] if create_kv else [])],
                  env={"P3_TRACE": trace}, timeout=120, launcher_args=("--timeout", "100"))
    assert job.returncode == 0, job.stdout[-4000:]
    lines = UNMODIFIED_LINE.findall(job.stdout)
    assert sorted(rank for rank, *_ in lines) == ["0", "1"], job.stdout[-4000:]
    # What the script itself saw: Module.fit used p3kv's kvstore ...
    assert {(kind, kvtype) for _, kind, kvtype, *_ in lines} == {("p3kv.mxnet.kvstore.P3", "p3")}
    assert len({checksum for *_, checksum in lines}) == 1, f"workers ended with different weights: {lines}"
    assert all(float(accuracy) > 0.9 for _, _, _, accuracy, _ in lines), lines
    # ... and the gradients really went through p3kv's servers (their per-slice trace).
    for server in (0, 1):
        with open(f"{trace}.server{server}.json") as f:
            events = [e["args"]["event"] for e in json.load(f)["traceEvents"]]
        assert "aggregate" in events and "broadcast" in events, f"server {server} aggregated nothing"
    assert len(glob.glob(f"{trace}.worker*.json")) == 2
