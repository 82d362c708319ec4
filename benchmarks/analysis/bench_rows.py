"""The emulated-cluster benchmark's result rows: their columns, and the one writer every runner uses.

One row per run (one system, one repeat, one point); every timed iteration of every rank goes to a second file
beside it (<csv stem>_iterations.csv). cluster_bench.py, sweeps.py and any other runner that wants the same
tables and figures (e.g. a real-cluster runner) import `write_run` and the column tuples from here, so the
files stay one schema. Rows written before this schema (the pre-optimizer sweeps in results/) are read with
`read_runs`, which fills what they lack: optimizer "none", one repeat, the payload-only bound.
"""

from __future__ import annotations

import csv
import json
import pathlib
from collections.abc import Callable, Sequence

from benchmarks.analysis import bench_report

# Settings, measurements, then the conditions of the run (load, CPU per host, tree state) and the versions.
RUN_COLUMNS = (
    "timestamp", "run_id", "tag", "smoke", "model", "kvstore", "compute", "status", "exit_code",
    "hosts", "layout", "workers", "servers", "bandwidth", "bandwidth_bps", "p100_equiv_gbps", "batch_size",
    "slice_size", "gpu", "gpu_scale", "efficiency", "efficiency_factor", "optimizer", "update_on",
    "warmup", "iters", "repeats", "repeat", "order", "seed",
    "unit", "samples_per_batch", "median_s", "q1_s", "q3_s", "iter_s", "throughput", "compute_s",
    "payload_bound_s", "comm_bound_s", "bound_s", "bound_throughput", "pct_of_bound", "model_bytes",
    "wire_bytes", "messages", "wall_s",
    "load_1m_before", "load_1m_after", "max_load", "busy_pct_before", "max_busy_pct", "forced",
    "cpu_host_pct", "cpu_total_pct",
    "git_commit", "git_dirty", "allow_dirty", "cpus", "python", "mxnet", "p3kv", "horovod", "gluoncv", "sockeye",
    "idle_wait_s", "idle_warning",  # the run guard's wait (wall clock) and why a run proceeded on a busy machine
    "baseline_setting",  # the system's settings the job ran with (suites/baseline_settings.py), or "default (untuned)"
    # The emulation's fidelity (benchmarks/emulation/run_monitors.py): CPU limits and each host's CPU and throttled
    # time (per-host lists joined by ";"), the virtual GPU, the links' drops and retransmissions, the verdict.
    "host_cpus", "cpu_limit", "cpu_quota_cores", "host_cpu_s", "host_throttled_s", "host_throttled_pct",
    "throttled_max_pct", "throttled_periods_max_pct", "timed_window_s", "vgpu_late_max_us",
    "vgpu_forgiven_us_per_iter", "qdisc_drops", "qdisc_drops_total", "tcp_retrans", "tcp_retrans_total",
    "tcp_out_segs_total", "sampling_cpu_s", "faithful", "fidelity_notes",
    "rank_iter_s",  # every rank's timed iterations, [[rank 0's], [rank 1's], ...] (iter_s: rank 0's alone)
    "update_placement",  # where the optimizer ran: servers (CPU), workers (virtual GPU at its bandwidth), none
    # The kernel's side of the emulation: the CFS period and per-CPU slice of the host quotas (cpu_limit.py), and
    # whether the links received on NAPI threads charged to the hosts or in softirq (link_napi.py).
    "cfs_period_us", "cfs_slice_us", "link_rx",
    "torch",  # the torch version of the PyTorch systems' workers (suites/torch_systems.py)
    "link_queue_ms",  # each link direction's queue beyond its burst (emulated_cluster.tbf_args); "": uncapped
    # The link monitor (benchmarks/emulation/link_monitor.py), per host the worse direction: the share of sampling
    # intervals with data queued to the link, and of those the share in which it sent under 90% of what it owed;
    # the sampling thread's CPU.
    "link_backlogged_pct", "link_starved_pct", "link_starved_max_pct", "link_monitor_cpu_s",
    # The virtual GPU's late wake-ups summed per timed iteration (the worst rank), and the share of the machine's
    # CPU time the hypervisor took from it during the run (steal, /proc/stat).
    "vgpu_late_us_per_iter", "steal_pct",
    "link_burst_bytes",  # each link's bucket (emulated_cluster.burst_bytes); "": uncapped, or a row from before it
    "tcp_rto_min_ms",  # the links' TCP minimum RTO in real ms (link_shaping.dilated_rto_min_ms); "": the kernel's 200
    "horovod_cycle_ms",  # Horovod's cycle time in real ms, dilated (cluster_job.Point); "": another system, or a
    # Horovod row from before the dilated cycle (its 1 ms default, undilated)
    "priority_hold_ms",  # p3kv's P3_PRIORITY_HOLD_MS (sender.h); "": another system, or a p3kv row from before it
    # Per-thread caps (emulation/thread_cap.py): each thread's cores ("": uncapped), per host the threads placed
    # in groups of their own, those left uncapped as GPU-side work (Horovod's background thread) and the time
    # the kernel held the capped ones back (throttled, summed over the threads); how long before the timed window
    # the caps began (start-up runs at the host's quota: thread_cap.py; "": uncapped, or a row from before).
    "thread_cap_cores", "threads_capped", "threads_gpu_side", "thread_throttled_s", "thread_caps_lead_s",
    "omp_threads",  # OpenMP threads per process (thread_cap.omp_threads: the host's CPUs when capped); "": one
    # Per role (worker, server, scheduler), the busiest threads of its busiest process in the timed window, JSON:
    # {role: [[thread name, % of one dilated CPU, % of the window throttled], ...]} (emulation/thread_usage.py);
    # "": threads uncapped, or a row from before it.
    "thread_cpu",
    "tcp_congestion_control",  # TCP's congestion control on the links (link_shaping.py); "": a row from before, BBR
    # The socket monitor (--tcp-trace; emulation/socket_monitor.py; "": not traced): the most flows crossing links
    # at once, the flow-seconds with data waiting in a socket, the share of those with no link on the flow's path
    # at its rate (overall and per source host), the share of the flows' busy time the receive window and a full
    # send buffer held them, the retransmitted share of bytes sent, the sampling thread's CPU; then the unsaturated
    # time split by what held the flow ("rwnd:x;cwnd:y;pacing:...", % of it) and, for BBR's pacing share, its
    # egress's estimates over the link's rate ("": a row from before the split).
    "tcp_flows", "tcp_backlogged_s", "tcp_unsaturated_pct", "tcp_unsaturated_hosts", "tcp_rwnd_limited_pct",
    "tcp_sndbuf_limited_pct", "tcp_retrans_pct", "tcp_monitor_cpu_s", "tcp_unsaturated_limits",
    "tcp_unsaturated_bw_share",
    # For the cwnd share under BBR: why the window was full ("rtt:x;short:y;other:z", % of it) and the mean of smoothed
    # RTT over BBR's min RTT (socket_monitor.py; "": a row from before them).
    "tcp_cwnd_causes", "tcp_cwnd_rtt_inflation",
    # Each host's CPU use as the mean over the measurement window (host_cpu.HostCpuMonitor.means), and their sum,
    # beside cpu_host_pct's median 1-s interval ("": a row from before them).
    "cpu_host_mean_pct", "cpu_total_mean_pct",
    "weight_copy",  # p3kv.torch server placement: where the new values were copied into the parameters
    # (suites/torch_systems.WEIGHT_COPY); "": no such copy, or a server-placement row from before (the host's CPU)
    # p3kv.torch and DDP: where their own passes over the gradients during backward ran (torch_systems.GRADIENT_WORK:
    # the virtual GPU), and their virtual-GPU seconds per iteration (rank 0's); "": other systems, or a torch row
    # from before, whose training loop made them on the host's CPU
    "gradient_work", "gradient_work_s",
)
# A new column goes at the end: an existing CSV then gains it in its header alone (bench_report.append_csv rewrites
# a whole file that lacks a column elsewhere, and refuses one with a column not here).
ITERATION_COLUMNS = ("run_id", "tag", "model", "kvstore", "hosts", "bandwidth", "gpu_scale", "repeat", "rank",
                     "iteration", "time_s")
# What rows from before this schema lacked, as they ran: no optimizer, one run per point.
LEGACY_DEFAULTS = {"optimizer": "none", "update_on": "none", "repeats": "1", "repeat": "0", "smoke": "False",
                   "efficiency": "0.5", "efficiency_factor": "1"}


def iterations_path(csv_path: pathlib.Path) -> pathlib.Path:
    return csv_path.with_name(f"{csv_path.stem}_iterations.csv")


def write_run(csv_path: pathlib.Path, row: dict, iterations: dict[int, Sequence[float]] | None = None) -> None:
    """Appends one run's row to `csv_path` and its iterations ({rank: [seconds, ...]}) to the file beside it.
    A column the row lacks is written empty; a key not in RUN_COLUMNS is an error (a typo would be lost)."""
    unknown = set(row) - set(RUN_COLUMNS)
    if unknown:
        raise ValueError(f"not run columns: {', '.join(sorted(unknown))}")
    row = dict(row)
    if isinstance(row.get("iter_s"), (list, tuple)):
        row["iter_s"] = json.dumps([round(t, 6) for t in row["iter_s"]])
    if isinstance(row.get("rank_iter_s"), (list, tuple)):
        row["rank_iter_s"] = json.dumps([[round(t, 6) for t in times] for times in row["rank_iter_s"]])
    bench_report.append_csv(csv_path, [row], RUN_COLUMNS)
    if iterations:
        keys = {k: row.get(k, "") for k in ITERATION_COLUMNS if k not in ("rank", "iteration", "time_s")}
        rows = [{**keys, "rank": rank, "iteration": i, "time_s": round(t, 6)}
                for rank, times in sorted(iterations.items()) for i, t in enumerate(times)]
        bench_report.append_csv(iterations_path(csv_path), rows, ITERATION_COLUMNS)


def verdict(row: dict) -> bool | None:
    """A run's fidelity verdict: True, False, or None for rows from before the monitors (no verdict). A row as
    read from its CSV holds the text "True"/"False"; a row a runner has just made holds the bool."""
    value = row.get("faithful")
    if isinstance(value, bool):
        return value
    value = str(value or "").strip()  # None: a row shorter than a header that gained the column
    return None if value == "" else value == "True"


def read_runs(path: pathlib.Path, ok_only: bool = True) -> list[dict]:
    """Rows of a run CSV (this schema or the legacy one), legacy gaps filled in (see LEGACY_DEFAULTS)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        legacy = "optimizer" not in (reader.fieldnames or [])
        rows = []
        for row in reader:
            if ok_only and row.get("status") != "ok":
                continue
            if legacy:
                row = {**LEGACY_DEFAULTS, **{k: v for k, v in row.items() if v not in (None, "")}, "legacy": "True"}
                if row.get("compute") == "real":  # Gluon SGD on the servers, no momentum, no weight decay
                    row["optimizer"] = row["update_on"] = "sgd-plain"
                row.setdefault("payload_bound_s", row.get("bound_s", ""))
            else:
                row["legacy"] = "False"
            rows.append(row)
    return rows


def _bounds_differ(row: dict, fresh: dict) -> bool:
    def same(old: str, new) -> bool:
        try:
            return abs(float(old) - float(new)) <= 1e-9 * max(1.0, abs(float(new)))
        except ValueError:
            return str(old) == str(new)
    return not all(same(row.get(k, ""), v) for k, v in fresh.items())


def stale_bounds(path: pathlib.Path, bound_of: Callable[[dict], dict]) -> list[str]:
    """run_ids of the ok rows in `path` (this schema) whose bound columns differ from `bound_of(row)`."""
    return [r["run_id"] for r in read_runs(path) if r["legacy"] == "False" and _bounds_differ(r, bound_of(r))]


def rewrite_bounds(path: pathlib.Path, bound_of: Callable[[dict], dict]) -> int:
    """Replaces the bound columns of every ok row in `path` (this schema) with `bound_of(row)`, after a change to
    the bound's model; measurements and conditions are kept as written. Returns the rows changed."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    if "optimizer" not in fields:
        return 0  # legacy rows keep their payload-only bound
    changed = 0
    for row in rows:
        if row.get("status") == "ok":
            fresh = bound_of(row)
            if _bounds_differ(row, fresh):
                row.update({k: v for k, v in fresh.items()})
                changed += 1
    if changed:
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(path)
    return changed


def rank_iterations(row: dict) -> list[list[float]]:
    """Every rank's timed iterations of a run, one list per rank; rows written before rank_iter_s give rank 0's
    alone, legacy rows the run's median."""
    ranks = row.get("rank_iter_s")
    if ranks:
        return [[float(t) for t in times] for times in (json.loads(ranks) if isinstance(ranks, str) else ranks)]
    times = iteration_times_of_rank0(row)
    return [times] if times else []


def iteration_times(row: dict) -> list[float]:
    """Every rank's timed iterations of a run pooled (rank 0's in rows before rank_iter_s; the run's median alone
    in legacy rows): what the tables' medians and quartiles are taken over."""
    return [t for times in rank_iterations(row) for t in times]


def iteration_times_of_rank0(row: dict) -> list[float]:
    """Rank 0's timed iterations of a run (this schema), or the run's median alone (legacy rows)."""
    times = row.get("iter_s")
    if times:
        return [float(t) for t in (json.loads(times) if isinstance(times, str) else times)]
    return [float(row["median_s"])] if row.get("median_s") else []
