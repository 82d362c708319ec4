"""The run guard's idle gate while it waits (benchmarks/emulation/run_guard.py): what it says every ~30 s (busy
percent and the busiest processes, from /proc/<pid>/stat), the whole wait counted by the wall clock with the
samples in it, and the demo's mode that proceeds after its limit with a warning recorded in the row. The clock
and the samples are fakes: no test here waits."""

import logging
import os
import types

import pytest

from benchmarks.analysis import bench_rows
from benchmarks.emulation import run_guard
from benchmarks.suites import cluster_bench

pytestmark = pytest.mark.unit

BUSY = run_guard.Sample(50.0, (("cc1plus -O2 x.cc", 42, 30.0), ("python -m pytest", 7, 12.0)))


class FakeTime:
    """A wall clock that a sample (`sample_s`) and a sleep advance."""

    def __init__(self, sample_s: float = 5.0, samples=None):
        self.now = 0.0
        self.slept: list[float] = []
        self.sample_s = sample_s
        self.samples = samples

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def busy(self) -> run_guard.Sample:
        self.now += self.sample_s
        return next(self.samples) if self.samples is not None else BUSY


def test_waiting_logs_what_and_who_every_30_seconds(monkeypatch, caplog):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 0.0, 0.0))
    fake = FakeTime()
    caplog.set_level(logging.INFO, logger="run_guard")
    with pytest.raises(run_guard.Refused, match=r"after waiting 105 s \(busiest: cc1plus -O2 x.cc \(pid 42\) 30%"):
        run_guard.wait_for_idle(10.0, None, 100, False, busy=fake.busy, sleep=fake.sleep, clock=fake.monotonic)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("CPU busy 50% is above --max-busy 10% (busiest: cc1plus -O2 x.cc (pid 42) 30%, python -m "
                        "pytest (pid 7) 12%): waiting up to 100 s for an idle machine, then refusing")
    progress = [line for line in lines if line.startswith("still waiting")]
    # A sample (5 s) and a poll (5 s) per check: a line at the first check 30 s or more after the previous one.
    assert [line.split(":")[0] for line in progress] == ["still waiting, 35 of 100 s", "still waiting, 65 of 100 s",
                                                         "still waiting, 95 of 100 s"]
    assert all("CPU busy 50%" in line and "cc1plus -O2 x.cc (pid 42) 30%" in line for line in progress)


def test_the_whole_wait_counts_samples_included():
    fake = FakeTime(sample_s=5.0)
    with pytest.raises(run_guard.Refused, match=r"after waiting 15 s"):
        run_guard.wait_for_idle(10.0, None, 12, False, busy=fake.busy, sleep=fake.sleep, clock=fake.monotonic)
    # 5 s sample, 5 s poll, 5 s sample: 15 s of wall clock, past the 12 s limit (one sample over at most). Counting
    # only the sleeps would have slept 5 + 5 + 2 s and sampled four times: 32 s.
    assert fake.slept == [5]


def test_proceed_mode_starts_after_the_limit_with_a_warning():
    fake = FakeTime(sample_s=5.0)
    start = run_guard.wait_for_idle(10.0, None, 20, False, busy=fake.busy, sleep=fake.sleep, clock=fake.monotonic,
                                    proceed=True)
    assert start.forced is False and start.busy_pct == 50.0 and start.waited_s == 25.0
    assert start.warning == ("CPU busy 50% is above --max-busy 10% after waiting 25 s (busiest: cc1plus -O2 x.cc "
                             "(pid 42) 30%, python -m pytest (pid 7) 12%)")
    idle = FakeTime(samples=iter([BUSY, run_guard.Sample(3.0)]))
    start = run_guard.wait_for_idle(10.0, None, 20, False, busy=idle.busy, sleep=idle.sleep, clock=idle.monotonic,
                                    proceed=True)
    assert (start.warning, start.waited_s, start.busy_pct) == ("", 15.0, 3.0)  # idle in time: no warning


def test_busiest_processes_from_proc_stat(tmp_path):
    def write(pid, name, utime, stime, cmdline=None):
        d = tmp_path / str(pid)
        d.mkdir(exist_ok=True)
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        (d / "stat").write_text(f"{pid} ({name}) R 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n")
        if cmdline is not None:
            (d / "cmdline").write_bytes(cmdline)

    write(10, "cc1plus", 100, 20)
    write(11, "my (odd) name", 5, 5)
    (tmp_path / "self").mkdir()
    before = run_guard.process_times(str(tmp_path))
    assert before == {10: ("cc1plus", 120), 11: ("my (odd) name", 10)}
    write(10, "cc1plus", 150, 30)  # +60 jiffies
    write(11, "my (odd) name", 5, 15)  # +10
    write(12, "python", 20, 0, b"/usr/bin/python\0-m\0pytest\0")  # started during the window: +20
    after = run_guard.process_times(str(tmp_path))
    assert run_guard.busiest(before, after, total_jiffies=400) == (
        ("cc1plus", 10, 15.0), ("python", 12, 5.0), ("my (odd) name", 11, 2.5))
    assert run_guard.label(12, "python", str(tmp_path)) == "python -m pytest"
    assert run_guard.label(99, "gone", str(tmp_path)) == "gone"
    real = run_guard.sample_cpu(0.05)
    assert 0.0 <= real.busy_pct <= 100.0 and all(pct >= 0 for _, _, pct in real.top)


class FakeCluster:
    hosts, bandwidth, queue_ms, burst_ms = 2, "2gbit", cluster_bench.emulated_cluster.DEFAULT_QUEUE_MS, 1.0
    rto_min_ms = congestion_control = None  # the kernel's own and the machine's, as the points ask: nothing to set
    threaded_rx = False

    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        return self

    def close(self):
        pass


def test_a_run_that_proceeded_records_the_wait_and_the_warning(monkeypatch, tmp_path):
    """run_points in proceed mode: --load-wait is the whole run's budget; every row records its wait and why it
    started on a busy machine."""
    fake = FakeTime(sample_s=5.0)
    monkeypatch.setattr(run_guard, "time", types.SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep))
    monkeypatch.setattr(run_guard, "sample_cpu", fake.busy)
    monkeypatch.setattr(cluster_bench.emulated_cluster, "EmulatedCluster", FakeCluster)

    def run_point(cluster, point, scratch, port, live=None):
        return {"model": point.model, "kvstore": point.kvstore, "status": "ok", "run_id": f"r{port}"}, {0: [1.0]}

    monkeypatch.setattr(cluster_bench, "run_point", run_point)
    points = [cluster_bench.Point(model="resnet50_v1", kvstore=kv, hosts=2, bandwidth="2gbit")
              for kv in ("p3", "dist_sync")]
    conditions = cluster_bench.Conditions(load_wait=20, allow_dirty=True, proceed=True)
    csv_path = tmp_path / "demo.csv"
    seen = []
    cluster_bench.run_points(points, csv_path, conditions, live=None, on_row=seen.append)
    rows = bench_rows.read_runs(csv_path)
    assert [(r["idle_wait_s"], r["forced"]) for r in rows] == [("25.0", "False"), ("5.0", "False")]
    assert rows[0]["idle_warning"].startswith("CPU busy 50% is above --max-busy 10% after waiting 25 s (busiest: "
                                              "cc1plus -O2 x.cc (pid 42) 30%")
    assert rows[1]["idle_warning"].startswith("CPU busy 50% is above --max-busy 10% after waiting 5 s")  # budget spent
    assert [r["run_id"] for r in seen] == [r["run_id"] for r in rows]
    # The strict gate (publication sweeps) refuses instead, and writes nothing.
    with pytest.raises(run_guard.Refused, match="raise --load-wait"):
        cluster_bench.run_points(points, tmp_path / "strict.csv", cluster_bench.Conditions(load_wait=20,
                                                                                           allow_dirty=True))
    assert not (tmp_path / "strict.csv").exists()


def test_an_older_csv_gains_the_new_columns_when_appended_to(tmp_path):
    path = tmp_path / "old.csv"
    old_columns = bench_rows.RUN_COLUMNS[:bench_rows.RUN_COLUMNS.index("idle_wait_s")]
    path.write_text(",".join(old_columns) + "\n" + ",".join("x" if c == "run_id" else "" for c in old_columns) + "\n")
    bench_rows.write_run(path, {"run_id": "new", "status": "ok", "idle_wait_s": 3.0, "idle_warning": "busy"})
    rows = bench_rows.read_runs(path, ok_only=False)
    assert [(r["run_id"], r["idle_wait_s"], r["idle_warning"]) for r in rows] == [("x", None, None),
                                                                                   ("new", "3.0", "busy")]
