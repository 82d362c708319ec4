"""Each thread's CPU during a run, cut to the timed window: which thread of which process does the work.

Under per-thread caps (thread_cap.py) a thread runs at one dilated CPU at most, so a process whose work funnels
through one thread is held back by that thread, not by its host. Which thread that is, and how the rest of the
work spreads, is what the simulator needs to model a system's threads (sim/ps.py: ps-lite's receive path, p3kv's
receive and consumer threads) rather than assume them (issue 28). It is also what a reader of a row needs to see
why a system is CPU-bound.

The thread caps' scanner takes the samples (every `every` of its full scans, about once a second, and once more
when it stops): each known thread's time on a CPU (/proc/<pid>/task/<tid>/schedstat, in ns) and, for a capped
thread, the time its group was throttled. A thread's usage in the window is interpolated between the samples
around the window's ends; a thread that exits between samples loses at most one interval's CPU.

A process's role comes from its environment: DMLC_ROLE for MXNet's ps-lite processes, P3_ROLE for p3kv's; with
neither, it is a worker (Horovod's and DDP's ranks). `summary` gives, per role, the threads of its busiest process
(most CPU in the window), busiest first, as [name, % of one dilated CPU, % of the window throttled, where it
waits]: 100 is a thread that ran at its cap the whole window. Names are the threads' own: p3kv names its threads
"p3-..." (cpp/src/thread_name.h), while MXNet's engine, ps-lite's, the ZMQ MXNet links and OpenMP's threads all
keep the interpreter's "python". What can tell those apart is where each one sleeps between its work, read with
each CPU sample from /proc/<pid>/task/<tid>/wchan and shortened (WAITS): "epoll", "poll", "futex", "recv", ...
By their code one expects ZMQ's I/O thread in epoll_wait, ps-lite's receiving thread in zmq_msg_recv's poll(),
the engine's and OpenMP's threads on a futex (VGG-19's capped dist_sync servers: epoll, futex, then OpenMP's
threads; docs/benchmarks.md). p3kv's receive threads
show "poll" or "recv" (socket.cc waits in poll() before it reads), its consumer "futex" (test_thread_cap.py). The
process's first thread (a Python process's main thread: its tid is the pid) is "main" wherever it waits; a thread
never seen asleep is "". Where a thread waits counts every sample since the caps began, the CPU only the window.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

from benchmarks.emulation.cpu_limit import parse_stat

PROC = pathlib.Path("/proc")
ROLE_VARIABLES = ("DMLC_ROLE", "P3_ROLE")  # ps-lite's, p3kv's (p3kv/core/config.py)
TOP = 8  # threads listed per role
NAME_READS = 3  # samples that re-read a thread's name (it may name itself just after it starts)
# The kernel functions a blocked thread's wchan names, by the call it blocked in (others are kept as they are).
WAITS = (("epoll", "epoll"), ("futex", "futex"), ("poll", "poll"), ("select", "poll"), ("sk_wait", "recv"),
         ("wait_woken", "recv"), ("stream_read", "recv"), ("csk_accept", "accept"),
         ("nanosleep", "sleep"), ("pipe_read", "pipe"), ("wait4", "wait"))


@dataclasses.dataclass
class Track:
    """One thread's samples: (time.time(), CPU seconds, throttled seconds) since it started."""

    host: int
    pid: int
    name: str
    samples: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)
    waits: dict[str, int] = dataclasses.field(default_factory=dict)  # where it slept -> samples that saw it there
    main: bool = False  # the process's first thread (tid == pid)

    @property
    def where(self) -> str:
        """A process's first thread is "main"; any other is where it was most often seen asleep ("": never)."""
        if self.main:
            return "main"
        return max(self.waits, key=lambda w: (self.waits[w], w)) if self.waits else ""

    def at(self, t: float) -> tuple[float, float]:
        """(CPU, throttled) seconds at time `t`, interpolated; before the first sample the first, after the last
        the last."""
        s = self.samples
        if t <= s[0][0]:
            return s[0][1], s[0][2]
        if t >= s[-1][0]:
            return s[-1][1], s[-1][2]
        for (t0, c0, h0), (t1, c1, h1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
                return c0 + w * (c1 - c0), h0 + w * (h1 - h0)
        return s[-1][1], s[-1][2]

    def between(self, start: float, end: float) -> tuple[float, float]:
        """(CPU, throttled) seconds of this thread between `start` and `end`."""
        (c0, h0), (c1, h1) = self.at(start), self.at(end)
        return max(0.0, c1 - c0), max(0.0, h1 - h0)


class ThreadUsage:
    """The samples of every thread the caller hands in (`sample`); `proc` is /proc (a fake tree in tests)."""

    def __init__(self, proc: pathlib.Path = PROC):
        self._proc = proc
        self.tracks: dict[int, Track] = {}  # tid -> its samples
        self.roles: dict[int, str] = {}  # pid -> role

    def sample(self, threads: Mapping[int, tuple[int, int, pathlib.Path | None]], now: float) -> None:
        """One sample of `threads`: {tid: (host, pid, its own capped group or None)}, taken at `now`."""
        for tid, (host, pid, group) in threads.items():
            task = self._proc / str(pid) / "task" / str(tid)
            cpu = _schedstat_s(task / "schedstat")
            if cpu is None:
                continue  # exited meanwhile
            track = self.tracks.get(tid)
            if track is None:
                track = self.tracks[tid] = Track(host, pid, "", main=tid == pid)
                if pid not in self.roles:
                    self.roles[pid] = role_of(_read(self._proc / str(pid) / "environ"))
            if len(track.samples) < NAME_READS:
                track.name = _read(task / "comm").strip() or track.name
            track.samples.append((now, cpu, throttled_s(group) if group is not None else 0.0))
            wait = wait_of(_read(task / "wchan"))
            if wait:
                track.waits[wait] = track.waits.get(wait, 0) + 1

    def summary(self, start: float, end: float, thread_cores: float, top: int = TOP) -> dict[str, list]:
        """Per role, its busiest process's threads in the window [start, end], busiest first: [name, % of one
        dilated CPU (`thread_cores` cores), % of the window throttled (one decimal), where it waits], at most `top`
        of them."""
        span = end - start
        if span <= 0 or thread_cores <= 0:
            return {}
        per_process: dict[int, list[tuple[str, float, float, str]]] = {}
        for track in self.tracks.values():
            if track.samples:
                cpu, throttled = track.between(start, end)
                per_process.setdefault(track.pid, []).append((track.name, cpu, throttled, track.where))
        out: dict[str, list] = {}
        for role in sorted(set(self.roles[p] for p in per_process)):
            busiest = max((p for p in per_process if self.roles[p] == role),
                          key=lambda p: sum(t[1] for t in per_process[p]))
            threads = sorted(per_process[busiest], key=lambda t: -t[1])[:top]
            out[role] = [[name, round(100 * cpu / (span * thread_cores), 1), round(100 * held / span, 1), where]
                         for name, cpu, held, where in threads]
        return out


def role_of(environ: str) -> str:
    """A process's role from its environment (the text of /proc/<pid>/environ): ps-lite's or p3kv's variable;
    neither, a worker."""
    variables = dict(v.split("=", 1) for v in environ.split("\0") if "=" in v)
    return next((variables[v] for v in ROLE_VARIABLES if variables.get(v)), "worker")


def wait_of(wchan: str) -> str:
    """Where a thread sleeps, from its wchan's text: a short name for the calls WAITS knows, the kernel function
    itself for others, "" while it runs (the kernel writes "0") or when unreadable."""
    symbol = wchan.strip()
    if symbol in ("", "0"):
        return ""
    return next((short for part, short in WAITS if part in symbol), symbol)


def _read(path: pathlib.Path) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _schedstat_s(path: pathlib.Path) -> float | None:
    text = _read(path)
    return int(text.split()[0]) / 1e9 if text else None


def throttled_s(group: pathlib.Path) -> float:
    """The time a cgroup v1 cpu group was held back (its cpu.stat's throttled_time); 0 once it has gone."""
    text = _read(group / "cpu.stat")
    return parse_stat(text).get("throttled_time", 0) / 1e9 if text else 0.0
