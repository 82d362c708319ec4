"""Waiting for a job's hosts: its deadline, its shut-down grace, and its progress.

A job can move so slowly that nothing times out. With 32 KiB socket buffers a worker's loopback connection moved one
TCP window per 200 ms persist probe (fixed in commit 6460630): an InceptionV3 tuning job whose iterations take 3.3 s
crawled for 15 minutes until a person stopped it, and P3_TIMEOUT (600 s) never fired because bytes kept arriving.
So the runner watches progress: every worker touches its ready marker after each iteration
(worker_output.mark_progress), and ProgressWatch reads the markers' modification times. Once it has seen
MIN_INTERVALS iteration intervals, a job whose newest iteration is older than STALL_FACTOR times their median (and
at least STALL_FLOOR_S) is stalled: wait_all stops it, and the run is recorded as failed(stalled), which --resume
runs again. The factor leaves room for what slows a healthy iteration (a CPU-quota throttle, a retransmission
timeout, a slow tail at the job's end); the floor for jobs of sub-second iterations. Intervals are read as often as
wait_all polls (0.2 s): shorter iterations read as longer, which only raises the limit.
"""
from __future__ import annotations

import collections
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from benchmarks.emulation import proc_monitor

LOG = logging.getLogger("job_watch")
SHUTDOWN_GRACE = 60.0  # seconds the hosts get to end the job once every worker has reported
STALL_FACTOR = 20.0  # a job is stalled when its newest iteration is this many median intervals old...
STALL_FLOOR_S = 60.0  # ...and at least this many seconds
MIN_INTERVALS = 3  # iteration intervals seen (all workers together) before the watch judges


class ProgressWatch:
    """The iterations of a job's workers, from the modification times of the markers in `folder` (one per
    worker, touched after each iteration). `stalled()` says why the job is stalled, or None."""

    def __init__(self, folder: str, factor: float = STALL_FACTOR, floor_s: float = STALL_FLOOR_S,
                 min_intervals: int = MIN_INTERVALS, clock: Callable[[], float] = time.time):
        self._folder = folder
        self._factor, self._floor_s, self._min_intervals = factor, floor_s, min_intervals
        self._clock = clock  # the markers' times are wall-clock times
        self._seen: dict[str, tuple[float, int]] = {}  # marker -> (newest time, times seen to change)
        # A marker's first change ends the first iteration, which includes the framework's warm-up: not an interval.
        self.intervals: collections.deque[float] = collections.deque(maxlen=1000)
        self.reason: str | None = None  # why the job was judged stalled (set once)

    def poll(self) -> None:
        try:
            entries = list(os.scandir(self._folder))
        except OSError:  # no worker is ready yet
            return
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            before, changes = self._seen.get(entry.name, (None, 0))
            if before is not None and mtime > before:
                if changes >= 1:
                    self.intervals.append(mtime - before)
                changes += 1
            self._seen[entry.name] = (mtime, changes)

    def limit_s(self) -> float | None:
        """How old the newest iteration may be; None until MIN_INTERVALS intervals are seen."""
        if len(self.intervals) < self._min_intervals:
            return None
        return max(self._floor_s, self._factor * statistics.median(self.intervals))

    def stalled(self) -> str | None:
        self.poll()
        limit = self.limit_s()
        if self.reason or limit is None:
            return self.reason
        idle = self._clock() - max(t for t, _ in self._seen.values())
        if idle > limit:
            self.reason = (f"no worker finished an iteration for {idle:.0f} s, more than {limit:.0f} s (the larger of "
                           f"{self._factor:g} x the median iteration, {statistics.median(self.intervals):.3g} s, and "
                           f"{self._floor_s:g} s)")
        return self.reason


def wait_all(procs: list[subprocess.Popen], timeout: float, results_complete: Callable[[], bool] = lambda: False,
             stalled: Callable[[], str | None] = lambda: None) -> int:
    """Waits for every host's launcher; the first failure stops the others, and so do a job that has not ended
    SHUTDOWN_GRACE seconds after every worker reported, the deadline, and a stall (`stalled` says why: exit code
    124, as the deadline). Returns the job's exit code."""
    deadline = time.monotonic() + timeout
    code = 0
    while [p.poll() for p in procs].count(None):  # poll every one: a list, not a short-circuiting any()
        failed = [p for p in procs if p.returncode not in (None, 0)]
        complete = results_complete()
        if complete:
            deadline = min(deadline, time.monotonic() + SHUTDOWN_GRACE)
        stall = None if complete or failed else stalled()
        if stall:
            LOG.error("stopping the job: %s", stall)
        if failed or stall or time.monotonic() > deadline:
            code = failed[0].returncode if failed else 124
            for p in procs:
                if p.poll() is None:
                    proc_monitor.stop_tree(p, set(proc_monitor.descendants(p.pid)))
            break
        time.sleep(0.2)
    for p in procs:
        p.wait()
    return code or next((p.returncode for p in procs if p.returncode), 0)
