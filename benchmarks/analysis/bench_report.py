"""Results of the transport benchmark: the CSV every run is appended to, and the markdown summary table.

The transport benchmark is not like-for-like: its p3kv rows drive p3kv's raw P3Worker on numpy arrays (no MXNet
engine, no kvstore adapter), while the MXNet rows go through kv.pushpull and MXNet's engine; no system runs an
optimizer. The `path` column and the table's labels say so; benchmarks/suites/kvstore_bench.py is the like-for-like one.
"""

from __future__ import annotations

import csv
import logging
import pathlib
import statistics
from collections.abc import Iterable, Sequence

LOG = logging.getLogger("bench_report")

# One row per (repeat, model, kvstore) run. Settings, versions and commit travel with every row, so rows from
# different invocations stay comparable in one file. The 1-minute load average before and after each job flags
# runs that shared the CPUs with something else.
COLUMNS = (
    "timestamp", "git_commit", "git_dirty", "repeat", "model", "kvstore", "status", "exit_code",
    "workers", "servers", "warmup", "iters", "slice_size", "arrays", "params", "bytes",
    "median_s", "mean_s", "min_s", "max_s", "goodput_gbit_s", "wall_s",
    "server_peak_rss_mib", "worker_peak_rss_mib", "scheduler_peak_rss_mib", "total_peak_rss_mib",
    "dmlc_ps_van_type", "dmlc_ps_water_mark", "mxnet_kvstore_slice_threshold", "omp_num_threads",
    "cpus", "load_1m_before", "load_1m_after", "python", "numpy", "mxnet", "p3kv", "path",
)
# What each transport-benchmark kvstore actually runs (the `path` column and the table's labels).
PATH_OF = {"p3": "p3kv raw P3Worker on numpy (no MXNet engine)", "dist_sync": "MXNet kv.pushpull (engine)",
           "mxnet-p3": "MXNet kv.pushpull (engine)"}
LABEL_OF = {"p3": "p3kv, raw P3Worker (numpy, no MXNet engine)", "dist_sync": "MXNet dist_sync (kv.pushpull)",
            "mxnet-p3": "MXNet P3 (kv.pushpull)"}


def append_csv(path: pathlib.Path, rows: Iterable[dict], columns: Sequence[str] = COLUMNS) -> None:
    """Append rows; write the header if the file is new. A file written before some of `columns` existed (its
    header a subset of them) is first rewritten with all of them, its rows reading the new ones as empty; a file
    with a column `columns` lacks is an error (move it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if len(header) < len(columns) and tuple(header) == tuple(columns[:len(header)]):
            lines = path.read_text().splitlines(keepends=True)  # added at the end: the header alone changes
            path.write_text(",".join(columns) + "\n" + "".join(lines[1:]))
        elif tuple(header) != tuple(columns) and set(header) <= set(columns):
            with path.open(newline="") as f:
                old = list(csv.DictReader(f))
            tmp = path.with_suffix(".tmp")
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(columns))
                writer.writeheader()
                writer.writerows(old)
            tmp.replace(path)
        elif tuple(header) != tuple(columns):
            raise SystemExit(f"{path} has columns this version of the benchmark does not write "
                             f"({', '.join(sorted(set(header) - set(columns)))}); move it aside (e.g. rename it) "
                             "and run again")
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Per (model, kvstore): median over repeats of the per-run median s/iter, and the speedup over dist_sync
    (dist_sync's s/iter divided by this one's: above 1 is faster than dist_sync)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["kvstore"]), []).append(row)
    table = []
    for (model, kvstore), runs in groups.items():
        ok = [r for r in runs if r["status"] == "ok"]
        medians = [float(r["median_s"]) for r in ok]
        rss = [float(r["server_peak_rss_mib"]) for r in ok if r.get("server_peak_rss_mib") not in (None, "")]
        s_iter = statistics.median(medians) if medians else None
        table.append({
            "model": model, "kvstore": kvstore, "runs": len(runs), "ok": len(ok), "s_iter": s_iter,
            "spread": (min(medians), max(medians)) if medians else None,
            "goodput": 2 * 8 * float(ok[0]["bytes"]) / s_iter / 1e9 if s_iter else None,
            "server_rss": max(rss) if rss else None,
            "wall_s": statistics.median(float(r["wall_s"]) for r in runs),
        })
    baseline = {t["model"]: t["s_iter"] for t in table if t["kvstore"] == "dist_sync"}
    for t in table:
        base = baseline.get(t["model"])
        t["speedup"] = base / t["s_iter"] if base and t["s_iter"] else None
    return table


def markdown(table: Sequence[dict], settings: str) -> str:
    lines = [
        "# Transport benchmark (push + broadcast of every array, no model compute, no optimizer)", "", settings, "",
        ("Not like-for-like: p3kv's rows drive its raw P3Worker on numpy arrays, the MXNet rows go through "
         "kv.pushpull and MXNet's engine. benchmarks/suites/kvstore_bench.py compares all systems through the engine "
         "with the same optimizer."), "",
        ("| model | kvstore | ok/runs | s/iter (median) | min-max of run medians | goodput Gbit/s "
         "| speedup vs dist_sync | server peak RSS MiB | wall s/run |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        spread = f"{t['spread'][0]:.3f}-{t['spread'][1]:.3f}" if t["spread"] else "-"
        label = LABEL_OF.get(t["kvstore"], t["kvstore"])
        lines.append(f"| {t['model']} | {label} | {t['ok']}/{t['runs']} | {_fmt(t['s_iter'], 3)} | {spread} "
                     f"| {_fmt(t['goodput'], 2)} | {_fmt(t['speedup'], 2)} | {_fmt(t['server_rss'], 0)} "
                     f"| {t['wall_s']:.0f} |")
    lines += ["", ("goodput: bytes one worker pushes plus receives per second. speedup: dist_sync's s/iter "
                   "divided by this row's (above 1 is faster)."), ""]
    return "\n".join(lines)
