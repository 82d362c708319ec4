"""Smoke test of the like-for-like kvstore benchmark (benchmarks/suites/kvstore_bench.py) on a tiny model.

It proves the systems do the same work: with the same seeded gradients and the same SGD, worker 0 of every
system ends with the same weights, and they moved away from the initial ones. Horovod joins when it is
installed (make bench-setup); otherwise the test says it was skipped.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from harness import ROOT

from benchmarks.workloads import kvstore_worker

BENCH = ["-m", "benchmarks.suites.kvstore_bench"]

# Three layers, one array split over slices (p3kv's default slice is 50,000 elements) and over both servers.
TINY = {"model": "tiny", "params": [
    {"name": "conv0_weight", "shape": [16, 3, 3, 3], "dtype": "float32"},
    {"name": "conv0_bias", "shape": [16], "dtype": "float32"},
    {"name": "dense0_weight", "shape": [130, 1000], "dtype": "float32"},
    {"name": "dense1_weight", "shape": [10, 130], "dtype": "float32"},
], "layers": [{"name": "conv0", "params": [0, 1]}, {"name": "dense0", "params": [2]},
              {"name": "dense1", "params": [3]}]}


def horovod_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import horovod.mxnet as h; assert h.gloo_built()"],
                          capture_output=True, timeout=120, check=False)
    return done.returncode == 0


def run_bench(tmp_path, *options, timeout=150):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *BENCH, *options], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.mxnet
def test_same_work_same_weights(tmp_path):
    shapes = tmp_path / "shapes"
    shapes.mkdir()
    (shapes / "tiny.json").write_text(json.dumps(TINY))
    systems = ["p3", "dist_sync"]
    if horovod_available():
        systems.append("horovod")
    else:
        print("horovod is not installed (make bench-setup): checked p3 and dist_sync only")
    results = tmp_path / "results"
    done = run_bench(tmp_path, "--models", "tiny", "--shapes-dir", str(shapes), "--systems", *systems,
                     "--repeats", "1", "--warmup", "1", "--iters", "2", "--results-dir", str(results),
                     "--save-weights", str(tmp_path / "weights"), "--force", "--allow-dirty", "--timeout", "120")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    with open(results / "kvstore_bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        assert [int(r["iteration"]) for r in mine] == [0, 1], system
        assert all(r["status"] == "ok" and 0 < float(r["time_s"]) < 60 for r in mine), mine
        assert all(r["arrays"] == "4" and r["git_commit"] and r["load_1m_before"] and r["busy_pct_before"]
                   and r["forced"] in ("True", "False") for r in mine), mine
    assert "| tiny |" in (results / "kvstore_bench.md").read_text()

    initial = [kvstore_worker.initial_weight(0, k, p["shape"], p["dtype"]) for k, p in enumerate(TINY["params"])]
    reference = np.load(tmp_path / "weights" / "tiny.dist_sync.0.npz")
    for k, start in enumerate(initial):
        assert not np.allclose(reference[f"k{k}"], start), f"key {k} was never updated"
    for system in systems:
        got = np.load(tmp_path / "weights" / f"tiny.{system}.0.npz")
        for k in range(len(initial)):
            np.testing.assert_allclose(got[f"k{k}"], reference[f"k{k}"], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{system} key {k}")


@pytest.mark.unit
def test_refuses_a_busy_machine_without_force(tmp_path):
    done = run_bench(tmp_path, "--max-load", "-1", "--load-wait", "0", "--allow-dirty", "--results-dir", str(tmp_path),
                     timeout=60)
    assert done.returncode == 2
    assert "above --max-load -1.00" in done.stderr and "--force" in done.stderr, done.stderr
    assert not (tmp_path / "kvstore_bench.csv").exists()


@pytest.mark.unit
@pytest.mark.parametrize("times, expected", [([1.0], (1.0, 1.0, 1.0)), ([1.0, 2.0, 3.0, 4.0, 5.0], (2.0, 3.0, 4.0))])
def test_quartiles(times, expected):
    from benchmarks.suites import kvstore_bench

    assert kvstore_bench.quartiles(times) == expected


@pytest.mark.unit
def test_slice_size_reaches_the_parameter_server_jobs_only(monkeypatch):
    from benchmarks.suites import cluster_bench, cluster_job
    from benchmarks.workloads import job_env
    monkeypatch.delenv("P3_SLICE_SIZE", raising=False)
    monkeypatch.setenv("DMLC_PS_ROOT_PORT", "9000")  # left in the caller's shell
    env = job_env.job_environment("p3-noopt", 10_000)
    assert env["P3_SLICE_SIZE"] == env["MXNET_KVSTORE_SLICE_THRESHOLD"] == "10000"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    horovod = job_env.job_environment("horovod", 10_000)
    assert not [k for k in horovod if k.startswith(("P3_", "DMLC_"))]
    assert "MXNET_KVSTORE_SLICE_THRESHOLD" not in horovod
    assert "P3_SLICE_SIZE" not in job_env.job_environment("p3")
    # The emulated-cluster runner builds its jobs' environment with the same helper.
    point = cluster_bench.Point(model="resnet50", kvstore="mxnet-p3", hosts=2, bandwidth="1gbit", slice_size=20_000)
    env = cluster_job._environment(point, {})
    assert env["MXNET_KVSTORE_SLICE_THRESHOLD"] == env["P3_SLICE_SIZE"] == "20000" and "P3_SECRET" in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
