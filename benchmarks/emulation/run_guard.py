"""When a benchmark may start: a clean git tree (or an override that is recorded) and an idle machine.

A 2-core machine shared with builds and tests gives numbers that measure the neighbours: a run waits up to
`wait_s` (wall clock, samples included) for the CPUs to be idle over a 5-second sample (and, if asked, for the
1-minute load average to fall), saying every 30 s what it waits for and which processes are busy, then refuses,
unless forced (recorded in every row) or, in a demo's proceed mode, starts with a warning recorded in the
row. Uncommitted changes make a row impossible to reproduce from its commit: refused unless allowed
(recorded).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import subprocess
import time
from collections.abc import Callable

from benchmarks.emulation import tree_manifest
from benchmarks.paths import ROOT

LOG = logging.getLogger("run_guard")

# What the benchmarks themselves write: a sweep appends to its CSVs and rewrites the tables of docs/benchmarks.md
# and the README's headline, and the next sweep of `make sweeps` must not take that for an uncommitted change to
# the code it measures.
OUTPUTS = ("benchmarks/results", "README.md", "docs/benchmarks.md")


class Refused(RuntimeError):
    """The benchmark must not start (dirty tree, busy machine); the message says why and how to override."""


DEFAULT_MAX_BUSY = 10.0  # percent of all cores: what a shell, an editor and the kernel take on an idle machine


def cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot; idle and iowait count as not busy."""
    with open(path) as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_percent(window_s: float = 5.0, *, times: Callable[[], tuple[int, int]] = cpu_times,
                 sleep: Callable[[float], None] = time.sleep) -> float:
    """Percent of the machine's CPU time (all cores) spent busy over the next `window_s` seconds."""
    busy0, total0 = times()
    sleep(window_s)
    busy1, total1 = times()
    return 100.0 * (busy1 - busy0) / max(1, total1 - total0)


def git_state(root: pathlib.Path = ROOT) -> tuple[str, bool]:
    """(HEAD commit or "none", whether tracked files other than OUTPUTS differ from it). With P3_TREE_MANIFEST set
    (a copied tree whose .git lags it: tree_manifest.py), the manifest's commit, and whether a file differs from it."""
    manifest = os.environ.get(tree_manifest.VARIABLE)
    if manifest:
        commit, differ = tree_manifest.check(pathlib.Path(manifest), root, OUTPUTS)
        if differ:
            LOG.warning("%d tracked files differ from the manifest's commit %s: %s", len(differ), commit[:12],
                        ", ".join(differ[:5]) + (" ..." if len(differ) > 5 else ""))
        return commit, bool(differ)

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=root, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    excluded = [f":(exclude){path}" for path in OUTPUTS]
    return git("rev-parse", "HEAD") or "none", bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                                        *excluded))


def check_tree(allow_dirty: bool, root: pathlib.Path = ROOT) -> tuple[str, bool]:
    commit, dirty = git_state(root)
    if dirty and not allow_dirty:
        raise Refused(f"the git tree at {root} has uncommitted changes: the rows could not be reproduced from "
                      f"commit {commit[:12]}. Commit them, or pass --allow-dirty (recorded in every row).")
    if dirty:
        LOG.warning("running on a dirty tree (--allow-dirty): every row says so")
    return commit, dirty


def tree_or_refusal(allow_dirty: bool, root: pathlib.Path = ROOT) -> tuple[str, bool] | None:
    """check_tree for a command's main(): a refusal is logged, and None tells main() to exit with status 2."""
    try:
        return check_tree(allow_dirty, root)
    except Refused as e:
        LOG.error("%s", e)
        return None


@dataclasses.dataclass(frozen=True)
class Sample:
    """CPU use over one sample window: the machine's busy percent and the busiest processes."""

    busy_pct: float  # percent of all cores
    top: tuple[tuple[str, int, float], ...] = ()  # (name, pid, percent of all cores), busiest first


def process_times(proc: str = "/proc") -> dict[int, tuple[str, int]]:
    """{pid: (name, utime + stime jiffies)} of every process readable now (a process that exits meanwhile is
    left out). The name is the kernel's comm, which is what `top` shows."""
    times = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(")")  # comm may hold spaces and parentheses
        fields = rest.split()
        if len(fields) > 12:
            times[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime (stat fields 14, 15)
    return times


def busiest(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], total_jiffies: int,
            count: int = 3) -> tuple[tuple[str, int, float], ...]:
    """The `count` processes that used the most CPU between two process_times snapshots, as percent of all
    cores (the unit of the busy percent): a process that started during the window counts from zero."""
    used = []
    for pid, (name, jiffies) in after.items():
        delta = jiffies - before.get(pid, (name, 0))[1]
        if delta > 0:
            used.append((name, pid, 100.0 * delta / max(1, total_jiffies)))
    return tuple(sorted(used, key=lambda u: -u[2])[:count])


def label(pid: int, name: str, proc: str = "/proc", width: int = 48) -> str:
    """`name` with the start of the process's arguments ("python" alone says little), if it still runs."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")[1:]
    except OSError:
        return name
    text = " ".join(a.decode(errors="replace") for a in args if a)
    return f"{name} {text[:width]}{'...' if len(text) > width else ''}".strip()


def sample_cpu(window_s: float = 5.0, *, times: Callable[[], tuple[int, int]] = cpu_times,
               procs: Callable[[], dict[int, tuple[str, int]]] = process_times,
               sleep: Callable[[float], None] = time.sleep) -> Sample:
    """busy_percent and who was busy, over the same window. Only processes alive at the window's end are seen:
    short-lived ones (a compiler run by make) leave the busy percent above the sum of the busiest."""
    busy0, total0 = times()
    procs0 = procs()
    sleep(window_s)
    busy1, total1 = times()
    top = busiest(procs0, procs(), total1 - total0)
    return Sample(100.0 * (busy1 - busy0) / max(1, total1 - total0),
                  tuple((label(pid, name), pid, pct) for name, pid, pct in top))


@dataclasses.dataclass(frozen=True)
class Start:
    """What the machine looked like when a run was let start (recorded in its row)."""

    busy_pct: float  # CPU busy over the last sample window, percent of all cores
    load_1m: float
    forced: bool
    waited_s: float = 0.0  # wall-clock time spent in the gate, samples included
    warning: str = ""  # set when the machine never became idle and the run proceeded anyway (proceed mode)


REPORT_S = 30.0  # seconds between the gate's progress lines while it waits


def who(top: tuple[tuple[str, int, float], ...]) -> str:
    return ", ".join(f"{name} (pid {pid}) {pct:.0f}%" for name, pid, pct in top) or "no process stands out"


def wait_for_idle(max_busy: float, max_load: float | None, wait_s: float, force: bool, *,
                  busy: Callable[[], float | Sample] | None = None,
                  getloadavg: Callable[[], tuple[float, float, float]] | None = None,
                  sleep: Callable[[float], None] | None = None, poll_s: float = 5.0,
                  clock: Callable[[], float] | None = None, proceed: bool = False,
                  report_s: float = REPORT_S) -> Start:
    """Waits until the machine is idle: CPU busy over a short sample at most `max_busy` percent and, when
    `max_load` is set, the 1-minute load average at most `max_load`. The whole wait counts against `wait_s`,
    by the wall clock, the samples included (a wait may overrun by one sample). While it waits it logs, every
    `report_s` seconds, what it waits for and the busiest processes. If the machine never becomes idle it raises
    Refused, or with `proceed` it starts with a warning that the row records (a demo's mode: publication runs
    keep the strict gate). With `force` it starts at once (recorded). The sample, not the load average, is the
    default gate: the average still carries the previous run for a minute or two after its processes exit."""
    busy = busy or sample_cpu
    getloadavg = getloadavg or os.getloadavg  # looked up now, so tests can patch os.getloadavg
    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    began = clock()

    def sample() -> tuple[Sample, float, str]:
        measured, load = busy(), getloadavg()[0]
        cpu = measured if isinstance(measured, Sample) else Sample(float(measured))
        why = []
        if cpu.busy_pct > max_busy:
            why.append(f"CPU busy {cpu.busy_pct:.0f}% is above --max-busy {max_busy:g}%")
        if max_load is not None and load > max_load:
            why.append(f"1-minute load {load:.2f} is above --max-load {max_load:.2f}")
        return cpu, load, " and ".join(why)

    cpu, load, why = sample()
    if why and not force and wait_s > 0:
        LOG.info("%s (busiest: %s): waiting up to %.0f s for an idle machine, then %s", why, who(cpu.top), wait_s,
                 "proceeding with a warning" if proceed else "refusing")
    reported = clock()
    while why and not force and clock() - began < wait_s:
        sleep(min(poll_s, wait_s - (clock() - began)))
        cpu, load, why = sample()
        if why and clock() - reported >= report_s:
            reported = clock()
            LOG.info("still waiting, %.0f of %.0f s: %s (busiest: %s)", reported - began, wait_s, why, who(cpu.top))
    waited = clock() - began
    if not why:
        return Start(cpu.busy_pct, load, False, waited)
    if force:
        LOG.warning("%s; starting anyway (--force, recorded)", why)
        return Start(cpu.busy_pct, load, True, waited)
    if proceed:
        warning = f"{why} after waiting {waited:.0f} s (busiest: {who(cpu.top)})"
        LOG.warning("%s; proceeding anyway (recorded in the row): the numbers also measure that work", warning)
        return Start(cpu.busy_pct, load, False, waited, warning)
    raise Refused(f"{why} after waiting {waited:.0f} s (busiest: {who(cpu.top)}): the numbers would measure the "
                  "other work. Stop it, raise --load-wait, or pass --force (recorded in every row).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The guard's options, shared by every benchmark runner."""
    p.add_argument("--max-busy", type=float, default=DEFAULT_MAX_BUSY,
                   help="a run waits until the CPUs were at most this busy (percent of all cores) over a 5-second "
                   f"sample (default {DEFAULT_MAX_BUSY:g})")
    p.add_argument("--max-load", type=float, default=None,
                   help="also wait for the 1-minute load average to fall below this (default: not checked)")
    p.add_argument("--load-wait", type=float, default=600.0, help="seconds a run waits for an idle machine (wall "
                   "clock, samples included), then refuses")
    p.add_argument("--force", action="store_true", help="run on a busy machine anyway (recorded in every row)")
    p.add_argument("--allow-dirty", action="store_true", help="run on uncommitted changes (recorded in every row)")
