"""One job of the emulated-cluster benchmark: a system's processes on every emulated host, and its row.

A parameter-server system runs the paper's layout: on every host `python -m p3kv.launch` starts its worker and server
in its namespace, the scheduler on host 0. Horovod runs through the same launcher, one rank per host, its rendezvous
on host 0, each launcher in a UTS namespace named by its address (Gloo finds a rank's address from its hostname).
Host 0's output goes to the terminal, every host's to a log; each host's CPU is sampled (host_cpu.py). With CPU
limits (Point.host_cpus) a host's processes run at host_cpus × gpu_scale cores (cpu_limit.py; each thread also at
gpu_scale with Point.thread_cap, and host_cpus OpenMP threads per process, thread_cap.py), and the run's monitors
give its fidelity verdict (run_monitors.py); a job in which no worker finishes an iteration for far longer than its
iterations take is stopped and recorded as failed(stalled) (job_watch.py). The row has the measurement, the bound
with headers (wire_bound.py) and the conditions (cluster_bench.py adds those common to an invocation and writes it
through bench_rows.py).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import threading
import time

from benchmarks import paths
from benchmarks.analysis import bench_rows, bench_stats
from benchmarks.emulation import (
    cfs_bandwidth,
    cpu_limit,
    emulated_cluster,
    emulated_compute,
    host_cpu,
    job_watch,
    link_shaping,
    run_monitors,
    thread_cap,
    wire_bound,
)
from benchmarks.paths import ROOT
from benchmarks.suites import baseline_settings, torch_systems
from benchmarks.workloads import job_env, model_shapes, worker_output

LOG = logging.getLogger("cluster_job")
# What --kvstore names: (the launcher's --kvstore, extra environment, extra worker flags).
KVSTORES = {
    "p3": ("p3", {}, []), "dist_sync": ("dist_sync", {}, []), "mxnet-p3": ("mxnet-p3", {}, []),
    "horovod": ("horovod", {}, ["--system", "horovod"]), "p3-slicing-only": ("p3", {"P3_PRIORITY": "none"}, []),
    "p3-priority-split": ("p3", {"P3_SLICE_SIZE": str(1 << 30)}, ["--split-big-arrays", "SERVERS"]),
    "p3-priority-only": ("p3", {"P3_SLICE_SIZE": str(1 << 30)}, []),
    **torch_systems.KVSTORES,  # PyTorch: p3kv.torch in both placements, DDP (gloo) under torchrun
}
NO_SERVERS = ("horovod", *torch_systems.NO_SERVERS)  # one rank per host, no parameter servers
LINK_BURST_GPU_MS = 1.0  # a link's bucket in the GPU's time: 10 ms real at the demo's 0.1, as before it was dilated


@dataclasses.dataclass
class Point:
    """One run's settings."""
    model: str
    kvstore: str
    hosts: int = 4
    bandwidth: str | None = "1gbit"
    compute: str = "emulated"
    batch_size: int = 32
    slice_size: int | None = None
    gpu: str = "p100"
    gpu_scale: float = 1.0
    efficiency_factor: float = 1.0
    optimizer: str = "sgd"
    warmup: int = 3
    iters: int = 20
    repeat: int = 0
    repeats: int = 1
    order: int = 0
    tag: str = ""
    timeout: float = 900.0
    log_interval: int = 5
    layout: str = "colocated"  # or "separate": workers on the first half of the hosts, servers on the rest
    # The system's own settings (baseline_settings.py): variables every process of the job gets, and the label
    # the row's baseline_setting column shows ("": none applied, "default (untuned)").
    setting_env: tuple[tuple[str, str], ...] = ()
    baseline_setting: str = ""
    host_cpus: float | None = None  # CPUs of one emulated host, dilated by gpu_scale; None: no CPU limit
    link_rx: str = "softirq"  # how hosts receive: "softirq" (the kernel's way) or "napi" (link_napi.py)
    link_queue_ms: float = emulated_cluster.DEFAULT_QUEUE_MS  # each link direction's queue, in the GPU's own time
    # Durations in the GPU's own time (real: this / gpu_scale), dilated like compute (so is Horovod's cycle time):
    # each link's token bucket (what it sends at once after an idle spell), the hosts' CFS period (None: a fixed
    # real one), TCP's minimum RTO if set (None: the kernel's 200 ms real; results/cfs_period/summary.md).
    link_burst_gpu_ms: float = LINK_BURST_GPU_MS
    tcp_rto_min_gpu_ms: float | None = None
    tcp_congestion: str | None = None  # TCP's congestion control on the links (None: the machine's default)
    cfs_period_gpu_ms: float | None = cfs_bandwidth.PERIOD_GPU_MS
    thread_cap: bool = False  # each thread of a host at most one dilated CPU, too (thread_cap.py)
    tcp_trace: bool = False  # the socket monitor reads every host's TCP sockets (socket_monitor.py)

    @property
    def dilation(self) -> float:  # a duration in the GPU's time over this is real time; real compute: undilated
        return self.gpu_scale if self.compute == "emulated" else 1.0

    @property
    def link_queue_real_ms(self) -> float:
        """The queue tc gets, in real time. Under dilation a link runs at gpu_scale times the P100-equivalent rate,
        and a queue of link_queue_ms at that rate would hold gpu_scale times the switch's bytes: the queue is
        dilated like every duration, so that it holds the same bytes at every dilation."""
        return self.link_queue_ms / self.dilation

    @property
    def link_burst_real_ms(self) -> float:  # the bucket tc gets, in real ms (as link_queue_real_ms)
        return self.link_burst_gpu_ms / self.dilation

    @property
    def tcp_rto_min_real_ms(self) -> float | None:  # the row's tcp_rto_min_ms; None: the kernel's own
        emulated = self.tcp_rto_min_gpu_ms is not None and self.compute == "emulated"
        return self.tcp_rto_min_gpu_ms / self.gpu_scale if emulated else None

    @property
    def horovod_cycle_real_ms(self) -> float | None:  # the row's horovod_cycle_ms; None: not Horovod
        return baseline_settings.horovod_cycle_real_ms(self.setting_env, self.dilation) \
            if self.kvstore == "horovod" else None

    @property
    def link_burst_bytes(self) -> int | None:  # the bucket's bytes (the row's link_burst_bytes); None: uncapped
        return emulated_cluster.burst_bytes(emulated_cluster.parse_rate(self.bandwidth), self.link_burst_real_ms) \
            if self.bandwidth else None

    @property
    def cfs_period_real_us(self) -> int | None:  # the quota's CFS period in real µs; None: the fixed default
        return None if self.cfs_period_gpu_ms is None else cfs_bandwidth.dilated_period_us(self.cfs_period_gpu_ms,
                                                                                          self.dilation)

    @property
    def cfs_period_us(self) -> int | None:
        """The period the hosts' groups get (the row's cfs_period_us), None without a quota."""
        quota = self.cpu_quota
        if quota is None:
            return None
        return cfs_bandwidth.period_us(quota, self.cfs_period_real_us or cfs_bandwidth.PERIOD_US)

    @property
    def cpu_quota(self) -> float | None:
        """Each host's CPU bandwidth in cores, or None: limits apply to emulated (dilated) compute only."""
        if self.host_cpus is None or self.compute != "emulated":
            return None
        return cpu_limit.quota_cores(self.host_cpus, self.gpu_scale)

    @property
    def thread_cap_cores(self) -> float | None:  # each thread's cores, one CPU dilated (the row's); None: uncapped
        return self.gpu_scale if self.thread_cap and self.cpu_quota is not None else None

    @property
    def workers(self) -> int:
        return self.hosts if self.layout == "colocated" or self.kvstore in NO_SERVERS else self.hosts // 2

    @property
    def servers(self) -> int:
        return 0 if self.kvstore in NO_SERVERS else self.workers

    def roles(self, host: int) -> tuple[int, int]:
        """(workers, servers) on `host`."""
        if self.kvstore in NO_SERVERS:
            return 1, 0
        if self.layout == "colocated":
            return 1, 1
        return (1, 0) if host < self.workers else (0, 1)

    def group(self) -> tuple:
        """Everything but the system (and its own settings): the runs one comparison interleaves."""
        return tuple(v for k, v in dataclasses.asdict(self).items()
                     if k not in ("kvstore", "repeat", "order", "setting_env", "baseline_setting"))


def model_arrays(model: str) -> tuple[list[int], int]:
    """(elements of every array, model bytes)."""
    return model_shapes.array_sizes(model)


def model_bytes(model: str) -> int:
    return model_arrays(model)[1]


def comm_bound_seconds(bytes_per_model: int, hosts: int, rate_bps: float | None, layout: str = "colocated") -> float:
    """Payload-only time of one iteration's traffic on the busiest link (each direction); the bound uses
    wire_bound.link_load, which adds the headers. Colocated: 2 (N-1)/N of the model each way; separate: 1."""
    if rate_bps is None or hosts < 2:
        return 0.0
    share = 2 * (hosts - 1) / hosts if layout == "colocated" else 1.0
    return share * bytes_per_model * 8 / rate_bps


BOUND_COLUMNS = ("comm_bound_s", "bound_s", "bound_throughput", "pct_of_bound", "wire_bytes", "messages")


def bound_columns(row: dict) -> dict:
    """A row's bound (BOUND_COLUMNS) from its settings and measurements (model, kvstore, hosts, layout,
    slice_size, bandwidth_bps, compute_s, workers, samples_per_batch, throughput): the same function at run time
    and when `sweeps.py rebound` rewrites older rows after a change to the header model (wire_bound.py)."""
    def number(key: str) -> float:
        value = row.get(key)
        return float(value) if value not in (None, "") else 0.0

    sizes, nbytes = model_arrays(row["model"])
    slice_size = int(number("slice_size")) or None
    link = wire_bound.link_load(row["kvstore"], sizes, nbytes, int(row["hosts"]), row.get("layout") or "colocated",
                                slice_size)
    comm = link.seconds(number("bandwidth_bps") or None)
    bound = max(number("compute_s"), comm)
    bound_throughput = number("workers") * number("samples_per_batch") / bound if bound else float("inf")
    throughput = number("throughput")
    return {"comm_bound_s": round(comm, 4), "bound_s": round(bound, 4), "bound_throughput": round(bound_throughput, 2),
            "pct_of_bound": round(100 * throughput / bound_throughput, 1) if bound else "",
            "wire_bytes": round(link.wire), "messages": round(link.messages)}


def calibrated_efficiency(model: str) -> float:
    return emulated_compute.efficiency_of(emulated_compute.load_description(model))


def _worker_argv(point: Point, out: pathlib.Path) -> list[str]:
    extra = [point.servers and str(point.servers) if a == "SERVERS" else a for a in KVSTORES[point.kvstore][2]]
    module = (torch_systems.WORKER_MODULE if point.kvstore in torch_systems.SYSTEMS
              else "benchmarks.workloads.cluster_worker")
    return [*paths.python_module(module), "--model", point.model, "--compute", point.compute,
            "--batch-size", str(point.batch_size), "--warmup", str(point.warmup), "--iters", str(point.iters),
            "--gpu", point.gpu, "--gpu-scale", str(point.gpu_scale), "--efficiency-factor",
            str(point.efficiency_factor), "--optimizer", point.optimizer, "--log-interval", str(point.log_interval),
            "--out", str(out), *extra]


def _environment(point: Point, extra: dict) -> dict:
    # Allreduce jobs get no parameter-server variables (job_env's "horovod" rule holds for DDP too).
    env = job_env.job_environment("horovod" if point.kvstore in NO_SERVERS else point.kvstore, point.slice_size)
    if point.kvstore not in NO_SERVERS:
        env["P3_SECRET"] = secrets.token_hex(32)  # one per job, the same on every host
    env.update(OMP_NUM_THREADS=str(thread_cap.omp_threads(point.host_cpus, point.thread_cap_cores)),
               MXNET_CPU_WORKER_NTHREADS="1", PYTHONUNBUFFERED="1", **extra)
    env.update(point.setting_env)  # the system's tuned (or grid) setting: reaches every process through the launcher
    if point.horovod_cycle_real_ms is not None:  # dilated; Horovod reads it with strtof (fractions are fine)
        env["HOROVOD_CYCLE_TIME"] = f"{point.horovod_cycle_real_ms:.6g}"
    return env


def new_run_id(point: Point, hosts: int) -> str:
    """A name no other run has (a resumed sweep runs the same point, repeat and port again): the point, the UTC
    time and a random token."""
    return (f"{point.model}.{point.kvstore}.{point.bandwidth}.{hosts}h.r{point.repeat}."
            f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.{secrets.token_hex(3)}")


def _forward(stream, prefix: str, sink, log_file) -> None:
    for line in stream:
        log_file.write(line)
        if sink is not None:
            sink.write(prefix + line)
            sink.flush()


def run_point(cluster: emulated_cluster.EmulatedCluster, point: Point, scratch: pathlib.Path, port: int,
              live=sys.stdout) -> tuple[dict, dict[int, list[float]]]:
    """Runs one job across the cluster's hosts; returns its row (without the common columns) and every rank's
    timed iterations."""
    launcher_kvstore, extra, _ = KVSTORES[point.kvstore]
    hosts = cluster.hosts
    name = new_run_id(point, hosts)
    out = scratch / name
    env = {**_environment(point, extra), worker_output.READY_ENV: str(scratch / f"{name}.ready")}
    LOG.info("%s on %s (repeat %d, position %d): %d hosts, %s, %s compute, batch %d, optimizer %s", point.model,
             point.kvstore, point.repeat, point.order, hosts, point.bandwidth or "uncapped", point.compute,
             point.batch_size, point.optimizer)
    load_before = os.getloadavg()[0]
    def all_ready() -> bool:  # every worker built its model: thread caps start, and the CPU window (until reported)
        return worker_output.ready_count(env[worker_output.READY_ENV]) >= point.workers

    def reported() -> bool:
        return len(list(scratch.glob(f"{name}.rank*.json"))) == point.workers
    monitors = run_monitors.RunMonitors(cluster, point.host_cpus if point.cpu_quota else None,
                                        point.cpu_quota, point.cfs_period_real_us, point.thread_cap_cores,
                                        ready=all_ready, tcp_trace=point.tcp_trace).start()
    start = time.perf_counter()
    procs, threads, logs = [], [], []
    for i in range(hosts):
        local_workers, local_servers = point.roles(i)
        argv = [sys.executable, "-m", "p3kv.launch", "-n", str(point.workers), "-s", str(point.servers),
                "--kvstore", launcher_kvstore, "--host", cluster.address(i), "--port", str(port),
                "--local-workers", str(local_workers), "--local-servers", str(local_servers),
                "--timeout", str(point.timeout), *torch_systems.LAUNCHER_FLAGS.get(point.kvstore, [])]
        if i:
            argv += ["--no-scheduler", "--root", cluster.address(0)]
        if launcher_kvstore == "horovod":
            argv += ["--slots", ",".join(f"{cluster.address(h)}:1" for h in range(hosts))]
            # Gloo finds a rank's address from its hostname (not HOROVOD_GLOO_IFACE): a name of its own per host.
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', cluster.address(i), *argv]
        argv += ["--", *_worker_argv(point, out)]
        if launcher_kvstore == "torchrun":  # DDP: torchrun instead of p3kv's launcher
            argv = torch_systems.torchrun_argv(sys.executable, hosts, i, cluster.address(0), port,
                                               _worker_argv(point, out), cluster.address(i))
        host_env = env
        log = open(scratch / f"{name}.host{i}.log", "w")
        logs.append(log)
        proc = cluster.popen(i, argv, env=host_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        procs.append(proc)
        thread = threading.Thread(target=_forward, args=(proc.stdout, f"[host{i}] ", live if i == 0 else None, log),
                                  daemon=True)
        thread.start()
        threads.append(thread)
    cpu = host_cpu.HostCpuMonitor([p.pid for p in procs], window=lambda: all_ready() and not reported()).start()
    progress = job_watch.ProgressWatch(env[worker_output.READY_ENV])  # a crawling job is stopped (job_watch.py)
    exit_code = job_watch.wait_all(procs, point.timeout + 60, reported, progress.stalled)
    cpu_pct = cpu.stop()
    cpu_mean = cpu.means()
    for thread in threads:
        thread.join(timeout=10)
    for log in logs:
        log.close()
    wall = time.perf_counter() - start
    nbytes = model_bytes(point.model)
    emulated = point.compute == "emulated"
    row = {"model": point.model, "kvstore": point.kvstore, "compute": point.compute, "hosts": hosts,
           "workers": point.workers, "servers": point.servers, "layout": point.layout,
           "bandwidth": point.bandwidth or "uncapped", "bandwidth_bps": cluster.rate_bps or "",
           "p100_equiv_gbps": round(cluster.rate_bps / point.gpu_scale / 1e9, 3)
           if emulated and cluster.rate_bps else "",
           "batch_size": point.batch_size, "slice_size": point.slice_size or "",
           "gpu": point.gpu if emulated else "", "gpu_scale": point.gpu_scale if emulated else "",
           "efficiency": round(calibrated_efficiency(point.model) * point.efficiency_factor, 4) if emulated else "",
           "efficiency_factor": point.efficiency_factor if emulated else "", "optimizer": point.optimizer,
           "warmup": point.warmup, "iters": point.iters, "repeat": point.repeat, "repeats": point.repeats,
           "order": point.order, "tag": point.tag, "exit_code": exit_code, "wall_s": round(wall, 1),
           "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
           "cpu_host_pct": ";".join(f"{c:g}" for c in cpu_pct), "cpu_total_pct": round(sum(cpu_pct), 1),
           "cpu_host_mean_pct": ";".join(f"{c:g}" for c in cpu_mean) if cpu_mean else "",
           "cpu_total_mean_pct": round(sum(cpu_mean), 1) if cpu_mean else "",
           "model_bytes": nbytes, "run_id": name,
           "baseline_setting": point.baseline_setting or baseline_settings.DEFAULT_UNTUNED,
           "link_queue_ms": point.link_queue_ms if cluster.rate_bps else "",
           "link_burst_bytes": emulated_cluster.burst_bytes(cluster.rate_bps, cluster.burst_ms) if cluster.rate_bps
           else "", "tcp_rto_min_ms": round(cluster.rto_min_ms) if cluster.rto_min_ms else "",
           "tcp_congestion_control": cluster.congestion_control or link_shaping.machine_congestion_control(),
           "horovod_cycle_ms": point.horovod_cycle_real_ms if point.horovod_cycle_real_ms is not None else "",
           "priority_hold_ms": baseline_settings.priority_hold_ms(env) if launcher_kvstore == "p3" else "",
           "omp_threads": env["OMP_NUM_THREADS"]}
    files = sorted(scratch.glob(f"{name}.rank*.json"))
    results = [json.loads(p.read_text()) for p in files]
    every = [t for r in results for t in r.get("iter_s") or []]
    row.update(monitors.finish(results, files, wall, statistics.median(every) if every else None,
                               point.gpu_scale if point.compute == "emulated" else 1.0))
    # MXNet's ps-lite servers sometimes hang at shutdown after every worker reported (more often under load):
    # the measurement is complete, so a baseline's row keeps it, with the exit code. p3kv gets no such pass.
    baseline_hang = exit_code != 0 and len(results) == point.workers and launcher_kvstore != "p3"
    if baseline_hang:
        LOG.warning("%s on %s: every worker reported, then the job did not end cleanly (exit code %s); keeping "
                    "the measurement", point.model, point.kvstore, exit_code)
    if (exit_code != 0 and not baseline_hang) or len(results) != point.workers:
        tails = []
        for i in range(hosts):
            lines = (scratch / f"{name}.host{i}.log").read_text(errors="replace").splitlines()[-15:]
            tails.append(f"--- host {i} ---\n" + "\n".join(lines))
        LOG.error("%s on %s failed (exit codes %s, %d of %d results); last output:\n%s", point.model,
                  point.kvstore, [p.returncode for p in procs], len(results), point.workers, "\n".join(tails))
        row["status"] = "failed(stalled)" if progress.reason else f"failed({exit_code})"
        return row, {}
    first = next(r for r in results if r["rank"] == 0)
    compute = round(statistics.median(r["compute_s"] for r in results), 4)
    throughput = sum(r["samples_per_batch"] / r["median_s"] for r in results)
    q1, median, q3 = bench_stats.quartiles(every)  # every rank's iterations, as the tables take them
    row.update(status="ok", unit=first["unit"], samples_per_batch=first["samples_per_batch"],
               median_s=round(median, 4), q1_s=round(q1, 4), q3_s=round(q3, 4), iter_s=first["iter_s"],
               rank_iter_s=[r["iter_s"] for r in sorted(results, key=lambda r: r["rank"])],
               throughput=round(throughput, 2), compute_s=compute, payload_bound_s=round(
                   max(compute, comm_bound_seconds(nbytes, hosts, cluster.rate_bps, point.layout)), 4),
               optimizer=first["optimizer"], update_on=first["update_on"],
               update_placement=first.get("update_placement", ""), weight_copy=first.get("weight_copy", ""),
               gradient_work=first.get("gradient_work", ""), gradient_work_s=first.get("gradient_work_s", ""),
               **{k: v for k, v in first["versions"].items() if k in bench_rows.RUN_COLUMNS})
    row.update(bound_columns(row))
    bound_throughput, comm = row["bound_throughput"], row["comm_bound_s"]
    LOG.info("%s on %s: %.1f %s/s (bound %.1f, %.0f%%), median %.3f s/iter, compute %.3f s, link %.3f s, CPU per "
             "host %s%%; %s%s", point.model, point.kvstore, throughput, first["unit"], bound_throughput,
             row["pct_of_bound"] or 0, median, compute, comm, row["cpu_host_pct"],
             "faithful" if row["faithful"] else "NOT faithful",
             f" ({row['fidelity_notes']})" if row["fidelity_notes"] else "")
    return row, {r["rank"]: r["iter_s"] for r in results}
