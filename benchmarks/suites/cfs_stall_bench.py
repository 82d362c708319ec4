"""What a host's CPU quota costs the virtual GPU's timer, per CFS period and bandwidth slice.

The emulated cluster's virtual GPU completes operations from a real-time thread outside every host's quota, but
through MXNet's engine callback, which takes mutexes the host's threads also take. A host thread that its quota
stops inside such a section holds the timer until the next period (cfs_bandwidth.py). This bench measures that
alone, with no MXNet: benchmarks/emulation/cfs_stall_probe.cc runs `--threads` host threads in one CPU group with
a quota of `--cores`, and a probe thread moved out of the group, SCHED_FIFO like the timer, that wakes every
`--probe-period-us` and records how late it woke. What the host threads do (`--work`): `lock`, share an ordinary
mutex (held `--hold-us`, then `--gap-us` of work without it) that the probe takes too, recording how long it
waited; `pi`, the same with a priority-inheriting mutex; `tcp`, stream over loopback TCP (kernel work, which a
kernel without full preemption does not let the probe interrupt). Each (work, period, slice) setting runs
`--repeats` times, interleaved. Rows: results/cfs_stall.csv; table: results/cfs_stall.md. Needs root and cgroup v1
(one thread leaves its process's group only there).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.emulation import cfs_bandwidth, cpu_limit, run_guard
from benchmarks.paths import RESULTS, ROOT

LOG = logging.getLogger("cfs_stall_bench")
SOURCE = ROOT / "benchmarks" / "emulation" / "cfs_stall_probe.cc"
FLAGS = ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]
FIELDS = ("timestamp", "git_commit", "git_dirty", "repeat", "work", "cores", "period_us", "quota_us", "slice_us",
          "threads", "hold_us", "gap_us", "probe_period_us", "seconds", "samples", "wait_p50_us", "wait_p99_us",
          "wait_p999_us", "wait_max_us", "wake_late_p99_us", "wake_late_max_us", "host_sections", "throttled_pct",
          "outside_group", "realtime", "busy_pct_before", "load_1m_before", "forced")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=float, default=0.4, help="the group's quota in cores (default 0.4: 4 host CPUs "
                    "at gpu_scale 0.1, the demo's)")
    ap.add_argument("--work", nargs="+", default=["lock", "pi", "tcp"], choices=["lock", "pi", "tcp"],
                    help="what the host threads do (see above)")
    ap.add_argument("--periods", type=int, nargs="+", default=[10_000, 5000, 2500], help="CFS periods, us")
    ap.add_argument("--slices", type=int, nargs="+", default=[1000, 250], help="machine bandwidth slices, us")
    ap.add_argument("--threads", type=int, default=2, help="host threads sharing the mutex")
    ap.add_argument("--hold-us", type=int, default=20)
    ap.add_argument("--gap-us", type=int, default=80)
    ap.add_argument("--probe-period-us", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0, help="per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--binary", default=str(ROOT / "build" / "tools" / "cfs_stall_probe"))
    ap.add_argument("--csv", default=str(RESULTS / "cfs_stall.csv"))
    ap.add_argument("--summary", default=str(RESULTS / "cfs_stall.md"))
    run_guard.add_arguments(ap)
    return ap.parse_args(argv)


def build(binary: pathlib.Path) -> None:
    binary.parent.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "g++").split()
    done = subprocess.run([*cxx, *FLAGS, str(SOURCE), "-o", str(binary)], capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cfs_stall_bench: building {SOURCE.name} failed:\n{done.stdout}{done.stderr}")


def run_one(binary: pathlib.Path, hierarchy: cpu_limit.Hierarchy, args: argparse.Namespace, work: str, period: int,
            slice_us: int) -> dict:
    """One probe run doing `work` in a fresh group with the quota of `args.cores` over `period` and the machine's
    slice at `slice_us`: the probe's JSON plus the group's throttled share and the quota it got."""
    name = f"p3c{os.getpid()}x900h0"  # cpu_limit.cleanup_stale's pattern: removed if this process dies
    limits = cpu_limit.HostCpuLimits([name], hierarchy, slice_file=cfs_bandwidth.SLICE_FILE,
                                     base_period_us=period, slice_us=slice_us)
    with limits:
        limits.set_quota(args.cores)
        before = limits.usage()[0]
        probe = [str(binary), work, str(args.seconds), str(args.threads), str(args.hold_us), str(args.gap_us),
                 str(args.probe_period_us), str(hierarchy.cpu / "tasks")]
        done = subprocess.run(limits.wrap(0, probe), capture_output=True, text=True, timeout=args.seconds + 60,
                              check=False)
        used = limits.usage()[0] - before
        if done.returncode != 0:
            raise RuntimeError(f"cfs_stall_probe exited {done.returncode}: {done.stderr.strip()}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        quota_us = max(cfs_bandwidth.MIN_QUOTA_US, round(args.cores * limits.period_us))
        return {**result, "work": work, "period_us": limits.period_us, "quota_us": quota_us,
                "slice_us": limits.bandwidth_slice_us or "",
                "throttled_pct": round(100 * used.throttled_s / args.seconds, 1)}


def summary(rows: list[dict], args: argparse.Namespace, meta: dict) -> str:
    lines = [
        "# How long a host's CPU quota holds a real-time thread that shares a lock with it",
        "",
        f"`python -m benchmarks.suites.cfs_stall_bench` at commit {meta['commit']}"
        f"{' (uncommitted changes)' if meta['dirty'] else ''}, {meta['when']}; {os.cpu_count()} CPUs, kernel "
        f"{os.uname().release}. Started once a 5-second sample showed the CPUs {meta['busy']:.0f}% busy"
        f"{' (--force)' if meta['forced'] else ''}. One CPU group with a quota of {args.cores:g} cores and "
        f"{args.threads} host threads; a probe thread outside the group (SCHED_FIFO 1, as the virtual GPU's timer) "
        f"wakes every {args.probe_period_us} us. Work: `lock`, the host threads take an ordinary mutex for "
        f"{args.hold_us} us, then work {args.gap_us} us without it, and the probe takes the same mutex after each "
        "wake-up (wait: how long it waited); `pi`, the same with a priority-inheriting mutex; `tcp`, the host "
        f"threads stream over loopback TCP and the probe only wakes. Wake-ups due while the probe was still held "
        f"are skipped, so one stall counts once. {args.seconds:g} s per run, {args.repeats} "
        "repeats per setting, interleaved; the table gives the median over repeats (min-max for the maxima).",
        "",
        "| work | CFS period | quota per period | slice | probe wait p50 | p99 | p99.9 | max (min-max) "
        "| wake-up late p99 | max (min-max) | group throttled |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["work"], r["period_us"], r["slice_us"]) for r in rows):
        group = [r for r in rows if (r["work"], r["period_us"], r["slice_us"]) == key]

        def med(field: str, group: list[dict] = group) -> float:
            return statistics.median(float(r[field]) for r in group)

        def spread(field: str, group: list[dict] = group) -> str:
            values = [float(r[field]) / 1000 for r in group]
            return f"{statistics.median(values):.2f} ms ({min(values):.2f}-{max(values):.2f})"

        waits = (f"{med('wait_p50_us'):.0f} us | {med('wait_p99_us'):.0f} us | {med('wait_p999_us'):.0f} us "
                 f"| {spread('wait_max_us')}") if key[0] != "tcp" else "- | - | - | -"
        lines.append(f"| {key[0]} | {key[1] / 1000:g} ms | {group[0]['quota_us'] / 1000:g} ms | {key[2]} us "
                     f"| {waits} | {med('wake_late_p99_us'):.0f} us | {spread('wake_late_max_us')} "
                     f"| {med('throttled_pct'):.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    hierarchy = cpu_limit.find_hierarchy()
    if hierarchy.version != 1:
        LOG.error("cfs_stall_bench needs cgroup v1's cpu controller: under v2 one thread cannot leave its "
                  "process's group (the probe would be limited by the quota it measures)")
        return 2
    tree = run_guard.tree_or_refusal(args.allow_dirty)
    if tree is None:
        return 2
    binary = pathlib.Path(args.binary)
    build(binary)
    try:
        start = run_guard.wait_for_idle(args.max_busy, args.max_load, args.load_wait, args.force)
    except run_guard.Refused as e:
        LOG.error("%s", e)
        return 2
    meta = {"commit": tree[0], "dirty": tree[1], "busy": start.busy_pct, "forced": start.forced,
            "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    rows = []
    settings = [(w, p, s) for w in args.work for p in args.periods for s in args.slices]
    for repeat in range(args.repeats):
        for work, period, slice_us in settings:
            load = os.getloadavg()[0]
            result = run_one(binary, hierarchy, args, work, period, slice_us)
            rows.append({"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "git_commit": tree[0], "git_dirty": tree[1], "repeat": repeat, "cores": args.cores,
                         "threads": args.threads, "hold_us": args.hold_us, "gap_us": args.gap_us,
                         "probe_period_us": args.probe_period_us, "seconds": args.seconds, **result,
                         "busy_pct_before": round(start.busy_pct, 1), "load_1m_before": round(load, 2),
                         "forced": start.forced})
            LOG.info("%s, period %d us, slice %s us: wait max %.0f us, wake-up late max %.0f us, "
                     "throttled %.0f%%", work, period, result["slice_us"], result["wait_max_us"],
                     result["wake_late_max_us"], result["throttled_pct"])
    for path in (args.csv, args.summary):
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    text = summary(rows, args, meta)
    pathlib.Path(args.summary).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
