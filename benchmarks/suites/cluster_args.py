"""The options every emulated-cluster runner shares (cluster_bench.py, sweeps.py, demo.py, tune.py): each host's
CPUs and their CFS period, how hosts receive, the links' queue, and the run conditions."""

from __future__ import annotations

import argparse

from benchmarks.emulation import cfs_bandwidth, emulated_cluster, link_shaping, run_guard

# 4 CPUs per emulated host: with 2, the 4-host demo point's hosts were throttled 13-43% of their timed window (the
# servers' and workers' own CPU work did not fit, where a real GPU host has more cores); with 4, at 4 hosts and
# dilations 0.05-0.1, no host of any system over 6.2% (results/pilot_dilation/).
DEFAULT_HOST_CPUS = 4.0
# Models whose hosts need more: VGG-19's at 15 Gbps-equivalent were throttled 16% (p3kv) and 73% (dist_sync) of their
# timed window with 4 CPUs, p3kv not at all and dist_sync less with 8 (results/pilot_vgg_cpus/summary.md). More CPUs
# per host force a smaller --gpu-scale (4 hosts of 8 fit 2 cores up to 0.056), so only where needed.
MODEL_HOST_CPUS = {"vgg19": 8.0}


def add_cpu_arguments(p: argparse.ArgumentParser) -> None:
    """--host-cpus, --thread-cap / --no-thread-cap and --no-cpu-limit (shared with sweeps.py and demo.py)."""
    p.add_argument("--host-cpus", type=float, default=None, help="CPUs of one emulated host: its "
                   "processes get host_cpus x --gpu-scale cores (a cgroup each), dilated like compute and links. "
                   f"Default {DEFAULT_HOST_CPUS:g} ({', '.join(f'{m} {c:g}' for m, c in MODEL_HOST_CPUS.items())}): "
                   "with 2, hosts of 4-host points were throttled 13-43%% of the time; "
                   "4 fits a 4-host point at the demo's dilation (0.1) on 2 cores (the quotas may use 90%% of the "
                   "machine: 4 x 4 x 0.1125 = 1.8); a larger count forces a smaller --gpu-scale and longer runs")
    p.add_argument("--cfs-period-gpu-ms", type=float, default=cfs_bandwidth.PERIOD_GPU_MS, help="the CFS period of "
                   "the hosts' CPU quotas in the emulated GPU's time: real period this / --gpu-scale (within the "
                   "kernel's 1 ms to 1 s), so that a host's run-then-stop cycle is dilated like compute and links "
                   f"(default {cfs_bandwidth.PERIOD_GPU_MS:g}: 10 ms at 0.1; rows record the real period as "
                   "cfs_period_us)")
    p.add_argument("--thread-cap", action=argparse.BooleanOptionalAction, default=True,
                   help="also cap each thread of a host at one dilated CPU (--gpu-scale of a core, a cgroup of its "
                   "own under its host's) once every worker has built its model: the host's quota alone lets one "
                   "thread run host_cpus times faster than one of the host's CPUs would. On by default (with it "
                   "every system's runs passed the fidelity monitors at 3 dilations: results/sweeps/dilation.csv); "
                   "cgroup v1 only: --no-thread-cap where a machine has v2 (benchmarks/emulation/thread_cap.py; "
                   "rows record thread_cap_cores)")
    p.add_argument("--no-cpu-limit", action="store_true", help="run the hosts without CPU limits, for comparison "
                   "(rows say cpu_limit=off and are never faithful)")
    p.add_argument("--link-rx", choices=("softirq", "napi"), default="softirq", help="how emulated hosts receive: "
                   "softirq (the kernel's default: on whatever CPU sent, charged to no host) or napi (a kernel thread "
                   "per host in its CPU group; the switch ports then send without TSO, about 3x the CPU per byte; "
                   "benchmarks/emulation/link_napi.py). Rows record it (link_rx)")


def add_queue_argument(p: argparse.ArgumentParser) -> None:
    """--link-queue-ms (shared with sweeps.py)."""
    p.add_argument("--link-queue-ms", type=float, default=emulated_cluster.DEFAULT_QUEUE_MS, help="each link "
                   "direction's queue: how long a packet may wait beyond the bucket's burst, in the emulated GPU's "
                   "time: tc tbf's latency is link_queue_ms / gpu_scale, so that the queue holds the same bytes at "
                   "every dilation, as the bucket does (1 ms of GPU time; rows record link_burst_bytes) "
                   f"(default {emulated_cluster.DEFAULT_QUEUE_MS:g}; rows record it as link_queue_ms)")


def add_tcp_argument(p: argparse.ArgumentParser) -> None:
    """--tcp-rto-min-gpu-ms (cluster_bench.py's)."""
    p.add_argument("--tcp-rto-min-gpu-ms", type=float, default=0.0, help="TCP's minimum retransmission timeout on "
                   "the links in the emulated GPU's time (real: this / --gpu-scale, set per route; it also decides "
                   f"when an idle connection restarts from its initial window); e.g. {link_shaping.KERNEL_RTO_MIN_MS:g}"
                   " dilates the kernel's own. Default 0: the kernel's 200 ms of real time (dilating it did not help: "
                   "results/cfs_period/summary.md; rows record a set value as tcp_rto_min_ms)")
    p.add_argument("--tcp-congestion", type=congestion_control, default=None, metavar="NAME", help="TCP's "
                   "congestion control on the links, "
                   "e.g. cubic or bbr (a route's congctl in every host; the kernel must have it loaded). Default: the "
                   "machine's (sysctl net.ipv4.tcp_congestion_control). Rows record it as tcp_congestion_control")


def congestion_control(name: str) -> str:
    """--tcp-congestion's type: an algorithm the kernel has loaded, refused before any cluster is built."""
    try:
        link_shaping.check_congestion_control(name)
    except (ValueError, OSError) as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return name


def add_redo_argument(p: argparse.ArgumentParser) -> None:
    """--redo-unfaithful (sweeps.py's and tune.py's)."""
    p.add_argument("--redo-unfaithful", action="store_true", help="--resume, and also run again each run the "
                   "fidelity monitors judged unfaithful (most under hypervisor steal, which comes in episodes of "
                   "minutes: a later pass is the remedy); the unfaithful rows stay and are counted")


def host_cpus_from_args(args: argparse.Namespace, model: str | None = None) -> float | None:
    """A point's host_cpus: None with --no-cpu-limit, else --host-cpus, else the model's default."""
    if args.no_cpu_limit:
        return None
    return args.host_cpus if args.host_cpus is not None else MODEL_HOST_CPUS.get(model, DEFAULT_HOST_CPUS)


def add_condition_arguments(p: argparse.ArgumentParser) -> None:
    """The statistics and run-condition options (shared with sweeps.py)."""
    p.add_argument("--repeats", type=int, default=3, help="rounds over the systems, a fresh shuffled order each")
    p.add_argument("--seed", type=int, default=0, help="seeds the shuffled orders (recorded)")
    run_guard.add_arguments(p)
    p.add_argument("--smoke", action="store_true", help="mark the rows as a smoke run (never a result)")
    p.add_argument("--tcp-trace", action="store_true", help="read every host's TCP sockets during each run "
                   "(benchmarks/emulation/socket_monitor.py): rows fill tcp_unsaturated_pct and the other tcp_* "
                   "columns (off by default; its CPU is part of sampling_cpu_s)")
