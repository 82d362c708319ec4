"""Loopback pushpull: p3kv's core summing one model's gradients among W local processes against
torch.distributed.all_reduce over gloo as DDP's reducer runs it (buckets), on the same arrays (issue 27).

    python -m benchmarks.suites.torch_loopback_bench --model resnet50_v1 --workers 2 --repeats 5 --iters 20

Each (repeat, system) is one job of benchmarks/workloads/allreduce_worker.py (see there for what each system does
per iteration): p3kv through `python -m p3kv.launch -n W -s W --servers core` (one framework-free server per
worker, the paper's colocated layout on one machine), gloo through `torchrun --standalone --nproc-per-node W`.
No compute and no optimizer: the sum alone, on loopback (no link cap), so the two transports' CPU costs are what is
compared; the emulated cluster (sweeps.py torch) is where links and compute come in.

Statistics: every repeat runs the systems in a freshly shuffled order (--seed); per system the gradient throughput
(model bytes per worker over the median iteration time) with the 95% CI of the hierarchical bootstrap over jobs,
then iterations (benchmarks/analysis/bootstrap.py), and the ratio p3kv / gloo with its CI. The systems' sums must
agree (each rank's checksum of its last sums; equal for W = 2). Before each job the run guard waits for an idle
machine (refuses otherwise, unless --force: recorded). Rows go to --csv, the table to the .md beside it; the default
is build/torch_loopback/ (a shared or busy machine's numbers are not results): commit a run from an idle machine
with --csv benchmarks/results/torch_loopback.csv.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.analysis import bench_report, bootstrap
from benchmarks.emulation import run_guard
from benchmarks.paths import ROOT
from benchmarks.workloads import job_env, model_shapes

LOG = logging.getLogger("torch_loopback_bench")
SYSTEMS = ("p3kv", "gloo")
WORKER = "benchmarks.workloads.allreduce_worker"
COLUMNS = ("timestamp", "git_commit", "git_dirty", "forced", "busy_pct_before", "load_1m_before", "seed", "repeat",
           "position", "model", "system", "workers", "status", "exit_code", "bytes", "arrays", "buckets",
           "bucket_cap_mb", "warmup", "iters", "median_s", "gbytes_per_s", "checksum", "rank_iter_s", "wall_s",
           "torch", "p3kv", "numpy", "python")
DEFAULT_CSV = ROOT / "build" / "torch_loopback" / "torch_loopback.csv"


def job_argv(system: str, args: argparse.Namespace, out: str) -> list[str]:
    worker = ["-m", WORKER, "--system", system, "--model", args.model, "--warmup", str(args.warmup), "--iters",
              str(args.iters), "--bucket-cap-mb", str(args.bucket_cap_mb), "--out", out]
    if args.description:
        worker += ["--description", str(args.description)]
    if system == "p3kv":
        return [sys.executable, "-m", "p3kv.launch", "-n", str(args.workers), "-s", str(args.workers), "--servers",
                "core", "--timeout", str(args.timeout), "--", sys.executable, *worker]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.workers),
            "--monitor-interval", "1", *worker]


def run_job(system: str, args: argparse.Namespace, scratch: pathlib.Path, repeat: int) -> tuple[int, list[dict]]:
    """(exit code, every rank's result) of one job."""
    out = str(scratch / f"{system}.r{repeat}")
    env = job_env.job_environment("horovod" if system == "gloo" else "p3", None)  # gloo: no P3_* variables
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(f"{out}.log", "w") as log:
        try:
            code = subprocess.run(job_argv(system, args, out), cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=args.timeout + 30, check=False).returncode
        except subprocess.TimeoutExpired:
            code = 124
    results = [json.loads(p.read_text()) for p in sorted(scratch.glob(f"{system}.r{repeat}.rank*.json"))]
    if code != 0 or len(results) != args.workers:
        tail = pathlib.Path(f"{out}.log").read_text(errors="replace").splitlines()[-20:]
        LOG.error("%s repeat %d failed (exit %s, %d of %d results):\n%s", system, repeat, code, len(results),
                  args.workers, "\n".join(tail))
    return code, results


def row_of(system: str, args, repeat: int, position: int, code: int, results: list[dict], start, commit: str,
           dirty: bool, wall: float) -> dict:
    ok = code == 0 and len(results) == args.workers
    first = min(results, key=lambda r: r["rank"]) if results else {}
    ranks = [r["iter_s"] for r in sorted(results, key=lambda r: r["rank"])]
    every = [t for times in ranks for t in times]
    median = float(np.median(every)) if every else None
    versions = first.get("versions", {})
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": commit, "git_dirty": dirty,
            "forced": start.forced, "busy_pct_before": round(start.busy_pct, 1),
            "load_1m_before": round(os.getloadavg()[0], 2), "seed": args.seed, "repeat": repeat,
            "position": position, "model": args.model, "system": system, "workers": args.workers,
            "status": "ok" if ok else f"failed({code})", "exit_code": code, "bytes": first.get("bytes", ""),
            "arrays": first.get("arrays", ""), "buckets": first.get("buckets") or "",
            "bucket_cap_mb": args.bucket_cap_mb if system == "gloo" else "", "warmup": args.warmup,
            "iters": args.iters, "median_s": round(median, 6) if median else "",
            "gbytes_per_s": round(first["bytes"] / median / 1e9, 3) if median else "",
            "checksum": ";".join(f"{r['checksum']:.6f}" for r in sorted(results, key=lambda r: r["rank"])),
            "rank_iter_s": json.dumps([[round(t, 6) for t in times] for times in ranks]), "wall_s": round(wall, 1),
            **{k: versions.get(k, "") for k in ("torch", "p3kv", "numpy", "python")}}


def jobs_of(rows: Sequence[dict], system: str) -> list[np.ndarray]:
    """Each ok job of `system` as (iterations, ranks) seconds."""
    out = []
    for r in rows:
        if r["system"] == system and r["status"] == "ok":
            ranks = json.loads(r["rank_iter_s"])
            n = min(len(t) for t in ranks)
            out.append(np.array([t[:n] for t in ranks]).T)
    return out


def summary(rows: Sequence[dict], resamples: int = bootstrap.RESAMPLES) -> str:
    """Markdown: each system's GB/s per worker with its 95% CI, the ratio p3kv / gloo, and whether the sums
    agreed."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return "no job succeeded\n"
    nbytes = float(ok[0]["bytes"])
    lines = [f"{ok[0]['model']}: {nbytes / 1e6:.1f} MB of gradients in {ok[0]['arrays']} arrays, "
             f"{ok[0]['workers']} workers on loopback; GB/s of gradient summed per worker (model bytes over the "
             f"median iteration), 95% CIs (bootstrap over jobs, then iterations)", "",
             "| system | jobs | GB/s (95% CI) | median s/iter |", "|---|---|---|---|"]
    jobs = {s: jobs_of(ok, s) for s in SYSTEMS}
    for system in SYSTEMS:
        if jobs[system]:
            e = bootstrap.throughput(jobs[system], nbytes / 1e9, resamples=resamples)
            lines.append(f"| {system} | {len(jobs[system])} | {e.value:.3f} ({e.low:.3f}-{e.high:.3f}) | "
                         f"{nbytes / 1e9 / e.value:.4f} |")
    if all(jobs.values()):
        r = bootstrap.ratio(jobs["p3kv"], jobs["gloo"], nbytes, nbytes, resamples=resamples)
        lines += ["", f"p3kv / gloo: {r.value:.2f} ({r.low:.2f}-{r.high:.2f})"]
    checksums = {s: {r["checksum"] for r in ok if r["system"] == s} for s in SYSTEMS}
    same = len(set().union(*checksums.values())) == 1
    lines.append(f"Sums: {'equal in every job and system' if same else 'DIFFER: ' + str(checksums)}")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50_v1", help="whose arrays (benchmarks/workloads/shapes/)")
    p.add_argument("--description", type=pathlib.Path, help="a shape file instead of --model's (the tests')")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="gloo: DDP's bucket size (default 25)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="seeds the shuffled orders (recorded)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take")
    p.add_argument("--csv", type=pathlib.Path, default=DEFAULT_CSV)
    run_guard.add_arguments(p)
    args = p.parse_args(argv)
    if args.workers < 2 or args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--workers must be >= 2, --iters and --repeats >= 1, --warmup >= 0")
    if not args.description:
        model_shapes.load(args.model)  # a clear error now for a model without a shape file
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        commit, dirty = run_guard.check_tree(args.allow_dirty)
    except run_guard.Refused as e:
        LOG.error("%s", e)
        return 3
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="torch_loopback.") as tmp:
        for repeat in range(args.repeats):
            order = list(args.systems)
            rng.shuffle(order)
            for position, system in enumerate(order):
                try:
                    start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
                except run_guard.Refused as e:
                    LOG.error("%s", e)
                    return 3
                began = time.perf_counter()
                code, results = run_job(system, args, pathlib.Path(tmp), repeat)
                row = row_of(system, args, repeat, position, code, results, start, commit, dirty,
                              time.perf_counter() - began)
                LOG.info("%s repeat %d: %s, median %s s/iter", system, repeat, row["status"], row["median_s"])
                rows.append(row)
                bench_report.append_csv(args.csv, [row], COLUMNS)
    text = summary(rows)
    args.csv.with_suffix(".md").write_text(text)
    sys.stdout.write("\n" + text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
