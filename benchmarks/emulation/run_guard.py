"""When a benchmark may start: a clean git tree (or an override that is recorded) and an idle machine.

A 2-core machine shared with builds and tests gives numbers that measure the neighbours: a run waits up to
`wait_s` for the CPUs to be idle over a 5-second sample (and, if asked, for the 1-minute load average to fall),
then refuses, unless forced (recorded in every row). Uncommitted changes make a row impossible to reproduce
from its commit: refused unless allowed (recorded).
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

from benchmarks.paths import ROOT

LOG = logging.getLogger("run_guard")

# What the benchmarks themselves write: a sweep appends to its CSVs and rewrites the README's tables, and the next
# sweep of `make sweeps` must not take that for an uncommitted change to the code it measures.
OUTPUTS = ("benchmarks/results", "README.md")


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
    """(HEAD commit or "none", whether tracked files other than OUTPUTS differ from it)."""
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
class Start:
    """What the machine looked like when a run was let start (recorded in its row)."""

    busy_pct: float  # CPU busy over the last sample window, percent of all cores
    load_1m: float
    forced: bool


def wait_for_idle(max_busy: float, max_load: float | None, wait_s: float, force: bool, *,
                  busy: Callable[[], float] | None = None,
                  getloadavg: Callable[[], tuple[float, float, float]] | None = None,
                  sleep: Callable[[float], None] | None = None, poll_s: float = 5.0) -> Start:
    """Waits up to `wait_s` seconds until the machine is idle: CPU busy over a short sample at most `max_busy`
    percent and, when `max_load` is set, the 1-minute load average at most `max_load`. Raises Refused if it never
    is; with `force` it starts at once (recorded). The sample, not the load average, is the default gate: the
    average still carries the previous run for a minute or two after its processes have exited."""
    busy = busy or busy_percent
    getloadavg = getloadavg or os.getloadavg  # looked up now, so tests can patch os.getloadavg
    sleep = sleep or time.sleep

    def sample() -> tuple[float, float, str]:
        pct, load = busy(), getloadavg()[0]
        why = []
        if pct > max_busy:
            why.append(f"CPU busy {pct:.0f}% is above --max-busy {max_busy:g}%")
        if max_load is not None and load > max_load:
            why.append(f"1-minute load {load:.2f} is above --max-load {max_load:.2f}")
        return pct, load, " and ".join(why)

    pct, load, why = sample()
    waited = 0.0
    if why and not force:
        LOG.info("%s: waiting up to %.0f s", why, wait_s)
    while why and not force and waited < wait_s:
        step = min(poll_s, wait_s - waited)
        sleep(step)
        waited += step
        pct, load, why = sample()
    if not why:
        return Start(pct, load, False)
    if force:
        LOG.warning("%s; starting anyway (--force, recorded)", why)
        return Start(pct, load, True)
    raise Refused(f"{why} after waiting {waited:.0f} s: the numbers would measure the other work. Stop it, raise "
                  "--load-wait, or pass --force (recorded in every row).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The guard's options, shared by every benchmark runner."""
    p.add_argument("--max-busy", type=float, default=DEFAULT_MAX_BUSY,
                   help="a run waits until the CPUs were at most this busy (percent of all cores) over a 5-second "
                   f"sample (default {DEFAULT_MAX_BUSY:g})")
    p.add_argument("--max-load", type=float, default=None,
                   help="also wait for the 1-minute load average to fall below this (default: not checked)")
    p.add_argument("--load-wait", type=float, default=600.0, help="seconds a run waits for an idle machine, then "
                   "refuses")
    p.add_argument("--force", action="store_true", help="run on a busy machine anyway (recorded in every row)")
    p.add_argument("--allow-dirty", action="store_true", help="run on uncommitted changes (recorded in every row)")
