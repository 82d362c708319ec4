"""Time-to-accuracy of p3kv vs MXNet dist_sync vs MXNet dist_async (ASGD) on an emulated cluster (root).

    sudo .venv/bin/python -m benchmarks.suites.accuracy --hosts 4 --bandwidth 100mbit --compute-s 0.3 --iters 150

The paper's accuracy experiment (appendix B.2, Fig. 15: ResNet-110 on CIFAR-10, 4 machines, 1 Gbps; P3 reached
93% top-1 and ASGD 88%, and P3 reached 80% about 6x sooner) in miniature: a Gluon MLP on scikit-learn's bundled
digits (benchmarks/workloads/accuracy_worker.py: fixed seeds, SGD momentum + weight decay on the servers, per-layer
emulated
compute), N hosts as network namespaces with capped links (benchmarks/emulation/emulated_cluster.py), one worker and one
server per host, the scheduler on host 0. Each system runs as its own job; with --repeats the order is shuffled
every round. Rank 0's held-out test accuracy every --eval-every iterations against wall-clock time goes to --csv
(one row per evaluation), a figure with the paper's numbers beside ours to --plot, a table to --summary.

The emulated-cluster runner's machinery, not a copy of it: each round's order of systems is
cluster_bench.interleave's (freshly shuffled per repeat, seeded by --order-seed, position recorded); the run guard
(benchmarks/emulation/run_guard.py) refuses a dirty tree unless --allow-dirty and waits before every job for an idle
machine (--max-busy over a 5-second sample, --max-load if given; up to --load-wait seconds), then refuses unless
--force, all recorded; and every
job also becomes one row of the emulated runner's columns (benchmarks/analysis/bench_rows.py: optimizer, conditions,
versions) in <csv stem>_runs.csv, its workers' timed iterations in <csv stem>_runs_iterations.csv. The table's
seconds per iteration are the median and interquartile range over every iteration of every repeat
(benchmarks/analysis/bench_stats.py), as the emulated runner's tables give them.

p3kv and dist_sync compute the same updates (same data, seeds and optimizer; synchronous), so their curves per
iteration are the same and only their speed differs; dist_async applies each worker's gradient alone on stale
weights, so its curve per iteration differs.
"""


from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks import paths
from benchmarks.analysis import bench_report, bench_rows, bench_stats
from benchmarks.analysis.accuracy_summary import LABELS, plot, summary  # noqa: F401  (LABELS: the tests')
from benchmarks.emulation import emulated_cluster, job_watch, run_guard
from benchmarks.paths import RESULTS, ROOT
from benchmarks.suites import cluster_bench
from benchmarks.suites.cluster_job import Point

LOG = logging.getLogger("accuracy")
SYSTEMS = {"p3": "p3", "dist_sync": "dist_sync", "dist_async": "dist_sync"}  # system -> the launcher's --kvstore


COLUMNS = (
    "timestamp", "tag", "system", "kvstore", "status", "exit_code", "repeat", "hosts", "bandwidth", "bandwidth_bps",
    "dataset", "model", "params", "batch_size", "optimizer", "lr", "momentum", "wd", "seed", "compute_s", "iters",
    "eval_every", "iteration", "time_s", "test_accuracy", "test_loss", "train_loss", "median_iter_s", "train_s",
    "wall_s", "load_1m_before", "load_1m_after", "git_commit", "git_dirty", "cpus", "python", "mxnet", "p3kv",
    "scikit-learn", "run_id", "order", "order_seed", "max_load", "busy_pct_before", "max_busy_pct", "forced",
    "allow_dirty",
)


MODEL = "accuracy-mlp"  # the run rows' model column (bench_rows): the digits MLP of accuracy_worker.py
BASE_PORT = 9500


def worker_argv(args: argparse.Namespace, system: str, out: pathlib.Path) -> list[str]:
    return [*paths.python_module("benchmarks.workloads.accuracy_worker"), "--system", system,
            "--iters", str(args.iters), "--eval-every", str(args.eval_every), "--batch-size", str(args.batch_size),
            "--hidden", str(args.hidden),
            "--layers", str(args.layers), "--lr", str(args.lr), "--momentum", str(args.momentum), "--wd",
            str(args.wd), "--seed", str(args.seed), "--compute-s", str(args.compute_s), "--out", str(out)]


def runs_path(csv_path: pathlib.Path) -> pathlib.Path:
    """Where the per-job rows in the emulated runner's columns go (bench_rows; its iterations beside it)."""
    return csv_path.with_name(f"{csv_path.stem}_runs.csv")


def run_system(cluster: emulated_cluster.EmulatedCluster, args: argparse.Namespace, system: str, repeat: int,
               scratch: pathlib.Path, port: int) -> tuple[list[dict], dict, dict[int, list[float]]]:
    """One job of `system` across the cluster: its curve rows (one per evaluation, or one failed row), its run
    row in bench_rows.RUN_COLUMNS (without the columns common to the invocation) and every rank's timed
    iterations."""
    hosts = cluster.hosts
    name = f"{system}.{repeat}.{port}"
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}.{name}"  # unique across invocations appending to one CSV
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["P3_SECRET"] = secrets.token_hex(32)
    # Hosts share the machine's cores: one compute thread per process.
    env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1", PYTHONUNBUFFERED="1")
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    procs, logs = [], []
    for i in range(hosts):
        argv = [sys.executable, "-m", "p3kv.launch", "-n", str(hosts), "-s", str(hosts), "--kvstore",
                SYSTEMS[system], "--host", cluster.address(i), "--port", str(port), "--local-workers", "1",
                "--local-servers", "1", "--timeout", str(args.timeout)]
        if i:
            argv += ["--no-scheduler", "--root", cluster.address(0)]
        argv += ["--", *worker_argv(args, system, scratch / name)]
        log = open(scratch / f"{name}.host{i}.log", "w")
        logs.append(log)
        procs.append(cluster.popen(i, argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True))
    exit_code = job_watch.wait_all(procs, args.timeout + 60)
    for log in logs:
        log.close()
    base = {"tag": args.tag, "system": system, "kvstore": SYSTEMS[system], "repeat": repeat, "hosts": hosts,
            "bandwidth": cluster.bandwidth or "uncapped", "bandwidth_bps": cluster.rate_bps or "",
            "dataset": "sklearn load_digits (80/20 split)", "model": f"MLP {args.layers}x{args.hidden}",
            "batch_size": args.batch_size, "optimizer": "sgd momentum+wd on servers", "lr": args.lr,
            "momentum": args.momentum, "wd": args.wd, "seed": args.seed, "compute_s": args.compute_s,
            "iters": args.iters, "eval_every": args.eval_every, "exit_code": exit_code,
            "wall_s": round(time.perf_counter() - start, 1), "load_1m_before": round(load_before, 2),
            "load_1m_after": round(os.getloadavg()[0], 2), "run_id": run_id}
    run = {"run_id": run_id, "tag": args.tag, "model": MODEL, "kvstore": system, "compute": "emulated",
           "exit_code": exit_code, "hosts": hosts, "layout": "colocated", "workers": hosts, "servers": hosts,
           "bandwidth": base["bandwidth"], "bandwidth_bps": base["bandwidth_bps"], "batch_size": args.batch_size,
           "optimizer": f"sgd(lr={args.lr},momentum={args.momentum},wd={args.wd})", "update_on": "servers",
           "warmup": 0, "iters": args.iters, "unit": "samples", "samples_per_batch": args.batch_size,
           "compute_s": args.compute_s, "wall_s": base["wall_s"], "load_1m_before": base["load_1m_before"],
           "load_1m_after": base["load_1m_after"]}
    results = [json.loads(p.read_text()) for p in sorted(scratch.glob(f"{name}.rank*.json"))]
    if exit_code != 0 or len(results) != hosts:
        tails = "\n".join(f"--- host {i} ---\n" + "\n".join(
            (scratch / f"{name}.host{i}.log").read_text(errors="replace").splitlines()[-15:]) for i in range(hosts))
        LOG.error("%s failed (exit code %s, %d of %d results); last output:\n%s", system, exit_code, len(results),
                  hosts, tails)
        return [{**base, "status": f"failed({exit_code})"}], {**run, "status": f"failed({exit_code})"}, {}
    first = next(r for r in results if r["rank"] == 0)
    base.update(status="ok", params=first["params"], median_iter_s=round(statistics.median(first["iter_s"]), 4),
                train_s=round(first["train_s"], 2),
                **{k: v for k, v in first["versions"].items() if k in COLUMNS and k != "python"})
    rows = [{**base, **e, "test_accuracy": round(e["test_accuracy"], 4), "test_loss": round(e["test_loss"], 4),
             "train_loss": round(e["train_loss"], 4)} for e in first["evals"]]
    q1, median, q3 = bench_stats.quartiles(first["iter_s"])
    throughput = sum(args.batch_size / statistics.median(r["iter_s"]) for r in results)
    run.update(status="ok", median_s=round(median, 4), q1_s=round(q1, 4), q3_s=round(q3, 4),
               iter_s=first["iter_s"], throughput=round(throughput, 2),
               **{k: v for k, v in first["versions"].items() if k in bench_rows.RUN_COLUMNS and k != "python"})
    LOG.info("%s: final test accuracy %.4f after %d iterations, %.1f s (%.3f s/iter)", system,
             rows[-1]["test_accuracy"], args.iters, first["train_s"], base["median_iter_s"])
    return rows, run, {r["rank"]: r["iter_s"] for r in results}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bandwidth", default="100mbit", help="every host's link rate (tc syntax)")
    p.add_argument("--iters", type=int, default=150, help="iterations per worker")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2, help="hidden layers of the MLP")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compute-s", type=float, default=0.3, help="emulated compute per iteration (seconds)")
    p.add_argument("--repeats", type=int, default=1, help="rounds over the systems, order shuffled each round")
    p.add_argument("--order-seed", type=int, default=0, help="seeds the shuffled order of the systems (recorded; "
                   "--seed seeds the training)")
    run_guard.add_arguments(p)
    p.add_argument("--targets", type=float, nargs="+", default=[0.8, 0.9], help="accuracies for time-to-accuracy")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    p.add_argument("--csv", type=pathlib.Path, default=RESULTS / "accuracy" / "accuracy.csv")
    p.add_argument("--plot", type=pathlib.Path)
    p.add_argument("--summary", type=pathlib.Path)
    p.add_argument("--keep-logs", type=pathlib.Path, help="keep every host's output here")
    p.add_argument("--tag", default="")
    p.add_argument("--report", action="store_true", help="run nothing: write --summary and --plot from --csv")
    args = p.parse_args(argv)
    if args.hosts < 2:
        p.error("--hosts must be at least 2")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        emulated_cluster.parse_rate(args.bandwidth)
    except ValueError as e:
        p.error(str(e))
    return args


def conditions(args: argparse.Namespace) -> cluster_bench.Conditions:
    return cluster_bench.Conditions(max_busy=args.max_busy, max_load=args.max_load, load_wait=args.load_wait,
                                    force=args.force,
                                    allow_dirty=args.allow_dirty, seed=args.order_seed)


def order(args: argparse.Namespace) -> list[Point]:
    """The jobs in the order they run: cluster_bench.interleave's fresh seeded shuffle every repeat (a Point per
    system carries only the ordering here; its `kvstore` is the accuracy system)."""
    base = [Point(model=MODEL, kvstore=system, hosts=args.hosts, bandwidth=args.bandwidth, compute="emulated",
                  batch_size=args.batch_size, warmup=0, iters=args.iters, tag=args.tag, timeout=args.timeout)
            for system in args.systems]
    return cluster_bench.interleave(base, args.repeats, args.order_seed)


def run(args: argparse.Namespace) -> list[dict]:
    """Every system `args.repeats` times on one cluster, in `order`; appends each job's curve rows to args.csv
    and its run row to runs_path(args.csv) as it ends. Raises run_guard.Refused (dirty tree, busy machine)
    before a job that may not start."""
    cond = conditions(args)
    commit, dirty = run_guard.check_tree(cond.allow_dirty)
    rows: list[dict] = []
    port = BASE_PORT
    with tempfile.TemporaryDirectory(prefix="accuracy.") as tmp, \
            emulated_cluster.EmulatedCluster(args.hosts, args.bandwidth) as cluster:
        scratch = args.keep_logs or pathlib.Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        for point in order(args):
            start = run_guard.wait_for_idle(cond.max_busy, cond.max_load, cond.load_wait, cond.force)
            common = cluster_bench.common_columns(cond, commit, dirty)
            curve, job, iterations = run_system(cluster, args, point.kvstore, point.repeat, scratch, port)
            port += 1
            recorded = {"forced": start.forced, "busy_pct_before": round(start.busy_pct, 1), "order": point.order}
            new = [{**common, **recorded, "order_seed": cond.seed, **r} for r in curve]
            bench_report.append_csv(args.csv, new, COLUMNS)
            bench_rows.write_run(runs_path(args.csv), {**common, **recorded, "repeats": point.repeats,
                                                       "repeat": point.repeat, **job}, iterations)
            rows += new
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.report:
        with args.csv.open(newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        reason = emulated_cluster.why_unavailable()
        if reason:
            LOG.error("cannot build the emulated cluster: %s", reason)
            return 2
        try:
            rows = run(args)
        except run_guard.Refused as e:
            LOG.error("%s", e)
            return 3
    ids = {r.get("run_id") for r in rows}
    jobs = [j for j in bench_rows.read_runs(runs_path(args.csv)) if j.get("run_id") in ids]
    table = summary(rows, args.targets, jobs)
    sys.stdout.write("\n" + table)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(table)
    if args.plot:
        first = rows[0]
        title = (f"{first['model']} on digits: {first['hosts']} hosts, {first['bandwidth']} links,\n"
                 f"{float(first['compute_s']):g} s/iter emulated compute, load {first.get('load_1m_before', '?')} "
                 "at start")
        plot(rows, args.plot, title, min(args.targets))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
