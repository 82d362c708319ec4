"""`make demo`: p3kv against MXNet's dist_sync on the emulated cluster, in a few minutes (runs as root).

    sudo .venv/bin/python -m benchmarks.suites.demo                          # p3kv and dist_sync
    sudo .venv/bin/python -m benchmarks.suites.demo --systems p3 dist_sync mxnet-p3 horovod

The paper's ResNet-50 point (4 hosts as network namespaces on 400 Mbit links, P100 compute slowed 10x: P100s on
4 Gbit links, where the paper measured +26%; each host's CPU held to 4 x 0.1 cores, each of its threads to one
dilated CPU once the models are built), each system run --repeats times in interleaved, freshly shuffled order,
each job 2 warm-up + 6 timed iterations (every rank's kept). It prints a line per job with its fidelity verdict,
then one screen: each system's throughput with a 95% bootstrap CI, the ratio p3kv / dist_sync with its CI, % of
the bound, the CPU the hosts used, how many jobs the fidelity monitors passed, and the committed reference figure
for the same point and conditions, from faithful runs only (demo_screen.py). It writes only under --out
(build/demo/: demo.csv, demo_iterations.csv, summary.md, fig_demo.png, logs/), replacing the previous run's files
there, never the committed results or the README.

MXNet's P3 and Horovod run only when asked (--systems); Horovod only when `horovod.mxnet` imports (never built
here: `make bench-setup` builds it). The run guard waits at most --wait seconds in all for an idle machine, then
proceeds and records a warning in the rows (--strict: refuse instead, as the sweeps do). The paper's full
12-job comparison (all four systems, 3 repeats of 2 + 20 iterations) is `make demo-full`
(python -m benchmarks.suites.sweeps demo). Without root or the right to create network namespaces it says so at
once, names what runs without them, and exits 2. Each system runs at its tuned best for the point where
results/tuning/best.json has one (`python -m benchmarks tune`; --untuned: defaults), as every row records.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.analysis import bench_rows
from benchmarks.emulation import cpu_limit, emulated_cluster, run_guard
from benchmarks.paths import ROOT
from benchmarks.suites import baseline_settings, cluster_bench, demo_screen
from benchmarks.suites.cluster_job import Point

LOG = logging.getLogger("demo")
DEFAULT_SYSTEMS = ("p3", "dist_sync")
OUT = ROOT / "build" / "demo"
WAIT_S = 60.0  # the whole run's idle-gate budget before it proceeds with a recorded warning
FILES = ("demo.csv", "demo_iterations.csv", "summary.md", "fig_demo.png")

WITHOUT_ROOT = """\
What runs without root (no network namespaces):
  the drop-in example, p3kv and dist_sync training the same model; compare the checksums they print:
    python -m p3kv.launch -n 2 -s 2 -- python examples/gluon_drop_in.py --kvstore p3
    python -m p3kv.launch -n 2 -s 2 --kvstore dist_sync -- python examples/gluon_drop_in.py --kvstore dist_sync
  the like-for-like kvstore benchmark on this machine's loopback (all systems, the same SGD):
    make bench-kvstore
"""


def why_no_cluster() -> str | None:
    """Why this process cannot build the emulated cluster (root, ip/tc, the right to create a network
    namespace, which a container may withhold from root), or None; within a few seconds."""
    reason = emulated_cluster.why_unavailable()
    if reason:
        return reason
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=5, check=False)
    if probe.returncode != 0:
        return (f"cannot create a network namespace ({probe.stderr.strip() or 'unshare --net failed'}): run on a "
                "machine or container with CAP_SYS_ADMIN and CAP_NET_ADMIN")
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suites.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=list(cluster_bench.SYSTEMS),
                   help="p3 (p3kv) and dist_sync by default; mxnet-p3 and horovod when asked")
    p.add_argument("--model", default="resnet50_v1", choices=cluster_bench.MODELS)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bandwidth", default="400mbit", help="every host's link (tc syntax)")
    p.add_argument("--gpu-scale", type=float, default=0.1, help="P100 compute slowed 1/scale times: links of "
                   "--bandwidth / scale for real P100s (default 0.1: 4 Gbit/s; 4 hosts of --host-cpus 4 fit "
                   "on 2 cores up to 0.1125)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="jobs per system, interleaved in shuffled order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=5000, help="bootstrap resamples of each CI")
    p.add_argument("--out", type=pathlib.Path, default=OUT, help="where everything goes (default build/demo)")
    p.add_argument("--max-busy", type=float, default=run_guard.DEFAULT_MAX_BUSY,
                   help="the idle gate: CPU busy percent (all cores) over a 5-second sample")
    p.add_argument("--wait", type=float, default=WAIT_S, help="seconds in all the demo waits for an idle machine, "
                   "then proceeds with a warning recorded in the rows")
    p.add_argument("--strict", action="store_true", help="refuse after --wait instead of proceeding")
    p.add_argument("--force", action="store_true", help="start every job at once, busy or not (recorded)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    p.add_argument("--smoke", action="store_true", help="mark the rows as a smoke run (tests)")
    cluster_bench.add_cpu_arguments(p)
    baseline_settings.add_arguments(p)
    args = p.parse_args(argv)
    if args.hosts < 2 or args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--hosts must be >= 2, --iters and --repeats >= 1, --warmup >= 0")
    try:
        emulated_cluster.parse_rate(args.bandwidth)
    except ValueError as e:
        p.error(str(e))
    return args


def points(args: argparse.Namespace) -> list[Point]:
    base = [Point(model=args.model, kvstore=kv, hosts=args.hosts, bandwidth=args.bandwidth, compute="emulated",
                  batch_size=args.batch_size, gpu="p100", gpu_scale=args.gpu_scale, optimizer="sgd",
                  warmup=args.warmup, iters=args.iters, tag="demo", timeout=args.timeout,
                  log_interval=max(1, args.warmup + args.iters),
                  host_cpus=cluster_bench.host_cpus_from_args(args, args.model),
                  link_rx=args.link_rx, cfs_period_gpu_ms=args.cfs_period_gpu_ms, thread_cap=args.thread_cap)
            for kv in args.systems]
    return baseline_settings.from_args(cluster_bench.interleave(base, args.repeats, args.seed), args)


def fresh_output(out: pathlib.Path) -> None:
    """Replaces the previous run's files (a summary must never pool runs)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "logs", ignore_errors=True)


def progress(total: int, started: float):
    done = []

    def on_row(row: dict) -> None:
        done.append(row)
        result = (f"{float(row['throughput']):.1f} {row['unit']}/s" if row["status"] == "ok" else row["status"])
        wait = f", waited {float(row['idle_wait_s']):.0f} s for an idle machine" if row.get("idle_wait_s") else ""
        warn = " (started on a busy machine: recorded)" if row.get("idle_warning") else ""
        faithful = bench_rows.verdict(row)
        failed = [n for n in str(row.get("fidelity_notes") or "").split("; ") if n][:1]  # failures come first
        verdict = ("" if faithful is None else ", faithful" if faithful else
                   f", not faithful ({failed[0] if failed else 'see its fidelity_notes'})")
        LOG.info("[%d/%d] %s repeat %d: %.0f s, %s%s%s%s; %.0f s so far", len(done), total,
                 demo_screen.LABEL.get(row["kvstore"], row["kvstore"]), int(row["repeat"]) + 1, float(row["wall_s"]),
                 result, verdict, wait, warn, time.monotonic() - started)

    return on_row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    started = time.monotonic()
    reason = why_no_cluster()
    if reason:
        sys.stderr.write(f"make demo needs root and network namespaces: {reason}.\n"
                         "As root: sudo make demo (or sudo .venv/bin/python -m benchmarks.suites.demo).\n\n"
                         + WITHOUT_ROOT)
        return 2
    todo, skipped = cluster_bench.drop_unavailable(points(args))
    if not todo:
        LOG.error("nothing to run: %s", "; ".join(f"{kv}: {why}" for kv, why in skipped.items()))
        return 2
    fresh_output(args.out)
    csv_path = args.out / "demo.csv"
    conditions = cluster_bench.Conditions(max_busy=args.max_busy, load_wait=args.wait, force=args.force,
                                          allow_dirty=True, seed=args.seed, smoke=args.smoke,
                                          proceed=not args.strict)
    LOG.info("%d jobs: %s x %d repeats, %s, %d hosts, %s links, compute x%g, %d warm-up + %d timed iterations; "
             "output in %s", len(todo), " ".join(sorted({p.kvstore for p in todo})), args.repeats, args.model,
             args.hosts, args.bandwidth, args.gpu_scale, args.warmup, args.iters, args.out)
    try:
        rows = cluster_bench.run_points(todo, csv_path, conditions, keep_logs=args.out / "logs", live=None,
                                        on_row=progress(len(todo), started))
    except (run_guard.Refused, cpu_limit.QuotaRefused, cpu_limit.CpuLimitError) as e:
        LOG.error("%s", e)
        return 3
    arrays = (demo_screen.iteration_arrays(bench_rows.iterations_path(csv_path))
              if bench_rows.iterations_path(csv_path).exists() else {})
    figure = args.out / "fig_demo.png"
    if arrays:
        demo_screen.plot(rows, arrays, figure, args.resamples, args.seed)
    written = [p for p in (csv_path, bench_rows.iterations_path(csv_path), args.out / "summary.md", figure)
               if p.exists() or p.name == "summary.md"]
    text = demo_screen.screen(rows, arrays, resamples=args.resamples, seed=args.seed,
                              wall_s=time.monotonic() - started, files=[demo_screen.shown(p) for p in written],
                              skipped=skipped)
    (args.out / "summary.md").write_text("```\n" + text + "```\n")
    sys.stdout.write("\n" + text)
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
