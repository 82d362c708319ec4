"""CPU utilisation per emulated host: the processes a host's launcher started, sampled from /proc.

Emulated compute costs no CPU, so what a host burns is communication, the optimizer and the framework; when the
hosts together approach the machine's cores, the run measures CPU contention, not the network. Each interval's
rate is the CPU time its processes used (utime + stime, of processes alive at both ends of the interval)
divided by the interval; a run reports the median interval per host and the mean over its window (means()).

Only the job's measurement window counts when the runner names one (every worker has built its model, and not
all have reported): start-up (the import of MXNet) and shut-down fall out. The second matters: MXNet's servers
can idle for up to a minute at exit, and in a short job those idle seconds outnumber the busy ones, so a median
over the whole run read 0% (CI, stop 44). A window shorter than one interval reports its mean.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence

from benchmarks.emulation import proc_monitor

LOG = logging.getLogger("host_cpu")
TICKS = os.sysconf("SC_CLK_TCK")
POLL_S = 0.1  # how often the window is checked: its edges are placed this closely


def cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


class HostCpuMonitor:
    """Samples each host's process tree (its root pid and descendants) every `interval` seconds while
    `window()` is true (None: from start to stop)."""

    def __init__(self, roots: Sequence[int], interval: float = 1.0, window: Callable[[], bool] | None = None):
        self._roots = list(roots)
        self._interval = interval
        self._window = window
        self._stopped = threading.Event()
        self.rates: list[list[float]] = [[] for _ in roots]  # percent of one core, per full interval, per host
        self.window_rates: list[float] | None = None  # each host's mean over the whole window
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def start(self) -> HostCpuMonitor:
        self._thread.start()
        return self

    def _snapshot(self) -> list[dict[int, int]]:
        snapshot = []
        for root in self._roots:
            ticks = {}
            for pid in (root, *proc_monitor.descendants(root)):
                value = cpu_ticks(pid)
                if value is not None:
                    ticks[pid] = value
            snapshot.append(ticks)
        return snapshot

    @staticmethod
    def _rates(old: list[dict[int, int]], new: list[dict[int, int]], seconds: float) -> list[float]:
        return [100.0 * sum(n[pid] - o[pid] for pid in n.keys() & o.keys()) / TICKS / seconds
                for o, n in zip(old, new)]

    def _open(self) -> bool:
        return self._window is None or self._window()

    def _run(self) -> None:
        try:
            while not self._open():  # before the window: nothing to count
                if self._stopped.wait(POLL_S):
                    return
            first = before = self._snapshot()
            t_first = t0 = time.monotonic()
            while True:
                closed = self._stopped.wait(POLL_S) or not self._open()
                if closed or time.monotonic() - t0 >= self._interval:
                    after, t1 = self._snapshot(), time.monotonic()
                    if t1 - t0 >= self._interval:  # a full interval (the window's last is usually partial)
                        for host, rate in enumerate(self._rates(before, after, t1 - t0)):
                            self.rates[host].append(rate)
                    before, t0 = after, t1
                    if closed:
                        self.window_rates = self._rates(first, after, t1 - t_first) if t1 > t_first else None
                        return
        except Exception:  # a monitor failure must not abort the run it watches
            LOG.exception("sampling /proc failed; CPU utilisation will be incomplete")

    def stop(self) -> list[float]:
        """The median full interval's utilisation of each host (percent of one core); a window shorter than one
        interval gives its mean; no window at all gives 0."""
        self._stopped.set()
        self._thread.join()
        if not any(self.rates) and self.window_rates is not None:
            return self.means()
        return [round(statistics.median(r), 1) if r else 0.0 for r in self.rates]

    def means(self) -> list[float] | None:
        """Each host's mean utilisation over the whole window (percent of one core), after stop(); None when the
        window never opened. The CPU a run used is this mean (what the simulator's CPU use is compared with); the median
        interval stop() returns leaves out a job's busiest and idlest seconds alike."""
        return None if self.window_rates is None else [round(r, 1) for r in self.window_rates]
