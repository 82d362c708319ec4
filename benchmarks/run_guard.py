"""When a benchmark may start: a clean git tree (or an override that is recorded) and an idle machine.

A 2-core machine shared with builds and tests gives numbers that measure the neighbours: a run waits up to
`wait_s` for the 1-minute load average to fall to `max_load`, then refuses, unless forced (recorded in every
row). Uncommitted changes make a row impossible to reproduce from its commit: refused unless allowed (recorded).
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import time
from collections.abc import Callable

LOG = logging.getLogger("run_guard")
ROOT = pathlib.Path(__file__).resolve().parent.parent
# What the benchmarks themselves write: a sweep appends to its CSVs and rewrites the README's tables, and the next
# sweep of `make sweeps` must not take that for an uncommitted change to the code it measures.
OUTPUTS = ("benchmarks/results", "README.md")


class Refused(RuntimeError):
    """The benchmark must not start (dirty tree, busy machine); the message says why and how to override."""


def default_max_load() -> float:
    return max(1.0, (os.cpu_count() or 1) / 4)


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


def wait_for_load(max_load: float, wait_s: float, force: bool, *,
                  getloadavg: Callable[[], tuple[float, float, float]] | None = None,
                  sleep: Callable[[float], None] | None = None, poll_s: float = 10.0) -> tuple[float, bool]:
    """Returns (1-minute load when the run starts, whether it started above `max_load` because of `force`).
    Waits up to `wait_s` seconds for the load to fall; raises Refused if it does not. With `force` it starts at
    once (recorded)."""
    getloadavg = getloadavg or os.getloadavg  # looked up now, so tests can patch os.getloadavg
    sleep = sleep or time.sleep
    load = getloadavg()[0]
    if force and load > max_load:
        wait_s = 0.0
    waited = 0.0
    while load > max_load and waited < wait_s:
        if waited == 0:
            LOG.info("1-minute load %.2f is above --max-load %.2f: waiting up to %.0f s", load, max_load, wait_s)
        step = min(poll_s, wait_s - waited)
        sleep(step)
        waited += step
        load = getloadavg()[0]
    if load <= max_load:
        return load, False
    if force:
        LOG.warning("1-minute load %.2f is above --max-load %.2f; starting anyway (--force, recorded)", load, max_load)
        return load, True
    raise Refused(f"the 1-minute load average is {load:.2f}, above --max-load {max_load:.2f}, after waiting "
                  f"{waited:.0f} s: the numbers would measure the other work. Wait, raise --load-wait, or pass "
                  "--force (recorded in every row).")
