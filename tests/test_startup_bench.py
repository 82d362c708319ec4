"""Smoke test of benchmarks/suites/startup_bench.py: every condition runs once, to the end, and is reported."""

import csv
import os
import subprocess
import sys

import pytest
from harness import ROOT

BENCH = ["-m", "benchmarks.suites.startup_bench"]


@pytest.mark.mxnet
def test_each_condition_runs_a_job_and_is_tabled(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, *BENCH, "--repeats", "1", "--steps", "2", "--results-dir", str(tmp_path),
                           "--force", "--allow-dirty", "--timeout", "120"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    with open(tmp_path / "startup.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["optimizer_on"], r["preload_mxnet"]) for r in rows) == [
        ("servers", "0"), ("servers", "1"), ("workers", "0"), ("workers", "1")]
    for row in rows:
        # --force only marks a job that started on a busy machine.
        assert row["status"] == "ok" and row["forced"] in ("True", "False") and row["git_dirty"] in ("True", "False")
        assert float(row["busy_pct_before"]) >= 0, row
        # Launch, then imports, then the first step, then the last; the job's processes took CPU.
        assert 0 < float(row["imported_s"]) < float(row["first_step_s"]) <= float(row["last_step_s"]), row
        assert float(row["last_step_s"]) < float(row["wall_s"]) and float(row["cpu_s"]) > 0, row
    table = (tmp_path / "startup.md").read_text()
    for update in ("servers", "workers"):
        for preload in (1, 0):
            assert f"| {update} | {preload} | 1 |" in table, table
