"""The emulated-cluster benchmark's result rows: their columns, and the one writer every runner uses.

One row per run (one system, one repeat, one point); every timed iteration of every rank goes to a second file
beside it (<csv stem>_iterations.csv). cluster_bench.py, sweeps.py and any other runner that wants the same
tables and figures (e.g. a real-cluster runner) import `write_run` and the column tuples from here, so the
files stay one schema. Rows written before this schema (the pre-optimizer sweeps in results/) are read with
`read_runs`, which fills what they lack: optimizer "none", one repeat, the payload-only bound.
"""

from __future__ import annotations

import csv
import json
import pathlib
from collections.abc import Sequence

import bench_report

# Settings, measurements, then the conditions of the run (load, CPU per host, tree state) and the versions.
RUN_COLUMNS = (
    "timestamp", "run_id", "tag", "smoke", "model", "kvstore", "compute", "status", "exit_code",
    "hosts", "layout", "workers", "servers", "bandwidth", "bandwidth_bps", "p100_equiv_gbps", "batch_size",
    "slice_size", "gpu", "gpu_scale", "efficiency", "efficiency_factor", "optimizer", "update_on",
    "warmup", "iters", "repeats", "repeat", "order", "seed",
    "unit", "samples_per_batch", "median_s", "q1_s", "q3_s", "iter_s", "throughput", "compute_s",
    "payload_bound_s", "comm_bound_s", "bound_s", "bound_throughput", "pct_of_bound", "model_bytes",
    "wire_bytes", "messages", "wall_s",
    "load_1m_before", "load_1m_after", "max_load", "busy_pct_before", "max_busy_pct", "forced",
    "cpu_host_pct", "cpu_total_pct",
    "git_commit", "git_dirty", "allow_dirty", "cpus", "python", "mxnet", "p3kv", "horovod", "gluoncv", "sockeye",
)
ITERATION_COLUMNS = ("run_id", "tag", "model", "kvstore", "hosts", "bandwidth", "gpu_scale", "repeat", "rank",
                     "iteration", "time_s")
# What rows from before this schema lacked, as they ran: no optimizer, one run per point.
LEGACY_DEFAULTS = {"optimizer": "none", "update_on": "none", "repeats": "1", "repeat": "0", "smoke": "False",
                   "efficiency": "0.5", "efficiency_factor": "1"}


def iterations_path(csv_path: pathlib.Path) -> pathlib.Path:
    return csv_path.with_name(f"{csv_path.stem}_iterations.csv")


def write_run(csv_path: pathlib.Path, row: dict, iterations: dict[int, Sequence[float]] | None = None) -> None:
    """Appends one run's row to `csv_path` and its iterations ({rank: [seconds, ...]}) to the file beside it.
    A column the row lacks is written empty; a key not in RUN_COLUMNS is an error (a typo would be lost)."""
    unknown = set(row) - set(RUN_COLUMNS)
    if unknown:
        raise ValueError(f"not run columns: {', '.join(sorted(unknown))}")
    row = dict(row)
    if isinstance(row.get("iter_s"), (list, tuple)):
        row["iter_s"] = json.dumps([round(t, 6) for t in row["iter_s"]])
    bench_report.append_csv(csv_path, [row], RUN_COLUMNS)
    if iterations:
        keys = {k: row.get(k, "") for k in ITERATION_COLUMNS if k not in ("rank", "iteration", "time_s")}
        rows = [{**keys, "rank": rank, "iteration": i, "time_s": round(t, 6)}
                for rank, times in sorted(iterations.items()) for i, t in enumerate(times)]
        bench_report.append_csv(iterations_path(csv_path), rows, ITERATION_COLUMNS)


def read_runs(path: pathlib.Path, ok_only: bool = True) -> list[dict]:
    """Rows of a run CSV (this schema or the legacy one), legacy gaps filled in (see LEGACY_DEFAULTS)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        legacy = "optimizer" not in (reader.fieldnames or [])
        rows = []
        for row in reader:
            if ok_only and row.get("status") != "ok":
                continue
            if legacy:
                row = {**LEGACY_DEFAULTS, **{k: v for k, v in row.items() if v not in (None, "")}, "legacy": "True"}
                if row.get("compute") == "real":  # Gluon SGD on the servers, no momentum, no weight decay
                    row["optimizer"] = row["update_on"] = "sgd-plain"
                row.setdefault("payload_bound_s", row.get("bound_s", ""))
            else:
                row["legacy"] = "False"
            rows.append(row)
    return rows


def iteration_times(row: dict) -> list[float]:
    """Rank 0's timed iterations of a run (this schema), or the run's median alone (legacy rows)."""
    times = row.get("iter_s")
    if times:
        return [float(t) for t in (json.loads(times) if isinstance(times, str) else times)]
    return [float(row["median_s"])] if row.get("median_s") else []
