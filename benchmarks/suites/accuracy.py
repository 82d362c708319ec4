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
from benchmarks.emulation import emulated_cluster, run_guard
from benchmarks.paths import RESULTS, ROOT
from benchmarks.suites import cluster_bench, cluster_job
from benchmarks.suites.cluster_job import Point

LOG = logging.getLogger("accuracy")
SYSTEMS = {"p3": "p3", "dist_sync": "dist_sync", "dist_async": "dist_sync"}  # system -> the launcher's --kvstore
LABELS = {"p3": "p3kv (P3)", "dist_sync": "MXNet dist_sync", "dist_async": "MXNet dist_async (ASGD)"}
# The paper's Fig. 15 (appendix B.2), as its text states them.
PAPER = {"setting": "ResNet-110 on CIFAR-10, 4 machines, 1 Gbps", "final": {"P3": 93.0, "ASGD": 88.0},
         "to_80_speedup": 6.0}
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
    exit_code = cluster_job.wait_all(procs, args.timeout + 60)
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


def time_to(rows: Sequence[dict], target: float) -> float | None:
    """Seconds until the test accuracy first reached `target` (rows of one run), None if it never did."""
    return next((float(r["time_s"]) for r in rows if float(r["test_accuracy"]) >= target), None)


def runs_of(rows: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            runs.setdefault((r["system"], int(r["repeat"])), []).append(r)
    for run in runs.values():
        run.sort(key=lambda r: int(r["iteration"]))
    return runs


def iteration_spread(jobs: Sequence[dict], system: str) -> bench_stats.Spread | None:
    """Seconds per iteration of `system` over every timed iteration of every repeat (run rows, bench_rows)."""
    times = [bench_rows.iteration_times(j) for j in jobs if j.get("kvstore") == system and j.get("status") == "ok"]
    return bench_stats.spread(times) if any(times) else None


def same_updates_sentence(runs: dict[tuple[str, int], list[dict]]) -> str | None:
    """Whether p3kv and dist_sync drew the same curve in every repeat both ran: they compute the same updates, so
    every evaluation's test accuracy and loss (as the CSV prints them) must match."""
    repeats = sorted(r for s, r in runs if s == "p3" and ("dist_sync", r) in runs)
    if not repeats:
        return None

    def curve(system: str, repeat: int) -> list[tuple[str, str, str]]:
        return [(r["iteration"], r["test_accuracy"], r.get("test_loss")) for r in runs[(system, repeat)]]

    differ = [r for r in repeats if curve("p3", r) != curve("dist_sync", r)]
    evaluations = len(runs[("p3", repeats[0])])
    if not differ:
        return (f"In all {len(repeats)} repeats p3kv and dist_sync gave the same test accuracy and loss (as the CSV "
                f"prints them) at every one of the {evaluations} evaluations: the same updates, as they must.")
    return (f"p3kv and dist_sync drew different curves in repeat(s) {', '.join(map(str, differ))} of "
            f"{len(repeats)}: they should compute the same updates.")


def spread_sentences(runs: dict[tuple[str, int], list[dict]], jobs: Sequence[dict]) -> list[str]:
    """Final accuracy over the repeats per system, and whether p3kv's and dist_sync's iteration IQRs overlap."""
    finals = []
    for system in dict.fromkeys(s for s, _ in runs):
        values = [100 * float(run[-1]["test_accuracy"]) for (s, _), run in runs.items() if s == system]
        span = f"{min(values):.1f}%" if min(values) == max(values) else f"{min(values):.1f}–{max(values):.1f}%"
        finals.append(f"{LABELS.get(system, system)} {span}")
    sentences = [f"Final test accuracy over the repeats: {', '.join(finals)}."]
    p3, ds = iteration_spread(jobs, "p3"), iteration_spread(jobs, "dist_sync")
    if p3 and ds:
        overlap = p3.q1_s <= ds.q3_s and ds.q1_s <= p3.q3_s
        sentences.append(f"Seconds per iteration: p3kv median {p3.median_s:.3f} (IQR {p3.q1_s:.3f}–{p3.q3_s:.3f}), "
                         f"dist_sync {ds.median_s:.3f} (IQR {ds.q1_s:.3f}–{ds.q3_s:.3f}): the IQRs "
                         + ("overlap." if overlap else "do not overlap."))
    return sentences


def summary(rows: Sequence[dict], targets: Sequence[float], jobs: Sequence[dict] = ()) -> str:
    """Markdown table per system: final accuracy, time to each target (medians over repeats), s/iter: median
    and interquartile range over all iterations of all repeats from the run rows `jobs` (bench_stats), or, for
    curves written before those rows existed, the median of each run's recorded median (no IQR)."""
    runs = runs_of(rows)
    systems = list(dict.fromkeys(system for system, _ in runs))
    header = (["system", "runs", "final test accuracy", "median s/iter"] + [f"time to {t:.0%}" for t in targets]
              + ["s/iter IQR"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ttas: dict[str, dict[float, float | None]] = {}
    for system in systems:
        mine = [run for (s, _), run in runs.items() if s == system]
        final = statistics.median(float(run[-1]["test_accuracy"]) for run in mine)
        spread = iteration_spread(jobs, system)
        per_iter = spread.median_s if spread else statistics.median(float(run[0]["median_iter_s"]) for run in mine)
        iqr = f"{spread.q1_s:.3f}–{spread.q3_s:.3f}" if spread else "-"
        ttas[system] = {}
        cells = []
        for t in targets:
            times = [time_to(run, t) for run in mine]
            reached = [x for x in times if x is not None]
            value = statistics.median(reached) if len(reached) == len(times) else None
            ttas[system][t] = value
            cells.append(f"{value:.1f} s" if value is not None else f"not reached ({len(reached)}/{len(times)})")
        lines.append(f"| {LABELS.get(system, system)} | {len(mine)} | {100 * final:.1f}% | {per_iter:.3f} | "
                     + " | ".join(cells) + f" | {iqr} |")
    notes = []
    for t in targets:
        asgd = ttas.get("dist_async", {}).get(t)
        for system in ("p3", "dist_sync"):
            mine = ttas.get(system, {}).get(t)
            if asgd and mine:
                notes.append(f"{LABELS[system]} reached {t:.0%} {asgd / mine:.2f}x as fast as ASGD")
    if not rows:
        return "No runs.\n"
    first = rows[0]
    loads = [float(r[k]) for r in rows for k in ("load_1m_before", "load_1m_after") if r.get(k) not in (None, "")]
    settings = (f"Settings: {first.get('hosts', '?')} hosts (one worker + one server each), "
                f"{first.get('bandwidth', '?')} links, {first.get('model', '?')} ({first.get('params', '?')} "
                f"parameters) on {first.get('dataset', '?')}, batch {first.get('batch_size', '?')} per worker, "
                f"{first.get('optimizer', '?')} (lr {first.get('lr', '?')}, momentum {first.get('momentum', '?')}, "
                f"wd {first.get('wd', '?')}), {first.get('compute_s', '?')} s/iteration emulated compute, "
                f"{first.get('iters', '?')} iterations, test accuracy every {first.get('eval_every', '?')}, seed "
                f"{first.get('seed', '?')}; 1-minute load "
                + (f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?")
                + f" on {first.get('cpus', '?')} cores; commit {str(first.get('git_commit', '?'))[:10]}"
                + (" (uncommitted changes)" if any(str(r.get("git_dirty")) == "True" for r in rows) else "")
                + ("; some runs started on a busy machine (--force)" if any(str(r.get("forced")) == "True"
                                                                           for r in rows) else "") + ".")
    paper = (f"The paper (Fig. 15, {PAPER['setting']}): P3 {PAPER['final']['P3']:.0f}% vs ASGD "
             f"{PAPER['final']['ASGD']:.0f}% final top-1 accuracy; P3 reached 80% about {PAPER['to_80_speedup']:.0f}x "
             "as fast.")
    facts = [f for f in (same_updates_sentence(runs), *spread_sentences(runs, jobs)) if f]
    return (settings + "\n\n" + "\n".join(lines) + "\n\n" + ("; ".join(notes) + ".\n\n" if notes else "")
            + " ".join(facts) + "\n\n" + paper + "\n")


def plot(rows: Sequence[dict], path: pathlib.Path, title: str, target: float) -> None:
    """Test accuracy against time and against iterations, and the paper's Fig. 15 numbers beside ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs_of(rows)
    if not runs:
        return
    colors = {"p3": "tab:blue", "dist_sync": "tab:gray", "dist_async": "tab:orange"}
    fig, (by_time, by_iter, paper) = plt.subplots(1, 3, figsize=(15, 4.2))
    seen = set()
    for (system, _), run in runs.items():
        label = None if system in seen else LABELS.get(system, system)
        seen.add(system)
        xs_t = [float(r["time_s"]) for r in run]
        xs_i = [int(r["iteration"]) for r in run]
        ys = [100 * float(r["test_accuracy"]) for r in run]
        # dist_sync dashed on top: where it equals p3kv (per iteration), both stay visible.
        style, z = ("--", 3) if system == "dist_sync" else ("-", 2)
        by_time.plot(xs_t, ys, style, color=colors.get(system), label=label, zorder=z)
        by_iter.plot(xs_i, ys, style, color=colors.get(system), label=label, zorder=z)
    for ax, xlabel in ((by_time, "wall-clock time (s)"), (by_iter, "iteration (per worker)")):
        ax.axhline(100 * target, color="tab:red", linewidth=0.7, linestyle=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    by_time.set_title(title, fontsize=9)
    by_iter.set_title("per iteration\n(p3kv and dist_sync compute the same updates)", fontsize=9)
    final = {s: 100 * statistics.median(float(run[-1]["test_accuracy"]) for (x, _), run in runs.items() if x == s)
             for s in dict.fromkeys(s for s, _ in runs)}
    names = ["paper: P3", "paper: ASGD"] + [f"ours: {LABELS.get(s, s)}" for s in final]
    values = [PAPER["final"]["P3"], PAPER["final"]["ASGD"], *final.values()]
    bars = paper.barh(names, values, color=["tab:blue", "tab:orange"] + [colors.get(s, "tab:gray") for s in final],
                      alpha=0.8)
    paper.bar_label(bars, fmt="%.1f%%", fontsize=8)
    paper.set_xlim(0, 110)
    paper.invert_yaxis()
    paper.set_xlabel("final test accuracy (%)")
    paper.set_title(f"the paper's Fig. 15 ({PAPER['setting']}:\nP3 reached 80% ~{PAPER['to_80_speedup']:.0f}x "
                    "sooner than ASGD) beside ours", fontsize=8, loc="right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
