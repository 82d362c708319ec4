"""Each thread of an emulated host at most one dilated CPU: per-thread CPU groups under the host's group.

A host's quota (cpu_limit.py) dilates its CPUs together: `host_cpus × gpu_scale` cores for all its threads. It
does not dilate one CPU: a single busy thread may use the host's whole quota, i.e. run `host_cpus` times faster
than one core of the emulated host would let it (at 4 CPUs and gpu_scale 0.11 one thread gets 0.44 cores, where
one dilated CPU is 0.11). A system whose work funnels through one thread (a server's consumer, an engine's
dispatch, the GIL) then looks faster than it would on the real host. Time-dilated emulation slows each virtual CPU
(Gupta et al., NSDI'06); here a thread is the unit the kernel can cap: each thread of the host's processes is
moved into a child group of the host's group with a quota of `gpu_scale` cores per period. The host's quota still
bounds the sum (cgroup v1 enforces both levels), so the host behaves as `host_cpus` dilated CPUs.

How threads are found: a process joins its host's group before it runs anything (cpu_limit.wrap), so a scanner thread
of the runner reads each host's own `tasks` often (a thread there has only its host's quota: it is capped at once,
and its process remembered). Less often it lists the tasks of every process it knows (a thread starts in its
creator's group: until then it shares its creator's cap, never freed of one) and looks in /proc for processes
forked by a capped thread (they start in that thread's group, under the host's). A thread whose group cannot take
it (a real-time thread: children have no real-time budget) stays where it is and is counted. The group of a thread
that has exited is removed after its throttled time is added to its host's.

Start-up is not capped when a run says when it ends (`ready`): until then the scanner only notes the hosts'
threads, which keep their host's quota, so the processes import and build their models at the host's pace rather
than one dilated CPU's (a quarter of it at 4 CPUs); once `ready()` holds (every worker has built its model:
worker_output.mark_ready) every thread is capped, and threads born later at once. `began_at` says when; the run's
fidelity verdict fails a run whose timed window started before it (fidelity.py).

Threads that stand for GPU-side work on the real hosts are not capped: a thread born while its creator carries the
name GPU_SIDE (`gpu_side()`) is moved to its host's group (out of its creator's, perhaps capped, group) and keeps
the host's quota. The virtual GPU's timer thread is one (it is the GPU; it runs real-time, which a child group
without real-time budget would refuse it), Horovod's background thread another (it sums with Gloo on the CPU
here, where a GPU host sums with NCCL on the GPU); cluster_worker.py names both. DDP's Gloo threads are GPU-side for
the same reason; torch names them itself as they start (GLOO_THREADS), so they are known by those names.

cgroup v1 only (a thread may sit in a group apart from its process's other threads); v2 would need threaded
subtrees, and is refused with a message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence

from benchmarks.emulation import thread_usage
from benchmarks.emulation.cfs_bandwidth import MIN_QUOTA_US
from benchmarks.emulation.cpu_limit import CpuLimitError

LOG = logging.getLogger("thread_cap")
PREFIX = "t"  # a child group's name: PREFIX + the thread id
GPU_SIDE = "p3-gpu-side"  # a thread's name (comm, at most 15 bytes) that keeps it uncapped
# The threads of torch's Gloo process group (torch 2.13 names them at once, so gpu_side()'s name does not survive):
# they sum and send what NCCL sums and sends on a GPU host, as Horovod's background thread does.
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
PROC = pathlib.Path("/proc")


def omp_threads(host_cpus: float | None, thread_cores: float | None) -> int:
    """OpenMP threads for each process of an emulated host. Capped, a thread is one of the host's dilated CPUs, so
    a process gets as many as its host has CPUs: what MXNet gives itself on a real host of that size (OMP_NUM_THREADS
    unset: omp_get_num_procs()), so that the dist_sync and MXNet-P3 servers' sums and updates run on the host's
    CPUs as they would there (with one, dist_sync's VGG-19 servers sat at 7% of their quota and 40% of the bound:
    results/pilot_omp/summary.md). Uncapped, one: the hosts time-share the machine's cores."""
    if thread_cores is None or host_cpus is None:
        return 1
    return max(1, round(host_cpus))


def cpu_group(cgroup_file: str) -> str | None:
    """The cpu hierarchy's group in the text of a /proc/.../cgroup file; None where it names none."""
    for line in cgroup_file.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


def is_thread_group(group: str) -> bool:
    """Whether `group` (a path or a name) is one thread's capped group: PREFIX + its thread id."""
    last = group.rpartition("/")[2]
    return last.startswith(PREFIX) and last[len(PREFIX):].isdigit()


def thread_quota_us(cores: float, period_us: int) -> int:
    """One thread's quota per period: `cores` of one CPU (gpu_scale), never under the kernel's minimum."""
    if cores <= 0 or period_us <= 0:
        raise ValueError(f"cores per thread ({cores}) and the period ({period_us} us) must be positive")
    return max(MIN_QUOTA_US, round(cores * period_us))


@contextlib.contextmanager
def gpu_side(proc: pathlib.Path = PROC) -> Iterator[None]:
    """Threads the calling thread creates inside this block are GPU-side work (they inherit its name, GPU_SIDE):
    the thread caps leave them at their host's quota. The caller's own name comes back afterwards; the caller,
    seen by the scanner long before, stays capped."""
    comm = proc / "thread-self" / "comm"
    before = comm.read_text().strip()
    comm.write_text(GPU_SIDE)
    try:
        yield
    finally:
        comm.write_text(before)


@dataclasses.dataclass
class HostThreads:
    """What the caps did on one host: threads placed in groups of their own, threads their group refused (by
    errno name), GPU-side threads left at the host's quota, and the time the kernel held capped threads back
    (throttled), summed over them."""

    placed: int = 0
    throttled_s: float = 0.0
    refusals: dict[str, int] = dataclasses.field(default_factory=dict)  # {errno name: threads}
    gpu_side: int = 0  # threads named GPU_SIDE (or Gloo's), left uncapped

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())


class ThreadCaps:
    """Caps every thread in the host groups `host_dirs` (cgroup v1 cpu directories) at `cores` per `period_us`.
    `exempt`: thread ids left alone (the links' receive threads adopted into a host, link_napi.py). The scanner
    reads the hosts' own groups every `interval_s` and looks at their processes every `full_every` scans (a
    thread found late has been held to its creator's cap meanwhile, never freed of one); `proc` is /proc (a fake
    tree in the tests). `ready`: caps begin once it returns True (asked every scan until then); None: at once.
    Once they have begun, every `usage_every` full scans (and once at `stop`) each thread's CPU is sampled into
    `usage` (thread_usage.py)."""

    def __init__(self, host_dirs: Sequence[pathlib.Path], cores: float, period_us: int, *,
                 exempt: Collection[int] = (), interval_s: float = 0.02, full_every: int = 25,
                 proc: pathlib.Path = PROC, ready: Callable[[], bool] | None = None, usage_every: int = 2,
                 rmdir: Callable[[pathlib.Path], None] = pathlib.Path.rmdir):
        for d in host_dirs:
            if not (d / "tasks").exists() or not (d / "cpu.cfs_quota_us").exists():
                raise CpuLimitError(f"{d}: per-thread CPU caps need cgroup v1's cpu controller (a thread may join "
                                    "a group apart from its process there); run with --no-thread-cap here")
        self.dirs = list(host_dirs)
        self.quota_us, self.period_us = thread_quota_us(cores, period_us), period_us
        self.exempt = set(exempt)
        self.hosts = [HostThreads() for _ in self.dirs]
        self._interval, self._full_every, self._proc = interval_s, max(1, full_every), proc
        self._rmdir = rmdir  # a group's directory goes with rmdir alone (its control files are the kernel's)
        self._pids: dict[int, int] = {}  # the hosts' processes: pid -> host
        self._seen: set[int] = set()  # every pid in /proc looked at once (pids of other processes included)
        self._left: dict[int, int] = {}  # threads left in their host's group (refused, exempt, GPU-side) -> host
        self._placed: dict[int, int] = {}  # capped threads -> host (each in its child PREFIX + tid)
        self._tgid: dict[int, int] = {}  # the threads of the hosts' processes -> their process
        self._waiting: dict[int, int] = {}  # threads noted before the caps began -> host (still in its group)
        self._ready = ready
        self.began_at: float | None = None  # time.time() when the caps began; None: not yet
        self.usage = thread_usage.ThreadUsage(proc)
        self._usage_every = max(1, usage_every)
        self._full_scans = 0
        self.scans, self.cpu_s = 0, 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-caps", daemon=True)

    # -- one pass ---------------------------------------------------------------------------------------------
    def scan(self, full: bool = True) -> None:
        """Moves every thread in a host's own group into a group of its own (a new process's first threads: its
        host's quota alone holds them). With `full`, also every new thread of the hosts' processes (each starts in
        its creator's group, held to that cap until then) and new processes forked by a capped thread, and removes
        the groups of threads that have exited. Before the caps begin (`ready`) it only notes the threads."""
        if self.began_at is None and (self._ready is None or self._ready()):
            self.began_at = time.time()
            self._waiting.clear()  # each is placed below, in its host's group or its process's task list
            full = True
        for i, host in enumerate(self.dirs):
            for tid in _ints(_read(host / "tasks")):
                if tid not in self._placed and tid not in self._left and tid not in self._waiting:
                    self._place(i, tid)
        if not full:
            return
        running = _numeric(self._proc)
        for pid in running - self._seen:  # forked by a capped thread: in that thread's group, under its host's
            i = self._host_of(pid)
            if i is not None:
                self._pids.setdefault(pid, i)
        self._seen = running
        alive: set[int] = set()
        for pid, i in list(self._pids.items()):
            tids = _numeric(self._proc / str(pid) / "task")
            if not tids:
                del self._pids[pid]  # exited
                continue
            alive |= tids
            for tid in tids - self._placed.keys() - self._left.keys() - self._waiting.keys():
                self._place(i, tid)
        for tid in self._placed.keys() - alive:
            self._retire(tid)
        for noted in (self._left, self._waiting, self._tgid):
            for tid in noted.keys() - alive:
                del noted[tid]
        self._full_scans += 1
        if self.began_at is not None and self._full_scans % self._usage_every == 0:
            self.sample_usage()

    def sample_usage(self) -> None:
        """One sample of every known thread's CPU (and its group's throttled time, capped) into `usage`."""
        threads = {tid: (i, self._tgid[tid], self.dirs[i] / f"{PREFIX}{tid}" if tid in self._placed else None)
                   for noted in (self._placed, self._left) for tid, i in noted.items() if tid in self._tgid}
        self.usage.sample(threads, time.time())

    def _host_of(self, pid: int) -> int | None:
        """The host whose group (or one of its children) holds process `pid`'s main thread; None: no host's."""
        path = cpu_group(_read(self._proc / str(pid) / "cgroup")) or ""  # "": exited meanwhile
        group = path.rpartition("/")[0] if is_thread_group(path) else path
        if group in ("", "/"):
            return None
        return next((i for i, d in enumerate(self.dirs) if str(d).endswith(group)), None)

    def _place(self, i: int, tid: int) -> None:
        host = self.hosts[i]
        if tid in self.exempt:
            self._left[tid] = i
            return
        try:  # /proc/<tid> is the thread's own view (not listed in /proc, but there)
            status = dict(line.split(":\t", 1) for line in (self._proc / str(tid) / "status").read_text().splitlines()
                          if ":\t" in line)
        except OSError:
            return  # exited meanwhile
        name, pid = status.get("Name", "").strip(), int(status.get("Tgid", tid))
        self._tgid[tid] = pid
        self._pids.setdefault(pid, i)  # its process: later threads are found in its task list
        if name == GPU_SIDE or name in GLOO_THREADS:  # born in its creator's group, perhaps a capped one: to its host's
            try:
                (self.dirs[i] / "tasks").write_text(str(tid))
            except OSError as e:
                if e.errno == errno.ESRCH:
                    return  # exited meanwhile
                LOG.warning("GPU-side thread %d stays in its creator's group: %s", tid, e)
            self._left[tid] = i
            host.gpu_side += 1
            return
        if self.began_at is None:
            self._waiting[tid] = i  # start-up: its host's quota only, until the caps begin
            return
        child = self.dirs[i] / f"{PREFIX}{tid}"
        try:
            child.mkdir(exist_ok=True)
            (child / "cpu.cfs_period_us").write_text(str(self.period_us))
            (child / "cpu.cfs_quota_us").write_text(str(self.quota_us))
            (child / "tasks").write_text(str(tid))
        except OSError as e:
            if e.errno != errno.ESRCH:  # ESRCH: the thread exited meanwhile, nothing to count
                self._left[tid] = i  # refused once: not retried every scan
                why = errno.errorcode.get(e.errno or 0, str(e))
                host.refusals[why] = host.refusals.get(why, 0) + 1
                LOG.debug("thread %d stays in %s: %s", tid, self.dirs[i], e)
            self._remove(child)
            return
        self._placed[tid] = i
        host.placed += 1

    def _retire(self, tid: int) -> None:
        """Counts an exited thread's throttled time and removes its group, once the kernel lets it go (a thread
        still exiting keeps it busy: a later scan tries again)."""
        i = self._placed[tid]
        child = self.dirs[i] / f"{PREFIX}{tid}"
        throttled = thread_usage.throttled_s(child)
        if self._remove(child):
            self.hosts[i].throttled_s += throttled
            del self._placed[tid]

    def _remove(self, child: pathlib.Path) -> bool:
        try:
            self._rmdir(child)
        except FileNotFoundError:
            return True
        except OSError:
            return False  # not empty yet
        return True

    # -- the scanner ------------------------------------------------------------------------------------------
    def start(self) -> ThreadCaps:
        self.scan()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self._interval):
                self.scans += 1
                self.scan(full=self.scans % self._full_every == 0)
        except Exception:  # a monitor failure must not abort the run it watches; the threads keep their caps
            LOG.exception("placing threads in their CPU groups failed; later threads of this run are not capped")
        finally:
            self.cpu_s = time.thread_time()  # the scanner's own cost (part of the run's sampling_cpu_s)

    def stop(self) -> list[HostThreads]:
        """Stops the scanner, moves any thread still capped back into its host's group and removes the
        children (their throttled time counted). Returns each host's totals."""
        self._stopped.set()
        self._thread.join(timeout=10)
        if self.began_at is not None:
            self.sample_usage()  # the last sample, after the timed window's end
        LOG.info("thread caps: %d scans in %.2f s of CPU", self.scans, self.cpu_s)
        for i, host in enumerate(self.dirs):
            for child in _children(host):
                for tid in _ints(_read(child / "tasks")):
                    try:
                        (host / "tasks").write_text(str(tid))
                    except OSError:
                        pass  # exited meanwhile
                tid = int(child.name[len(PREFIX):])
                self._placed.setdefault(tid, i)
                self._retire(tid)
        return self.hosts


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""  # the group or the process went away


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def _numeric(directory: pathlib.Path) -> set[int]:
    """The numeric entries of `directory` (/proc's processes, a process's tasks); empty when it has gone."""
    try:
        return {int(n) for n in os.listdir(directory) if n.isdigit()}
    except OSError:
        return set()


def _children(host: pathlib.Path) -> list[pathlib.Path]:
    try:
        return [d for d in host.iterdir() if d.is_dir() and is_thread_group(d.name)]
    except OSError:
        return []
