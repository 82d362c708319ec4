"""The server's CPU time per slice (aggregate W pushes + optimizer update) beside a memory-traffic floor measured
in the same run (issue "Server hot path"; target: work <= 2x floor). Compiles benchmarks/suites/server_slice_bench.cc
with the extension's flags (setup.py: -O3 -Wall -Wextra, C++17) against the server's pure parts in cpp/src, runs
it, and writes benchmarks/results/server_slice.{csv,md}. No network, no MXNet, one thread. Under the run guard
(benchmarks/emulation/run_guard.py): a dirty tree or a busy machine is refused unless overridden, and the rows record
it.

Usage: python -m benchmarks.suites.server_bench [--workers 2 4 8] [--counts 50000 10000 200000]
                                         [--optimizers none sgd adam] [--iters 5] [--repeats 5]
"""

import argparse
import csv
import io
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys

from benchmarks.emulation import run_guard
from benchmarks.paths import RESULTS, ROOT

HERE = pathlib.Path(__file__).resolve().parent

LOG = logging.getLogger("server_bench")
SOURCE = HERE / "server_slice_bench.cc"
# The server's per-slice path and what it needs; nothing with sockets or threads.
UNITS = ("aggregator.cc", "admission.cc", "buffer_pool.cc", "slice_optimizer.cc", "optimizer.cc", "torch_optimizer.cc",
         "dtype.cc", "frame_builder.cc", "codec.cc")
# setup.py's extra_compile_args (and Pybind11Extension's C++17), so the numbers are the extension's; -Werror
# keeps the benchmark warnings-clean.
FLAGS = ["-std=c++17", "-O3", "-Wall", "-Wextra", "-Werror", "-pthread"]
OPTIMIZER_NAMES = {"none": "aggregate only", "sgd": "SGD momentum 0.9, wd 1e-4", "adam": "Adam, wd 1e-4"}


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        sys.exit("server_bench: no C++ compiler found: apt-get install g++")
    return cxx


def build(binary: pathlib.Path, extra_flags: tuple[str, ...] = ()) -> None:
    """Compiles the benchmark, one process per source (optimizer.cc alone takes seconds), then links it; raises
    RuntimeError with the compiler's output on an error or a warning."""
    sources = [SOURCE, *(ROOT / "cpp" / "src" / u for u in UNITS)]
    objects = [binary.parent / f"{binary.name}.{src.stem}.o" for src in sources]
    # The public API and the core's internal headers (the aggregator and buffer pool sit beside their sources).
    compile_flags = [*FLAGS, *extra_flags, "-I", str(ROOT / "cpp" / "include"), "-I", str(ROOT / "cpp" / "src")]
    procs = [subprocess.Popen([compiler(), *compile_flags, "-c", str(src), "-o", str(obj)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for src, obj in zip(sources, objects)]
    errors = [p.communicate(timeout=300)[0] for p in procs if p.wait(timeout=300) != 0]
    if errors:
        raise RuntimeError("server_bench: the build failed:\n" + "\n".join(errors))
    link = subprocess.run([compiler(), *FLAGS, *map(str, objects), "-o", str(binary)], capture_output=True,
                          text=True, timeout=300, check=False)
    if link.returncode != 0:
        raise RuntimeError("server_bench: linking failed:\n" + link.stdout + link.stderr)


def run(binary: pathlib.Path, args: list[str], timeout: float) -> tuple[list[str], list[dict]]:
    """Runs the benchmark; returns its '#' comment lines and its CSV rows."""
    done = subprocess.run([str(binary), *args], check=True, capture_output=True, text=True, timeout=timeout)
    comments = [line[1:].strip() for line in done.stdout.splitlines() if line.startswith("#")]
    table = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("#"))
    return comments, list(csv.DictReader(io.StringIO(table)))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def us(ns: str) -> str:
    return f"{float(ns) / 1000:.1f}"


def markdown(rows: list[dict], comments: list[str], meta: dict) -> str:
    lines = [
        "# Server hot path: CPU per slice vs. memory-traffic floor",
        "",
        f"benchmarks/suites/server_bench.py at commit {meta['commit']}"
        f"{' (uncommitted changes)' if meta['dirty'] else ''}; "
        f"{meta['cpu']}, {meta['cpus']} CPUs; {meta['compiler']}; flags {' '.join(FLAGS)}. "
        f"Started once a 5-second sample showed the CPUs {meta['busy_before']:.0f}% busy"
        f"{' (--force: busy machine)' if meta['forced'] else ''}; "
        f"1-minute load average {meta['load_before']:.2f} before, {meta['load_after']:.2f} after.",
        "",
        "Method: one thread drives the server's own state machine (Aggregator with SliceOptimizer as its update "
        "hook, no-op broadcast) with frames whose payloads come from a BufferPool and were filled once. An "
        "iteration pushes a 3.2 M-element float32 shard per worker (64 slices of 50,000; 320 of 10,000; 16 of "
        "200,000), so the working set exceeds L2 and L3 like a real server's; frames are built before the clock "
        "starts. work = thread CPU time of Aggregator::OnFrame for the W pushes of a slice (accumulate, update, "
        "broadcast hook). kernel = the optimizer kernel (ApplyUpdate) alone on the same sizes. All times are per "
        "slice-iteration, median (min-max) over the repeats; ratio = work / floor, per repeat, the two measured "
        "back to back.",
        "",
        *(f"Definition: {c}" for c in comments if c.startswith("floor")),
        "",
        "| optimizer | slice | W | work us | wall us | floor us | floor GB/s | kernel us | work / floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {OPTIMIZER_NAMES.get(r['optimizer'], r['optimizer'])} | {int(r['count']):,} | {r['workers']} "
            f"| {us(r['work_cpu_ns_median'])} ({us(r['work_cpu_ns_min'])}-{us(r['work_cpu_ns_max'])}) "
            f"| {us(r['work_wall_ns_median'])} "
            f"| {us(r['floor_cpu_ns_median'])} ({us(r['floor_cpu_ns_min'])}-{us(r['floor_cpu_ns_max'])}) "
            f"| {float(r['floor_gb_per_s']):.1f} | {us(r['kernel_cpu_ns_median'])} "
            f"| {float(r['ratio_median']):.2f} ({float(r['ratio_min']):.2f}-{float(r['ratio_max']):.2f}) |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--counts", type=int, nargs="+", default=[50_000, 10_000, 200_000])
    ap.add_argument("--optimizers", nargs="+", default=["none", "sgd", "adam"], choices=sorted(OPTIMIZER_NAMES))
    ap.add_argument("--elements", type=int, default=64 * 50_000, help="elements per worker and iteration")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--binary", default=str(ROOT / "build" / "server_slice_bench"))
    ap.add_argument("--csv", default=str(RESULTS / "server_slice.csv"))
    ap.add_argument("--summary", default=str(RESULTS / "server_slice.md"))
    run_guard.add_arguments(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    commit, dirty = tree

    binary = pathlib.Path(args.binary)
    binary.parent.mkdir(parents=True, exist_ok=True)
    build(binary)
    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, check=False)
    try:  # after the build, whose compilers would otherwise be the load the sample sees
        start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
    except run_guard.Refused as e:
        LOG.error("%s", e)
        return 2
    meta = {"commit": commit, "dirty": dirty, "cpu": cpu_model(), "cpus": os.cpu_count(),
            "compiler": version.stdout.splitlines()[0] if version.stdout else compiler(),
            "load_before": os.getloadavg()[0], "busy_before": start.busy_pct, "forced": start.forced}
    bench_args = ["--workers", ",".join(map(str, args.workers)), "--counts", ",".join(map(str, args.counts)),
                  "--optimizers", ",".join(args.optimizers), "--elements", str(args.elements),
                  "--iters", str(args.iters), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    comments, rows = run(binary, bench_args, args.timeout)
    meta["load_after"] = os.getloadavg()[0]
    for r in rows:
        r.update(commit=commit, git_dirty=dirty, busy_pct_before=round(start.busy_pct, 1), forced=start.forced,
                 load_1m_before=round(meta["load_before"], 2), load_1m_after=round(meta["load_after"], 2))
    for path in (args.csv, args.summary):
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(rows, comments, meta)
    with open(args.summary, "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
