"""How the kernel enforces an emulated host's CPU quota: the CFS period and the machine's bandwidth slice.

A quota is so many µs of CPU per period. Within a period a host may run its quota as fast as it likes and is then
stopped until the period ends; a real host with slower CPUs would instead run slower all the time. Two things
follow, and the period is chosen for both:
- a burst then a stop: the kernel's default period, 100 ms, let a 0.4-core host run 40 ms and then stand still
  for 60 ms;
- a thread stopped while it holds a lock holds everyone who waits for that lock, even threads outside every
  quota: the virtual GPU's timer (real-time, outside the groups) completes operations through MXNet's engine,
  whose mutexes the host's threads take. The timer is then late by up to the rest of the period
  (cfs_stall_probe.cc measures it: benchmarks/results/cfs_stall.md).
A shorter period shortens both, down to the kernel's 1 ms minimum quota per period.

The period is a duration like any other, so a cluster dilates it (PERIOD_GPU_MS of the GPU's own time, real
PERIOD_GPU_MS / gpu_scale: 10 ms at the demo's 0.1, 20 ms at 0.05). At a fixed real period a smaller dilation
cut the same work into finer periods of GPU time, and more of them came out throttled: at 0.05 dist_sync's busiest
host was throttled in 12.6% of its periods with 10 ms and 5.9% with 20 ms, against 6.5% at 0.1 (3 runs each,
results/cfs_period/summary.md).

The slice (kernel.sched_cfs_bandwidth_slice_us, 5 ms by default) is how much of a group's quota one CPU takes at
a time. It must be well under the quota per period, or the first CPU takes the whole quota and the host's other
threads wait on the other CPU. It is the machine's setting (it acts only on groups with a quota): MachineSlice sets
it while a cluster's groups exist and restores it afterwards.
"""

from __future__ import annotations

import logging
import math
import pathlib

LOG = logging.getLogger("cfs_bandwidth")
PERIOD_US = 10_000  # the period, unless the quota would then fall under MIN_QUOTA_US
PERIOD_GPU_MS = 1.0  # an emulated cluster's period in the GPU's own time (PERIOD_US at a dilation of 0.1)
MIN_QUOTA_US = 1000  # the kernel's smallest quota per period
MIN_PERIOD_US = 1000  # ... and its smallest period
MAX_PERIOD_US = 1_000_000  # ... and its largest
SLICE_US = 1000
SLICE_FILE = pathlib.Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")


def dilated_period_us(gpu_ms: float, gpu_scale: float) -> int:
    """The real period of `gpu_ms` of the GPU's own time at dilation `gpu_scale`; ValueError outside the kernel's
    range, naming the dilations that fit."""
    real = round(1000 * gpu_ms / gpu_scale)
    if not MIN_PERIOD_US <= real <= MAX_PERIOD_US:
        raise ValueError(f"a CFS period of {gpu_ms:g} ms of GPU time at gpu_scale {gpu_scale:g} is {real} us of real "
                         f"time, outside the kernel's {MIN_PERIOD_US} us to {MAX_PERIOD_US} us: use a gpu_scale from "
                         f"{1000 * gpu_ms / MAX_PERIOD_US:g} to {1000 * gpu_ms / MIN_PERIOD_US:g} or another period")
    return real


def period_us(cores: float | None, base: int = PERIOD_US) -> int:
    """The CFS period for a quota of `cores`: `base`, or longer where the quota would fall under the kernel's 1 ms
    minimum (below 0.1 cores at 10 ms), so that the quota is never rounded up."""
    if not MIN_PERIOD_US <= base <= MAX_PERIOD_US:
        raise ValueError(f"a CFS period of {base} us is outside the kernel's {MIN_PERIOD_US} us to {MAX_PERIOD_US} us")
    if cores is None:
        return base
    return max(base, math.ceil(MIN_QUOTA_US / cores))


class MachineSlice:
    """The machine's bandwidth slice set to `slice_us` between start() and close(); `file` None (a fake hierarchy,
    another kernel) touches nothing and claims nothing (`slice_us` then says None)."""

    def __init__(self, file: pathlib.Path | None, slice_us: int = SLICE_US):
        if slice_us < 1:
            raise ValueError(f"a CFS bandwidth slice of {slice_us} us is under the kernel's minimum of 1 us")
        self._file, self._want = file, slice_us
        self._before: str | None = None
        self.slice_us: int | None = None  # what the machine's slice was while the groups ran

    def start(self) -> None:
        if self._file is None or not self._file.exists():
            return
        try:
            self._before = self._file.read_text().strip()
            self._file.write_text(str(self._want))
            self.slice_us = self._want
        except OSError as e:  # the quotas still hold; a host may run on one CPU at a time (recorded)
            LOG.warning("cannot set %s to %d us (%s): a host's CPUs take %s us of its quota at a time",
                        self._file, self._want, e, self._before)
            self.slice_us = int(self._before) if self._before else None

    def close(self) -> None:
        if self._before is None or self._file is None:
            return
        try:
            self._file.write_text(self._before)
        except OSError as e:
            LOG.warning("cannot restore %s to %s: %s", self._file, self._before, e)
        self._before = None
