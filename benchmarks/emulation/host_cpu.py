"""CPU utilisation per emulated host: the processes a host's launcher started, sampled from /proc.

Emulated compute costs no CPU, so what a host burns is communication, the optimizer and the framework; when the
hosts together approach the machine's cores, the run measures CPU contention, not the network. Each interval's
rate is the CPU time its processes used (utime + stime, of processes alive at both ends of the interval)
divided by the interval; a run reports the median interval per host (start-up, the import of MXNet, falls out).
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Sequence

from benchmarks.emulation import proc_monitor

LOG = logging.getLogger("host_cpu")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


class HostCpuMonitor:
    """Samples each host's process tree (its root pid and descendants) every `interval` seconds."""

    def __init__(self, roots: Sequence[int], interval: float = 1.0):
        self._roots = list(roots)
        self._interval = interval
        self._stopped = threading.Event()
        self.rates: list[list[float]] = [[] for _ in roots]  # percent of one core, per interval, per host
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

    def _run(self) -> None:
        try:
            before, t0 = self._snapshot(), time.monotonic()
            while not self._stopped.wait(self._interval):
                after, t1 = self._snapshot(), time.monotonic()
                for host, (old, new) in enumerate(zip(before, after)):
                    used = sum(new[pid] - old[pid] for pid in new.keys() & old.keys())
                    self.rates[host].append(100.0 * used / TICKS / (t1 - t0))
                before, t0 = after, t1
        except Exception:  # a monitor failure must not abort the run it watches
            LOG.exception("sampling /proc failed; CPU utilisation will be incomplete")

    def stop(self) -> list[float]:
        """The median interval's utilisation of each host (percent of one core)."""
        self._stopped.set()
        self._thread.join()
        return [round(statistics.median(r), 1) if r else 0.0 for r in self.rates]
