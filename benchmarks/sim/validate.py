"""Held-out validation: the simulator against emulated-cluster measurements it was not fitted on
-> results/sim_validation.csv (and the fitted constants, results/sim_fit.json).

Which rows. Every ok, non-smoke row of the run CSVs (results/sweeps/*.csv, results/demo_cpu_limited/*.csv) with
emulated or no compute; when any row is faithful (column `faithful`, benchmarks/emulation/fidelity.py), only
faithful rows (column `selection`; `fidelity` says what each point's rows were), less those from before a change to
the emulation (benchmarks/analysis/superseded.outdated_by: the model describes the emulation as it is; `selection`
counts them); rows under another TCP congestion control than BBR are left out (the model's window is BBR's:
sockets.py).

What is simulated: what was run there (the link rate tc enforced, not its P100-equivalent; compute dilated by
--gpu-scale at the point's efficiency; the optimizer where the system ran it, as the row's update_placement says;
each host's CPU quota and per-thread cap when the row has them, else all hosts time-sharing the machine's cores;
the virtual GPU's rule of the time: chained operations, or a 1 ms forgiven gap before them; each system at the
setting its row ran, its baseline_setting).

The split. Fit: the ResNet-50 and VGG-19 points of the bandwidth sweep. Held out: every other point (InceptionV3
and Sockeye, the scale, slice, ablation, dilation, sensitivity, utilisation and demo points). CPU costs come from
loopback benchmarks only (costs.py). Fitted on the fit split only: each system's extra CPU per byte on the emulated
links (veth, bridge, tc: absent on loopback; fit_links) for the systems the model reads on one thread or on a
thread per connection, and what each thread of ps-lite's processes spends on a received message, per message and per
byte (threads.py, from the rows' thread_cpu; in place of the loopback cost and the links' for those systems), and
one share of the links' rate that TCP delivers while messages wait (Cluster.link_efficiency, fit_link_efficiency:
every system's flows cross the same tbf links under BBR, whose windows and pacing leave a loaded link idle part of
the time, results/tcp_trace/summary.md; one constant for all systems, not one per system). The
measured s/iter is the median over every timed iteration of every repeat (every rank's where recorded).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import hashlib
import json
import logging
import math
import multiprocessing
import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis.points import key_value, setting_identity
from benchmarks.analysis.superseded import outdated_by
from benchmarks.sim import costs as costs_lib
from benchmarks.sim import ddp, ring, settings, sockets, threads
from benchmarks.sim import model as model_lib
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.link_fit import Constants, fit_link_efficiency, fit_links
from benchmarks.sim.miss_notes import CPU_MEAN, CPU_MEDIAN_INTERVAL, MISS, note
from benchmarks.sim.ps import simulate

LOG = logging.getLogger("sim.validate")
RESULTS = costs_lib.RESULTS
SOURCES = ("sweeps", "demo_cpu_limited")  # folders of run CSVs under results/
FIT_SOURCE = "sweeps/bandwidth.csv"
FIT_MODELS = ("resnet50_v1", "vgg19")
FIT_FILE = RESULTS / "sim_fit.json"
OLD_SLACK_S = 1e-3  # the virtual GPU's forgiven gap before operations were chained (cpp/src/device_clock.h then)
NOT_FITTED_ON = ("selection",)  # point fields that describe the whole selection, not the point
COLUMNS = ("source", "split", "fidelity", "selection", "model", "kvstore", "hosts", "layout", "bandwidth",
           "p100_equiv_gbps", "compute", "gpu_scale", "efficiency_factor", "slice_size", "batch_size", "optimizer",
           "cpu", "update_placement", "baseline_setting", "vgpu", "runs", "measured_s", "simulated_s", "rel_error",
           "measured_cpu_pct", "simulated_cpu_pct", "measured_throughput", "simulated_throughput", "unit", "note")
# What makes rows one point (their iterations are pooled); the system is part of it.
POINT = ("model", "kvstore", "hosts", "layout", "bandwidth_bps", "compute", "gpu", "gpu_scale", "efficiency_factor",
         "slice_size", "batch_size", "optimizer", "samples_per_batch", "workers", "unit", "bandwidth",
         "p100_equiv_gbps", "cpus", "cpu_quota_cores", "thread_cap_cores", "update_placement", "update_on",
         "baseline_setting", "gradient_work")
FAITHFUL = "faithful"
UNFAITHFUL = "unfaithful"
UNJUDGED = "unjudged (before the fidelity monitors)"
ONLY_FAITHFUL = "faithful rows only"
NO_FAITHFUL = "no faithful row yet: every ok row, all predating the faithful emulation"


def fidelity(row: dict) -> str:
    verdict = str(row.get("faithful", "")).strip()
    return FAITHFUL if verdict == "True" else UNFAITHFUL if verdict == "False" else UNJUDGED


def split_of(point: dict) -> str:
    return "fit" if point["source"] == FIT_SOURCE and point["model"] in FIT_MODELS else "held-out"


def _iterations(row: dict) -> list[float]:
    ranks = row.get("rank_iter_s")
    if ranks:
        return [t for rank in json.loads(ranks) for t in rank]
    return [float(t) for t in json.loads(row["iter_s"])]


def _number(value, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _max_of(text: str) -> float:
    """The largest number of a ';'-separated per-host column ("" -> 0)."""
    return max((_number(v) for v in str(text or "").split(";") if v), default=0.0)


def _point_value(row: dict, column: str) -> str:
    """A POINT column as rows are pooled by it: a baseline setting by what it runs, so that runs of one setting
    recorded under two labels (untuned, then the default a later grid kept) stay one point."""
    value = row.get(column) or ""
    return setting_identity(value) if column == "baseline_setting" else value


def measured_points(results: pathlib.Path = RESULTS) -> tuple[list[dict], str]:
    """One entry per point of every run CSV (settings, the median over all its iterations, what its runs
    measured besides), and the selection rule that applied."""
    rows = []
    for folder in SOURCES:
        for path in sorted((results / folder).glob("*.csv")):
            if path.name.endswith("_iterations.csv"):
                continue
            with open(path) as f:
                for row in csv.DictReader(f):
                    if (row.get("status") == "ok" and row.get("smoke") != "True"
                            and row.get("compute") in ("emulated", "none") and row.get("iter_s")
                            and key_value(row, "tcp_congestion_control") == sockets.CONGESTION_CONTROL):
                        rows.append((f"{folder}/{path.name}", row))
    faithful = [(s, r) for s, r in rows if fidelity(r) == FAITHFUL]
    # Rows from before a change to the emulation (superseded.outdated_by) measured an emulation the model no
    # longer describes: the model is validated on the emulation as it is; they are left out and counted.
    current = [(s, r) for s, r in faithful if not outdated_by(r)]
    selection = ONLY_FAITHFUL if faithful else NO_FAITHFUL
    if len(current) < len(faithful):
        selection += f" ({len(faithful) - len(current)} from before a change to the emulation left out)"
    faithful = current
    groups: dict[tuple, list[dict]] = {}
    for source, row in faithful or rows:
        key = (source, fidelity(row), "vgpu_forgiven_us_per_iter" in row, *(_point_value(row, k) for k in POINT))
        groups.setdefault(key, []).append(row)
    points = []
    for key, runs in groups.items():
        iterations = [t for r in runs for t in _iterations(r)]
        run_medians = [statistics.median(_iterations(r)) for r in runs]
        # The CPU the runs used: the window's mean where every run has one (what the model's mean is compared
        # with), else the median 1-s interval of rows from before it (docs/benchmarks.md).
        mean = all(r.get("cpu_total_mean_pct") for r in runs)
        point = {**dict(zip(POINT, key[3:])), "baseline_setting": runs[0].get("baseline_setting") or "",
                 "source": key[0], "fidelity": key[1], "chained": key[2],
                 "runs": len(runs), "median_s": statistics.median(iterations),
                 "run_spread": max(run_medians) / min(run_medians) - 1,
                 "cpu_total_pct": statistics.median(_number(r.get("cpu_total_mean_pct" if mean else "cpu_total_pct"))
                                                    for r in runs),
                 "cpu_statistic": CPU_MEAN if mean else CPU_MEDIAN_INTERVAL,
                 "tcp_retrans": statistics.median(_number(r.get("tcp_retrans_total")) for r in runs),
                 "throttled_pct": max(_max_of(r.get("host_throttled_pct")) for r in runs),
                 "vgpu_late_us": max(_number(r.get("vgpu_late_max_us")) for r in runs),
                 "thread_cpu": [r["thread_cpu"] for r in runs if r.get("thread_cpu")],
                 "selection": selection}
        point["split"] = split_of(point)
        points.append(point)
    return points, selection


# --- one point ---------------------------------------------------------------------------------------------------
def update_place(point: dict) -> str:
    placement = point.get("update_placement") or ""
    if "virtual GPU" in placement:
        return "workers-gpu"
    if placement.startswith("servers") or point.get("update_on") in ("servers", "none"):
        return "servers"
    return "workers-cpu"  # before GPU-side updates, the workers updated on their CPU


def cluster_of(point: dict, link_efficiency: float = 1.0) -> Cluster:
    quota = _number(point.get("cpu_quota_cores")) or None
    shared = None if quota else _number(point.get("cpus"), costs_lib.TRANSPORT_CPUS)
    rate = _number(point.get("bandwidth_bps")) or None
    return Cluster(int(point["hosts"]), rate, layout=point["layout"] or "colocated", cores=quota,
                   shared_cores=shared, thread_cores=_number(point.get("thread_cap_cores")) or None,
                   gpu_slack_s=0.0 if point.get("chained") else OLD_SLACK_S, link_efficiency=link_efficiency)


def cpu_label(point: dict) -> str:
    quota, cap = _number(point.get("cpu_quota_cores")), _number(point.get("thread_cap_cores"))
    if not quota:
        return f"shared {_number(point.get('cpus'), 2):g} cores"
    return f"quota {quota:g} cores/host" + (f", {cap:g} per thread" if cap else "")


def simulate_point(point: dict, constants: Constants) -> tuple[float, float]:
    """(simulated s/iter, simulated CPU % of one core, all hosts) of a measured point."""
    scale = _number(point.get("gpu_scale"), 1.0) or 1.0
    factor = _number(point.get("efficiency_factor"), 1.0) or 1.0
    profile = model_lib.load(point["model"], int(point["batch_size"]), point.get("gpu") or "p100", scale, factor)
    if point["compute"] == "none":  # the worker runs the virtual GPU at an infinite scale: updates take no time
        profile = dataclasses.replace(costs_lib.no_compute(profile), memory_bytes_per_s=math.inf)
    cluster = cluster_of(point, constants.link_efficiency)
    kv = point["kvstore"]
    env = settings.setting(kv, settings.parse_label(point.get("baseline_setting", "")))
    link = CpuCosts(per_byte=constants.links.get(costs_lib.MEASURED_AS.get(kv, kv), 0.0))
    # The torch systems' passes over the gradients during backward: on the virtual GPU where the row says so
    # (gradient_work.py), else the host made them, which the model does not charge (note() says so).
    gpu_passes = point.get("gradient_work") == "virtual GPU"
    if kv == "horovod":
        h = costs_lib.horovod(point["optimizer"], constants.loopback, update_place(point), link)
        result = ring.simulate(profile, cluster, settings.apply_horovod(h, env), iters=3)
    elif kv == "ddp":
        d = settings.apply_ddp(costs_lib.ddp(point["optimizer"], constants.loopback, link), env)
        if not gpu_passes:
            d = dataclasses.replace(d, bucket_accesses=0, copy_back_accesses=0)
        result = ddp.simulate(profile, cluster, d, iters=3)
    else:
        system = costs_lib.system(kv, constants.loopback, point["optimizer"], update_place(point), link)
        measured = constants.thread_costs.get(costs_lib.MEASURED_AS.get(kv, kv))
        if measured and system.receivers == "process":
            system = dataclasses.replace(system, server_threads=measured.get("server"),
                                         worker_threads=measured.get("worker"))
        if not gpu_passes:
            system = dataclasses.replace(system, push_accesses=0)
        slice_size = int(point["slice_size"]) if point.get("slice_size") else None
        result = simulate(profile, cluster, settings.apply_ps(system, env, slice_size), iters=3)
    return result.iteration_s, result.cpu_pct


def _simulate_star(args) -> tuple[float, float]:
    return simulate_point(*args)


def _cost(point: dict) -> float:
    return model_lib.load(point["model"]).nbytes * int(point["hosts"]) ** 2


def simulate_all(points: Sequence[dict], constants: Constants, processes: int = 2) -> list[tuple[float, float]]:
    """simulate_point over `points`, slowest first on `processes` processes, in the points' order."""
    order = sorted(range(len(points)), key=lambda i: -_cost(points[i]))
    if processes > 1 and len(points) > 1:
        with multiprocessing.Pool(processes) as pool:
            done = pool.map(_simulate_star, [(points[i], constants) for i in order], chunksize=1)
    else:
        done = [simulate_point(points[i], constants) for i in order]
    out: list = [None] * len(points)
    for i, value in zip(order, done):
        out[i] = value
    return out


# --- the constants -------------------------------------------------------------------------------------------
def _inputs_hash(points: Sequence[dict]) -> str:
    digest = hashlib.sha256()
    for path in [RESULTS / name for name in ("kvstore_bench.csv", "kvstore_bench_slice10000/kvstore_bench.csv",
                                             "transport.csv", "server_slice.csv")] + sorted(
            pathlib.Path(__file__).parent.glob("*.py")):  # the loopback CSVs, this simulator's source
        digest.update(path.read_bytes())
    # Each fit point as the fit reads it: not `selection`, which counts rows of every sweep (a rerun of a held-out
    # point changed it, and with it the hash, and `make sim` refitted for a minute on unchanged fit points).
    for p in sorted(json.dumps({k: v for k, v in p.items() if k not in NOT_FITTED_ON}, sort_keys=True, default=str)
                    for p in points if p["split"] == "fit"):
        digest.update(p.encode())
    return digest.hexdigest()[:16]


def constants(points: Sequence[dict], refit: bool = False, path: pathlib.Path = FIT_FILE) -> Constants:
    """The fitted constants: from `path` when it was fitted on the same inputs (loopback CSVs, fit points,
    this simulator's source), else fitted now and written there."""
    key = _inputs_hash(points)
    measured = threads.fitted(points, threads.traffic)
    if not refit and path.exists():
        saved = json.loads(path.read_text())
        if saved.get("inputs") == key:
            return Constants(costs_lib.from_dict(saved["loopback"]), saved["links_s_per_byte"], measured,
                             saved.get("link_efficiency", 1.0))
    loopback = costs_lib.fitted()
    # The links' CPU at the full rate, the rate's delivered share with that CPU, then the CPU again at that share
    # (p3kv's is fitted on CPU use, which the share hardly moves; the others' on s/iter).
    links = fit_links(points, loopback, simulate_all, thread_costs=measured)
    efficiency = fit_link_efficiency(points, loopback, links, simulate_all, thread_costs=measured)
    links = fit_links(points, loopback, simulate_all, thread_costs=measured, link_efficiency=efficiency)
    path.write_text(json.dumps({
        "inputs": key, "fitted": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fit_points": sum(p["split"] == "fit" for p in points), "loopback": costs_lib.as_dict(loopback),
        "links_s_per_byte": links, "link_efficiency": efficiency,
        "thread_costs": threads.as_dict(measured)}, indent=1) + "\n")
    return Constants(loopback, links, measured, efficiency)


# --- the rows ----------------------------------------------------------------------------------------------------
def rows_of(points: Sequence[dict], sims: Sequence[tuple[float, float]]) -> list[dict]:
    out = []
    for point, (sim, sim_cpu) in zip(points, sims):
        measured = float(point["median_s"])
        workers, spb = int(point["workers"]), float(point["samples_per_batch"])
        scale = _number(point.get("gpu_scale")) or None
        rel = (sim - measured) / measured
        out.append({
            "source": point["source"], "split": point["split"], "fidelity": point["fidelity"],
            "selection": point["selection"], "model": point["model"], "kvstore": point["kvstore"],
            "hosts": point["hosts"], "layout": point["layout"], "bandwidth": point["bandwidth"],
            "p100_equiv_gbps": round(_number(point["bandwidth_bps"]) / scale / 1e9, 2)
            if scale and point["bandwidth_bps"] else "",
            "compute": point["compute"], "gpu_scale": point["gpu_scale"],
            "efficiency_factor": point["efficiency_factor"], "slice_size": point["slice_size"],
            "batch_size": point["batch_size"], "optimizer": point["optimizer"], "cpu": cpu_label(point),
            "update_placement": update_place(point), "baseline_setting": point.get("baseline_setting") or "default",
            "vgpu": "chained" if point["chained"] else "1 ms forgiven", "runs": point["runs"],
            "measured_s": round(measured, 4), "simulated_s": round(sim, 4), "rel_error": round(rel, 4),
            "measured_cpu_pct": round(point["cpu_total_pct"], 1), "simulated_cpu_pct": round(sim_cpu, 1),
            "measured_throughput": round(workers * spb / measured, 2),
            "simulated_throughput": round(workers * spb / sim, 2), "unit": point["unit"],
            "note": note(point, rel, sim_cpu)})
    return out


def run(path: pathlib.Path = RESULTS / "sim_validation.csv", refit: bool = False, processes: int = 2) -> list[dict]:
    points, _ = measured_points()
    found = constants(points, refit)
    out = rows_of(points, simulate_all(points, found, processes))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(out)
    return out


def errors_by(rows: Sequence[dict], split: str) -> dict[str, list[float]]:
    """{system: signed errors} of the rows of one split, plus "all"."""
    found: dict[str, list[float]] = {}
    for r in rows:
        if r["split"] == split:
            e = float(r["rel_error"])
            found.setdefault(r["kvstore"], []).append(e)
            found.setdefault("all", []).append(e)
    return found


def summary(rows: Sequence[dict]) -> str:
    lines = [f"selection: {rows[0]['selection'] if rows else '-'}"]
    for split in ("fit", "held-out"):
        for system, errors in sorted(errors_by(rows, split).items()):
            within = sum(abs(e) <= MISS for e in errors)
            lines.append(f"{split:8} {system:18} {len(errors):3} points, {within:3} within 10% "
                         f"({100 * within / len(errors):.0f}%), median signed error "
                         f"{100 * statistics.median(errors):+.1f}%, median |error| "
                         f"{100 * statistics.median(abs(e) for e in errors):.1f}%")
    return "\n".join(lines) + "\n"
