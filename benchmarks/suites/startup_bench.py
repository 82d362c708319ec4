"""What P3_PRELOAD_MXNET costs and saves: a job's first step and its CPU, servers importing mxnet at start-up or not.

    python -m benchmarks.suites.startup_bench --repeats 5

Each job is `python -m p3kv.launch -n 2 -s 2 -- python -m benchmarks.workloads.startup_worker` on loopback: a Gluon
Trainer
(SGD momentum 0.9, wd 1e-4) on kvstore 'p3', 5 steps. Four conditions: the optimizer on the servers
(update_on_kvstore=True: worker 0 ships it right after the rendezvous and every server must import mxnet to
unpickle it) or on the workers (update_on_kvstore=False: the servers only sum and never need mxnet), times
P3_PRELOAD_MXNET=1 (the default: each server imports mxnet in a background thread as it starts) or 0 (only when an
optimizer arrives). Measured per job: the time from launch to the end of worker 0's first step and to its last
step, the job's wall time, and the CPU time of the whole process tree (getrusage of the waited children).

Statistics: the conditions run in a freshly shuffled order in every repeat, under the run guard (clean tree, idle
machine). Results: results/startup.csv (one row per job) and results/startup.md (median and range per
condition); both rewritten by each invocation.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import pathlib
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.emulation import proc_monitor, run_guard
from benchmarks.paths import RESULTS, ROOT

LOG = logging.getLogger("startup_bench")
CONDITIONS = [(update, preload) for update in ("servers", "workers") for preload in (1, 0)]
COLUMNS = ("timestamp", "git_commit", "git_dirty", "cpus", "repeat", "position", "optimizer_on", "preload_mxnet",
           "status", "imported_s", "first_step_s", "last_step_s", "later_step_s", "wall_s", "cpu_s",
           "busy_pct_before", "forced", "load_1m_before", "load_1m_after")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(update: str, preload: int, steps: int, timeout: float, scratch: pathlib.Path, tag: str) -> dict:
    out, log_path = scratch / f"{tag}.json", scratch / f"{tag}.log"
    command = [sys.executable, "-m", "p3kv.launch", "-n", "2", "-s", "2", "--", sys.executable,
               "-m", "benchmarks.workloads.startup_worker", "--out", str(out), "--steps", str(steps),
               "--update-on-kvstore", "1" if update == "servers" else "0"]
    env = dict(os.environ, P3_PRELOAD_MXNET=str(preload),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    row = {"optimizer_on": update, "preload_mxnet": preload, "load_1m_before": round(os.getloadavg()[0], 2)}
    cpu0, start = children_cpu(), time.perf_counter()
    env["STARTUP_T0"] = repr(time.time())
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            LOG.error("%s did not end within %.0f s; stopping it", tag, timeout)
            proc_monitor.stop_tree(process, set(proc_monitor.descendants(process.pid)))
            code = 124
    row.update(wall_s=round(time.perf_counter() - start, 3), cpu_s=round(children_cpu() - cpu0, 3),
               load_1m_after=round(os.getloadavg()[0], 2))
    if code != 0 or not out.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        LOG.error("%s failed (exit code %s):\n%s", tag, code, "\n".join(tail))
        return {**row, "status": f"failed({code})"}
    result = json.loads(out.read_text())
    row.update(status="ok", **{k: round(result[k], 3) for k in ("imported_s", "first_step_s", "last_step_s",
                                                                 "later_step_s")})
    LOG.info("%s: first step %.2f s after launch, wall %.2f s, CPU %.2f s", tag, row["first_step_s"], row["wall_s"],
             row["cpu_s"])
    return row


def markdown(rows: list[dict], header: str) -> str:
    lines = ["# Server start-up: importing mxnet at start (P3_PRELOAD_MXNET)", "", header, "",
             "| optimizer on | P3_PRELOAD_MXNET | jobs ok | first step after launch, s | job wall, s | job CPU, s |",
             "|---|---|---|---|---|---|"]

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})" if values else "-"

    for update, preload in CONDITIONS:
        ok = [r for r in rows if r["optimizer_on"] == update and r["preload_mxnet"] == preload and r["status"] == "ok"]
        lines.append(f"| {update} | {preload} | {len(ok)} | {cell([r['first_step_s'] for r in ok])} | "
                     f"{cell([r['wall_s'] for r in ok])} | {cell([r['cpu_s'] for r in ok])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seeds the run order")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    run_guard.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 2:
        parser.error("--repeats must be >= 1 and --steps >= 2")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    commit, dirty = tree
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    common = {"timestamp": stamp, "git_commit": commit, "git_dirty": dirty, "cpus": os.cpu_count()}
    shuffler = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="startup_bench.") as scratch:
        for repeat in range(args.repeats):
            order = CONDITIONS[:]
            shuffler.shuffle(order)
            for position, (update, preload) in enumerate(order):
                try:
                    start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
                except run_guard.Refused as e:
                    LOG.error("%s", e)
                    return 2
                row = run_one(update, preload, args.steps, args.timeout, pathlib.Path(scratch),
                              f"{update}.{preload}.{repeat}")
                rows.append({**common, "repeat": repeat, "position": position, "busy_pct_before":
                             round(start.busy_pct, 1), "forced": start.forced, **row})
    args.results_dir.mkdir(parents=True, exist_ok=True)
    with open(args.results_dir / "startup.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    header = (f"{stamp}, commit {commit[:12]}{' (dirty)' if dirty else ''}, {os.cpu_count()} CPUs: 2 workers + 2 "
              f"servers on loopback, {args.steps} steps, {args.repeats} repeats in shuffled order (seed {args.seed}); "
              f"each job started once a 5-second sample showed the CPUs at most {args.max_busy:g}% busy. Median "
              "(min–max) over the repeats; job CPU is every process of the job (launcher, scheduler, servers, "
              "workers).")
    table = markdown(rows, header)
    (args.results_dir / "startup.md").write_text(table)
    sys.stdout.write(table)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
