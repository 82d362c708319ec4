"""Each emulated host's CPU counters over time, so that a run's timed window can be cut out afterwards: a thread
samples every host group (cpu_limit.HostCpuLimits.usage) at a fixed interval, and `window` takes the difference
between the samples around a window."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from benchmarks.emulation.cpu_limit import CpuUsage, HostCpuLimits

LOG = logging.getLogger("cpu_sampler")


class UsageSampler:
    """Every host group's counters every `interval` seconds on a thread, so that a window (the timed iterations)
    can be cut out afterwards (`window`). Samples are stamped with time.time(), the clock of file modification
    times (a rank's result file marks the end of its timed iterations)."""

    def __init__(self, limits: HostCpuLimits, interval: float = 0.25):
        self._limits, self._interval = limits, interval
        self.samples: list[tuple[float, list[CpuUsage]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-groups", daemon=True)

    def start(self) -> UsageSampler:
        self.samples.append((time.time(), self._limits.usage()))
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self._interval):
                self.samples.append((time.time(), self._limits.usage()))
        except Exception:  # a monitor failure must not abort the run it watches
            LOG.exception("reading the CPU groups failed; the window's usage will be coarser")

    def stop(self) -> list[tuple[float, list[CpuUsage]]]:
        self._stopped.set()
        self._thread.join(timeout=10)
        try:
            self.samples.append((time.time(), self._limits.usage()))
        except OSError:
            LOG.exception("reading the CPU groups failed at the end of the run")
        return self.samples


def window(samples: Sequence[tuple[float, Sequence[CpuUsage]]], start: float, end: float) -> list[CpuUsage]:
    """Each host's usage over [start, end], from the last sample at or before `start` to the first at or after
    `end` (so the window is covered, a sampling interval wider at most). Whole samples range when the window
    lies outside them."""
    if not samples:
        return []
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    first = before[-1] if before else samples[0]
    last = after[0] if after else samples[-1]
    return [b - a for a, b in zip(first[1], last[1])]
