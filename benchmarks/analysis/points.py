"""Points from result rows: per point (model, link, host count, optimizer, ... and system) the median throughput
over every timed iteration of every repeat, its interquartile range, the range of the per-repeat medians, n
(repeats), the header-inclusive bound, the CPU the hosts used and the ratios against the baselines; and the
markdown table every runner and the README print them in."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from benchmarks.analysis import bench_rows, bench_stats
from benchmarks.emulation import fidelity
from benchmarks.emulation.link_shaping import (
    DEFAULT_BURST_MS,
    DEFAULT_QUEUE_MS,
    KERNEL_RTO_MIN_MS,
    LEGACY_CONGESTION_CONTROL,
    burst_bytes,
)
from p3kv.core import config

LABEL = {"p3": "p3kv", "dist_sync": "dist_sync", "mxnet-p3": "MXNet P3", "horovod": "Horovod",
         "p3-slicing-only": "p3kv slicing only", "p3-priority-split": "p3kv priority only (big arrays split)",
         "p3-priority-only": "p3kv priority only (unsplit)", "torch-p3kv": "p3kv.torch (worker placement)",
         "torch-p3kv-server": "p3kv.torch (server placement)", "ddp": "DDP (gloo)"}


DEFAULT_UNTUNED = "default (untuned)"  # the baseline_setting of a system run at its defaults, nothing tuned


MIB = 1 << 20
# Every tuned variable of a system with its default (as a string, the way the environment carries it); where in
# each project's source they were read: benchmarks/suites/baseline_settings.py, which tunes them.
DEFAULTS: dict[str, dict[str, str]] = {
    "horovod": {"HOROVOD_FUSION_THRESHOLD": str(128 * MIB), "HOROVOD_CYCLE_TIME": "1"},
    "dist_sync": {"MXNET_KVSTORE_BIGARRAY_BOUND": str(1_000_000)},
    "mxnet-p3": {"MXNET_KVSTORE_SLICE_THRESHOLD": str(40_000)},
    "p3": {"P3_SLICE_SIZE": str(config.get("P3_SLICE_SIZE", {})),
           "P3_SOCKET_BUFFER": str(config.get("P3_SOCKET_BUFFER", {}))},
    "ddp": {"DDP_BUCKET_CAP_MB": "25"},
}
_DEFAULT_VALUES = {name: value for variables in DEFAULTS.values() for name, value in variables.items()}


def setting_identity(label: str) -> str:
    """What a baseline_setting label runs, for comparing rows: "default" for any label of the defaults (untuned,
    a grid's default cell, a tuned default, variables all at their defaults), else its variables as written less
    those at their default value ("P3_SLICE_SIZE=25000 P3_SOCKET_BUFFER=131072 (tuned)" runs what
    "P3_SLICE_SIZE=25000" does)."""
    label = label or DEFAULT_UNTUNED
    if label.startswith("default") or label.endswith("(default)"):
        return "default"
    variables = [word.partition("=") for word in label.split(" (")[0].split()]
    kept = [f"{name}={value}" for name, _, value in variables if _DEFAULT_VALUES.get(name) != value]
    return " ".join(kept) or "default"


# What makes two rows the same point (the system is part of it; comparisons group by everything else).
POINT_KEY = ("tag", "model", "hosts", "layout", "bandwidth", "compute", "batch_size", "gpu_scale",
             "efficiency_factor", "optimizer", "slice_size", "legacy",
             "host_cpus",  # CPU-limited runs never pool with unlimited ones (rows from before the limits: "")
             "link_queue_ms",  # nor shallow link queues with deep ones (rows from before the column: 50 ms)
             "cfs_period_us",  # nor one CFS period with another (cfs_bandwidth.py)
             "link_burst_bytes",  # nor one link bucket with another (rows from before the column: 10 ms of rate)
             "tcp_rto_min_ms",  # nor one TCP minimum RTO with another (rows from before the column: the kernel's)
             "thread_cap_cores",  # nor threads capped at one dilated CPU with uncapped ones (thread_cap.py)
             "omp_threads",  # nor one OpenMP thread per process with a host's CPU count (rows from before: one)
             "tcp_congestion_control")  # nor CUBIC with BBR (rows from before the column: BBR, link_shaping.py)


def key_value(row: dict, column: str) -> str:
    """A POINT_KEY column of a row as the key compares it."""
    if column == "link_queue_ms":
        return f"{number(row.get(column), DEFAULT_QUEUE_MS) or DEFAULT_QUEUE_MS:g}"
    if column == "tcp_rto_min_ms":
        return f"{number(row.get(column), KERNEL_RTO_MIN_MS) or KERNEL_RTO_MIN_MS:g}"
    if column == "link_burst_bytes":
        burst = link_burst(row)
        return "" if burst is None else str(burst)
    if column == "tcp_congestion_control":
        return str(row.get(column) or LEGACY_CONGESTION_CONTROL)
    if column == "omp_threads":
        return f"{number(row.get(column), 1.0) or 1.0:g}"
    return str(row.get(column, ""))


def link_burst(row: dict) -> int | None:
    """A row's link bucket in bytes: its column, or for a row from before it the 10 ms of rate every link had then;
    None for an uncapped link."""
    if row.get("link_burst_bytes") not in (None, ""):
        return int(float(row["link_burst_bytes"]))
    rate = number(row.get("bandwidth_bps"), 0.0)
    return burst_bytes(rate, DEFAULT_BURST_MS) if rate else None


def number(value, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def shown(row: dict) -> bool:
    """Whether a row's measurement is a result: runs the fidelity monitors judged unfaithful are not (rows from
    before the monitors, with no verdict, are shown and counted as such: see fidelity_count)."""
    return bench_rows.verdict(row) is not False


def _counted(rows: Sequence[dict], include_smoke: bool) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and (include_smoke or str(r.get("smoke")) != "True")]


def fidelity_count(rows: Sequence[dict], include_smoke: bool = False) -> dict[str, int]:
    """{"faithful", "unfaithful", "unjudged", "all"}: how many ok (non-smoke) runs had each verdict."""
    runs = _counted(rows, include_smoke)
    verdicts = [bench_rows.verdict(r) for r in runs]
    return {"faithful": verdicts.count(True), "unfaithful": verdicts.count(False),
            "unjudged": verdicts.count(None), "all": len(runs)}


def fidelity_sentence(rows: Sequence[dict], include_smoke: bool = False) -> str:
    """"n faithful of m runs" and which monitors failed the others, or "" when no row has a verdict."""
    count = fidelity_count(rows, include_smoke)
    if count["faithful"] + count["unfaithful"] == 0:
        return ""
    failed: dict[str, int] = {}
    for r in _counted(rows, include_smoke):
        if bench_rows.verdict(r) is False:
            for monitor in sorted({n.split(":")[0] for n in fidelity.failures(r.get("fidelity_notes"))}):
                failed[monitor] = failed.get(monitor, 0) + 1
    why = f" (failed: {', '.join(f'{m} {n}' for m, n in sorted(failed.items()))})" if failed else ""
    unjudged = f"; {count['unjudged']} from before the monitors, shown without a verdict" if count["unjudged"] else ""
    return (f"{count['faithful']} faithful of {count['all']} runs: the {count['unfaithful']} others are left out"
            f"{why}{unjudged} (benchmarks/emulation/fidelity.py).")


def ranks_phrase(rows: Sequence[dict]) -> str:
    """Whose iterations the statistics of `rows` pool: every rank's, or rank 0's in rows from before rank_iter_s."""
    with_ranks = [bool(r.get("rank_iter_s")) for r in rows]
    if all(with_ranks):
        return "every rank's"
    return "rank 0's" if not any(with_ranks) else "every rank's (rank 0's in older rows)"


def aggregate(rows: Sequence[dict], include_smoke: bool = False, include_unfaithful: bool = False) -> list[dict]:
    """One entry per point and system, in first-seen order, with the statistics over its repeats (every rank's
    iterations); ratios against dist_sync and Horovod of the same comparison. Runs judged unfaithful are left out
    (fidelity_count counts them) unless `include_unfaithful` (a runner's own figure of what it just ran, titled
    with the count). Smoke rows only with `include_smoke` (a runner's own summary), never in the README."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if (r.get("status") == "ok" and (include_unfaithful or shown(r))
                and (include_smoke or str(r.get("smoke")) != "True")):
            groups.setdefault((tuple(key_value(r, k) for k in POINT_KEY), r["kvstore"]), []).append(r)
    points = []
    for (key, kvstore), runs in groups.items():
        first = runs[0]
        per_iteration = int(first["workers"]) * number(first["samples_per_batch"])
        if first.get("legacy") == "True" or not first.get("iter_s"):  # one run, its recorded throughput
            value = statistics.median(number(r["throughput"]) for r in runs)
            low = high = value
            run_values = [number(r["throughput"]) for r in runs]
            iterations = sum(int(number(r.get("iters"))) for r in runs)
        else:
            spread = bench_stats.spread([bench_rows.iteration_times(r) for r in runs])
            value, low, high = spread.throughput(per_iteration)
            run_values = [per_iteration / spread.run_median_max_s, per_iteration / spread.run_median_min_s]
            iterations = spread.iterations
        cpu = [number(r.get("cpu_total_pct")) for r in runs if r.get("cpu_total_pct") not in (None, "")]
        cpu_host = [number(c) for r in runs for c in str(r.get("cpu_host_pct") or "").split(";") if c]
        bound = statistics.median(number(r["bound_throughput"]) for r in runs)
        points.append({
            "key": key, "kvstore": kvstore, "model": first["model"], "hosts": int(first["hosts"]),
            "bandwidth": first["bandwidth"], "bandwidth_bps": number(first.get("bandwidth_bps")),
            "gpu_scale": number(first.get("gpu_scale"), 0.0), "p100_equiv_gbps": equivalent_gbps(first),
            "optimizer": optimizer_label(first.get("optimizer")),
            "slice_size": first.get("slice_size") or "default", "efficiency_factor": first.get("efficiency_factor"),
            "thread_cap_cores": number(first.get("thread_cap_cores")) or None,
            "unit": first["unit"], "n": len(runs), "iterations": iterations, "throughput": value, "low": low,
            "high": high, "run_min": min(run_values), "run_max": max(run_values), "bound_throughput": bound,
            "pct_of_bound": 100 * value / bound if bound else None, "cpu_total_pct": max(cpu) if cpu else None,
            "cpu_host_max_pct": max(cpu_host) if cpu_host else None, "legacy": first.get("legacy") == "True",
            "load_max": max(max(number(r.get("load_1m_before")), number(r.get("load_1m_after"))) for r in runs),
            "busy_max": max((number(r["busy_pct_before"]) for r in runs if r.get("busy_pct_before") not in (None, "")),
                            default=None),
            "dirty": any(str(r.get("git_dirty")) == "True" for r in runs),
            "forced": any(str(r.get("forced")) == "True" for r in runs),
            "cpu_bound": sum(cpu_bound(r) for r in runs),
        })
    by_key: dict[tuple, dict[str, float]] = {}
    for p in points:
        by_key.setdefault(p["key"], {})[p["kvstore"]] = p["throughput"]
    for p in points:
        peers = by_key[p["key"]]
        for peer in ("dist_sync", "horovod", "mxnet-p3"):
            p[f"vs_{peer}"] = p["throughput"] / peers[peer] if peer in peers and peer != p["kvstore"] else None
    return points


def cpu_bound(row: dict) -> bool:
    """Whether a faithful capped run's host ran out of its CPUs (fidelity.py's rule 1 flags it CPU-bound): its
    result holds for hosts of its --host-cpus."""
    return fidelity.CPU_BOUND in str(row.get("fidelity_notes") or "")


def optimizer_label(recorded: str | None) -> str:
    """"sgd" for the reviewed SGD (momentum + weight decay, recorded with its settings), else as recorded."""
    recorded = recorded or "none"
    return "sgd" if recorded.startswith("sgd(") else recorded


def equivalent_gbps(row: dict) -> float | None:
    if row.get("p100_equiv_gbps"):
        return number(row["p100_equiv_gbps"])
    rate, scale = number(row.get("bandwidth_bps")), number(row.get("gpu_scale"))
    return rate / scale / 1e9 if rate and scale else None


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if value >= 100 else f"{value:.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def link_label(p: dict) -> str:
    eq = p["p100_equiv_gbps"]
    return f"{p['bandwidth']} ({eq:g} Gbps)" if eq else p["bandwidth"]


def setting(p: dict) -> str:
    """What a point changes from the defaults (slice size, calibrated efficiency, threads capped), or ""."""
    parts = []
    if p.get("slice_size") not in (None, "", "default"):
        parts.append(f"slice {int(number(p['slice_size'])):,}")
    factor = number(p.get("efficiency_factor"), 1.0)
    if factor != 1.0:
        parts.append(f"efficiency ×{factor:g}")
    if p.get("thread_cap_cores"):
        parts.append("1 CPU per thread")  # thread_cap.py: each thread at one dilated CPU
    return ", ".join(parts)


def p100_equivalent(p: dict) -> float | None:
    """The point's rate as real P100s would train (the figures' y axis): emulated compute runs 1 / --gpu-scale
    times slower than a P100, and the links are slowed with it."""
    return p["throughput"] / p["gpu_scale"] if p["gpu_scale"] and p["throughput"] is not None else None


def point_table(points: Sequence[dict]) -> str:
    lines = ["| model | hosts | link (P100-equiv.) | optimizer | system | throughput (median) | P100-equiv. | IQR | "
             "repeat medians | n | % of bound | vs dist_sync | vs Horovod | CPU % (all hosts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        system = LABEL.get(p["kvstore"], p["kvstore"])
        if setting(p):
            system += f" ({setting(p)})"
        if p.get("cpu_bound"):  # beside its numbers: the result holds for hosts of that many CPUs (fidelity.py)
            system += f" — CPU-bound in {p['cpu_bound']} of {p['n']} runs"
        iqr = "-" if p["legacy"] else f"{fmt(p['low'])}–{fmt(p['high'])}"
        runs = "-" if p["n"] == 1 else f"{fmt(p['run_min'])}–{fmt(p['run_max'])}"
        lines.append(f"| {p['model']} | {p['hosts']} | {link_label(p)} | {p['optimizer']} | {system} "
                     f"| {fmt(p['throughput'])} {p['unit']}/s | {fmt(p100_equivalent(p))} | {iqr} | {runs} | "
                     f"{p['n']} | "
                     f"{fmt(p['pct_of_bound'], 0)}% | "
                     f"{fmt_ratio(p['vs_dist_sync'])} | {fmt_ratio(p['vs_horovod'])} | {fmt(p['cpu_total_pct'], 0)} |")
    return "\n".join(lines)
