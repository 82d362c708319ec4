"""What one emulated run's monitors measured, as row columns, and its fidelity verdict (fidelity.py).

Started just before a job's processes and finished after they exit: each host's CPU group (cpu_limit.py:
whole-run CPU and throttled time, and the timed window's share throttled), the link queues' drops and TCP
retransmissions (net_counters.py), whether every link sent at its rate while data was queued to it
(link_monitor.py), the virtual GPU's lateness and forgiven gaps from the workers' JSON, and what the monitors
themselves cost (the runner's own CPU, the link monitor's thread included, and the link sampler's while the job
ran).

The timed window is cut from the CPU groups' samples: it ends when the last rank wrote its result (the file's
modification time: ranks write it right after their last timed iteration) and lasts as long as the slowest rank's
timed iterations together. With per-thread caps, how long before that window they began is a column
(thread_caps_lead_s) and a rule of the verdict, and the busiest threads of each role's busiest process in the
window are another (thread_cpu, thread_usage.py).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import resource
from collections.abc import Callable, Sequence

from benchmarks.emulation import (
    cpu_sampler,
    fidelity,
    link_monitor,
    net_counters,
    qdisc_stats,
    socket_monitor,
    tcp_diag,
    thread_cap,
)

LOG = logging.getLogger("run_monitors")

# Columns this module fills (bench_rows.RUN_COLUMNS holds them after the older ones).
COLUMNS = ("host_cpus", "cpu_limit", "cpu_quota_cores", "host_cpu_s", "host_throttled_s", "host_throttled_pct",
           "throttled_max_pct", "throttled_periods_max_pct", "timed_window_s", "vgpu_late_max_us",
           "vgpu_forgiven_us_per_iter", "qdisc_drops", "qdisc_drops_total", "tcp_retrans", "tcp_retrans_total",
           "tcp_out_segs_total", "sampling_cpu_s", "faithful", "fidelity_notes", "cfs_period_us", "cfs_slice_us",
           "link_rx", "link_backlogged_pct", "link_starved_pct", "link_starved_max_pct", "link_monitor_cpu_s",
           "vgpu_late_us_per_iter", "steal_pct", "thread_cap_cores", "threads_capped", "thread_throttled_s",
           "thread_caps_lead_s", "thread_cpu", *socket_monitor.COLUMNS)


def joined(values: Sequence[float], digits: int = 3) -> str:
    """Per-host values in one cell: "a;b;c"."""
    return ";".join(f"{round(v, digits):g}" for v in values)


def steal_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot: the time a hypervisor ran something else on this machine's
    CPUs, and all time. None where the kernel does not count steal."""
    try:
        with open(path) as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RunMonitors:
    """One run's monitors on `cluster` (an EmulatedCluster). `host_cpus` None: CPU limits off for this run;
    `quota` the per-host cores when on; `thread_cores` each thread's cores (thread_cap.py), None: threads
    uncapped; `ready` when those caps begin (thread_cap.ThreadCaps; None: at once); `tcp_trace` whether the socket
    monitor reads every host's TCP sockets (socket_monitor.py; capped links only)."""

    def __init__(self, cluster, host_cpus: float | None, quota: float | None, period_us: int | None = None,
                 thread_cores: float | None = None, ready: Callable[[], bool] | None = None,
                 tcp_trace: bool = False):
        self._cluster = cluster
        self.host_cpus, self.quota = host_cpus, quota
        self.period_us = period_us  # the quota's CFS period in real µs; None: the default (cfs_bandwidth.py)
        self.thread_cores = thread_cores if host_cpus is not None else None
        self._ready = ready
        self._threads: thread_cap.ThreadCaps | None = None
        self._sampler: cpu_sampler.UsageSampler | None = None
        self._net_before: list[net_counters.HostNet] | None = None
        self._links: link_monitor.LinkMonitor | None = None
        self._tcp_trace = tcp_trace
        self._sockets: socket_monitor.SocketMonitor | None = None

    def start(self) -> RunMonitors:
        if self._cluster.cpu is not None:
            self._cluster.set_cpu_quota(self.quota if self.host_cpus is not None else None, self.period_us)
            if self.thread_cores is not None:  # a refusal (cgroup v2) ends the run before any monitor starts
                self._threads = thread_cap.ThreadCaps(
                    self._cluster.cpu.cpu_dirs(), self.thread_cores, self._cluster.cpu.period_us,
                    exempt=[t for tids in getattr(self._cluster, "rx_threads", []) for t in tids],
                    ready=self._ready).start()
            self._sampler = cpu_sampler.UsageSampler(self._cluster.cpu).start()
        if self._cluster.rate_bps:  # uncapped links have no queue of their own to watch
            try:
                self._links = link_monitor.LinkMonitor(self._cluster.namespaces, self._cluster.bridge_ns).start()
            except (qdisc_stats.QdiscError, OSError) as e:  # a monitor failure must not abort the run it watches
                LOG.warning("the link monitor cannot read the link queues: %s", e)
        if self._tcp_trace and self._cluster.rate_bps:
            try:
                self._sockets = socket_monitor.SocketMonitor(
                    self._cluster.namespaces, [self._cluster.address(i) for i in range(self._cluster.hosts)]).start()
            except (tcp_diag.TcpDiagError, OSError) as e:
                LOG.warning("the socket monitor cannot read the hosts' TCP sockets: %s", e)
        self._net_before = self._net()
        self._self_before = _self_cpu_s()
        self._link_sampler_before = self._cluster.sampler_cpu_s()
        self._steal_before = steal_times()
        return self

    def _net(self) -> list[net_counters.HostNet] | None:
        try:
            return net_counters.snapshot(self._cluster.namespaces, self._cluster.bridge_ns)
        except (OSError, ValueError) as e:  # a monitor failure must not abort the run it watches
            LOG.warning("reading the link counters failed: %s", e)
            return None

    def finish(self, results: Sequence[dict], result_files: Sequence[pathlib.Path], wall_s: float,
               median_iter_s: float | None, gpu_scale: float = 1.0) -> dict:
        """The columns (COLUMNS) of the run whose workers reported `results` into `result_files`, its emulated
        compute dilated by `gpu_scale`."""
        samples = self._sampler.stop() if self._sampler is not None else []
        threads = self._threads.stop() if self._threads is not None else None
        link_series = self._links.stop() if self._links is not None else None
        socket_intervals = self._sockets.stop() if self._sockets is not None else None
        net_after = self._net()
        sampling = _self_cpu_s() - self._self_before
        link_now = self._cluster.sampler_cpu_s()
        if link_now is not None:
            sampling += link_now - (self._link_sampler_before or 0.0)
        limited = self.host_cpus is not None and self._cluster.cpu is not None
        steal = steal_share(self._steal_before, steal_times())
        row: dict = {"steal_pct": round(100 * steal, 2) if steal is not None else "",
                     "host_cpus": self.host_cpus if self.host_cpus is not None else "",
                     "cpu_limit": f"cgroup-v{self._cluster.cpu.hierarchy.version}" if limited else "off",
                     "cpu_quota_cores": round(self.quota, 4) if limited and self.quota else "",
                     "sampling_cpu_s": round(sampling, 3),
                     "cfs_period_us": self._cluster.cpu.period_us if limited else "",
                     "cfs_slice_us": (self._cluster.cpu.bandwidth_slice_us or "") if limited else "",
                     "link_rx": getattr(self._cluster, "link_rx", "")}
        if threads is not None:
            row.update(thread_cap_cores=self.thread_cores, threads_capped=joined([h.placed for h in threads], 0),
                       threads_gpu_side=joined([h.gpu_side for h in threads], 0),
                       thread_throttled_s=joined([h.throttled_s for h in threads]))
            refused = sum(h.refused for h in threads)
            if refused:
                LOG.info("%d threads stayed uncapped in their host's group: %s", refused,
                         "; ".join(f"host {i}: {h.refusals}" for i, h in enumerate(threads) if h.refused))
        window, window_s, end = None, 0.0, 0.0
        if results and result_files:  # the timed window (see the module's docstring)
            end = max(p.stat().st_mtime for p in result_files)
            window_s = max(sum(r.get("iter_s") or []) for r in results)
        if samples:
            whole = cpu_sampler.window(samples, samples[0][0], samples[-1][0])
            row.update(host_cpu_s=joined([u.cpu_s for u in whole]), host_throttled_s=joined([u.throttled_s
                                                                                             for u in whole]))
            if window_s:
                window = cpu_sampler.window(samples, end - window_s, end)
                shares = [u.throttled_s / window_s if window_s else 0.0 for u in window]
                row.update(host_throttled_pct=joined([100 * s for s in shares], 1),
                           throttled_max_pct=round(100 * max(shares), 1),
                           throttled_periods_max_pct=round(100 * max(u.throttled_period_share for u in window), 1),
                           timed_window_s=round(window_s, 3))
        caps_lead, capped = None, threads is not None and bool(window_s)
        if capped:  # seconds the caps began before the timed window; None: never
            began = self._threads.began_at
            caps_lead = None if began is None else end - window_s - began
            row["thread_caps_lead_s"] = "" if caps_lead is None else round(caps_lead, 2)
            busiest = self._threads.usage.summary(end - window_s, end, self.thread_cores)
            row["thread_cpu"] = json.dumps(busiest, separators=(",", ":")) if busiest else ""
        late = [r["vgpu_late_max_us"] for r in results if r.get("vgpu_late_max_us") is not None]
        late_sum = [r["vgpu_late_us_per_iter"] for r in results if r.get("vgpu_late_us_per_iter") is not None]
        forgiven = [r["vgpu_forgiven_us_per_iter"] for r in results if r.get("vgpu_forgiven_us_per_iter") is not None]
        row.update(vgpu_late_max_us=round(max(late), 1) if late else "",
                   vgpu_late_us_per_iter=round(max(late_sum), 1) if late_sum else "",
                   vgpu_forgiven_us_per_iter=round(max(forgiven), 1) if forgiven else "")
        net = None
        if net_after is not None and self._net_before is not None:
            net = net_counters.difference(net_after, self._net_before)
            row.update(qdisc_drops=joined([h.drops for h in net], 0), qdisc_drops_total=sum(h.drops for h in net),
                       tcp_retrans=joined([h.retrans_segs for h in net], 0),
                       tcp_retrans_total=sum(h.retrans_segs for h in net),
                       tcp_out_segs_total=sum(h.out_segs for h in net))
        links = None
        if link_series is not None and window_s:
            links = link_monitor.analyse(link_series, self._cluster.rate_bps, end - window_s, end)
            row.update(link_backlogged_pct=joined([100 * h.backlogged_share for h in links], 1),
                       link_starved_pct=joined([100 * h.starved_share for h in links], 1),
                       link_starved_max_pct=round(100 * max(h.starved_share for h in links), 1))
        if self._links is not None:
            row["link_monitor_cpu_s"] = round(self._links.cpu_s, 3)
        if socket_intervals is not None and window_s:
            row.update(socket_monitor.analyse(socket_intervals, self._cluster.hosts, self._cluster.rate_bps,
                                              end - window_s, end).columns())
        if self._sockets is not None:
            row["tcp_monitor_cpu_s"] = round(self._sockets.cpu_s, 3)
        cpus = os.cpu_count() or 1
        headroom = cpus - self._cluster.hosts * self.quota if limited and self.quota else None
        verdict = fidelity.judge(cpu_window=window, window_s=window_s, limited=limited, ranks=results,
                                 median_iter_s=median_iter_s, net=net, sampling_cpu_s=sampling, wall_s=wall_s,
                                 headroom_cores=headroom, links=links, gpu_scale=gpu_scale, steal=steal,
                                 thread_caps=capped, caps_lead_s=caps_lead)
        row.update(faithful=verdict.faithful, fidelity_notes=verdict.text())
        return row
