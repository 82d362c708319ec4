"""Like-for-like kvstore benchmark: p3kv, MXNet dist_sync, MXNet's P3 and Horovod, same work through MXNet's engine.

    python -m benchmarks.suites.kvstore_bench --models resnet50_v1 vgg19 --repeats 3 --warmup 3 --iters 20

Each (repeat, model, system) is one job: `python -m p3kv.launch -n W -s S --kvstore ...` (p3, p3-noopt,
dist_sync, mxnet-p3) or `horovodrun -np W --gloo` (horovod, no servers), running benchmarks/workloads/kvstore_worker.py
on every worker: a pushpull (or allreduce) of every parameter array of the model per iteration, in backward
order with priority -layer, plus the same SGD (momentum 0.9, wd 1e-4, rescale_grad 1/W) wherever each system
runs it (see kvstore_worker.py). p3-noopt is p3kv whose servers only sum, so p3 / p3-noopt is the cost of
the server-side optimizer.

Statistics: the systems run in a freshly shuffled order in every repeat (a small machine drifts); every timed
iteration is kept. Per (model, system) the summary has the median and interquartile range over all timed
iterations of all repeats, the range of the per-run medians, and the ratios of medians against dist_sync and
Horovod (their s/iter over this one's: above 1 is faster). The 1-minute load average is recorded before and
after every job; the benchmark refuses to start on a busy machine (above --max-load) unless --force, which is
recorded in every row. Results: results/kvstore_bench.csv (one row per timed iteration, with every setting,
the commit and the versions), results/kvstore_bench_summary.csv and results/kvstore_bench.md (this
invocation's summary, also printed). Both CSVs are rewritten by each invocation.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import pathlib
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import paths
from benchmarks.emulation import proc_monitor, run_guard
from benchmarks.paths import RESULTS, ROOT, SHAPES_DIR
from benchmarks.workloads import job_env, kvstore_worker

LOG = logging.getLogger("kvstore_bench")
SYSTEMS = kvstore_worker.SYSTEMS
LAUNCHER_KVSTORE = {"p3": "p3", "p3-noopt": "p3", "dist_sync": "dist_sync", "mxnet-p3": "mxnet-p3"}
LABEL = {"p3": "p3kv + SGD (servers)", "p3-noopt": "p3kv, no optimizer (servers only sum)",
         "dist_sync": "MXNet dist_sync + SGD (servers)", "mxnet-p3": "MXNet P3 + SGD (workers)",
         "horovod": "Horovod ring allreduce (Gloo) + SGD (workers)"}
OPTIMIZER_TARGET = 1.20  # p3kv with SGD within 20% of p3kv without

ITERATION_COLUMNS = (
    "timestamp", "git_commit", "git_dirty", "repeat", "position", "model", "system", "status", "exit_code",
    "iteration", "time_s", "workers", "servers", "warmup", "iters", "arrays", "params", "bytes", "optimizer",
    "update_on", "wall_s", "total_peak_rss_mib", "load_1m_before", "load_1m_after", "max_load", "busy_pct_before",
    "max_busy_pct", "forced", "allow_dirty", "cpus", "python", "numpy", "mxnet", "p3kv", "p3kv_path", "horovod", "env",
)
SUMMARY_COLUMNS = (
    "model", "system", "label", "runs_ok", "runs_failed", "iterations", "median_s", "q1_s", "q3_s", "iqr_s",
    "run_median_min_s", "run_median_max_s", "vs_dist_sync", "vs_horovod", "vs_p3_noopt", "load_1m_max",
)


def horovod_problem() -> str | None:
    """Why Horovod cannot run here, or None. Needs horovod.mxnet (built with MXNet and Gloo) and horovodrun."""
    if horovodrun() is None:
        return "horovodrun is not installed (make bench-setup installs Horovod 0.28.1 with MXNet and Gloo)"
    check = subprocess.run([sys.executable, "-c", "import horovod.mxnet as h; assert h.gloo_built()"],
                           capture_output=True, text=True, timeout=120, check=False)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        return f"horovod.mxnet with Gloo does not import ({last}); make bench-setup installs it"
    return None


def horovodrun() -> str | None:
    beside = pathlib.Path(sys.executable).parent / "horovodrun"
    return str(beside) if beside.exists() else shutil.which("horovodrun")


def job_command(args: argparse.Namespace, model: str, system: str, out: pathlib.Path,
                weights: pathlib.Path | None) -> list[str]:
    worker = [*paths.python_module("benchmarks.workloads.kvstore_worker"), "--system", system, "--model", model,
              "--shapes-dir", str(args.shapes_dir), "--warmup", str(args.warmup), "--iters", str(args.iters),
              "--seed", str(args.seed), "--out", str(out)]
    if args.max_keys:
        worker += ["--max-keys", str(args.max_keys)]
    if weights is not None:
        worker += ["--save-weights", str(weights)]
    if system == "horovod":
        return [horovodrun(), "-np", str(args.workers), "-H", f"localhost:{args.workers}", "--gloo",
                "--network-interface", "lo", *worker]
    return [sys.executable, "-m", "p3kv.launch", "-n", str(args.workers), "-s", str(args.servers),
            "--kvstore", LAUNCHER_KVSTORE[system], "--timeout", str(args.timeout), "--", *worker]




def stop_job(process: subprocess.Popen, monitor: proc_monitor.TreeMonitor) -> None:
    pids = set(proc_monitor.descendants(process.pid)) | monitor.known_pids()
    proc_monitor.stop_tree(process, pids)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the job's own session (start_new_session)
    except ProcessLookupError:
        pass


def run_one(args: argparse.Namespace, model: str, system: str, repeat: int, scratch: pathlib.Path) -> list[dict]:
    """One job; its rows (one per timed iteration, or one row saying why it failed)."""
    tag = f"{model}.{system}.{repeat}"
    out, log_path = scratch / f"{tag}.jsonl", scratch / f"{tag}.log"
    weights = args.save_weights / f"{tag}.npz" if args.save_weights else None
    command = job_command(args, model, system, out, weights)
    LOG.info("repeat %d: %s, %s (%d workers%s)", repeat, model, system, args.workers,
             "" if system == "horovod" else f", {args.servers} servers")
    base = {"repeat": repeat, "model": model, "system": system, "workers": args.workers,
            "servers": 0 if system == "horovod" else args.servers, "warmup": args.warmup, "iters": args.iters,
            "load_1m_before": round(os.getloadavg()[0], 2)}
    start = time.perf_counter()
    with log_path.open("w") as log:
        env = job_env.job_environment(system, args.slice_size)
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        monitor = proc_monitor.TreeMonitor(process.pid).start()
        try:
            exit_code = process.wait(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            LOG.error("%s did not end within %s s; stopping it", tag, args.timeout + 60)
            stop_job(process, monitor)
            exit_code = 124
        finally:
            peaks = monitor.stop()
    base.update(wall_s=round(time.perf_counter() - start, 2), exit_code=exit_code,
                load_1m_after=round(os.getloadavg()[0], 2), total_peak_rss_mib=round(peaks.total))
    lines = out.read_text().splitlines() if out.exists() else []
    if exit_code != 0 or not lines:
        tail = log_path.read_text(errors="replace").splitlines()[-args.log_tail:]
        LOG.error("%s failed (exit code %s); last lines of its output:\n%s", tag, exit_code, "\n".join(tail))
        return [{**base, "status": f"failed({exit_code})"}]
    result = json.loads(lines[-1])
    base.update(status="ok", **{k: result[k] for k in ("arrays", "params", "bytes", "optimizer", "update_on")},
                **{k: result["versions"].get(k) for k in ("python", "numpy", "mxnet", "p3kv", "p3kv_path", "horovod")},
                env=json.dumps({k: v for k, v in result["env"].items() if v is not None}, sort_keys=True))
    times = result["times_s"]
    LOG.info("%s: median %.4f s/iter over %d iterations, wall %.0f s, load %.2f -> %.2f", tag,
             statistics.median(times), len(times), base["wall_s"], base["load_1m_before"], base["load_1m_after"])
    return [{**base, "iteration": i, "time_s": round(t, 6)} for i, t in enumerate(times)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(rows: list[dict], systems: list[str], models: list[str]) -> list[dict]:
    out = []
    for model in models:
        medians = {}
        for system in systems:
            mine = [r for r in rows if r["model"] == model and r["system"] == system]
            ok = [r for r in mine if r["status"] == "ok"]
            runs_ok = sorted({r["repeat"] for r in ok})
            entry = {"model": model, "system": system, "label": LABEL[system], "runs_ok": len(runs_ok),
                     "runs_failed": len({r["repeat"] for r in mine if r["status"] != "ok"}),
                     "iterations": len(ok), "load_1m_max": max((max(r["load_1m_before"], r["load_1m_after"])
                                                                for r in mine), default=None)}
            if ok:
                times = [r["time_s"] for r in ok]
                q1, median, q3 = quartiles(times)
                run_medians = [statistics.median([r["time_s"] for r in ok if r["repeat"] == k]) for k in runs_ok]
                entry.update(median_s=median, q1_s=q1, q3_s=q3, iqr_s=q3 - q1, run_median_min_s=min(run_medians),
                             run_median_max_s=max(run_medians))
                medians[system] = median
            out.append(entry)
        for entry in out[-len(systems):]:
            mine = medians.get(entry["system"])
            for column, other in (("vs_dist_sync", "dist_sync"), ("vs_horovod", "horovod"),
                                  ("vs_p3_noopt", "p3-noopt")):
                if mine and other in medians:
                    entry[column] = medians[other] / mine
    return out


def _f(value, digits: int = 4) -> str:
    return "-" if value is None or value == "" else f"{value:.{digits}f}"


def markdown(summary: list[dict], settings: str, skipped: dict[str, str]) -> str:
    lines = ["# Like-for-like kvstore benchmark (benchmarks/suites/kvstore_bench.py)", "", settings, "",
             "s/iter: median over every timed iteration of every repeat; IQR = q3 - q1; runs = range of the "
             "per-run medians. vs X = X's median / this median (above 1: faster than X).", "",
             "| model | system | s/iter (median) | IQR | runs | vs dist_sync | vs Horovod | iterations |",
             "|---|---|---|---|---|---|---|---|"]
    for e in summary:
        if not e.get("median_s"):
            lines.append(f"| {e['model']} | {e['label']} | failed ({e['runs_failed']} runs) | | | | | 0 |")
            continue
        vs_d = _f(e.get("vs_dist_sync"), 2) + "×" if e.get("vs_dist_sync") else "-"
        vs_h = _f(e.get("vs_horovod"), 2) + "×" if e.get("vs_horovod") else "-"
        lines.append(f"| {e['model']} | {e['label']} | {_f(e['median_s'])} | {_f(e['iqr_s'])} | "
                     f"{_f(e['run_median_min_s'])}–{_f(e['run_median_max_s'])} | {vs_d} | {vs_h} | "
                     f"{e['iterations']} |")
    lines.append("")
    for e in summary:
        if e["system"] == "p3" and e.get("vs_p3_noopt"):
            ratio = 1 / e["vs_p3_noopt"]
            verdict = "meets" if ratio <= OPTIMIZER_TARGET else "misses"
            lines.append(f"- {e['model']}: p3kv + SGD takes {ratio:.2f}× the time of p3kv without an optimizer "
                         f"({verdict} the target of at most {OPTIMIZER_TARGET:.2f}×).")
    for system, why in skipped.items():
        lines.append(f"- {system} skipped: {why}")
    return "\n".join(lines) + "\n"


def write_csv(path: pathlib.Path, rows: list[dict], columns: tuple[str, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50_v1", "vgg19"])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the run order and the gradients")
    parser.add_argument("--slice-size", type=int, default=None,
                        help="elements per slice (p3kv) and per message (MXNet's P3); default: theirs (50,000 and "
                        "40,000). Results then go to results/kvstore_bench_slice<N>/ (the simulator fits on it)")
    parser.add_argument("--max-keys", type=int, default=None, help="only the first N arrays of each model (tests)")
    parser.add_argument("--shapes-dir", type=pathlib.Path, default=SHAPES_DIR)
    run_guard.add_arguments(parser)
    parser.add_argument("--require-horovod", action="store_true",
                        help="fail when Horovod cannot run here (default: skip it with a message, also in the table)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--save-weights", type=pathlib.Path, default=None,
                        help="worker 0 of each job writes its final weights to DIR/<model>.<system>.<repeat>.npz")
    parser.add_argument("--keep-logs", type=pathlib.Path, default=None, help="keep each job's output here")
    parser.add_argument("--log-tail", type=int, default=40, help="output lines shown when a job fails")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--iters and --repeats must be >= 1, --warmup >= 0")
    if args.slice_size is not None:
        if args.slice_size < 1:
            parser.error("--slice-size must be >= 1")
        if args.results_dir == RESULTS:
            args.results_dir = RESULTS / f"kvstore_bench_slice{args.slice_size}"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    commit, dirty = tree
    systems = list(dict.fromkeys(args.systems))
    skipped: dict[str, str] = {}
    if "horovod" in systems:
        problem = horovod_problem()
        if problem is not None:
            if args.require_horovod:
                LOG.error("horovod: %s", problem)
                return 2
            LOG.warning("skipping horovod: %s", problem)
            skipped["horovod"] = problem
            systems.remove("horovod")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    common = {"timestamp": stamp, "git_commit": commit, "git_dirty": dirty, "allow_dirty": args.allow_dirty,
              "cpus": os.cpu_count(), "max_load": args.max_load, "max_busy_pct": args.max_busy}
    shuffler = random.Random(args.seed)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvstore_bench.") as tmp:
        scratch = args.keep_logs or pathlib.Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        if args.save_weights:
            args.save_weights.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):
            for model in args.models:
                order = systems[:]
                shuffler.shuffle(order)
                LOG.info("repeat %d, %s: order %s", repeat, model, ", ".join(order))
                for position, system in enumerate(order):
                    try:
                        start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
                    except run_guard.Refused as e:
                        LOG.error("%s", e)
                        return 2
                    started = {"forced": start.forced, "busy_pct_before": round(start.busy_pct, 1)}
                    for row in run_one(args, model, system, repeat, scratch):
                        rows.append({**common, **started, "position": position, **row})
    summary = summarize(rows, systems, args.models)
    write_csv(args.results_dir / "kvstore_bench.csv", rows, ITERATION_COLUMNS)
    write_csv(args.results_dir / "kvstore_bench_summary.csv", summary, SUMMARY_COLUMNS)
    settings = (f"{stamp}, commit {commit[:12]}{' (dirty)' if dirty else ''}: {args.workers} workers, "
                f"{args.servers} servers (Horovod: none) on loopback, {args.warmup} warm-up + {args.iters} timed "
                f"iterations, {args.repeats} repeats in shuffled order (seed {args.seed})"
                f"{f', slices of {args.slice_size:,} elements' if args.slice_size else ''}"
                f"{f', first {args.max_keys} arrays only' if args.max_keys else ''}, {os.cpu_count()} CPUs, "
                f"Python {platform.python_version()}. Each job started once a 5-second sample showed the CPUs "
                f"at most {args.max_busy:g}% busy (highest: {max((r['busy_pct_before'] for r in rows), default=0):.0f}%"
                f"{'; some jobs forced on a busy machine' if any(r['forced'] for r in rows) else ''}); each job's "
                "CPU sample and load before/after are in kvstore_bench.csv. Optimizer everywhere but p3-noopt: SGD "
                "momentum 0.9, wd 1e-4, "
                "rescale_grad 1/W.")
    table = markdown(summary, settings, skipped)
    (args.results_dir / "kvstore_bench.md").write_text(table)
    sys.stdout.write(table)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
