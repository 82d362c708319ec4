"""Throughput of p3kv vs MXNet dist_sync vs MXNet's built-in P3 on an emulated cluster (runs as root).

    python benchmarks/cluster_bench.py --model resnet50_v1 --hosts 4 --bandwidth 1gbit \\
        --kvstore p3 dist_sync mxnet-p3 --compute emulated --gpu-scale 0.1 --iters 20

Builds N hosts as network namespaces on a bridge with every link capped at --bandwidth
(benchmarks/emulated_cluster.py) and runs, for every --kvstore in turn, the paper's layout: one server and one
worker per host, the scheduler on host 0, each host's processes started by its own `python -m p3kv.launch`
inside its namespace. Workers run benchmarks/cluster_worker.py (see there for the two compute modes).

Throughput is samples/s (tokens/s for Sockeye) summed over workers: each worker's batch over its median
iteration time after --warmup. Beside it, the physical bound: max(compute time per iteration, the time the
iteration's bytes need on the busiest capped link); with one server per host each link carries
2 (N-1)/N of the model each way per iteration. Host 0's output is printed live (a progress line every
--log-interval iterations); each result is appended to --csv with every setting and the software versions.
Kvstores: p3, dist_sync, mxnet-p3, and the ablations p3-slicing-only (P3_PRIORITY=none: slices sent first come
first served) and p3-priority-only (no slicing: one slice per array).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pathlib
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import bench_report
import emulated_cluster
import proc_monitor

LOG = logging.getLogger("cluster_bench")
HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
# What --kvstore names: (the launcher's --kvstore, extra environment).
KVSTORES = {
    "p3": ("p3", {}),
    "dist_sync": ("dist_sync", {}),
    "mxnet-p3": ("mxnet-p3", {}),
    "p3-slicing-only": ("p3", {"P3_PRIORITY": "none"}),
    "p3-priority-only": ("p3", {"P3_SLICE_SIZE": str(1 << 30)}),
}
MODELS = ("resnet50_v1", "inceptionv3", "vgg19", "sockeye")
MODEL_ALIASES = {"resnet50": "resnet50_v1"}
COLUMNS = (
    "timestamp", "tag", "model", "kvstore", "compute", "status", "exit_code", "hosts", "layout", "workers",
    "servers",
    "bandwidth", "bandwidth_bps", "batch_size", "slice_size", "gpu", "gpu_scale", "warmup", "iters", "repeat",
    "unit", "samples_per_batch", "median_s", "throughput", "compute_s", "comm_bound_s", "bound_s",
    "bound_throughput", "pct_of_bound", "model_bytes", "wall_s", "load_1m_before", "git_commit", "git_dirty",
    "cpus", "python", "mxnet", "p3kv", "gluoncv", "sockeye",
)
BASE_PORT = 9300


@dataclasses.dataclass
class Point:
    """One measurement's settings."""

    model: str
    kvstore: str
    hosts: int = 4
    bandwidth: str | None = "1gbit"
    compute: str = "emulated"
    batch_size: int = 32
    slice_size: int | None = None
    gpu: str = "p100"
    gpu_scale: float = 1.0
    warmup: int = 3
    iters: int = 20
    repeat: int = 0
    tag: str = ""
    timeout: float = 900.0
    log_interval: int = 5
    layout: str = "colocated"  # or "separate": workers on the first half of the hosts, servers on the rest

    @property
    def workers(self) -> int:
        return self.hosts if self.layout == "colocated" else self.hosts // 2

    @property
    def servers(self) -> int:
        return self.workers

    def roles(self, host: int) -> tuple[int, int]:
        """(workers, servers) on `host`."""
        if self.layout == "colocated":
            return 1, 1
        return (1, 0) if host < self.workers else (0, 1)


def git_state() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    return git("rev-parse", "HEAD") or "none", bool(git("status", "--porcelain", "--untracked-files=no"))


def model_bytes(model: str) -> int:
    description = json.loads((HERE / "shapes" / f"{model}.json").read_text())
    itemsize = {"float32": 4, "float16": 2, "float64": 8}
    total = 0
    for p in description["params"]:
        n = 1
        for d in p["shape"]:
            n *= d
        total += n * itemsize.get(p["dtype"], 4)
    return total


def comm_bound_seconds(bytes_per_model: int, hosts: int, rate_bps: float | None, layout: str = "colocated") -> float:
    """Time one iteration's traffic needs on the busiest link (each direction). Colocated (one server + one
    worker per host): the worker sends the (N-1)/N of its gradient owned by other hosts' servers, and the host's
    server sends its 1/N of the model to the N-1 other workers; the same amounts come in. Separate (W workers,
    W servers): a worker's link carries the whole model each way, and so does a server's (W x 1/W)."""
    if rate_bps is None or hosts < 2:
        return 0.0
    share = 2 * (hosts - 1) / hosts if layout == "colocated" else 1.0
    return share * bytes_per_model * 8 / rate_bps


def _worker_argv(point: Point, out: pathlib.Path) -> list[str]:
    return [sys.executable, str(HERE / "cluster_worker.py"), "--model", point.model, "--compute", point.compute,
            "--batch-size", str(point.batch_size), "--warmup", str(point.warmup), "--iters", str(point.iters),
            "--gpu", point.gpu, "--gpu-scale", str(point.gpu_scale), "--log-interval", str(point.log_interval),
            "--out", str(out)]


def _environment(point: Point, extra: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(HERE), env.get("PYTHONPATH", "")) if p)
    env["P3_SECRET"] = secrets.token_hex(32)  # one per job, the same on every host
    # Hosts share 2 cores: one compute thread per process (the real-compute mode's fairness).
    env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", PYTHONUNBUFFERED="1")
    if point.slice_size:
        env["P3_SLICE_SIZE"] = str(point.slice_size)
        env["MXNET_KVSTORE_SLICE_THRESHOLD"] = str(point.slice_size)  # MXNet's P3 (worker side)
    env.update(extra)
    return env


def _forward(stream, prefix: str, sink, log_file) -> None:
    for line in stream:
        log_file.write(line)
        if sink is not None:
            sink.write(prefix + line)
            sink.flush()


def run_point(cluster: emulated_cluster.EmulatedCluster, point: Point, scratch: pathlib.Path, port: int,
              live=sys.stdout) -> dict:
    """Runs one job across the cluster's hosts; returns its CSV row."""
    launcher_kvstore, extra = KVSTORES[point.kvstore]
    hosts = cluster.hosts
    name = f"{point.model}.{point.kvstore}.{point.bandwidth}.{hosts}h.{point.repeat}.{port}"
    out = scratch / name
    env = _environment(point, extra)
    LOG.info("%s on %s: %d hosts, %s, %s compute, batch %d", point.model, point.kvstore, hosts,
             point.bandwidth or "uncapped", point.compute, point.batch_size)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    procs, threads, logs = [], [], []
    for i in range(hosts):
        local_workers, local_servers = point.roles(i)
        argv = [sys.executable, "-m", "p3kv.launch", "-n", str(point.workers), "-s", str(point.servers),
                "--kvstore", launcher_kvstore, "--host", cluster.address(i), "--port", str(port), "--local-workers",
                str(local_workers), "--local-servers", str(local_servers), "--timeout", str(point.timeout)]
        if i:
            argv += ["--no-scheduler", "--root", cluster.address(0)]
        argv += ["--", *_worker_argv(point, out)]
        log = open(scratch / f"{name}.host{i}.log", "w")
        logs.append(log)
        proc = cluster.popen(i, argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        procs.append(proc)
        thread = threading.Thread(target=_forward, args=(proc.stdout, f"[host{i}] ", live if i == 0 else None, log),
                                  daemon=True)
        thread.start()
        threads.append(thread)
    def results_complete() -> bool:
        return len(list(scratch.glob(f"{name}.rank*.json"))) == point.workers

    exit_code = _wait_all(procs, point.timeout + 60, results_complete)
    for thread in threads:
        thread.join(timeout=10)
    for log in logs:
        log.close()
    wall = time.perf_counter() - start
    row = {"model": point.model, "kvstore": point.kvstore, "compute": point.compute, "hosts": hosts,
           "workers": point.workers, "servers": point.servers, "layout": point.layout,
           "bandwidth": point.bandwidth or "uncapped",
           "bandwidth_bps": cluster.rate_bps or "", "batch_size": point.batch_size,
           "slice_size": point.slice_size or "", "gpu": point.gpu if point.compute == "emulated" else "",
           "gpu_scale": point.gpu_scale if point.compute == "emulated" else "", "warmup": point.warmup,
           "iters": point.iters, "repeat": point.repeat, "tag": point.tag, "exit_code": exit_code,
           "wall_s": round(wall, 1), "load_1m_before": round(load_before, 2)}
    results = [json.loads(p.read_text()) for p in sorted(scratch.glob(f"{name}.rank*.json"))]
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
        row["status"] = f"failed({exit_code})"
        return row
    first = next(r for r in results if r["rank"] == 0)
    nbytes = model_bytes(point.model)
    comm = comm_bound_seconds(nbytes, hosts, cluster.rate_bps, point.layout)
    compute = statistics.median(r["compute_s"] for r in results)
    bound = max(compute, comm)
    throughput = sum(r["samples_per_batch"] / r["median_s"] for r in results)
    bound_throughput = point.workers * first["samples_per_batch"] / bound if bound else float("inf")
    row.update(status="ok", unit=first["unit"], samples_per_batch=first["samples_per_batch"],
               median_s=round(first["median_s"], 4), throughput=round(throughput, 2),
               compute_s=round(compute, 4), comm_bound_s=round(comm, 4), bound_s=round(bound, 4),
               bound_throughput=round(bound_throughput, 2),
               pct_of_bound=round(100 * throughput / bound_throughput, 1) if bound else "",
               model_bytes=nbytes, **{k: v for k, v in first["versions"].items() if k in COLUMNS})
    LOG.info("%s on %s: %.1f %s/s (bound %.1f, %.0f%%), median %.3f s/iter, compute %.3f s, link %.3f s",
             point.model, point.kvstore, throughput, first["unit"], bound_throughput, row["pct_of_bound"] or 0,
             first["median_s"], compute, comm)
    return row


SHUTDOWN_GRACE = 60.0  # seconds the hosts get to end the job once every worker has reported


def _wait_all(procs: list[subprocess.Popen], timeout: float, results_complete) -> int:
    """Waits for every host's launcher; the first failure stops the others, and so does a job that has not
    ended SHUTDOWN_GRACE seconds after every worker reported. Returns the job's exit code."""
    deadline = time.monotonic() + timeout
    code = 0
    while any(p.poll() is None for p in procs):
        failed = [p for p in procs if p.returncode not in (None, 0)]
        if results_complete():
            deadline = min(deadline, time.monotonic() + SHUTDOWN_GRACE)
        if failed or time.monotonic() > deadline:
            code = failed[0].returncode if failed else 124
            for p in procs:
                if p.poll() is None:
                    proc_monitor.stop_tree(p, set(proc_monitor.descendants(p.pid)))
            break
        time.sleep(0.2)
    for p in procs:
        p.wait()
    return code or next((p.returncode for p in procs if p.returncode), 0)


def common_columns() -> dict:
    commit, dirty = git_state()
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": commit, "git_dirty": dirty,
            "cpus": os.cpu_count(), "python": platform.python_version()}


def run_points(points: Sequence[Point], csv_path: pathlib.Path, *, keep_logs: pathlib.Path | None = None,
               utilisation_dir: pathlib.Path | None = None) -> list[dict]:
    """Runs the points in order, one cluster per (hosts) value, rebuilt only when the host count changes;
    appends every row to `csv_path` as soon as it exists."""
    rows = []
    common = common_columns()
    with tempfile.TemporaryDirectory(prefix="cluster_bench.") as tmp:
        scratch = keep_logs or pathlib.Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        cluster = None
        try:
            for n, point in enumerate(points):
                if cluster is None or cluster.hosts != point.hosts:
                    if cluster is not None:
                        cluster.close()
                    cluster = emulated_cluster.EmulatedCluster(point.hosts, point.bandwidth).start()
                elif cluster.bandwidth != point.bandwidth:
                    cluster.set_bandwidth(point.bandwidth)
                if utilisation_dir is not None:
                    utilisation_dir.mkdir(parents=True, exist_ok=True)
                    cluster.start_sampler(str(utilisation_dir / f"{point.model}.{point.kvstore}.{point.hosts}h."
                                              f"{point.bandwidth}.csv"))
                row = {**common, **run_point(cluster, point, scratch, BASE_PORT + n)}
                if utilisation_dir is not None:
                    cluster.stop_sampler()
                rows.append(row)
                bench_report.append_csv(csv_path, [row], COLUMNS)
        finally:
            if cluster is not None:
                cluster.close()
    return rows


def summary(rows: Sequence[dict]) -> str:
    """Markdown table: throughput per kvstore, the bound and the speedups over the two MXNet peers."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["model"], r["hosts"], r["bandwidth"], r["compute"], r["batch_size"],
                               r.get("layout", ""), r["slice_size"]), []).append(r)
    lines = ["| model | hosts | bandwidth | compute | slice | kvstore | throughput | % of bound | vs dist_sync | "
             "vs mxnet-p3 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, hosts, bandwidth, compute, _, _, slice_size), group in groups.items():
        by_kv: dict[str, list[float]] = {}
        for r in group:
            by_kv.setdefault(r["kvstore"], []).append(float(r["throughput"]))
        median = {k: statistics.median(v) for k, v in by_kv.items()}
        bound = statistics.median(float(r["bound_throughput"]) for r in group)
        unit = group[0]["unit"]
        for kv, value in median.items():
            vs = [f"{value / median[peer]:.2f}x" if peer in median and peer != kv else ""
                  for peer in ("dist_sync", "mxnet-p3")]
            lines.append(f"| {model} | {hosts} | {bandwidth} | {compute} | {slice_size or 'default'} | {kv} | "
                         f"{value:.1f} {unit}/s | "
                         f"{100 * value / bound:.0f}% of {bound:.1f} | {vs[0]} | {vs[1]} |")
    return "\n".join(lines) + "\n"


def plot_comparison(rows: Sequence[dict], path: pathlib.Path, title: str) -> None:
    """Bar chart of throughput per kvstore with the physical bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return
    kvs = list(dict.fromkeys(r["kvstore"] for r in ok))
    values = [statistics.median(float(r["throughput"]) for r in ok if r["kvstore"] == kv) for kv in kvs]
    bound = statistics.median(float(r["bound_throughput"]) for r in ok)
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(kvs, values, color=["tab:blue" if kv.startswith("p3") else "tab:gray" for kv in kvs])
    ax.bar_label(bars, fmt="%.1f")
    ax.axhline(bound, color="tab:red", linestyle="--", label=f"physical bound {bound:.1f}")
    ax.set_ylabel(f"throughput ({ok[0]['unit']}/s, all workers)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", default=["resnet50_v1"], help=f"one or more of {', '.join(MODELS)}")
    p.add_argument("--kvstore", nargs="+", default=["p3", "dist_sync", "mxnet-p3"], choices=list(KVSTORES))
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bandwidth", default="1gbit", help="link rate of every host (tc syntax, e.g. 300mbit, "
                   "10gbit) or 'none' for uncapped links")
    p.add_argument("--compute", choices=("emulated", "real", "none"), default="emulated",
                   help="emulated: profiled layer times; real: the model on CPU; none: push+pull only")
    p.add_argument("--layout", choices=("colocated", "separate"), default="colocated", help="colocated: one "
                   "server + one worker per host (the paper's); separate: workers on half the hosts, servers on "
                   "the other half")
    p.add_argument("--batch-size", type=int, default=32, help="per worker (sentences for sockeye)")
    p.add_argument("--gpu", default="p100", help="emulated compute: the GPU whose speed the profile assumes")
    p.add_argument("--gpu-scale", type=float, default=1.0, help="emulated compute: its speed factor (0.1: ten "
                   "times slower, matching links ten times slower than the paper's)")
    p.add_argument("--slice-size", type=int, default=None, help="elements per slice for p3 and mxnet-p3 "
                   "(default: each system's own)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1, help="rounds over the kvstores (order rotated each round)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    p.add_argument("--log-interval", type=int, default=5, help="iterations between progress lines")
    p.add_argument("--csv", type=pathlib.Path, default=RESULTS / "cluster.csv")
    p.add_argument("--plot", type=pathlib.Path, help="write a bar chart of the comparison here")
    p.add_argument("--summary", type=pathlib.Path, help="write the markdown summary here")
    p.add_argument("--utilisation", type=pathlib.Path, help="sample every link's counters every 10 ms into "
                   "this folder (one CSV per run)")
    p.add_argument("--keep-logs", type=pathlib.Path, help="keep every host's output here")
    p.add_argument("--tag", default="", help="a label written in every row (e.g. the sweep's name)")
    args = p.parse_args(argv)
    args.model = [MODEL_ALIASES.get(m, m) for m in args.model]
    for m in args.model:
        if m not in MODELS:
            p.error(f"--model {m}: choose from {', '.join(MODELS)}")
    if args.bandwidth.lower() == "none":
        args.bandwidth = None
    else:
        try:
            emulated_cluster.parse_rate(args.bandwidth)
        except ValueError as e:
            p.error(str(e))
    if args.hosts < 2:
        p.error("--hosts must be at least 2")
    if args.layout == "separate" and args.hosts % 2:
        p.error("--layout separate needs an even --hosts (half workers, half servers)")
    return args


def points_from_args(args: argparse.Namespace) -> list[Point]:
    points = []
    for repeat in range(args.repeats):
        shift = repeat % len(args.kvstore)
        for model in args.model:
            for kv in args.kvstore[shift:] + args.kvstore[:shift]:
                points.append(Point(model=model, kvstore=kv, hosts=args.hosts, bandwidth=args.bandwidth,
                                    compute=args.compute, batch_size=args.batch_size, slice_size=args.slice_size,
                                    gpu=args.gpu, gpu_scale=args.gpu_scale, warmup=args.warmup, iters=args.iters,
                                    repeat=repeat, tag=args.tag, timeout=args.timeout, layout=args.layout,
                                    log_interval=args.log_interval))
    return points


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    reason = emulated_cluster.why_unavailable()
    if reason:
        LOG.error("cannot build the emulated cluster: %s", reason)
        return 2
    rows = run_points(points_from_args(args), args.csv, keep_logs=args.keep_logs, utilisation_dir=args.utilisation)
    table = summary(rows)
    sys.stdout.write("\n" + table)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(table)
    if args.plot:
        title = (f"{', '.join(args.model)}: {args.hosts} hosts, {args.bandwidth or 'uncapped'} links, "
                 f"{args.compute} compute" + (f" ({args.gpu} x{args.gpu_scale:g})" if args.compute == "emulated"
                                              else ""))
        plot_comparison(rows, args.plot, title)
        LOG.info("wrote %s", args.plot)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
