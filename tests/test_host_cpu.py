"""The per-host CPU monitor of the emulated-cluster runner: it counts the job's measurement window only.

CI (stop 44) read 0% for a short smoke job: its MXNet servers idled at exit for longer than the workers had
iterated, and a median over the whole run took the idle seconds. These tests run a real process that burns CPU
and then idles, and check what the monitor reports with and without a window around the busy part.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.emulation import host_cpu

pytestmark = pytest.mark.unit

# A job that touches a file when its measurement starts, burns one core for `busy` s, idles `idle` s, touches a
# file when its measurement ends and idles `after` s more.
JOB = """
import pathlib, sys, time
flag = pathlib.Path(sys.argv[1])
flag.with_suffix(".busy").touch()
end = time.monotonic() + {busy}
while time.monotonic() < end:
    pass
time.sleep({idle})
flag.with_suffix(".done").touch()
time.sleep({after})
"""
# Busy for 1.6 s, then idle for 4 s after the measurement: a job that waits at exit.
BURN_THEN_IDLE = JOB.format(busy=1.6, idle=0, after=4)


def _watch(tmp_path, window: bool, interval: float) -> tuple[list[float], host_cpu.HostCpuMonitor]:
    tmp_path.mkdir(exist_ok=True)
    flag = tmp_path / "job"
    busy, done = flag.with_suffix(".busy"), flag.with_suffix(".done")
    proc = subprocess.Popen([sys.executable, "-c", BURN_THEN_IDLE, str(flag)])
    try:
        monitor = host_cpu.HostCpuMonitor(
            [proc.pid], interval=interval,
            window=(lambda: busy.exists() and not done.exists()) if window else None).start()
        assert proc.wait(timeout=30) == 0
        return monitor.stop(), monitor
    finally:
        proc.kill()
        proc.wait()


def test_a_window_counts_the_busy_part_of_a_job_that_idles_at_exit(tmp_path):
    whole, _ = _watch(tmp_path / "a", window=False, interval=0.5)
    windowed, monitor = _watch(tmp_path / "b", window=True, interval=0.5)
    assert whole == [0.0]  # idle intervals outnumber busy ones: the failure CI saw
    assert len(monitor.rates[0]) >= 2 and windowed[0] > 70, (windowed, monitor.rates)  # one core, busy


# A bursty job inside its window: 1 s busy, then 2.5 s idle, then the window closes (and the process lingers).
BURST_THEN_IDLE = JOB.format(busy=1.0, idle=2.5, after=1)


def test_the_mean_over_the_window_counts_the_busy_second_the_median_leaves_out(tmp_path):
    flag = tmp_path / "job"
    busy, done = flag.with_suffix(".busy"), flag.with_suffix(".done")
    proc = subprocess.Popen([sys.executable, "-c", BURST_THEN_IDLE, str(flag)])
    try:
        monitor = host_cpu.HostCpuMonitor([proc.pid], interval=0.5,
                                          window=lambda: busy.exists() and not done.exists()).start()
        assert proc.wait(timeout=30) == 0
        median = monitor.stop()
    finally:
        proc.kill()
        proc.wait()
    assert median == [0.0], monitor.rates  # 5 idle half-seconds outnumber 2 busy ones
    (mean,) = monitor.means()
    assert 15 < mean < 50, (mean, monitor.rates)  # about 1 CPU-second over the 3.5 s window


def test_a_window_shorter_than_one_interval_reports_its_mean(tmp_path):
    cpu, monitor = _watch(tmp_path, window=True, interval=5.0)
    assert monitor.rates == [[]] and monitor.window_rates is not None
    assert cpu[0] > 70, cpu


def test_a_window_that_never_opens_reports_nothing_and_stop_returns():
    monitor = host_cpu.HostCpuMonitor([1], interval=0.2, window=lambda: False).start()
    time.sleep(0.5)
    started = time.monotonic()
    assert monitor.stop() == [0.0]
    assert monitor.means() is None  # nothing measured, not a measured zero
    assert time.monotonic() - started < 1.0
