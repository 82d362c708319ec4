"""Soak benchmark: does any p3kv process grow in memory over a long run?

    python -m benchmarks.suites.soak_bench                      # 1,000 iterations, 2 workers + 2 servers
    python -m benchmarks.suites.soak_bench --iters 300          # shorter

One job of ``python -m p3kv.launch`` runs benchmarks/workloads/bench_worker.py (ResNet-50-shaped traffic: one push +
broadcast of every array per iteration, no model compute) for --iters iterations. Every --interval seconds the
resident set (VmRSS) of every descendant of the launcher with a P3_ROLE (scheduler, servers, workers) is read
from /proc. Writes results/soak.csv (time_s, role, pid, rss_mib: one row per process and sample) and
results/soak.md (iterations/s, RSS at start, end and peak per process, and a verdict).

Memory is compared only over the steady phase: the samples taken while every worker was running, minus the
first --warmup-fraction of them (interpreter start-up, key init, first allocation of buffers). "start" is the
mean of the first --window samples after warm-up, "end" the mean of the last --window samples of the steady
phase. RSS of a server moves up and down with its receive queue (bounded by P3_SERVER_QUEUE_BYTES), so no single
sample decides: the test of a leak is the trend, the Theil-Sen slope of RSS over time (scipy.stats.theilslopes,
robust to the odd spike) with its 95% CI, as growth over the steady phase in percent of the starting RSS. A
process is "flat" when the whole CI lies below --tolerance percent, "growing" when the whole CI lies above it,
and "inconclusive" otherwise (too few or too noisy samples); the 95th percentile of each half of the phase is
shown beside it. The verdict is "flat" when every process is, "growing" when any process is.

    python -m benchmarks.suites.soak_bench --samples benchmarks/results/soak.csv   # the verdict of older samples

It runs under the run guard as every benchmark does (benchmarks/emulation/run_guard.py): a dirty tree is refused
unless --allow-dirty, the job waits for an idle machine, and soak.md records the commit, the machine's CPU use and
load before the job and the load after it. The soak is a memory check on loopback (undilated, no emulated links):
its iterations/s are context, not a throughput result.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from scipy import stats

from benchmarks import paths
from benchmarks.emulation import proc_monitor, run_guard
from benchmarks.paths import RESULTS, ROOT

LOG = logging.getLogger("soak_bench")
ROLES = ("scheduler", "server", "worker")


class RssSampler:
    """Samples VmRSS of the launcher's P3 processes every `interval` s from a thread it owns; `stop()` joins it."""

    def __init__(self, root: int, interval: float):
        self._root = root
        self._interval = interval
        self._stopped = threading.Event()
        self._roles: dict[int, str] = {}
        self._start = time.monotonic()
        self.samples: list[tuple[float, str, int, float]] = []  # (time_s, role, pid, rss_mib)
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, str, int, float]]:
        self._stopped.set()
        self._thread.join()
        return self.samples

    def known_pids(self) -> set[int]:
        return set(self._roles)

    def sample_once(self) -> None:
        now = round(time.monotonic() - self._start, 2)
        for pid in proc_monitor.descendants(self._root):
            role = self._roles.get(pid) or self._roles.setdefault(pid, proc_monitor.role_of(pid))
            if role not in ROLES:
                continue  # a shell or helper between the launcher and a node
            rss = _rss_kib(pid)
            if rss is not None:
                self.samples.append((now, role, pid, round(rss / 1024, 2)))

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.sample_once()
            except Exception:  # a sampler failure must not abort the job it watches
                LOG.exception("sampling /proc failed; the RSS series ends here")
                return
            self._stopped.wait(self._interval)


def _rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS


def run_job(args: argparse.Namespace, scratch: pathlib.Path) -> tuple[int, float, dict | None, list]:
    """The launcher's exit code, the wall time, worker 0's result row and the RSS samples."""
    out = scratch / "result.jsonl"
    log_path = scratch / "job.log"
    command = [sys.executable, "-m", "p3kv.launch", "-n", str(args.workers), "-s", str(args.servers),
               "--timeout", str(args.timeout), "--", *paths.python_module("benchmarks.workloads.bench_worker"),
               "--model", args.model, "--warmup", "0", "--iters", str(args.iters), "--out", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("BENCH_LOG_LEVEL", "WARNING")  # no line per iteration: 1,000 of them per worker
    LOG.info("%d iterations of %s on %d workers, %d servers", args.iters, args.model, args.workers, args.servers)
    start = time.perf_counter()
    with log_path.open("w") as log:
        launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        sampler = RssSampler(launcher.pid, args.interval).start()
        try:
            code = launcher.wait(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            LOG.error("the launcher outlived its own --timeout %s s; stopping the job", args.timeout)
            proc_monitor.stop_tree(launcher, sampler.known_pids())
            code = 124
        finally:
            samples = sampler.stop()
    wall = time.perf_counter() - start
    lines = out.read_text().splitlines() if out.exists() else []
    if code != 0 or not lines:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        LOG.error("the job failed (exit code %s); last lines of its output:\n%s", code, "\n".join(tail))
    return code, wall, (json.loads(lines[-1]) if lines else None), samples


def steady_window(samples: list, workers: int, warmup_fraction: float) -> tuple[float, float]:
    """(first, last) sample time of the steady phase: every worker alive, warm-up dropped."""
    per_time: dict[float, int] = {}
    for t, role, _, _ in samples:
        if role == "worker":
            per_time[t] = per_time.get(t, 0) + 1
    full = sorted(t for t, n in per_time.items() if n == workers)
    if not full:
        return 0.0, 0.0
    return full[int(len(full) * warmup_fraction)], full[-1]


def trend(times: list[float], rss: list[float], tolerance: float, level: float = 0.95) -> dict:
    """The Theil-Sen trend of one process's RSS as growth over the span of `times` in percent of its starting
    level, with its CI, and the state it gives: "flat" (CI below `tolerance` %), "growing" (CI above it) or
    "inconclusive"; the 95th percentile of each half beside it."""
    t, y = np.asarray(times, dtype=float), np.asarray(rss, dtype=float)
    half = len(y) // 2
    p95 = (float(np.percentile(y[:half], 95)), float(np.percentile(y[half:], 95))) if half else (y[0], y[0])
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    if len(set(t.tolist())) < 3 or span <= 0:
        return {"trend": 0.0, "trend_low": 0.0, "trend_high": 0.0, "p95_1": p95[0], "p95_2": p95[1],
                "state": "inconclusive"}
    slope, intercept, low, high = stats.theilslopes(y, t, alpha=level)
    base = intercept + slope * t[0]  # the trend line at the start: a spike in the first samples moves nothing
    scale = 100.0 * span / base if base > 0 else 0.0
    growth, growth_low, growth_high = slope * scale, low * scale, high * scale
    state = ("flat" if growth_high <= tolerance else "growing" if growth_low > tolerance else "inconclusive")
    return {"trend": growth, "trend_low": growth_low, "trend_high": growth_high, "p95_1": p95[0], "p95_2": p95[1],
            "state": state}


def verdict(rows: list[dict]) -> str:
    """"flat" when every process is, "growing" when any is, else "inconclusive"."""
    states = {r["state"] for r in rows}
    return "growing" if "growing" in states else "flat" if states == {"flat"} else "inconclusive"


def summarize(samples: list, workers: int, args: argparse.Namespace) -> list[dict]:
    """One row per process: role, pid, start/end/peak MiB over the steady phase, growth %, its trend with CI and
    state (see `trend`)."""
    first, last = steady_window(samples, workers, args.warmup_fraction)
    rows = []
    by_pid: dict[int, list] = {}
    for t, role, pid, rss in samples:
        by_pid.setdefault(pid, []).append((t, role, rss))
    for pid, series in sorted(by_pid.items(), key=lambda kv: (ROLES.index(kv[1][0][1]), kv[0])):
        steady = [rss for t, _, rss in series if first <= t <= last]
        if len(steady) < 2:
            continue
        window = max(1, min(args.window, len(steady) // 2))
        start, end = statistics.fmean(steady[:window]), statistics.fmean(steady[-window:])
        growth = 100.0 * (end - start) / start if start else 0.0
        times = [t for t, _, _ in series if first <= t <= last]
        rows.append({"role": series[0][1], "pid": pid, "start": start, "end": end,
                     "peak": max(rss for _, _, rss in series), "growth": growth,
                     **trend(times, steady, args.tolerance)})
    return rows


def write_csv(path: pathlib.Path, samples: list) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time_s", "role", "pid", "rss_mib"])
        writer.writerows(samples)


def conditions(commit: str, dirty: bool, start: run_guard.Start, load_after: float) -> str:
    """The run guard's record of the machine around the job, as one sentence of soak.md."""
    tree = f"commit {commit[:12]}" + (" with uncommitted changes (--allow-dirty)" if dirty else ", clean tree")
    gate = (f"started with the CPUs {start.busy_pct:.0f}% busy over a 5 s sample after waiting {start.waited_s:.0f} s "
            f"for an idle machine" + (" (--force: busy, started anyway)" if start.forced else ""))
    return f"Conditions: {tree}; {gate}; 1-minute load {start.load_1m:.2f} before, {load_after:.2f} after."


def write_markdown(path: pathlib.Path, args: argparse.Namespace, code: int, wall: float, result: dict | None,
                   rows: list[dict], window: tuple[float, float], conditions_line: str = "") -> str:
    ok = code == 0 and result is not None
    overall = verdict(rows) if ok and rows else "no verdict (job failed)"
    lines = ["# Soak benchmark (memory over a long run)", "",
             f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}: {args.workers} workers, {args.servers} servers on loopback, "
             f"{args.model} traffic, {args.iters} iterations, RSS sampled every {args.interval:g} s, "
             f"{os.cpu_count()} CPUs. Launcher exit code {code}, wall {wall:.0f} s.", ""]
    if conditions_line:
        lines += [conditions_line, ""]
    if result is not None:
        lines += [f"Throughput: {1 / result['mean_s']:.2f} iterations/s (mean {result['mean_s']:.3f} s/iter, median "
                  f"{result['median_s']:.3f}, min {result['min_s']:.3f}, max {result['max_s']:.3f}); the final "
                  "check of every element passed.", ""]
    lines += [f"Steady phase: t = {window[0]:.0f}-{window[1]:.0f} s (every worker running, first "
              f"{args.warmup_fraction:.0%} dropped as warm-up); start/end = mean of the first/last {args.window} "
              "samples of it; peak = largest sample of the whole run.", "",
              *table(rows),
              "", f"Verdict: **{overall}** (per process: flat when the 95% CI of the trend, the Theil-Sen growth "
              f"over the steady phase, lies below {args.tolerance:g}%; growing when it lies above; inconclusive "
              "otherwise. No single sample decides.)"]
    path.write_text("\n".join(lines) + "\n")
    return overall


def table(rows: list[dict]) -> list[str]:
    lines = ["| role | pid | RSS start MiB | RSS end MiB | end vs start | p95 1st half | p95 2nd half | "
             "trend (95% CI) | RSS peak MiB (whole run) | state |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['role']} | {r['pid']} | {r['start']:.1f} | {r['end']:.1f} | {r['growth']:+.2f}% | "
                     f"{r['p95_1']:.1f} | {r['p95_2']:.1f} | {r['trend']:+.2f}% ({r['trend_low']:+.2f} to "
                     f"{r['trend_high']:+.2f}) | {r['peak']:.1f} | {r['state']} |")
    return lines


def read_samples(path: pathlib.Path) -> list[tuple[float, str, int, float]]:
    with path.open(newline="") as f:
        return [(float(r["time_s"]), r["role"], int(r["pid"]), float(r["rss_mib"])) for r in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=10, help="samples averaged for start and end")
    parser.add_argument("--tolerance", type=float, default=5.0, help="percent growth still called flat")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the job may take")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--samples", type=pathlib.Path, help="run nothing: print the verdict of this soak.csv "
                        "(--workers as it ran)")
    run_guard.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.iters < 1 or not 0 <= args.warmup_fraction < 1:
        parser.error("--iters must be >= 1 and --warmup-fraction in [0, 1)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.samples:
        rows = summarize(read_samples(args.samples), args.workers, args)
        print("\n".join(table(rows)) + f"\n\nVerdict: {verdict(rows) if rows else 'no steady phase'}")
        return 0
    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    try:
        start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
    except run_guard.Refused as e:
        LOG.error("%s", e)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-") as scratch:
        code, wall, result, samples = run_job(args, pathlib.Path(scratch))
    record = conditions(*tree, start, os.getloadavg()[0])
    args.results_dir.mkdir(parents=True, exist_ok=True)
    write_csv(args.results_dir / "soak.csv", samples)
    rows = summarize(samples, args.workers, args)
    window = steady_window(samples, args.workers, args.warmup_fraction)
    overall = write_markdown(args.results_dir / "soak.md", args, code, wall, result, rows, window, record)
    print((args.results_dir / "soak.md").read_text())
    LOG.info("verdict: %s", overall)
    return 0 if code == 0 and result is not None else 1


if __name__ == "__main__":
    sys.exit(main())
