"""The PyTorch systems on the emulated cluster (root): a smoke run of the runner for DDP and p3kv.torch in both
placements on 2 CPU-limited hosts, writing the rows the MXNet systems' runs write. Ratios between systems are
results (the torch sweep), never asserted here."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest
from harness import ROOT

from benchmarks.emulation import emulated_cluster
from benchmarks.suites import cluster_bench, torch_systems

pytestmark = pytest.mark.system
pytest.importorskip("torch", reason="the PyTorch benchmark needs torch (pip install '.[torch]')")


def test_runner_smoke_every_torch_system_on_two_hosts(tmp_path):
    """Every torch system trains ResNet-50's arrays with SGD on 2 CPU-limited hosts over 400 Mbit links: each run
    writes its row with every column the MXNet systems' rows carry (the optimizer where the system runs it, CPU
    quota, throttling, drops and retransmissions, the fidelity verdict, every rank's iterations, the torch
    version) and DDP runs without servers."""
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "cluster.csv"
    systems = list(torch_systems.SYSTEMS)
    cmd = [sys.executable, "-m", "benchmarks.suites.cluster_bench", "--model", "resnet50", "--hosts", "2",
           "--bandwidth", "400mbit", "--gpu-scale", "0.2", "--kvstore", *systems, "--warmup", "1", "--iters", "2",
           "--repeats", "1", "--seed", "3", "--log-interval", "1", "--batch-size", "4", "--csv", str(out),
           "--timeout", "240", "--smoke", "--force", "--allow-dirty", "--untuned"]
    runner = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, timeout=600,
                            check=False)
    output = runner.stdout
    assert runner.returncode == 0, output[-6000:]
    assert re.search(r"^\[host0\] .* iter 3: [\d.]+ images/s", output, re.MULTILINE)  # host 0's progress is live
    with out.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == cluster_bench.COLUMNS
        rows = list(reader)
    assert sorted(r["kvstore"] for r in rows) == sorted(systems)
    for r in rows:
        assert r["status"] == "ok" and r["exit_code"] == "0", r
        assert r["optimizer"] == "sgd(lr=0.01,momentum=0.9,wd=0.0001,grad/2 before the sum)", r
        assert r["update_placement"] == ("servers (CPU)" if r["kvstore"] == "torch-p3kv-server"
                                         else "workers (virtual GPU, 732 GB/s x 0.2)"), r
        assert r["weight_copy"] == torch_systems.WEIGHT_COPY.get(r["kvstore"], ""), r  # server placement's on the GPU
        assert r["gradient_work"] == "virtual GPU" and float(r["gradient_work_s"]) > 0, r  # every system's passes
        assert r["servers"] == ("0" if r["kvstore"] == "ddp" else "2") and r["workers"] == "2"
        assert r["torch"] and r["p3kv"] and r["baseline_setting"] == "default (untuned)"
        assert (r["host_cpus"], r["cpu_quota_cores"]) == ("4.0", "0.8") and r["cpu_limit"].startswith("cgroup-v")
        assert len(r["host_throttled_pct"].split(";")) == 2 and float(r["timed_window_s"]) > 0
        assert len(r["cpu_host_mean_pct"].split(";")) == 2 and float(r["cpu_total_mean_pct"]) > 0, r
        assert len(r["qdisc_drops"].split(";")) == 2 and len(r["tcp_retrans"].split(";")) == 2
        assert int(r["tcp_out_segs_total"]) > 0 and r["vgpu_late_max_us"] != ""
        assert r["faithful"] in ("True", "False") and (r["faithful"] == "True" or r["fidelity_notes"]), r
        assert [len(times) for times in json.loads(r["rank_iter_s"])] == [2, 2]
        assert float(r["throughput"]) > 0 and float(r["throughput"]) <= 1.05 * float(r["bound_throughput"])
        assert float(r["compute_s"]) == pytest.approx(float(rows[0]["compute_s"]))  # the same emulated compute
