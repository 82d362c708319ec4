"""The bench that measures what a CPU quota costs a real-time thread sharing a lock with the host
(cfs_stall_bench.py), for real (root, cgroup v1): the probe really runs in a quota-limited group that
throttles its host threads, its own thread really leaves that group, and the machine's slice comes back."""

import csv
import pathlib

import pytest

from benchmarks.emulation import cfs_bandwidth, cpu_limit
from benchmarks.suites import cfs_stall_bench

pytestmark = pytest.mark.system


def test_the_probe_runs_throttled_host_threads_and_an_unthrottled_realtime_prober(tmp_path):
    reason = cpu_limit.why_unavailable()
    if reason is None and cpu_limit.find_hierarchy().version != 1:
        reason = "cfs_stall_bench needs cgroup v1 (a thread cannot leave its process's group under v2)"
    if reason:
        pytest.skip(reason)
    slice_before = cfs_bandwidth.SLICE_FILE.read_text()
    out = tmp_path / "stall.csv"
    rc = cfs_stall_bench.main(["--work", "lock", "tcp", "--periods", "10000", "2500", "--slices", "250",
                               "--repeats", "1", "--seconds", "1", "--binary", str(tmp_path / "probe"), "--csv",
                               str(out), "--summary", str(tmp_path / "stall.md"), "--force", "--allow-dirty"])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["work"], r["period_us"], r["quota_us"], r["slice_us"]) for r in rows] == [
        ("lock", "10000", "4000", "250"), ("lock", "2500", "1000", "250"),
        ("tcp", "10000", "4000", "250"), ("tcp", "2500", "1000", "250")]
    for r in rows:
        assert r["outside_group"] == "True" and r["realtime"] == "True"
        # One wake-up per ms for 1 s, less those a long stall skipped; lock sections, or MB streamed.
        assert 200 <= int(r["samples"]) <= 1000 and int(r["host_sections"]) > 0
        # Two spinning threads want 2 cores of a 0.4-core quota: the group is throttled most of the time; the
        # streaming pair is throttled too (its socket work is charged to it).
        assert float(r["throttled_pct"]) > (50 if r["work"] == "lock" else 0), r
        assert (float(r["wait_max_us"]) > 0) == (r["work"] == "lock")  # the tcp probe takes no lock
    summary = (tmp_path / "stall.md").read_text()
    assert "| lock | 2.5 ms | 1 ms | 250 us |" in summary
    assert "| tcp | 10 ms | 4 ms | 250 us | - | - | - | - |" in summary
    assert cfs_bandwidth.SLICE_FILE.read_text() == slice_before
    assert not [p for p in pathlib.Path(cpu_limit.find_hierarchy().cpu).glob("p3c*x900h0")]
