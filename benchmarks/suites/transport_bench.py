"""Transport benchmark: p3kv's raw P3Worker against MXNet dist_sync and MXNet's P3 kv.pushpull, real model shapes.

    python -m benchmarks.suites.transport_bench --models resnet50_v1 vgg19 --kvstores p3 dist_sync mxnet-p3 \\
        --workers 2 --servers 2 --warmup 2 --iters 10 --repeats 3

Each (repeat, model, kvstore) is one job of ``python -m p3kv.launch`` running benchmarks/workloads/bench_worker.py on
every worker (no model compute: one push + broadcast of every array per iteration, in backward order, priority
-key, no optimizer anywhere).

Not like-for-like: for p3 the worker drives p3kv's raw P3Worker on numpy arrays (no MXNet engine, no kvstore
adapter), while dist_sync and mxnet-p3 go through kv.pushpull and MXNet's engine. Read it as the cost of each
transport, not of each kvstore; benchmarks/suites/kvstore_bench.py runs every system through the engine with the same
optimizer. Every row says which path it measured (column `path`).

Runs are interleaved (every kvstore once per repeat, in rotated order) because a small machine is noisy. Rows
are appended to results/transport.csv; results/transport.md gets this invocation's summary table, which is
also printed. While a job runs, the peak resident memory of its processes is sampled from /proc.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from benchmarks import paths
from benchmarks.analysis import bench_report
from benchmarks.emulation import proc_monitor
from benchmarks.paths import RESULTS, ROOT

LOG = logging.getLogger("transport_bench")
KVSTORES = ("p3", "dist_sync", "mxnet-p3")
MODE_OF = {"p3": "p3kv", "dist_sync": "dist_sync", "mxnet-p3": "mxnet-p3"}


def git_state() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    return git("rev-parse", "HEAD") or "none", bool(git("status", "--porcelain", "--untracked-files=no"))


def worker_command(args: argparse.Namespace, model: str, out: pathlib.Path) -> list[str]:
    command = [*paths.python_module("benchmarks.workloads.bench_worker"), "--model", model,
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--out", str(out)]
    if args.slice_size:
        command += ["--slice-size", str(args.slice_size)]
    return command


def run_one(args: argparse.Namespace, model: str, kvstore: str, repeat: int, scratch: pathlib.Path) -> dict:
    out = scratch / f"{model}.{kvstore}.{repeat}.jsonl"
    log_path = scratch / f"{model}.{kvstore}.{repeat}.log"
    command = [sys.executable, "-m", "p3kv.launch", "-n", str(args.workers), "-s", str(args.servers),
               "--kvstore", kvstore, "--timeout", str(args.timeout), "--", *worker_command(args, model, out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    LOG.info("repeat %d: %s on %s (%d workers, %d servers)", repeat, model, kvstore, args.workers, args.servers)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with log_path.open("w") as log:
        launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        monitor = proc_monitor.TreeMonitor(launcher.pid).start()
        try:
            exit_code = launcher.wait(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            LOG.error("the launcher outlived its own --timeout %s s; stopping the job", args.timeout)
            proc_monitor.stop_tree(launcher, set(proc_monitor.descendants(launcher.pid)) | monitor.known_pids())
            exit_code = 124
        finally:
            peaks = monitor.stop()
    wall = time.perf_counter() - start
    lines = out.read_text().splitlines() if out.exists() else []
    row = {"repeat": repeat, "model": model, "kvstore": kvstore, "path": bench_report.PATH_OF[kvstore],
           "exit_code": exit_code, "wall_s": round(wall, 2),
           "workers": args.workers, "servers": args.servers, "warmup": args.warmup, "iters": args.iters,
           "slice_size": args.slice_size or "", "load_1m_before": round(load_before, 2),
           "load_1m_after": round(os.getloadavg()[0], 2), **_memory_columns(peaks)}
    if exit_code != 0 or not lines:
        tail = log_path.read_text(errors="replace").splitlines()[-args.log_tail:]
        LOG.error("%s on %s failed (exit code %s); last lines of its output:\n%s", model, kvstore, exit_code,
                  "\n".join(tail))
        row["status"] = f"failed({exit_code})"
        return row
    result = json.loads(lines[-1])
    if result["mode"] != MODE_OF[kvstore]:
        raise SystemExit(f"--kvstore {kvstore} ran bench_worker in mode {result['mode']}: launcher and worker "
                         "disagree about P3_BASELINE")
    row.update(status="ok", **{k: result[k] for k in ("arrays", "params", "bytes", "median_s", "mean_s",
                                                      "min_s", "max_s")})
    row["slice_size"] = result["slice_size"] or ""  # what the system used, its default included
    row["goodput_gbit_s"] = result["goodput"]
    row.update({k.lower(): v for k, v in result["env"].items() if k.lower() in bench_report.COLUMNS})
    row.update({k: v for k, v in result["versions"].items() if k in bench_report.COLUMNS})
    LOG.info("%s on %s: %.4f s/iter (median), %.2f Gbit/s, wall %.0f s, server peak RSS %s MiB", model, kvstore,
             result["median_s"], result["goodput"], wall, row["server_peak_rss_mib"])
    return row


def _memory_columns(peaks: proc_monitor.Peaks) -> dict:
    def mib(role: str):
        value = peaks.by_role.get(role)
        return round(value) if value is not None else ""

    return {"server_peak_rss_mib": mib("server"), "worker_peak_rss_mib": mib("worker"),
            "scheduler_peak_rss_mib": mib("scheduler"), "total_peak_rss_mib": round(peaks.total)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50_v1", "vgg19"])
    parser.add_argument("--kvstores", nargs="+", choices=KVSTORES, default=list(KVSTORES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--slice-size", type=int, default=None,
                        help="elements per slice for p3 and mxnet-p3 (default: each system's own default)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--keep-logs", type=pathlib.Path, default=None, help="keep each job's output here")
    parser.add_argument("--log-tail", type=int, default=40, help="output lines shown when a job fails")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    commit, dirty = git_state()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    common = {"timestamp": stamp, "git_commit": commit, "git_dirty": dirty, "cpus": os.cpu_count(),
              "python": platform.python_version()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="transport_bench.") as tmp:
        scratch = args.keep_logs or pathlib.Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):
            order = args.kvstores[repeat % len(args.kvstores):] + args.kvstores[:repeat % len(args.kvstores)]
            for model in args.models:
                for kvstore in order:
                    row = {**common, **run_one(args, model, kvstore, repeat, scratch)}
                    rows.append(row)
                    bench_report.append_csv(args.results_dir / "transport.csv", [row])
    settings = (f"{stamp}, commit {commit[:12]}{' (dirty)' if dirty else ''}: {args.workers} workers, "
                f"{args.servers} servers on loopback, {args.warmup} warmup + {args.iters} timed iterations, "
                f"{args.repeats} repeats, slice size {args.slice_size or 'default'}, {os.cpu_count()} CPUs.")
    table = bench_report.markdown(bench_report.summarize(rows), settings)
    (args.results_dir / "transport.md").write_text(table)
    sys.stdout.write(table)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
