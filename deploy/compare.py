"""`fab bench`: the comparison of the emulated-cluster benchmark, run on a real cluster with real compute.

Every system (p3kv, MXNet dist_sync, MXNet's P3) trains the same real model on every host's accelerator (GPU
when the host has one, else CPU: benchmarks/device_worker.py, which is cluster_worker.py's real-compute loop), one
job per system and repeat, launched with deploy.launch and collected with deploy.logs, in a shuffled order each
repeat. Each job's result becomes one row with benchmarks/cluster_bench.py's CSV columns (appended to
dest/cluster.csv), and dest/cluster.md and dest/cluster.png are that runner's table and figure, so the emulated
and the real cluster's results read the same way. The physical bound counts the link only when `bandwidth` (the
hosts' link rate, e.g. the cap set with `fab bandwidth`) is given and every host runs one worker and one server.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
import random
import statistics
import sys
import time
import types
from collections.abc import Sequence
from typing import TextIO

from deploy.hosts import Host
from deploy.job import JOB_DIR_PLACEHOLDER, KVSTORES, _shares, launch, logs
from deploy.remote import ConnectionFactory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
OPTIMIZER = {"p3": "sgd on servers", "dist_sync": "sgd on servers", "mxnet-p3": "sgd on workers"}


@dataclasses.dataclass(frozen=True)
class CompareResult:
    exit_code: int  # 0 when every job succeeded, else the first failure's code
    rows: list[dict]  # one per job, cluster_bench.COLUMNS
    folder: str  # cluster.csv, cluster.md, cluster.png and each job's collected logs (<repeat>-<system>/<host>/)


def _benchmarks() -> types.SimpleNamespace:
    """benchmarks/cluster_bench.py (a script folder, not a package: its columns, bound, table and figure), with
    the CSV writer and rate parser it uses."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    import bench_report
    import cluster_bench
    import emulated_cluster

    return types.SimpleNamespace(COLUMNS=cluster_bench.COLUMNS, model_bytes=cluster_bench.model_bytes,
                                 comm_bound_seconds=cluster_bench.comm_bound_seconds,
                                 common_columns=cluster_bench.common_columns, summary=cluster_bench.summary,
                                 plot_comparison=cluster_bench.plot_comparison, append_csv=bench_report.append_csv,
                                 parse_rate=emulated_cluster.parse_rate)


def _row(cb: types.SimpleNamespace, results: list[dict], *, system: str, model: str, hosts: int, workers: int,
         servers: int, colocated: bool, bandwidth: str | None, batch_size: int, warmup: int, iters: int, repeat: int,
         exit_code: int, wall: float, devices: set[str], tag: str) -> dict:
    row = {"model": model, "kvstore": system, "compute": "real", "hosts": hosts, "workers": workers,
           "servers": servers, "layout": "colocated" if colocated else "deployed", "bandwidth": bandwidth or "unknown",
           "batch_size": batch_size, "slice_size": "", "gpu": ",".join(sorted(devices)), "warmup": warmup,
           "iters": iters, "repeat": repeat, "tag": tag, "exit_code": exit_code, "wall_s": round(wall, 1),
           "optimizer": OPTIMIZER.get(system, "")}
    if exit_code != 0 or len(results) != workers:
        row["status"] = f"failed({exit_code})"
        return row
    first = next(r for r in results if r["rank"] == 0)
    rate = cb.parse_rate(bandwidth) if bandwidth else None
    try:
        nbytes = cb.model_bytes(model)
    except FileNotFoundError:  # no shape file (e.g. the smoke tests' tiny model): no link bound
        nbytes = 0
    comm = cb.comm_bound_seconds(nbytes, hosts, rate) if colocated and nbytes else 0.0
    compute = statistics.median(r["compute_s"] for r in results)
    bound = max(compute, comm)
    throughput = sum(r["samples_per_batch"] / r["median_s"] for r in results)
    bound_throughput = workers * first["samples_per_batch"] / bound
    row.update(status="ok", unit=first["unit"], samples_per_batch=first["samples_per_batch"],
               median_s=round(first["median_s"], 4), throughput=round(throughput, 2), compute_s=round(compute, 4),
               comm_bound_s=round(comm, 4), bound_s=round(bound, 4), bound_throughput=round(bound_throughput, 2),
               pct_of_bound=round(100 * throughput / bound_throughput, 1), model_bytes=nbytes or "",
               bandwidth_bps=rate or "", **{k: v for k, v in first["versions"].items() if k in cb.COLUMNS})
    return row


def compare(hosts: Sequence[Host], connect: ConnectionFactory, dest: str, *, systems: Sequence[str] = KVSTORES,
            model: str = "resnet50_v1", batch_size: int = 32, warmup: int = 3, iters: int = 20, repeats: int = 3,
            bandwidth: str | None = None, seed: int = 0, tag: str = "fab bench", out: TextIO | None = None,
            workers: int = 1, servers: int = 1, port: int = 9000, **launch_options) -> CompareResult:
    """Runs every system `repeats` times (order shuffled each repeat, from `seed`) across `hosts`; writes and
    returns the rows. `launch_options` (path, timeout, env, state_dir, grace) go to deploy.launch."""
    unknown = [s for s in systems if s not in KVSTORES]
    if unknown or not systems:
        raise ValueError(f"--systems {','.join(systems)}: choose from {', '.join(KVSTORES)}")
    if repeats < 1 or iters < 1:
        raise ValueError("--repeats and --iters must be at least 1")
    cb = _benchmarks()
    if bandwidth:
        cb.parse_rate(bandwidth)  # a ValueError names the accepted forms
    shares = _shares(hosts, workers, servers)
    total_workers, total_servers = sum(s[1] for s in shares), sum(s[2] for s in shares)
    colocated = all(w == 1 and s == 1 for _, w, s in shares)
    command = ["python", "benchmarks/device_worker.py", "--model", model, "--compute", "real", "--batch-size",
               str(batch_size), "--warmup", str(warmup), "--iters", str(iters), "--log-interval",
               str(max(1, min(5, iters))), "--out", f"{JOB_DIR_PLACEHOLDER}/result"]
    os.makedirs(dest, exist_ok=True)
    csv_path = os.path.join(dest, "cluster.csv")
    common = cb.common_columns()
    order = random.Random(seed)
    rows, exit_code, job = [], 0, 0
    for repeat in range(repeats):
        shuffled = list(systems)
        order.shuffle(shuffled)
        for system in shuffled:
            start = time.perf_counter()
            result = launch(hosts, connect, command, kvstore=system, workers=workers, servers=servers,
                            port=port + job, out=out, **launch_options)
            job += 1
            folder = os.path.join(dest, f"{repeat}-{system}")
            logs(hosts, connect, result.job, folder)
            found = sorted(glob.glob(os.path.join(folder, "*", "result.*.rank*.json")))
            results = [json.loads(pathlib.Path(p).read_text()) for p in found]
            devices = {os.path.basename(p).split(".")[1] for p in found}
            row = {**common, **_row(cb, results, system=system, model=model, hosts=len(shares),
                                    workers=total_workers, servers=total_servers, colocated=colocated,
                                    bandwidth=bandwidth, batch_size=batch_size, warmup=warmup, iters=iters,
                                    repeat=repeat, exit_code=result.exit_code, wall=time.perf_counter() - start,
                                    devices=devices, tag=tag)}
            exit_code = exit_code or result.exit_code or (0 if row["status"] == "ok" else 1)
            rows.append(row)
            cb.append_csv(pathlib.Path(csv_path), [row], cb.COLUMNS)
    with open(os.path.join(dest, "cluster.md"), "w") as f:
        f.write(cb.summary(rows))
    devices = ",".join(sorted({r["gpu"] for r in rows if r.get("gpu")})) or "?"
    cb.plot_comparison(rows, pathlib.Path(dest, "cluster.png"),
                       f"{model}: {len(shares)} hosts, {bandwidth or 'link rate not given'}, real compute ({devices})")
    return CompareResult(exit_code, rows, dest)
