"""`make demo` end to end (benchmarks/suites/demo.py): a tiny run on 2 emulated hosts writes only under its
output folder and ends with the final screen; without root it stops at once and names what runs without."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest
from harness import ROOT as ROOT_DIR

from benchmarks.analysis import bench_rows
from benchmarks.emulation import emulated_cluster

pytestmark = pytest.mark.system

ROOT = pathlib.Path(ROOT_DIR)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def snapshot(folder: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_demo_writes_only_under_its_output_folder(tmp_path):
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "demo"
    results_before = snapshot(ROOT / "benchmarks" / "results")
    readme_before = (ROOT / "README.md").read_bytes()
    build_demo_before = snapshot(ROOT / "build" / "demo") if (ROOT / "build" / "demo").exists() else {}
    cmd = [sys.executable, "-m", "benchmarks.suites.demo", "--hosts", "2", "--bandwidth", "1gbit", "--warmup", "1",
           "--iters", "2",
           "--repeats", "1", "--batch-size", "4", "--resamples", "200", "--wait", "0", "--smoke", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "demo [1/2] " in output and "demo [2/2] " in output  # a progress line per job, with its verdict
    assert re.search(r"demo \[1/2\] .*images/s, (faithful|not faithful \(\w+: )", output), output[-3000:]
    assert "p3kv / dist_sync: " in done.stdout and "committed reference: none at this point" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["demo.csv", "demo_iterations.csv", "fig_demo.png", "logs",
                                                      "summary.md"]
    rows = bench_rows.read_runs(out / "demo.csv")
    assert sorted(r["kvstore"] for r in rows) == ["dist_sync", "p3"] and all(r["smoke"] == "True" for r in rows)
    assert all(r["idle_wait_s"] not in ("", None) for r in rows)  # the gate's wait is recorded, busy or not
    assert "p3kv / dist_sync" in (out / "summary.md").read_text()
    assert snapshot(ROOT / "benchmarks" / "results") == results_before
    assert (ROOT / "README.md").read_bytes() == readme_before
    if (ROOT / "build" / "demo").exists():
        assert snapshot(ROOT / "build" / "demo") == build_demo_before
    # A second run replaces the first's files rather than pooling with them.
    first_rows = len(rows)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert len(bench_rows.read_runs(out / "demo.csv")) == first_rows


def test_without_root_it_stops_at_once_and_names_what_runs_without(tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot run the demo as another user")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    done = subprocess.run([*NOBODY, sys.executable, "-m", "benchmarks.suites.demo", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    assert elapsed < 5, elapsed
    assert "needs root" in done.stderr
    assert "python -m p3kv.launch -n 2 -s 2 -- python examples/gluon_drop_in.py --kvstore p3" in done.stderr
    assert "--kvstore dist_sync -- python examples/gluon_drop_in.py --kvstore dist_sync" in done.stderr
    assert "checksums" in done.stderr and "make bench-kvstore" in done.stderr
    assert not (tmp_path / "x").exists()  # nothing written
