"""CPU-limited emulated hosts: one cgroup per host with a CPU bandwidth quota, dilated like compute and links.

Time dilation is faithful only when every resource is slowed by the same factor (Gupta et al., NSDI'06): compute
and links run at --gpu-scale, so a host's CPUs must too. Host i's processes (its launcher and every descendant)
run in a group of its own whose quota is `host_cpus × gpu_scale` cores (Mininet-HiFi's CPU-limited host, with
the quota taken from the dilation rather than chosen by hand). The groups also account each host's CPU time and
the time the kernel held it back for exceeding the quota (throttled), which the fidelity monitors read
(benchmarks/emulation/fidelity.py).

Two kernel interfaces, whichever this machine lets us write:
- cgroup v1: the `cpu` controller (cpu.cfs_period_us, cpu.cfs_quota_us, cpu.stat: nr_periods, nr_throttled,
  throttled_time in ns) and `cpuacct` (cpuacct.usage in ns), mounted separately or together;
- cgroup v2: cpu.max ("quota period" in µs) and cpu.stat (usage_usec, nr_periods, nr_throttled,
  throttled_usec), in a hierarchy whose root delegates the cpu controller.
Group names carry the creating process's pid like the cluster's namespaces (p3c<pid>x<n>h<i>), so
`cleanup_stale` removes those of a runner that died without its teardown.

A process joins its group before it forks anything: `wrap` prefixes the command with a tiny shell that writes its
own pid into the group, then execs the command (a preexec function would run between fork and exec in a process
with threads, which Python warns against). The shell runs outside `ip netns exec`, whose private /sys hides the
cgroup mounts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import signal
import time
from collections.abc import Sequence

from benchmarks.emulation import cfs_bandwidth, proc_monitor

LOG = logging.getLogger("cpu_limit")
ROOT = pathlib.Path("/sys/fs/cgroup")
# The CFS period and bandwidth slice: cfs_bandwidth.py (re-exported here for the callers that read them).
PERIOD_US, MIN_QUOTA_US, period_us = cfs_bandwidth.PERIOD_US, cfs_bandwidth.MIN_QUOTA_US, cfs_bandwidth.period_us
BANDWIDTH_SLICE_US, SLICE_FILE = cfs_bandwidth.SLICE_US, cfs_bandwidth.SLICE_FILE
# The quotas of a point may add up to at most this share of the machine's cores: the rest is the runner's own (the
# link sampler, the CPU monitors, the relay of host 0's output) and the kernel's (softirq work of the links), so
# that every host can get its whole quota when it asks.
MAX_MACHINE_SHARE = 0.9
# Real-time budget of a host's group (cgroup v1 with RT group scheduling, as here: a new group gets 0 and no thread
# in it may run real-time). The virtual GPU's timer thread (emulated_compute.run_timer_as_gpu) runs SCHED_FIFO so
# that it completes GPU operations on time, and a thread it waits for on a lock is boosted (virtual_stream.h): 5% of
# one CPU per host (each timer uses a few µs per operation), 16 hosts within the root's 95%.
RT_RUNTIME_US = 50_000
_NAME = re.compile(r"^p3c(\d+)x\d+h\d+$")
_JOIN = 'for procs in $1; do echo $$ > "$procs" || exit 125; done; shift; exec "$@"'


class CpuLimitError(RuntimeError):
    """No writable cgroup hierarchy with a CPU bandwidth controller, or a group operation failed."""


class QuotaRefused(ValueError):
    """A point's quotas do not fit on this machine; the message names the largest gpu_scale that does."""


# -- quota arithmetic (pure) ----------------------------------------------------------------------------------
def quota_cores(host_cpus: float, gpu_scale: float) -> float:
    """One emulated host's CPU bandwidth in cores: its CPUs slowed like its GPU."""
    if host_cpus <= 0 or gpu_scale <= 0:
        raise ValueError(f"host_cpus ({host_cpus}) and gpu_scale ({gpu_scale}) must be positive")
    return host_cpus * gpu_scale


def largest_fitting_scale(hosts: int, host_cpus: float, cpus: int, share: float = MAX_MACHINE_SHARE) -> float:
    """The largest gpu_scale at which `hosts` quotas add up to at most `share` of `cpus` cores."""
    return share * cpus / (hosts * host_cpus)


def check_fits(hosts: int, host_cpus: float, gpu_scale: float, cpus: int | None = None,
               share: float = MAX_MACHINE_SHARE) -> float:
    """Each host's quota in cores; raises QuotaRefused when the hosts' quotas together exceed `share` of the
    machine (then the hosts would compete for the cores and the quota would not be what they get)."""
    cpus = cpus or os.cpu_count() or 1
    quota = quota_cores(host_cpus, gpu_scale)
    if hosts * quota > share * cpus * (1 + 1e-9):
        fit = largest_fitting_scale(hosts, host_cpus, cpus, share)
        raise QuotaRefused(
            f"{hosts} hosts × {host_cpus:g} CPUs × gpu_scale {gpu_scale:g} = {hosts * quota:.3g} cores of CPU quota, "
            f"more than {share:.0%} of this machine's {cpus} cores: use --gpu-scale {fit:.4g} or less (the largest "
            f"that fits), fewer --host-cpus or fewer hosts, or --no-cpu-limit to run without CPU limits (the rows "
            f"say so)")
    return quota


# -- reading the kernel's counters (pure) ---------------------------------------------------------------------
def parse_stat(text: str) -> dict[str, int]:
    """A flat "key value" file (cpu.stat of v1 or v2) as {key: int}."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            found[parts[0]] = int(parts[1])
    return found


@dataclasses.dataclass(frozen=True)
class CpuUsage:
    """A group's counters at one moment (or their difference over a window)."""

    cpu_s: float = 0.0  # CPU time its processes used
    throttled_s: float = 0.0  # time the kernel held its runqueues back (summed over the CPUs it was throttled on)
    periods: int = 0  # CFS periods in which it ran
    throttled_periods: int = 0  # ... and in which it hit the quota

    def __sub__(self, other: CpuUsage) -> CpuUsage:
        return CpuUsage(self.cpu_s - other.cpu_s, self.throttled_s - other.throttled_s,
                        self.periods - other.periods, self.throttled_periods - other.throttled_periods)

    @property
    def throttled_period_share(self) -> float:
        return self.throttled_periods / self.periods if self.periods else 0.0


def usage_v1(cpu_stat: str, cpuacct_usage: str | None) -> CpuUsage:
    stat = parse_stat(cpu_stat)
    return CpuUsage(int(cpuacct_usage.strip()) / 1e9 if cpuacct_usage else 0.0, stat.get("throttled_time", 0) / 1e9,
                    stat.get("nr_periods", 0), stat.get("nr_throttled", 0))


def usage_v2(cpu_stat: str) -> CpuUsage:
    stat = parse_stat(cpu_stat)
    return CpuUsage(stat.get("usage_usec", 0) / 1e6, stat.get("throttled_usec", 0) / 1e6, stat.get("nr_periods", 0),
                    stat.get("nr_throttled", 0))


# -- the hierarchies --------------------------------------------------------------------------------------------
def _writable_dir(path: pathlib.Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Where groups go: v1 (the cpu directory, and cpuacct's when mounted apart) or v2 (one directory)."""

    version: int
    cpu: pathlib.Path
    cpuacct: pathlib.Path | None = None

    def dirs(self, name: str) -> list[pathlib.Path]:
        return [d / name for d in (self.cpu, self.cpuacct) if d is not None]


def find_hierarchy(root: pathlib.Path = ROOT) -> Hierarchy:
    """The first writable hierarchy with CPU bandwidth control: v1's cpu controller, else a v2 hierarchy that
    delegates cpu (enabling it in the root's subtree_control when it is available but off). Raises CpuLimitError
    naming what to do where neither is writable."""
    cpu = root / "cpu"
    if _writable_dir(cpu) and (cpu / "cpu.cfs_quota_us").exists():
        acct = root / "cpuacct"
        acct = acct if _writable_dir(acct) and (acct / "cpuacct.usage").exists() else None
        if acct is not None and acct.resolve() == cpu.resolve():
            acct = None  # mounted together (cpu,cpuacct): one directory holds both
        return Hierarchy(1, cpu, acct)
    for v2 in (root / "unified", root):
        controllers = v2 / "cgroup.controllers"
        if not controllers.exists() or not _writable_dir(v2) or "cpu" not in controllers.read_text().split():
            continue
        subtree = v2 / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            try:
                subtree.write_text("+cpu")
            except OSError as e:
                LOG.warning("cannot enable the cpu controller in %s: %s", subtree, e)
                continue
        return Hierarchy(2, v2)
    raise CpuLimitError(
        f"no writable cgroup hierarchy with CPU bandwidth control under {root}: CPU limits per emulated host need "
        "root and either cgroup v1's cpu controller (mounted at /sys/fs/cgroup/cpu) or cgroup v2 with the cpu "
        "controller delegated (`echo +cpu > /sys/fs/cgroup/cgroup.subtree_control`); or pass --no-cpu-limit to "
        "run without limits (the rows say so)")


def why_unavailable(root: pathlib.Path = ROOT) -> str | None:
    try:
        find_hierarchy(root)
    except CpuLimitError as e:
        return str(e)
    return None


class CpuGroup:
    """One host's group. Methods are called from the runner's main thread, `usage` also from a sampler."""

    def __init__(self, hierarchy: Hierarchy, name: str):
        self.hierarchy, self.name = hierarchy, name
        self.dirs = hierarchy.dirs(name)

    def create(self) -> None:
        for d in self.dirs:
            d.mkdir(exist_ok=True)
        if self.hierarchy.version == 1:
            (self.dirs[0] / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            rt = self.dirs[0] / "cpu.rt_runtime_us"
            if rt.exists():
                try:
                    rt.write_text(str(RT_RUNTIME_US))
                except OSError as e:  # the siblings' budgets fill the parent's: the timer stays ordinary (recorded)
                    LOG.warning("%s: no real-time budget for the virtual GPU's timer (%s)", self.name, e)

    def set_quota(self, cores: float | None, base_period_us: int = PERIOD_US) -> int:
        """`cores` of CPU bandwidth per period (cfs_bandwidth.period_us of `base_period_us`); None: unlimited (the
        group still accounts). Returns the period."""
        period = period_us(cores, base_period_us)
        quota = -1 if cores is None else max(MIN_QUOTA_US, round(cores * period))
        if self.hierarchy.version == 1:
            # Unlimited while the period changes: the kernel checks every intermediate quota/period pair.
            (self.dirs[0] / "cpu.cfs_quota_us").write_text("-1")
            (self.dirs[0] / "cpu.cfs_period_us").write_text(str(period))
            if quota >= 0:
                (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.dirs[0] / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period}")
        return period

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def usage(self) -> CpuUsage:
        stat = (self.dirs[0] / "cpu.stat").read_text()
        if self.hierarchy.version == 2:
            return usage_v2(stat)
        acct = self.dirs[-1] / "cpuacct.usage"
        return usage_v1(stat, acct.read_text() if acct.exists() else None)

    def remove(self, timeout: float = 10.0) -> None:
        """Kills what is left in the group (only our hosts' processes are ever put there), then removes it."""
        _remove_dirs(self.dirs, timeout)


def _remove_dirs(dirs: Sequence[pathlib.Path], timeout: float = 10.0) -> None:
    """Kills the processes of each group and removes it, its child groups first (thread_cap.py's)."""
    deadline = time.monotonic() + timeout
    for d in dirs:
        if not d.exists():
            continue
        try:
            children = [c for c in d.iterdir() if c.is_dir()]
        except OSError:
            children = []
        _remove_dirs(children, max(0.0, deadline - time.monotonic()))
        while True:
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:  # EBUSY: a killed process has not left yet
                if time.monotonic() > deadline:
                    raise CpuLimitError(f"cannot remove cgroup {d}: {e}; pids still in it: {pids}") from e
                time.sleep(0.05)


def cleanup_stale(root: pathlib.Path = ROOT) -> list[str]:
    """Removes the host groups of clusters whose creating process is gone; returns their paths."""
    removed = []
    for parent in (root / "cpu", root / "cpuacct", root / "unified", root):
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            match = _NAME.match(d.name)
            if match and d.is_dir() and not proc_monitor.alive(int(match.group(1))):
                try:
                    _remove_dirs([d])
                    removed.append(str(d))
                except CpuLimitError as e:
                    LOG.warning("%s", e)
    if removed:
        LOG.warning("removed %d stale CPU groups of dead clusters: %s", len(removed), " ".join(removed))
    return removed


class HostCpuLimits:
    """One group per emulated host, named after the cluster's namespaces (`names`). Owned by the cluster: it
    creates them at start and removes them at close. `slice_file`: the machine's CFS bandwidth slice
    (SLICE_FILE), set to `slice_us` while the groups exist; None leaves it alone. `base_period_us`: the CFS
    period (cfs_bandwidth.py says how it is chosen)."""

    def __init__(self, names: Sequence[str], hierarchy: Hierarchy | None = None,
                 slice_file: pathlib.Path | None = None, *, base_period_us: int = PERIOD_US,
                 slice_us: int = BANDWIDTH_SLICE_US):
        self.hierarchy = hierarchy or find_hierarchy()
        self.groups = [CpuGroup(self.hierarchy, name) for name in names]
        self.quota: float | None = None
        self._up = False
        self._slice = cfs_bandwidth.MachineSlice(slice_file, slice_us)
        self.base_period_us = period_us(None, base_period_us)  # checked here, before any group exists
        self.period_us = self.base_period_us  # the CFS period of the quota set last

    def start(self) -> HostCpuLimits:
        self._up = True
        try:
            for g in self.groups:
                g.create()
                g.set_quota(None)
            self._slice.start()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def bandwidth_slice_us(self) -> int | None:
        """What the machine's CFS bandwidth slice was while the groups ran (None: not set, not known)."""
        return self._slice.slice_us

    def adopt(self, i: int, tids: Sequence[int]) -> None:
        """Puts threads that do host i's work outside its processes (its link's receive threads, link_napi.py)
        into host i's group: v1 takes threads in `tasks`, v2 in `cgroup.threads` of a threaded group, so there a
        kernel thread joins through cgroup.procs."""
        for d in self.groups[i].dirs:
            target = d / ("tasks" if self.hierarchy.version == 1 else "cgroup.procs")
            for tid in tids:
                target.write_text(str(tid))

    def release(self, tids: Sequence[int]) -> None:
        """Threads adopted earlier back to the root group (kernel threads ignore the SIGKILL with which a
        group is emptied; they end with their device, which may outlive the group's removal by a moment)."""
        for root in {d.parent for g in self.groups for d in g.dirs}:
            target = root / ("tasks" if self.hierarchy.version == 1 else "cgroup.procs")
            for tid in tids:
                try:
                    target.write_text(str(tid))
                except OSError:
                    pass  # gone already

    def close(self) -> None:
        if not self._up:
            return
        self._up = False
        self._slice.close()
        for g in self.groups:
            try:
                g.remove()
            except CpuLimitError as e:
                LOG.error("%s", e)

    def __enter__(self) -> HostCpuLimits:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_quota(self, cores: float | None, base_period_us: int | None = None) -> None:
        """Every host's quota in cores (None: unlimited, accounting only), per CFS period of `base_period_us`
        (None: the limits' own base period)."""
        base = self.base_period_us if base_period_us is None else period_us(None, base_period_us)
        for g in self.groups:
            self.period_us = g.set_quota(cores, base)
        self.quota = cores

    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` started in host i's group: the process joins before it runs (or forks) anything."""
        return ["sh", "-c", _JOIN, "join-cpu-group", " ".join(self.groups[i].procs_files()), *argv]

    def usage(self) -> list[CpuUsage]:
        return [g.usage() for g in self.groups]

    def cpu_dirs(self) -> list[pathlib.Path]:
        """Each host group's directory in the hierarchy that holds its quota (thread_cap.py's parents)."""
        return [g.dirs[0] for g in self.groups]
