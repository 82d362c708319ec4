"""Each thread of an emulated host at most one dilated CPU: per-thread CPU groups under the host's group.

A host's quota (cpu_limit.py) dilates its CPUs together: `host_cpus × gpu_scale` cores for all its threads. It
does not dilate one CPU: a single busy thread may use the host's whole quota, i.e. run `host_cpus` times faster
than one core of the emulated host would let it (at 4 CPUs and gpu_scale 0.11 one thread gets 0.44 cores, where
one dilated CPU is 0.11). A system whose work funnels through one thread (a server's consumer, an engine's
dispatch, the GIL) then looks faster than it would on the real host. Time-dilated emulation slows each virtual CPU
(Gupta et al., NSDI'06); here a thread is the unit the kernel can cap: each thread of the host's processes is
moved into a child group of the host's group with a quota of `gpu_scale` cores per period. The host's quota still
bounds the sum (cgroup v1 enforces both levels), so the host behaves as `host_cpus` dilated CPUs.

How threads are found: a thread starts in its creator's group, so a scanner thread of the runner reads the host
group's `tasks` often (new processes join it there, cpu_limit.wrap) and each child's `tasks` less often (threads
created by a capped thread share their creator's cap until moved: briefly stricter, never looser). A thread whose
group cannot take it (a real-time thread: children have no real-time budget) stays where it is and is counted.
Children whose thread has exited are removed after their throttled time is added to the host's total.

cgroup v1 only (a thread may sit in a group apart from its process's other threads); v2 would need threaded
subtrees, and is refused with a message.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import pathlib
import threading
from collections.abc import Callable, Collection, Sequence

from benchmarks.emulation.cfs_bandwidth import MIN_QUOTA_US
from benchmarks.emulation.cpu_limit import CpuLimitError, parse_stat

LOG = logging.getLogger("thread_cap")
PREFIX = "t"  # a child group's name: PREFIX + the thread id


def thread_quota_us(cores: float, period_us: int) -> int:
    """One thread's quota per period: `cores` of one CPU (gpu_scale), never under the kernel's minimum."""
    if cores <= 0 or period_us <= 0:
        raise ValueError(f"cores per thread ({cores}) and the period ({period_us} us) must be positive")
    return max(MIN_QUOTA_US, round(cores * period_us))


@dataclasses.dataclass
class HostThreads:
    """What the caps did on one host: threads placed in groups of their own, threads left in the host's group
    (and why), and the time the kernel held capped threads back (throttled), summed over them."""

    placed: int = 0
    throttled_s: float = 0.0
    refusals: dict[str, int] = dataclasses.field(default_factory=dict)  # {errno name: threads}

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())


class ThreadCaps:
    """Caps every thread in the host groups `host_dirs` (cgroup v1 cpu directories) at `cores` per `period_us`.
    `exempt`: thread ids left alone (the links' receive threads adopted into a host, link_napi.py). The scanner
    reads the host groups every `interval_s` and the children every `child_every` scans."""

    def __init__(self, host_dirs: Sequence[pathlib.Path], cores: float, period_us: int, *,
                 exempt: Collection[int] = (), interval_s: float = 0.02, child_every: int = 10,
                 rmdir: Callable[[pathlib.Path], None] = pathlib.Path.rmdir):
        for d in host_dirs:
            if not (d / "tasks").exists() or not (d / "cpu.cfs_quota_us").exists():
                raise CpuLimitError(f"{d}: per-thread CPU caps need cgroup v1's cpu controller (a thread may join "
                                    "a group apart from its process there); run without --thread-cap here")
        self.dirs = list(host_dirs)
        self.quota_us, self.period_us = thread_quota_us(cores, period_us), period_us
        self.exempt = set(exempt)
        self.hosts = [HostThreads() for _ in self.dirs]
        self._interval, self._child_every = interval_s, max(1, child_every)
        self._rmdir = rmdir  # a group's directory goes with rmdir alone (its control files are the kernel's)
        self._skip: list[set[int]] = [set() for _ in self.dirs]  # refused once: not retried every scan
        self._scans = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-caps", daemon=True)

    # -- one pass ---------------------------------------------------------------------------------------------
    def scan(self, children: bool = True) -> None:
        """Moves every thread of the host groups (and, with `children`, every thread sharing a child with the
        thread it was made for) into a group of its own; removes the children of exited threads."""
        for i, host in enumerate(self.dirs):
            for tid in _tids(host / "tasks"):
                self._place(i, tid)
            if not children:
                continue
            for child in _children(host):
                owner = int(child.name[len(PREFIX):])
                tids = _tids(child / "tasks")
                if not tids:
                    self._retire(i, child)
                    continue
                for tid in tids:
                    if tid != owner:
                        self._place(i, tid)

    def _place(self, i: int, tid: int) -> None:
        if tid in self.exempt or tid in self._skip[i]:
            return
        child = self.dirs[i] / f"{PREFIX}{tid}"
        try:
            child.mkdir(exist_ok=True)
            (child / "cpu.cfs_period_us").write_text(str(self.period_us))
            (child / "cpu.cfs_quota_us").write_text(str(self.quota_us))
            (child / "tasks").write_text(str(tid))
        except OSError as e:
            if e.errno != errno.ESRCH:  # ESRCH: the thread exited meanwhile, nothing to count
                self._skip[i].add(tid)
                host = self.hosts[i]
                why = errno.errorcode.get(e.errno or 0, str(e))
                host.refusals[why] = host.refusals.get(why, 0) + 1
                LOG.debug("thread %d stays in %s: %s", tid, self.dirs[i], e)
            self._remove(child)
            return
        self.hosts[i].placed += 1

    def _retire(self, i: int, child: pathlib.Path) -> None:
        self.hosts[i].throttled_s += _throttled_s(child)
        self._remove(child)

    def _remove(self, child: pathlib.Path) -> None:
        try:
            self._rmdir(child)
        except OSError:
            pass  # not empty (a thread joined meanwhile: a later scan retires it) or already gone

    # -- the scanner ------------------------------------------------------------------------------------------
    def start(self) -> ThreadCaps:
        self.scan()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self._interval):
                self._scans += 1
                self.scan(children=self._scans % self._child_every == 0)
        except Exception:  # a monitor failure must not abort the run it watches; the threads keep their caps
            LOG.exception("placing threads in their CPU groups failed; later threads of this run are not capped")

    def stop(self) -> list[HostThreads]:
        """Stops the scanner, moves any thread still capped back into its host's group and removes the
        children (their throttled time counted). Returns each host's totals."""
        self._stopped.set()
        self._thread.join(timeout=10)
        for i, host in enumerate(self.dirs):
            for child in _children(host):
                for tid in _tids(child / "tasks"):
                    try:
                        (host / "tasks").write_text(str(tid))
                    except OSError:
                        pass  # exited meanwhile
                self._retire(i, child)
        return self.hosts


def _tids(tasks: pathlib.Path) -> list[int]:
    try:
        return [int(t) for t in tasks.read_text().split()]
    except OSError:
        return []  # the group went away


def _children(host: pathlib.Path) -> list[pathlib.Path]:
    try:
        return [d for d in host.iterdir() if d.is_dir() and d.name.startswith(PREFIX) and d.name[1:].isdigit()]
    except OSError:
        return []


def _throttled_s(group: pathlib.Path) -> float:
    try:
        return parse_stat((group / "cpu.stat").read_text()).get("throttled_time", 0) / 1e9
    except OSError:
        return 0.0
