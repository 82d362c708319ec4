"""Peak memory of a process tree (a launcher and its scheduler, servers and workers), sampled from /proc.

Linux only; no psutil. Each process's role is read from its environment (P3_ROLE or DMLC_ROLE). VmHWM is the
kernel's own peak resident set of a process, so a process seen once before it exits reports its true peak; the
total across processes is sampled, so it can miss short spikes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import threading

LOG = logging.getLogger("proc_monitor")


@dataclasses.dataclass
class Peaks:
    """Peak resident memory in MiB: the largest single process per role, and the sampled total of the tree."""

    by_role: dict[str, float] = dataclasses.field(default_factory=dict)
    total: float = 0.0
    pids: set[int] = dataclasses.field(default_factory=set)


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may contain spaces and parentheses; fields after its last ')' are safe.
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts): what names a stale namespace or cgroup."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(root: int) -> list[int]:
    children = _children_map()
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _status_kib(pid: int, fields: tuple[str, ...]) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    values[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return values


def role_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
    except OSError:
        return "other"
    return (env.get(b"P3_ROLE") or env.get(b"DMLC_ROLE") or b"other").decode(errors="replace")


class TreeMonitor:
    """Samples the tree under `root` every `interval` seconds from a thread it owns; `stop()` joins it."""

    def __init__(self, root: int, interval: float = 0.5):
        self._root = root
        self._interval = interval
        self._stopped = threading.Event()
        self._roles: dict[int, str] = {}
        self._lock = threading.Lock()
        self.peaks = Peaks()
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)

    def start(self) -> TreeMonitor:
        self._thread.start()
        return self

    def stop(self) -> Peaks:
        self._stopped.set()
        self._thread.join()
        return self.peaks

    def known_pids(self) -> set[int]:
        """Every descendant seen so far (some may have exited). Thread-safe."""
        with self._lock:
            return set(self.peaks.pids)

    def sample_once(self) -> None:
        total = 0
        for pid in descendants(self._root):
            values = _status_kib(pid, ("VmHWM", "VmRSS"))
            if not values:
                continue
            role = self._roles.setdefault(pid, role_of(pid))
            total += values.get("VmRSS", 0)
            with self._lock:
                self.peaks.pids.add(pid)
                peak = values.get("VmHWM", 0) / 1024
                self.peaks.by_role[role] = max(self.peaks.by_role.get(role, 0.0), peak)
        with self._lock:
            self.peaks.total = max(self.peaks.total, total / 1024)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.sample_once()
            except Exception:  # a monitor failure must not abort the benchmark it watches
                LOG.exception("sampling /proc failed; memory peaks will be incomplete")
                return
            self._stopped.wait(self._interval)


def stop_tree(launcher: subprocess.Popen, pids: set[int]) -> None:
    """Backstop when a launcher's own --timeout did not end its job: SIGTERM the launcher (it stops its
    children), then SIGKILL it and every process in `pids` (those it had started) that is left."""
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=30)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
