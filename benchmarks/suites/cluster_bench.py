"""Throughput of p3kv vs MXNet dist_sync vs MXNet's built-in P3 vs Horovod on an emulated cluster (runs as root).

    python -m benchmarks.suites.cluster_bench --model resnet50_v1 --hosts 4 --bandwidth 1gbit \\
        --kvstore p3 dist_sync mxnet-p3 horovod --compute emulated --gpu-scale 0.1 --iters 20 --repeats 3

Builds N hosts as network namespaces on a bridge with every link capped at --bandwidth
(benchmarks/emulation/emulated_cluster.py) and runs, for every --kvstore, the paper's layout: one server and one worker
per host, the scheduler on host 0, each host's processes started by its own `python -m p3kv.launch` inside its
namespace. Horovod has no servers: the same launcher (`--kvstore horovod`) starts one rank per host with Horovod's
Gloo environment and its rendezvous on host 0, ring allreduce over the same capped links. Workers
run benchmarks/workloads/cluster_worker.py (see there for the compute modes and where each system runs the optimizer:
SGD with momentum and weight decay by default, --optimizer none for the transport-only comparison).

Statistics: --repeats rounds; in each, every point's systems run in a freshly shuffled order (seeded by
--seed, recorded with the position of each run). Every timed iteration of every rank is kept
(<csv stem>_iterations.csv beside --csv); the summary gives the median and interquartile range over all timed
iterations of all repeats and the range of the per-repeat medians (benchmarks/analysis/bench_stats.py).

Conditions (benchmarks/emulation/run_guard.py): refuses a dirty git tree unless --allow-dirty; before each run waits up
to --load-wait seconds for the 1-minute load to fall below --max-load, then refuses unless --force. Load before
and after each run, the CPU utilisation of every emulated host (benchmarks/emulation/host_cpu.py) and the overrides are
in every row.

Throughput is samples/s (tokens/s for Sockeye) summed over workers: each worker's batch over its median
iteration time after --warmup. Beside it, the physical bound: max(compute time per iteration, the time the
iteration's bytes need on the busiest capped link), the bytes counting every message's frame header and the
TCP/IP/Ethernet headers (benchmarks/emulation/wire_bound.py). Rows go to --csv through
benchmarks/analysis/bench_rows.py.
Kvstores: p3, dist_sync, mxnet-p3, horovod, and p3kv's ablations p3-slicing-only (P3_PRIORITY=none: slices
first come first served), p3-priority-split (no slicing, but arrays above 10^6 elements cut into one key per
server, as MXNet's dist_sync splits them: the fair priority-only variant) and p3-priority-only (no slicing at
all: a big array lands on one server).
Settings: p3kv and each baseline run at their best setting for the point where --best (results/tuning/best.json,
written by `python -m benchmarks tune`) has one, else at their defaults; every row's baseline_setting column says
which (--untuned: defaults everywhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import aggregate, fidelity_sentence, point_table, shown
from benchmarks.emulation import cfs_bandwidth, cpu_limit, emulated_cluster, link_shaping, run_guard
from benchmarks.paths import RESULTS, ROOT  # noqa: F401  (ROOT: the tests' and deploy's)
from benchmarks.suites import baseline_settings
from benchmarks.suites.cluster_args import (  # noqa: F401  (the callers' names: cluster_bench.add_cpu_arguments, ...)
    DEFAULT_HOST_CPUS,
    MODEL_HOST_CPUS,
    add_condition_arguments,
    add_cpu_arguments,
    add_queue_argument,
    add_tcp_argument,
    host_cpus_from_args,
)
from benchmarks.suites.cluster_job import KVSTORES, Point, comm_bound_seconds, model_arrays, model_bytes, run_point  # noqa: F401

LOG = logging.getLogger("cluster_bench")
SYSTEMS = ("p3", "dist_sync", "mxnet-p3", "horovod")
MODELS = ("resnet50_v1", "inceptionv3", "vgg19", "sockeye")
MODEL_ALIASES = {"resnet50": "resnet50_v1"}
COLUMNS = bench_rows.RUN_COLUMNS
BASE_PORT = 9300


@dataclasses.dataclass
class Conditions:
    """How runs may start (run_guard) and what every row records about it."""

    max_busy: float = run_guard.DEFAULT_MAX_BUSY
    max_load: float | None = None
    load_wait: float = 600.0
    force: bool = False
    allow_dirty: bool = False
    seed: int = 0
    smoke: bool = False
    proceed: bool = False  # a busy machine: after load_wait seconds in all (the whole run's), proceed with a warning


def horovod_problem() -> str | None:
    """Why Horovod cannot run here, or None."""
    check = subprocess.run([sys.executable, "-c", "import horovod.mxnet as h; assert h.gloo_built()"],
                           capture_output=True, text=True, timeout=120, check=False)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        return (f"horovod.mxnet with Gloo does not import ({last}); `make bench-setup` installs Horovod 0.28.1 "
                "with MXNet and Gloo")
    return None


def interleave(points: Sequence[Point], repeats: int, seed: int) -> list[Point]:
    """`repeats` rounds over `points`; in each round, the systems of every comparison (points equal but for
    the system) run one after another in a freshly shuffled order (random.Random(seed))."""
    rng = random.Random(seed)
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group(), []).append(p)
    ordered = []
    for repeat in range(repeats):
        for members in groups.values():
            order = list(members)
            rng.shuffle(order)
            ordered += [dataclasses.replace(p, repeat=repeat, repeats=repeats, order=position)
                        for position, p in enumerate(order)]
    return ordered


def common_columns(conditions: Conditions, commit: str, dirty: bool) -> dict:
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": commit, "git_dirty": dirty,
            "allow_dirty": conditions.allow_dirty, "max_load": conditions.max_load,
            "max_busy_pct": conditions.max_busy, "seed": conditions.seed,
            "smoke": conditions.smoke, "cpus": os.cpu_count(), "python": platform.python_version()}


def run_points(points: Sequence[Point], csv_path: pathlib.Path, conditions: Conditions | None = None, *,
               keep_logs: pathlib.Path | None = None, utilisation_dir: pathlib.Path | None = None,
               live=sys.stdout, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Runs the points in order (see `interleave`), one cluster per (hosts) value, rebuilt only when the host
    count changes; appends every row to `csv_path` as soon as it exists, then calls `on_row` with it. Host 0's
    output goes to `live` (None: to its log only). Raises run_guard.Refused (dirty tree, busy machine) before a
    run that may not start, and before any run cpu_limit.QuotaRefused (a point's CPU quotas do not fit on this
    machine) or cpu_limit.CpuLimitError (CPU limits asked for, no cgroup to put them in)."""
    conditions = conditions or Conditions()
    limited = check_cpu_limits(points)
    commit, dirty = run_guard.check_tree(conditions.allow_dirty)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cluster_bench.") as tmp:
        scratch = keep_logs or pathlib.Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        cluster = None
        waited = 0.0
        try:
            for n, point in enumerate(points):
                limit = max(0.0, conditions.load_wait - waited) if conditions.proceed else conditions.load_wait
                start = run_guard.wait_for_idle(conditions.max_busy, conditions.max_load, limit, conditions.force,
                                                proceed=conditions.proceed)
                waited += start.waited_s
                if cluster is None or cluster.hosts != point.hosts or cluster.threaded_rx != (point.link_rx == "napi"):
                    if cluster is not None:
                        cluster.close()
                    cluster = emulated_cluster.EmulatedCluster(point.hosts, point.bandwidth,
                                                               cpu_groups=limited is not False,
                                                               threaded_rx=point.link_rx == "napi",
                                                               queue_ms=point.link_queue_real_ms,
                                                               burst_ms=point.link_burst_real_ms).start()
                elif (cluster.bandwidth, cluster.queue_ms, cluster.burst_ms) != (
                        point.bandwidth, point.link_queue_real_ms, point.link_burst_real_ms):
                    cluster.set_bandwidth(point.bandwidth, point.link_queue_real_ms, point.link_burst_real_ms)
                transport = (point.tcp_rto_min_real_ms, point.tcp_congestion)
                if (cluster.rto_min_ms, cluster.congestion_control) != transport:
                    cluster.set_transport(*transport)
                if utilisation_dir is not None:
                    utilisation_dir.mkdir(parents=True, exist_ok=True)
                    cluster.start_sampler(str(utilisation_dir / f"{point.model}.{point.kvstore}.{point.hosts}h."
                                              f"{point.bandwidth}.r{point.repeat}.csv"))
                row, iterations = run_point(cluster, point, scratch, BASE_PORT + n, live=live)
                row = {**common_columns(conditions, commit, dirty), "forced": start.forced,
                       "busy_pct_before": round(start.busy_pct, 1), "idle_wait_s": round(start.waited_s, 1),
                       "idle_warning": start.warning, **row}
                if utilisation_dir is not None:
                    cluster.stop_sampler()
                rows.append(row)
                bench_rows.write_run(csv_path, row, iterations)
                if on_row is not None:
                    on_row(row)
        finally:
            if cluster is not None:
                cluster.close()
    return rows


def check_cpu_limits(points: Sequence[Point]) -> bool | None:
    """Refuses (QuotaRefused, CpuLimitError) points whose CPU limits cannot hold here. Returns True when some point
    is limited, None when none is but the hosts' CPU can still be accounted in cgroups, False when it cannot."""
    for p in points:
        if p.cpu_quota is not None:
            cpu_limit.check_fits(p.hosts, p.host_cpus, p.gpu_scale)
            try:
                p.cfs_period_real_us  # noqa: B018  (raises where the dilated period leaves the kernel's range)
            except ValueError as e:
                raise cpu_limit.QuotaRefused(str(e)) from e
    if any(p.cpu_quota is not None for p in points):
        reason = cpu_limit.why_unavailable()
        if reason:
            raise cpu_limit.CpuLimitError(reason)
        return True
    return None if cpu_limit.why_unavailable() is None else False


def summary(rows: Sequence[dict]) -> str:
    """Markdown table of the faithful points in `rows` (see point_table), and how many runs were faithful."""
    judged = fidelity_sentence(rows, include_smoke=True)
    return point_table(aggregate(rows, include_smoke=True)) + "\n" + (f"\n{judged}\n" if judged else "")


def skipped_lines(skipped: dict[str, str] | None) -> str:
    """The summary's closing lines: each system left out, with the reason."""
    return "".join(f"\n- {kv} skipped: {why}\n" for kv, why in (skipped or {}).items())


def csv_summary(csv_path: pathlib.Path, tag: str = "", skipped: dict[str, str] | None = None) -> str:
    """The summary of every run in `csv_path` with this tag, whichever invocation wrote it."""
    rows = [r for r in bench_rows.read_runs(csv_path) if r.get("tag", "") == tag]
    return summary(rows) + skipped_lines(skipped)


def plot_comparison(rows: Sequence[dict], path: pathlib.Path, title: str) -> None:
    """Bar chart of throughput per kvstore (median over all iterations, IQR as error bars), the bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Every run, faithful or not: the figure shows what this invocation measured, and its title says how many
    # runs the fidelity monitors rejected (the summary tables and the README leave those out).
    points = aggregate(rows, include_smoke=True, include_unfaithful=True)
    if not points:
        return
    unfaithful = sum(1 for r in rows if r.get("status") == "ok" and not shown(r))
    if unfaithful:
        title += f" ({unfaithful} of {len(rows)} runs unfaithful: see fidelity_notes)"
    kvs = [p["kvstore"] for p in points]
    values = [p["throughput"] for p in points]
    errors = [[p["throughput"] - p["low"] for p in points], [p["high"] - p["throughput"] for p in points]]
    bound = statistics.median(p["bound_throughput"] for p in points)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    bars = ax.bar(kvs, values, yerr=errors, capsize=4,
                  color=["tab:blue" if kv.startswith("p3") else "tab:gray" for kv in kvs])
    ax.bar_label(bars, fmt="%.1f", label_type="center")
    ax.axhline(bound, color="tab:red", linestyle="--", label=f"physical bound {bound:.1f} (headers included)")
    ax.set_ylabel(f"throughput ({points[0]['unit']}/s, all workers)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def conditions_from_args(args: argparse.Namespace) -> Conditions:
    return Conditions(max_busy=args.max_busy, max_load=args.max_load, load_wait=args.load_wait, force=args.force,
                      allow_dirty=args.allow_dirty, seed=args.seed, smoke=args.smoke)


def checked_bandwidth(p: argparse.ArgumentParser, text: str) -> str | None:
    """--bandwidth as the runners take it: a tc rate, or None for "none" (uncapped links); else p.error."""
    if text.lower() == "none":
        return None
    try:
        emulated_cluster.parse_rate(text)
    except ValueError as e:
        p.error(str(e))
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", default=["resnet50_v1"], help=f"one or more of {', '.join(MODELS)}")
    p.add_argument("--kvstore", nargs="+", default=list(SYSTEMS), choices=list(KVSTORES))
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bandwidth", default="1gbit", help="link rate of every host (tc syntax, e.g. 300mbit, "
                   "10gbit) or 'none' for uncapped links")
    add_queue_argument(p)
    add_tcp_argument(p)
    p.add_argument("--compute", choices=("emulated", "real", "none"), default="emulated",
                   help="emulated: profiled layer times; real: the model on CPU; none: push+pull only")
    p.add_argument("--layout", choices=("colocated", "separate"), default="colocated", help="colocated: one "
                   "server + one worker per host (the paper's); separate: workers on half the hosts, servers on "
                   "the other half")
    p.add_argument("--batch-size", type=int, default=32, help="per worker (sentences for sockeye)")
    p.add_argument("--gpu", default="p100", help="emulated compute: the GPU whose speed the profile assumes")
    p.add_argument("--gpu-scale", type=float, default=1.0, help="emulated compute: its speed factor (0.1: ten "
                   "times slower, matching links ten times slower than the paper's)")
    p.add_argument("--efficiency-factor", type=float, default=1.0, help="emulated compute: multiplies each "
                   "model's calibrated efficiency (sensitivity runs)")
    p.add_argument("--optimizer", choices=("sgd", "none"), default="sgd", help="sgd: momentum 0.9, wd 1e-4 where "
                   "each system runs it; none: servers only sum (transport-only comparison)")
    p.add_argument("--slice-size", type=int, default=None, help="elements per slice for p3 and mxnet-p3 "
                   "(default: each system's own)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    add_cpu_arguments(p)
    add_condition_arguments(p)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    p.add_argument("--log-interval", type=int, default=5, help="iterations between progress lines")
    p.add_argument("--csv", type=pathlib.Path, default=RESULTS / "sweeps" / "cluster.csv")
    p.add_argument("--plot", type=pathlib.Path, help="write a bar chart of the comparison here")
    p.add_argument("--summary", type=pathlib.Path, help="write here the markdown summary of every run in --csv "
                   "with this --tag, all invocations' (the CSV accumulates runs; stdout shows this invocation's)")
    p.add_argument("--utilisation", type=pathlib.Path, help="sample every link's counters every 10 ms into "
                   "this folder (one CSV per run)")
    p.add_argument("--keep-logs", type=pathlib.Path, help="keep every host's output here")
    p.add_argument("--tag", default="", help="a label written in every row (e.g. the sweep's name)")
    baseline_settings.add_arguments(p)
    args = p.parse_args(argv)
    args.model = [MODEL_ALIASES.get(m, m) for m in args.model]
    for m in args.model:
        if m not in MODELS:
            p.error(f"--model {m}: choose from {', '.join(MODELS)}")
    args.bandwidth = checked_bandwidth(p, args.bandwidth)
    if args.hosts < 2:
        p.error("--hosts must be at least 2")
    if args.layout == "separate" and args.hosts % 2:
        p.error("--layout separate needs an even --hosts (half workers, half servers)")
    if args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--iters and --repeats must be >= 1, --warmup >= 0")
    if args.host_cpus is not None and args.host_cpus <= 0:
        p.error("--host-cpus must be positive")
    if args.link_queue_ms <= 0:
        p.error("--link-queue-ms must be positive")
    try:
        cfs_bandwidth.dilated_period_us(args.cfs_period_gpu_ms, args.gpu_scale)
    except ValueError as e:
        p.error(f"--cfs-period-gpu-ms: {e}")
    return args


def points_from_args(args: argparse.Namespace) -> list[Point]:
    base = [Point(model=model, kvstore=kv, hosts=args.hosts, bandwidth=args.bandwidth, compute=args.compute,
                  batch_size=args.batch_size, slice_size=args.slice_size, gpu=args.gpu, gpu_scale=args.gpu_scale,
                  efficiency_factor=args.efficiency_factor, optimizer=args.optimizer, warmup=args.warmup,
                  iters=args.iters, tag=args.tag, timeout=args.timeout, layout=args.layout,
                  log_interval=args.log_interval, host_cpus=host_cpus_from_args(args, model),
                  link_rx=args.link_rx, link_queue_ms=args.link_queue_ms,
                  cfs_period_gpu_ms=args.cfs_period_gpu_ms, tcp_rto_min_gpu_ms=args.tcp_rto_min_gpu_ms or None,
                  tcp_congestion=args.tcp_congestion, thread_cap=args.thread_cap, tcp_trace=args.tcp_trace)
            for model in args.model for kv in args.kvstore]
    return baseline_settings.from_args(interleave(base, args.repeats, args.seed), args)


def congestion_problem(points: Sequence[Point]) -> str | None:
    """Why a congestion control the points ask for cannot run here (the kernel has not loaded it), or None: asked
    before a cluster is built, so that a sweep under CUBIC does not fail at its first route."""
    for algorithm in sorted({p.tcp_congestion for p in points} - {None}):
        try:
            link_shaping.check_congestion_control(algorithm)
        except (ValueError, OSError) as e:  # OSError: a kernel without /proc/sys/net/ipv4 (as --tcp-congestion)
            return str(e)
    return None


def drop_unavailable(points: list[Point]) -> tuple[list[Point], dict[str, str]]:
    """Points whose system cannot run here are left out, with the reason (Horovod is optional)."""
    if not any(p.kvstore == "horovod" for p in points):
        return points, {}
    problem = horovod_problem()
    if problem is None:
        return points, {}
    LOG.warning("skipping horovod: %s", problem)
    return [p for p in points if p.kvstore != "horovod"], {"horovod": problem}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    reason = emulated_cluster.why_unavailable()
    if reason:
        LOG.error("cannot build the emulated cluster: %s", reason)
        return 2
    points, skipped = drop_unavailable(points_from_args(args))
    try:
        rows = run_points(points, args.csv, conditions_from_args(args), keep_logs=args.keep_logs,
                          utilisation_dir=args.utilisation)
    except (run_guard.Refused, cpu_limit.QuotaRefused, cpu_limit.CpuLimitError) as e:
        LOG.error("%s", e)
        return 3
    table = summary(rows) + skipped_lines(skipped)
    sys.stdout.write("\n" + table)
    if args.summary:  # from the whole CSV: a results folder accumulates runs over invocations
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(csv_summary(args.csv, args.tag, skipped))
    if args.plot:
        title = (f"{', '.join(args.model)}: {args.hosts} hosts, {args.bandwidth or 'uncapped'} links, "
                 f"{args.compute} compute" + (f" ({args.gpu} x{args.gpu_scale:g})" if args.compute == "emulated"
                                              else "") + f", optimizer {args.optimizer}, {args.repeats} repeats")
        plot_comparison(rows, args.plot, title)
        LOG.info("wrote %s", args.plot)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
