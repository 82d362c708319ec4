"""The README's headline: p3kv against each baseline at the paper's headline points of the bandwidth sweep, with
95% confidence intervals on every ratio and the conditions in one line.

Where the bandwidth sweep has no run with dilated CPUs at a named point yet and the dilation check has some there
(VGG-19 at 15 Gbps), the point is read from the dilation check, its dilations pooled: each job's iterations in
P100-equivalent seconds (times its gpu_scale), which that check shows to agree across dilations."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap
from benchmarks.analysis.points import (
    LABEL,
    POINT_KEY,
    cpu_bound,
    equivalent_gbps,
    fidelity_count,
    fidelity_sentence,
    key_value,
    number,
    ranks_phrase,
    shown,
)

# (model, its name, the P100-equivalent Gbps the paper names or None for "the point of our largest gain over
# dist_sync", what the paper reports for P3 against MXNet's parameter server)
POINTS = (("resnet50_v1", "ResNet-50", 4.0, "+26% at 4 Gbps"),
          ("vgg19", "VGG-19", 15.0, "+66% at 15 Gbps"),
          ("inceptionv3", "InceptionV3", None, "+18% (its largest)"),
          ("sockeye", "Sockeye (transformer)", None, "+38% (its largest)"))
BASELINES = ("dist_sync", "mxnet-p3", "horovod")


def job_iterations(row: dict) -> np.ndarray:
    """A job's timed iterations as (iterations, ranks), from the row itself: every rank's (rank_iter_s), or rank
    0's in rows from before it (whose _iterations files, from resumed sweeps, repeat some run_ids, so they cannot
    be joined to their rows); ranks cut to the fewest iterations any rank has."""
    ranks = bench_rows.rank_iterations(row)
    shortest = min(len(r) for r in ranks)
    return np.asarray([r[:shortest] for r in ranks], dtype=float).T


def equivalent_iterations(row: dict) -> np.ndarray:
    """job_iterations in P100-equivalent seconds (times the run's gpu_scale): runs of several scales pool, and a
    ratio of one scale's runs is the same either way."""
    return job_iterations(row) * (number(row.get("gpu_scale"), 1.0) or 1.0)


def dilated(row: dict) -> bool:
    """Whether a run's hosts had CPU quotas (rows from before the CPUs were dilated have none, and no verdict)."""
    return str(row.get("cpu_limit", "")).startswith("cgroup")


# What changes with the dilation alone (the link's rate, the scale, each thread's cap, the real CFS period, the
# link's bucket and TCP's minimum RTO, all dilated with it): left out of a pooled point's key.
DILATED = ("tag", "bandwidth", "gpu_scale", "thread_cap_cores", "cfs_period_us", "link_burst_bytes", "tcp_rto_min_ms")


def point_key(row: dict) -> tuple:
    """A row's point as the tables compare it (points.POINT_KEY: link, dilation, CPU quota, queues, ...)."""
    return tuple(key_value(row, c) for c in POINT_KEY)


def pooled_key(row: dict) -> tuple:
    """A row's point with its dilations pooled (the dilation check's rows)."""
    return tuple(key_value(row, c) for c in POINT_KEY if c not in DILATED)


def _point_rows(rows: Sequence[dict], model: str, gbps: float, key=point_key) -> list[dict]:
    """The point's rows under its newest conditions: those whose `key` is the last p3kv row's (rows are
    appended). A point rerun under new conditions is read from its newest runs only; older runs of a system not
    yet rerun are never pooled with them."""
    mine = [r for r in rows if r["model"] == model and equivalent_gbps(r) == gbps]
    p3 = [r for r in mine if r["kvstore"] == "p3"]
    if not p3:
        return []
    newest = key(p3[-1])
    return [r for r in mine if key(r) == newest]


def _runs(rows: Sequence[dict], model: str, gbps: float, kvstore: str, key=point_key) -> list[np.ndarray]:
    """Each shown (not unfaithful, not smoke) job's timed iterations as (iterations, ranks), under the point's
    newest conditions, in P100-equivalent seconds (equivalent_iterations)."""
    return [equivalent_iterations(r) for r in _point_rows(rows, model, gbps, key) if r["kvstore"] == kvstore
            and str(r.get("smoke")) != "True" and shown(r)]


def _source(bandwidth: Sequence[dict], dilation: Sequence[dict], model: str, gbps: float):
    """(rows, key, name) a named point is read from: the bandwidth sweep, or the dilation check's pooled rows
    where only it has runs with dilated CPUs there."""
    point = _point_rows(bandwidth, model, gbps)
    if point and dilated(point[0]):
        return bandwidth, point_key, "bandwidth"
    pooled = _point_rows(dilation, model, gbps, pooled_key)
    if any(r["kvstore"] == "p3" and dilated(r) and shown(r) for r in pooled):
        return dilation, pooled_key, "dilation"
    return bandwidth, point_key, "bandwidth"


def _gain(rows: Sequence[dict], model: str, gbps: float) -> float:
    """p3kv's ratio to dist_sync at one point by the medians (no resampling); -inf where either has no run."""
    p3, dist = _runs(rows, model, gbps, "p3"), _runs(rows, model, gbps, "dist_sync")
    return ratio(p3, dist, resamples=1).value if p3 and dist else float("-inf")


def emulation_cell(point: Sequence[dict], moved: Sequence[dict], key=point_key) -> str:
    """How the point's runs were emulated and judged: the CPU quota per host (and per thread where threads were
    capped) and how many runs were faithful (its unfaithful runs that superseded.py moved to results/legacy/,
    `moved`, counted too), or that they predate the dilated CPUs (and so the fidelity monitors); with `key`
    pooled_key, the dilations pooled."""
    if not point or not dilated(point[0]):
        return "CPUs not dilated (older runs, no verdict)"
    quotas = sorted({number(r.get("cpu_quota_cores")) for r in point})
    mine = key(point[0])
    count = fidelity_count([*point, *(r for r in moved if key(r) == mine and bench_rows.verdict(r) is False)])
    threads = sorted({number(r.get("thread_cap_cores")) for r in point} - {0.0})
    capped = f", {'/'.join(f'{t:g}' for t in threads)} per thread" if threads else ""
    scales = sorted({number(r.get("gpu_scale")) for r in point})
    pooled = (f"; the dilation check's {len(scales)} dilations pooled (`dilation.csv`)"
              if key is pooled_key else "")
    return (f"CPUs dilated ({'/'.join(f'{q:g}' for q in quotas)} cores per host{capped}){pooled}; "
            f"{count['faithful']} of {count['all']} runs faithful")


def ratio(a: list[np.ndarray], b: list[np.ndarray], resamples: int = bootstrap.RESAMPLES) -> bootstrap.Estimate:
    return bootstrap.ratio(a, b, 1.0, 1.0, resamples=resamples)


def _span(values: Sequence[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}–{max(values)}"


def headline_block(results: pathlib.Path) -> str:
    path = results / "sweeps" / "bandwidth.csv"
    everything = bench_rows.read_runs(path)
    moved = bench_rows.read_runs(results / "legacy" / "superseded_bandwidth.csv")  # counted in the emulation column
    dilation = bench_rows.read_runs(results / "sweeps" / "dilation.csv")
    dilation_moved = bench_rows.read_runs(results / "legacy" / "superseded_dilation.csv")
    sources: set[str] = set()
    rows = [r for r in everything if shown(r)]
    if everything and not rows:
        return f"No faithful runs yet in `benchmarks/results/sweeps/bandwidth.csv`: {fidelity_sentence(everything)}"
    if not rows:
        return "Not measured yet: `make sweeps` writes `benchmarks/results/sweeps/bandwidth.csv`."
    lines = ["| model | P100-equivalent link | p3kv | vs dist_sync | vs MXNet's P3 | vs Horovod | paper: P3 vs "
             "MXNet's parameter server | emulation |", "|---|---|---|---|---|---|---|---|"]
    behind: list[dict] = []  # the p3kv rows behind the table, for the conditions line
    repeats: list[int] = []
    flagged: set[str] = set()  # systems whose hosts ran out of their CPUs in a run shown (fidelity.py's rule 1)
    for model, name, gbps, paper in POINTS:
        mine = [r for r in rows if r["model"] == model]
        if not mine:
            continue
        rates = sorted({equivalent_gbps(r) for r in mine})
        if gbps is None:  # the point where p3kv gains most on dist_sync, by the ratio of the medians
            gbps = max(rates, key=lambda g: _gain(everything, model, g))
            where = f"{gbps:g} Gbps (our largest gain)"
        else:
            where = f"{gbps:g} Gbps"
        source, key, name_of = _source(everything, dilation, model, gbps)
        p3 = _runs(source, model, gbps, "p3", key)
        if not p3:
            continue
        sources.add(name_of)
        point = _point_rows(source, model, gbps, key)
        first = next(r for r in point if r["kvstore"] == "p3" and shown(r))
        behind.append(first)
        per_iteration = int(first["workers"]) * number(first["samples_per_batch"])
        rate = per_iteration / float(np.median(np.concatenate([job.ravel() for job in p3])))  # P100-equivalent
        cells = []
        for baseline in BASELINES:
            other = _runs(source, model, gbps, baseline, key)
            if not other:
                failed = sum(r["kvstore"] == baseline for r in point)  # rerun, but no run judged faithful
                older = any(r["kvstore"] == baseline for r in mine if point_key(r) != point_key(first))
                cells.append(f"no faithful run ({failed} left out)" if failed else "not rerun yet" if older else "-")
                continue
            repeats += [len(p3), len(other)]
            r = ratio(p3, other)
            bound = sorted({LABEL.get(k, k) for k in ("p3", baseline) for row in point
                            if row["kvstore"] == k and shown(row) and cpu_bound(row)})
            flagged.update(bound)
            cells.append(f"{r.value:.2f}× ({r.low:.2f}–{r.high:.2f})"
                         + (f", {' and '.join(bound)} CPU-bound" if bound else ""))
        lines.append(f"| {name} | {where} | {rate:,.0f} {first['unit']}/s | {' | '.join(cells)} | {paper} | "
                     f"{emulation_cell(point, dilation_moved if key is pooled_key else moved, key)} |")
    if not behind:
        return "Not measured yet: `make sweeps` writes `benchmarks/results/sweeps/bandwidth.csv`."
    iters = sorted({int(number(r["iters"])) for r in behind})
    batch = sorted({int(number(r["batch_size"])) for r in behind})
    hosts = sorted({int(number(r["hosts"])) for r in behind})
    links = sorted({r["bandwidth"] for r in behind})
    tcp = sorted({key_value(r, "tcp_congestion_control").upper() for r in behind})  # the machine's default: BBR
    ranks = ranks_phrase(behind)
    judged = fidelity_sentence(everything)
    limited = [dilated(r) for r in behind]
    quotas = sorted({number(r.get("cpu_quota_cores")) for r in behind if dilated(r)})
    how = (f"a quota of --host-cpus × --gpu-scale ({'/'.join(f'{q:g}' for q in quotas)} cores per host; "
           f"benchmarks/emulation/cpu_limit.py), the workers' updates of MXNet's P3 and Horovod on the virtual "
           f"GPU, every run judged by the fidelity monitors and only faithful ones shown")
    if any(number(r.get("thread_cap_cores")) for r in behind):
        how += (" (with 'per thread', also each thread of a host at one dilated CPU, benchmarks/emulation/"
                "thread_cap.py, except Horovod's background thread: its Gloo sum stands for NCCL's on the GPU)")
    if all(limited):
        cpu = f"Each host's CPUs were slowed with compute and links: {how}."
    elif not any(limited):
        cpu = ("The host CPUs are not slowed with compute and links, so the worker-side updates of MXNet's P3 and "
               "Horovod cost them CPU a GPU would not: their columns overstate p3kv's lead.")
    else:
        cpu = (f"Rows marked 'CPUs dilated' ran with each host's CPUs slowed with compute and links: {how}. The "
               f"others are older runs whose host CPUs were not slowed, so the worker-side updates of MXNet's P3 and "
               f"Horovod cost them CPU a GPU would not: their MXNet-P3 and Horovod columns overstate p3kv's lead "
               f"until they are rerun.")
    return "\n".join([*lines, "", (
        f"p3kv's throughput as P100s on those links would reach it, and its ratio to each baseline with a 95% "
        f"confidence interval (a percentile bootstrap over the {_span(repeats)} interleaved repeats per system, then "
        f"over {ranks} {'/'.join(map(str, iters))} timed iterations within each: benchmarks/analysis/bootstrap.py), "
        f"from `benchmarks/results/sweeps/bandwidth.csv`"
        + (" (rows whose emulation cell says so: from `dilation.csv`, its dilations pooled in P100-equivalent time)"
           if "dilation" in sources else "") + f". Conditions: {'/'.join(map(str, hosts))} emulated hosts (network "
        f"namespaces on one 2-core machine, one worker and one server each), {'/'.join(links)} links under TCP "
        f"{'/'.join(tcp)} with compute slowed to match the P100-equivalent rate, batch {'/'.join(map(str, batch))} "
        f"per worker, SGD with momentum on the servers ({LABEL['p3']}, dist_sync) or on the workers "
        f"(MXNet's P3, Horovod). {cpu} Not yet "
        f"verified on real GPUs or a real cluster." + (f" {judged}" if judged else "")
        + (" 'CPU-bound': a host of that system ran out of its --host-cpus CPUs in a run shown, more of its threads "
           "runnable than it has CPUs (benchmarks/emulation/fidelity.py flags it): the ratio holds for hosts of that "
           "size." if flagged else ""))])
