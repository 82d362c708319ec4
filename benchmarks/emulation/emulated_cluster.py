"""An emulated cluster on one machine: N hosts as network namespaces joined by a bridge, links capped with tc.

    with EmulatedCluster(hosts=4, bandwidth="1gbit") as cluster:
        cluster.popen(0, ["python", "-m", "p3kv.launch", ...])   # runs inside host 0's namespace
        cluster.address(1)                                       # "10.77.0.2"

Layout: host i is namespace ``<name>h<i>`` with interface ``eth0`` at 10.77.0.<i+1>/24; its veth peer ``h<i>``
sits in the namespace ``<name>br`` on the bridge ``br0``. The 10.77 addresses exist only inside these
namespaces. A bandwidth cap is a tbf qdisc on both ends of each host's link (host egress on eth0, host ingress on
the bridge side), i.e. a full-duplex NIC of that rate with `queue_ms` of queue (link_shaping.py). No netem: no latency.

Needs root (CI runs as root) and iproute2. Teardown is guaranteed by the context manager, by SIGTERM/SIGHUP
(turned into SystemExit while a cluster is up) and by atexit; `cleanup_stale()` removes namespaces left behind
by processes that died without any of those (SIGKILL): namespace names carry the creating process's pid.

With `cpu_groups=True` every host also gets a CPU cgroup (cpu_limit.py): whatever `popen`/`run` start in host i
joins host i's group before it runs, `set_cpu_quota` sets every host's CPU bandwidth (None: accounting only), and
the groups go with the namespaces (teardown and `cleanup_stale` alike; they carry the same names).

Interface counters of every host link are sampled from the bridge namespace (one process reading
/proc/net/dev every ~10 ms) with `start_sampler()`; see `read_samples()`.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from benchmarks import paths
from benchmarks.emulation import cpu_limit, host_cpu, link_napi, link_shaping, proc_monitor
from benchmarks.emulation.link_shaping import (  # noqa: F401  (the callers' names: emulated_cluster.tbf_args, ...)
    DEFAULT_BURST_MS,
    DEFAULT_QUEUE_MS,
    MIN_BURST_BYTES,
    burst_bytes,
    parse_rate,
    tbf_args,
)

LOG = logging.getLogger("emulated_cluster")
PREFIX = "p3c"  # namespace names: p3c<pid>x<n>h<i> and p3c<pid>x<n>br
SUBNET = "10.77.0"
_NAME = re.compile(rf"^{PREFIX}(\d+)x\d+(h\d+|br)$")
_counter = itertools.count()


class ClusterError(RuntimeError):
    """The emulated cluster cannot be set up (not root, iproute2 missing, a command failed)."""


def why_unavailable() -> str | None:
    """None when this process can build a cluster, else the reason (for a skip message or an error)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root; locally: sudo)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install iproute2"
    return None


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _namespaces() -> list[str]:
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Deletes the namespaces of clusters whose creating process is gone; returns their names."""
    removed = []
    for name in _namespaces():
        match = _NAME.match(name)
        if match and not proc_monitor.alive(int(match.group(1))):
            _kill_namespace_processes(name)
            _run(["ip", "netns", "delete", name], check=False)
            removed.append(name)
    if removed:
        LOG.warning("removed %d stale namespaces of dead clusters: %s", len(removed), " ".join(removed))
    return removed + cpu_limit.cleanup_stale()


def _kill_namespace_processes(namespace: str) -> None:
    done = _run(["ip", "netns", "pids", namespace], check=False)
    for pid in done.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class EmulatedCluster:
    """`hosts` namespaces on a bridge; `bandwidth` ("1gbit", None: uncapped) caps every host's link, `queue_ms` its
    queue; `cpu_groups`: a CPU cgroup per host (cpu_limit.CpuLimitError at start where none can be made);
    `threaded_rx`: hosts receive on NAPI threads of their own (link_napi.py), not in softirq."""

    def __init__(self, hosts: int, bandwidth: str | None = None, cpu_groups: bool = False, threaded_rx: bool = False,
                 queue_ms: float = DEFAULT_QUEUE_MS, burst_ms: float = DEFAULT_BURST_MS):
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be 1..200 (got {hosts})")
        self.hosts = hosts
        self.name = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.bridge_ns = f"{self.name}br"
        self.namespaces = [f"{self.name}h{i}" for i in range(hosts)]
        self.bandwidth = bandwidth
        self._rate = parse_rate(bandwidth) if bandwidth else None
        self.queue_ms, self.burst_ms = queue_ms, burst_ms
        self.rto_min_ms: float | None = None  # the hosts' TCP minimum RTO on their links (None: the kernel's)
        self.congestion_control: str | None = None  # TCP's on the links (None: the machine's default)
        if self._rate:
            tbf_args(self._rate, queue_ms, burst_ms)  # a bad queue or burst is refused before anything is built
        self._up = False
        self._sampler: subprocess.Popen | None = None
        self._want_cpu_groups = cpu_groups
        self.threaded_rx = threaded_rx
        self.cpu: cpu_limit.HostCpuLimits | None = None
        self._old_handlers: dict[int, object] = {}
        # Each host's link receive threads (link_napi.py), or why the links receive in softirq instead.
        self.rx_threads: list[list[int]] = [[] for _ in range(hosts)]
        self.rx_problem: str | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> EmulatedCluster:
        reason = why_unavailable()
        if reason:
            raise ClusterError(reason)
        cleanup_stale()
        self._up = True
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            _run(["ip", "netns", "add", self.bridge_ns])
            self._in(self.bridge_ns, "ip", "link", "set", "lo", "up")
            self._in(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.bridge_ns, "ip", "link", "set", "br0", "up")
            for i, ns in enumerate(self.namespaces):
                _run(["ip", "netns", "add", ns])
                self._in(ns, "ip", "link", "set", "lo", "up")
                self._in(ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", f"h{i}", "netns",
                         self.bridge_ns)
                self._in(ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                self._in(ns, "ip", "link", "set", "eth0", "up")
                self._in(self.bridge_ns, "ip", "link", "set", f"h{i}", "master", "br0")
                self._in(self.bridge_ns, "ip", "link", "set", f"h{i}", "up")
            self.set_bandwidth(self.bandwidth, self.queue_ms)
            if self.threaded_rx:
                self._thread_receive()
            if self._want_cpu_groups:
                self.cpu = cpu_limit.HostCpuLimits(self.namespaces, slice_file=cpu_limit.SLICE_FILE).start()
                for i, tids in enumerate(self.rx_threads):
                    self.cpu.adopt(i, tids)
        except BaseException:
            self.close()
            raise
        LOG.info("cluster %s: %d hosts at %s.1-%d, bandwidth %s", self.name, self.hosts, SUBNET, self.hosts,
                 self.bandwidth or "uncapped")
        return self

    def close(self) -> None:
        """Stops the sampler, kills every process still in the namespaces, deletes them. Idempotent."""
        if not self._up:
            return
        self._up = False
        self.stop_sampler()
        if self.cpu is not None:
            self.cpu.release([t for tids in self.rx_threads for t in tids])
        for ns in [*self.namespaces, self.bridge_ns]:
            _kill_namespace_processes(ns)
            _run(["ip", "netns", "delete", ns], check=False)
        if self.cpu is not None:
            self.cpu.close()  # after the kills: a group with processes in it cannot be removed
            self.cpu = None
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()
        atexit.unregister(self.close)

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)  # unwinds through close()

        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self._old_handlers[sig] = signal.signal(sig, on_signal)

    def _thread_receive(self) -> None:
        """Every host receives on a NAPI thread of its own (link_napi.py), remembered for its CPU group; the
        switch's ports send without TSO, which a veth needs to hand TCP to that thread. Where the kernel refuses,
        the links keep receiving in softirq and `rx_problem` says why (the rows record it)."""
        def run(where: str, action: str, devs: Sequence[str]) -> bool:
            done = _run(["ip", "netns", "exec", where, sys.executable, link_napi.__file__, action, *devs],
                        check=False)
            if done.returncode != 0:
                self.rx_problem = (done.stderr or done.stdout).strip() or f"link_napi exited {done.returncode}"
                LOG.warning("links receive in softirq: %s", self.rx_problem)
            return done.returncode == 0

        if not run(self.bridge_ns, "no-tso", [f"h{i}" for i in range(self.hosts)]):
            return
        for i, ns in enumerate(self.namespaces):  # one host at a time: its new thread is the one that appears
            before = link_napi.napi_threads("eth0")
            if not run(ns, "receive", ["eth0"]):
                return
            new = sorted(link_napi.napi_threads("eth0") - before)
            if len(new) == 1:  # a veth has one receive queue
                self.rx_threads[i] = new
            else:  # another cluster started beside this one
                self.rx_problem = f"host {i}: {len(new)} new receive threads for eth0, expected 1"
                LOG.warning("%s: its receive work is not charged to its CPU group", self.rx_problem)

    @property
    def link_rx(self) -> str:
        """How the links receive, for the rows: "softirq" (the kernel's default), "napi-threads" (each host's in
        its CPU group when it has one) or "softirq (why napi was refused)"."""
        if not self.threaded_rx:
            return "softirq"
        return f"softirq ({self.rx_problem})" if self.rx_problem else "napi-threads"

    # -- hosts ------------------------------------------------------------------------------------------------
    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def netns(self, i: int) -> str:
        return self.namespaces[i]

    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside host i's namespace (and CPU group, when the cluster has them)."""
        inside = ["ip", "netns", "exec", self.namespaces[i], *argv]
        return self.cpu.wrap(i, inside) if self.cpu is not None else inside

    def set_cpu_quota(self, cores: float | None, period_us: int | None = None) -> None:
        """Every host's CPU bandwidth in cores (None: unlimited) per CFS period of `period_us` real µs (None: the
        default, cfs_bandwidth.PERIOD_US); needs cpu_groups=True."""
        if self.cpu is None:
            raise ClusterError("this cluster has no CPU groups: build it with cpu_groups=True")
        self.cpu.set_quota(cores, period_us)

    def run(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.wrap(i, argv), **kwargs)

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(i, argv), env=None if env is None else dict(env), **kwargs)

    def _in(self, ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run(["ip", "netns", "exec", ns, *argv], check=check)

    # -- links ------------------------------------------------------------------------------------------------
    def set_bandwidth(self, bandwidth: str | None, queue_ms: float | None = None,
                      burst_ms: float | None = None) -> None:
        """Caps (or, with None, uncaps) both directions of every host's link, with `queue_ms` of queue and a bucket
        of `burst_ms` (real ms; None: as before)."""
        rate = parse_rate(bandwidth) if bandwidth else None
        queue_ms = self.queue_ms if queue_ms is None else queue_ms
        burst_ms = self.burst_ms if burst_ms is None else burst_ms
        args = tbf_args(rate, queue_ms, burst_ms) if rate is not None else []
        for i, ns in enumerate(self.namespaces):
            for where, dev in ((ns, "eth0"), (self.bridge_ns, f"h{i}")):
                if rate is None:
                    self._in(where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    self._in(where, "tc", "qdisc", "replace", "dev", dev, "root", *args)
        self.bandwidth, self._rate, self.queue_ms, self.burst_ms = bandwidth, rate, queue_ms, burst_ms

    @property
    def rate_bps(self) -> float | None:
        return self._rate

    def set_transport(self, rto_min_ms: float | None, congestion_control: str | None = None) -> None:
        """Every host's TCP toward the other hosts, on its link's route: the minimum RTO in real ms (None: the kernel's
        200 ms; it also bounds how long a connection may idle before TCP restarts it from its initial window:
        link_shaping.dilated_rto_min_ms) and the congestion control (None: the machine's default; a route's congctl,
        as a namespace may only default to the algorithms the machine allows unprivileged users)."""
        if congestion_control is not None:
            link_shaping.check_congestion_control(congestion_control)
        for i, ns in enumerate(self.namespaces):
            self._in(ns, "ip", "route", "replace", f"{SUBNET}.0/24", "dev", "eth0", "proto", "kernel", "scope", "link",
                     "src", self.address(i), *([] if rto_min_ms is None else ["rto_min", f"{round(rto_min_ms)}ms"]),
                     *([] if congestion_control is None else ["congctl", congestion_control]))
        self.rto_min_ms, self.congestion_control = rto_min_ms, congestion_control

    def set_link(self, i: int, up: bool) -> None:
        """Cuts (up=False) or restores host i's link: its bridge port goes down, as if the cable were pulled."""
        self._in(self.bridge_ns, "ip", "link", "set", f"h{i}", "up" if up else "down")

    def counters(self) -> dict[int, tuple[int, int]]:
        """{host: (bytes sent by the host, bytes received by the host)} now."""
        text = self._in(self.bridge_ns, "cat", "/proc/net/dev").stdout
        return {host: (rx, tx) for host, rx, tx in _parse_net_dev(text)}  # the bridge side sees them mirrored

    # -- utilisation sampler ----------------------------------------------------------------------------------
    def start_sampler(self, path: str, interval: float = 0.01) -> None:
        """Starts sampling every host link's counters into `path` (CSV: time_s,host,tx_bytes,rx_bytes)."""
        self.stop_sampler()
        argv = [*paths.python_module("benchmarks.emulation.emulated_cluster"), "sample", "--out", path,
                "--interval", str(interval)]
        self._sampler = subprocess.Popen(["ip", "netns", "exec", self.bridge_ns, *argv], cwd=paths.ROOT)

    def sampler_cpu_s(self) -> float | None:
        """CPU seconds the link sampler has used so far (None: no sampler running)."""
        if self._sampler is None:
            return None
        ticks = host_cpu.cpu_ticks(self._sampler.pid)
        return None if ticks is None else ticks / host_cpu.TICKS

    def stop_sampler(self) -> None:
        if self._sampler is None:
            return
        self._sampler.terminate()
        try:
            self._sampler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._sampler.kill()
            self._sampler.wait()
        self._sampler = None


def _parse_net_dev(text: str) -> list[tuple[int, int, int]]:
    """(host, rx_bytes, tx_bytes) of the bridge-side ports h<i> in /proc/net/dev text."""
    found = []
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not re.fullmatch(r"h\d+", name):
            continue
        fields = rest.split()
        found.append((int(name[1:]), int(fields[0]), int(fields[8])))
    return sorted(found)


def sample(out: str, interval: float) -> None:
    """The sampler process (runs in the bridge namespace until SIGTERM)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    start = time.monotonic()
    with open(out, "w") as f, open("/proc/net/dev") as dev:
        f.write("time_s,host,tx_bytes,rx_bytes\n")
        while not stop:
            dev.seek(0)
            now = time.monotonic() - start
            for host, rx, tx in _parse_net_dev(dev.read()):
                f.write(f"{now:.4f},{host},{rx},{tx}\n")  # bridge rx = host tx
            time.sleep(interval)


def read_samples(path: str) -> dict[int, list[tuple[float, int, int]]]:
    """{host: [(time_s, tx_bytes, rx_bytes), ...]} from a sampler file."""
    series: dict[int, list[tuple[float, int, int]]] = {}
    with open(path) as f:
        next(f, None)
        for line in f:
            parts = line.strip().split(",")
            if len(parts) == 4:
                series.setdefault(int(parts[1]), []).append((float(parts[0]), int(parts[2]), int(parts[3])))
    return series


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="(internal) sample /proc/net/dev of the bridge namespace")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.01)
    sub.add_parser("cleanup", help="delete namespaces left behind by dead clusters")
    args = parser.parse_args(argv)
    if args.command == "sample":
        sample(args.out, args.interval)
    else:
        logging.basicConfig(level=logging.INFO)
        print("\n".join(cleanup_stale()) or "nothing to clean up")  # noqa: T201 (a command's output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
