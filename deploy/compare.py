"""`fab bench`: the comparison of the emulated-cluster benchmark, run on a real cluster with real compute.

Every system (p3kv, MXNet dist_sync, MXNet's P3, Horovod) trains the same real model on every host's accelerator
(GPU when the host has one, else CPU: benchmarks/workloads/device_worker.py, which is cluster_worker.py's real-
compute loop; a host running several workers gives each the GPU of its local rank, which p3kv.launch hands every
system's workers), one job per system and repeat, launched with deploy.launch and collected with deploy.logs. The
emulated runner's machinery, reused: the order is cluster_bench.interleave's (freshly shuffled every repeat, seeded,
position recorded); the run guard (benchmarks/emulation/run_guard.py) refuses a dirty tree unless `allow_dirty` and,
before every job, waits up to `load_wait` seconds for this machine (the one driving the hosts) to be idle (CPU busy
over a 5-second sample at most `max_busy` percent; the 1-minute load at most `max_load` if given), then refuses
unless `force`, all recorded; each job's result becomes one row written by benchmarks/analysis/bench_rows.py (the
emulated runner's columns: optimizer and where it ran, the system's setting from `env`, conditions, versions, every
rank's timed iterations, whose quartiles the row's median and IQR are; dest/cluster.csv) with every rank's timed
iterations also beside it (dest/cluster_iterations.csv), and dest/cluster.md and dest/cluster.png are that runner's
table (median and IQR over every iteration of every repeat) and figure, so the emulated and the real cluster's
results read the same way. The physical bound counts the link only when `bandwidth` (the hosts' link rate, e.g. the
cap set with `fab bandwidth`) is given and every host runs one worker and one server (Horovod: one worker; its ring
moves the same bytes per link as colocated servers do).
Horovod runs through the same launcher (`p3kv.launch --kvstore horovod`: its rendezvous on the first host with
workers, one rank per worker, no servers), summing gradients with allreduce and running the same SGD on every
worker. Gloo connects ranks by the address each host's hostname resolves to, so the hosts' names must resolve to
their addresses on the job's network (true of most clusters; the tests give each emulated host its own name).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import pathlib
import statistics
import sys
import time
import types
from collections.abc import Sequence
from typing import TextIO

from deploy.hosts import Host
from deploy.install import DEFAULT_PATH, check_horovod, deployed_python
from deploy.job import JOB_DIR_PLACEHOLDER, KVSTORES, _shares, launch, logs
from deploy.remote import ConnectionFactory, DeployError, Session

LOG = logging.getLogger("p3kv.deploy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class CompareResult:
    exit_code: int  # 0 when every job succeeded, else the first failure's code
    rows: list[dict]  # one per job, bench_rows.RUN_COLUMNS
    folder: str  # cluster.csv, cluster.md, cluster.png and each job's collected logs (<repeat>-<system>/<host>/)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # system: why it could not run


def horovod_problem(hosts: Sequence[Host], connect: ConnectionFactory, path: str) -> str | None:
    """Why Horovod cannot run on `hosts` (the deployment at `path` lacks horovod.mxnet with Gloo), or None."""
    with Session(list(hosts), connect) as session:
        def check(host: Host) -> str:
            return check_horovod(session, host, deployed_python(session, host, session.resolve(host, path)))

        try:
            session.each(check, "checking Horovod")
        except DeployError as e:
            return "; ".join(e.failures.values()) + "; or leave it out: --systems p3,dist_sync,mxnet-p3"
    return None


def _benchmarks() -> types.SimpleNamespace:
    """The emulated runner's machinery (imported when used: it pulls in matplotlib's users): cluster_bench's
    conditions, order, bound, table and figure, bench_rows' writer, bench_stats, run_guard and the rate parser."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from benchmarks.analysis import bench_rows, bench_stats
    from benchmarks.emulation import emulated_cluster, run_guard
    from benchmarks.suites import baseline_settings, cluster_bench

    def setting(system: str, env: dict | None) -> str:
        """The row's baseline_setting: the system's own tuned variables among those every process got."""
        mine = {k: v for k, v in (env or {}).items() if k in baseline_settings.DEFAULTS.get(system, {})}
        return baseline_settings.env_text(mine) or baseline_settings.DEFAULT_UNTUNED

    return types.SimpleNamespace(setting=setting, COLUMNS=bench_rows.RUN_COLUMNS, model_bytes=cluster_bench.model_bytes,
                                 comm_bound_seconds=cluster_bench.comm_bound_seconds, Point=cluster_bench.Point,
                                 Conditions=cluster_bench.Conditions, interleave=cluster_bench.interleave,
                                 common_columns=cluster_bench.common_columns, summary=cluster_bench.summary,
                                 plot_comparison=cluster_bench.plot_comparison, write_run=bench_rows.write_run,
                                 quartiles=bench_stats.quartiles, run_guard=run_guard,
                                 parse_rate=emulated_cluster.parse_rate)


def refused() -> type[Exception]:
    """run_guard.Refused: what `compare` raises when the run guard stops it (the message says how to override)."""
    return _benchmarks().run_guard.Refused


def _row(cb: types.SimpleNamespace, results: list[dict], *, point, workers: int, servers: int, colocated: bool,
         exit_code: int, wall: float, devices: set[str], run_id: str) -> dict:
    """One job's row (bench_rows.RUN_COLUMNS, without the columns common to the invocation)."""
    row = {"run_id": run_id, "model": point.model, "kvstore": point.kvstore, "compute": "real",
           "hosts": point.hosts, "workers": workers, "servers": servers,
           "layout": "colocated" if colocated else "deployed", "bandwidth": point.bandwidth or "unknown",
           "batch_size": point.batch_size, "slice_size": "", "gpu": ",".join(sorted(devices)),
           "warmup": point.warmup, "iters": point.iters, "repeat": point.repeat, "repeats": point.repeats,
           "order": point.order, "tag": point.tag, "exit_code": exit_code, "wall_s": round(wall, 1),
           "optimizer": point.optimizer}
    if exit_code != 0 or len(results) != workers:
        row["status"] = f"failed({exit_code})"
        return row
    first = next(r for r in results if r["rank"] == 0)
    rate = cb.parse_rate(point.bandwidth) if point.bandwidth else None
    try:
        nbytes = cb.model_bytes(point.model)
    except FileNotFoundError:  # no shape file (e.g. the smoke tests' tiny model): no link bound
        nbytes = 0
    # Payload only: wire_bound's header-inclusive load models the emulated cluster's frames, not this network.
    comm = cb.comm_bound_seconds(nbytes, point.hosts, rate) if colocated and nbytes else 0.0
    compute = statistics.median(r["compute_s"] for r in results)
    bound = max(compute, comm)
    throughput = sum(r["samples_per_batch"] / r["median_s"] for r in results)
    bound_throughput = workers * first["samples_per_batch"] / bound
    ranks = [r["iter_s"] for r in sorted(results, key=lambda r: r["rank"])]
    q1, median, q3 = cb.quartiles([t for times in ranks for t in times])  # every rank's, as the emulated rows
    row.update(status="ok", unit=first["unit"], samples_per_batch=first["samples_per_batch"],
               median_s=round(median, 4), q1_s=round(q1, 4), q3_s=round(q3, 4), iter_s=first["iter_s"],
               rank_iter_s=ranks, update_placement=first.get("update_placement", ""),
               throughput=round(throughput, 2), compute_s=round(compute, 4), payload_bound_s=round(bound, 4),
               comm_bound_s=round(comm, 4), bound_s=round(bound, 4), bound_throughput=round(bound_throughput, 2),
               optimizer=first["optimizer"], update_on=first["update_on"],
               pct_of_bound=round(100 * throughput / bound_throughput, 1), model_bytes=nbytes or "",
               bandwidth_bps=rate or "", **{k: v for k, v in first["versions"].items() if k in cb.COLUMNS})
    return row


def compare(hosts: Sequence[Host], connect: ConnectionFactory, dest: str, *, systems: Sequence[str] = KVSTORES,
            model: str = "resnet50_v1", batch_size: int = 32, warmup: int = 3, iters: int = 20, repeats: int = 3,
            bandwidth: str | None = None, seed: int = 0, tag: str = "fab bench", out: TextIO | None = None,
            workers: int = 1, servers: int = 1, port: int = 9000, allow_dirty: bool = False,
            max_busy: float | None = None, max_load: float | None = None, load_wait: float = 600.0, force: bool = False,
            **launch_options) -> CompareResult:
    """Runs every system `repeats` times (cluster_bench.interleave's order: shuffled afresh each repeat, from
    `seed`) across `hosts`; writes and returns the rows. Raises run_guard.Refused before a job that may not
    start (a dirty tree without `allow_dirty`; this machine busy, see run_guard.wait_for_idle, for `load_wait`
    seconds without `force`). `launch_options` (path, timeout, env,
    state_dir, grace) go to deploy.launch."""
    unknown = [s for s in systems if s not in KVSTORES]
    if unknown or not systems:
        raise ValueError(f"--systems {','.join(systems)}: choose from {', '.join(KVSTORES)}")
    if repeats < 1 or iters < 1:
        raise ValueError("--repeats and --iters must be at least 1")
    cb = _benchmarks()
    if bandwidth:
        cb.parse_rate(bandwidth)  # a ValueError names the accepted forms
    skipped = {}
    if "horovod" in systems:  # optional, as in the emulated runner: left out, with the reason, where missing
        problem = horovod_problem([h for h, _, _ in _shares(hosts, workers, servers, "horovod")], connect,
                                  launch_options.get("path", DEFAULT_PATH))
        if problem:
            LOG.warning("skipping horovod: %s", problem)
            skipped["horovod"] = problem
            systems = [s for s in systems if s != "horovod"]
            if not systems:
                raise ValueError(f"--systems horovod: Horovod cannot run here: {problem}")
    conditions = cb.Conditions(load_wait=load_wait, force=force, allow_dirty=allow_dirty, seed=seed,
                               max_load=max_load, **({} if max_busy is None else {"max_busy": max_busy}))
    commit, dirty = cb.run_guard.check_tree(conditions.allow_dirty)
    shares = {system: _shares(hosts, workers, servers, system) for system in systems}
    # One comparison (cluster_bench.interleave's group): the hosts that run something in a parameter-server job.
    ps_shares = _shares(hosts, workers, servers)
    used_hosts = len(ps_shares)
    # Link in the bound when every host runs one worker and one server (then Horovod runs one rank on each).
    colocated = all(w == 1 and s == 1 for _, w, s in ps_shares)
    command = ["python", "-m", "benchmarks.workloads.device_worker", "--model", model, "--compute", "real",
               "--batch-size", str(batch_size), "--warmup", str(warmup), "--iters", str(iters), "--optimizer", "sgd",
               "--log-interval", str(max(1, min(5, iters))), "--out", f"{JOB_DIR_PLACEHOLDER}/result"]
    os.makedirs(dest, exist_ok=True)
    csv_path = pathlib.Path(dest, "cluster.csv")
    base = [cb.Point(model=model, kvstore=system, hosts=used_hosts, bandwidth=bandwidth, compute="real",
                     batch_size=batch_size, warmup=warmup, iters=iters, tag=tag,
                     layout="colocated" if colocated else "deployed") for system in systems]
    rows, exit_code = [], 0
    for job, point in enumerate(cb.interleave(base, repeats, seed)):
        start_state = cb.run_guard.wait_for_idle(conditions.max_busy, conditions.max_load, conditions.load_wait,
                                                 conditions.force)
        start = time.perf_counter()
        argv = command + (["--system", "horovod"] if point.kvstore == "horovod" else [])
        result = launch(hosts, connect, argv, kvstore=point.kvstore, workers=workers, servers=servers,
                        port=port + job, out=out, **launch_options)
        folder = os.path.join(dest, f"{point.repeat}-{point.kvstore}")
        logs(hosts, connect, result.job, folder)
        found = sorted(glob.glob(os.path.join(folder, "*", "result.*.rank*.json")))
        results = [json.loads(pathlib.Path(p).read_text()) for p in found]
        devices = {os.path.basename(p).split(".")[1] for p in found}
        row = {**cb.common_columns(conditions, commit, dirty), "forced": start_state.forced,
               "busy_pct_before": round(start_state.busy_pct, 1), "load_1m_before": round(start_state.load_1m, 2),
               "load_1m_after": round(os.getloadavg()[0], 2),
               "baseline_setting": cb.setting(point.kvstore, launch_options.get("env")),
               **_row(cb, results, point=point, workers=sum(s[1] for s in shares[point.kvstore]),
                      servers=sum(s[2] for s in shares[point.kvstore]), colocated=colocated,
                      exit_code=result.exit_code, wall=time.perf_counter() - start, devices=devices,
                      run_id=f"{result.job.job_id}.{point.kvstore}.r{point.repeat}")}
        exit_code = exit_code or result.exit_code or (0 if row["status"] == "ok" else 1)
        rows.append(row)
        cb.write_run(csv_path, row, {r["rank"]: r["iter_s"] for r in results} if row["status"] == "ok" else None)
    with open(os.path.join(dest, "cluster.md"), "w") as f:
        f.write(cb.summary(rows))
    devices = ",".join(sorted({r["gpu"] for r in rows if r.get("gpu")})) or "?"
    cb.plot_comparison(rows, pathlib.Path(dest, "cluster.png"),
                       f"{model}: {used_hosts} hosts, {bandwidth or 'link rate not given'}, real compute ({devices}), "
                       f"{repeats} repeats")
    return CompareResult(exit_code, rows, dest, skipped)
