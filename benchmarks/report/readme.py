"""The README's benchmark tables and the sentences around them, generated from the result CSVs.

    python -m benchmarks.report            # rewrite every <!-- bench:NAME --> ... <!-- /bench:NAME --> block
    python -m benchmarks.report --check    # exit 1 if a block differs from what the CSVs give now

Every number in a block comes from the rows: per point (a model, link, host count, optimizer, ... and system)
the median throughput over every timed iteration of every repeat, its interquartile range, the range of the
per-repeat medians, n (repeats), the header-inclusive bound and the CPU the hosts used. Rows from before the
reviewed schema (results/legacy/: no optimizer, one run, payload-only bound) are not results: the README's
status table only names their files, and their tables go to results/legacy/README.md (the same blocks), with
optimizer "none" and n=1. Rows marked smoke are never shown.
"""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Sequence

from benchmarks.analysis import bench_rows, bench_stats
from benchmarks.paths import RESULTS, ROOT

LOG = logging.getLogger("report")
SWEEPS_DIR = RESULTS / "sweeps"  # rows that satisfy the reviewed schema (optimizer, repeats, load, headers)
LEGACY = "legacy"  # results/legacy/: rows from before that schema, and the figures drawn from them
LEGACY_RUNS = ("demo", "sweep_bandwidth", "sweep_ablation", "sweep_slice", "sweep_scale", "sweep_utilisation",
               "sweep_targets")
README = ROOT / "README.md"
# The models each --models sweep covers (sweeps.py runs these by default): a block names those without rows yet.
SWEEP_MODELS = {"bandwidth": ("resnet50_v1", "inceptionv3", "sockeye", "vgg19")}
LABEL = {"p3": "p3kv", "dist_sync": "dist_sync", "mxnet-p3": "MXNet P3", "horovod": "Horovod",
         "p3-slicing-only": "p3kv slicing only", "p3-priority-split": "p3kv priority only (big arrays split)",
         "p3-priority-only": "p3kv priority only (unsplit)"}
# What makes two rows the same point (the system is part of it; comparisons group by everything else).
POINT_KEY = ("tag", "model", "hosts", "layout", "bandwidth", "compute", "batch_size", "gpu_scale",
             "efficiency_factor", "optimizer", "slice_size", "legacy")


def _float(value, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def aggregate(rows: Sequence[dict], include_smoke: bool = False) -> list[dict]:
    """One entry per point and system, in first-seen order, with the statistics over its repeats; ratios
    against dist_sync and Horovod of the same comparison. Smoke rows only with `include_smoke` (a runner's own
    summary), never in the README."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and (include_smoke or str(r.get("smoke")) != "True"):
            groups.setdefault((tuple(str(r.get(k, "")) for k in POINT_KEY), r["kvstore"]), []).append(r)
    points = []
    for (key, kvstore), runs in groups.items():
        first = runs[0]
        per_iteration = int(first["workers"]) * _float(first["samples_per_batch"])
        if first.get("legacy") == "True" or not first.get("iter_s"):  # one run, its recorded throughput
            value = statistics.median(_float(r["throughput"]) for r in runs)
            low = high = value
            run_values = [_float(r["throughput"]) for r in runs]
            iterations = sum(int(_float(r.get("iters"))) for r in runs)
        else:
            spread = bench_stats.spread([bench_rows.iteration_times(r) for r in runs])
            value, low, high = spread.throughput(per_iteration)
            run_values = [per_iteration / spread.run_median_max_s, per_iteration / spread.run_median_min_s]
            iterations = spread.iterations
        cpu = [_float(r.get("cpu_total_pct")) for r in runs if r.get("cpu_total_pct") not in (None, "")]
        cpu_host = [_float(c) for r in runs for c in str(r.get("cpu_host_pct") or "").split(";") if c]
        bound = statistics.median(_float(r["bound_throughput"]) for r in runs)
        points.append({
            "key": key, "kvstore": kvstore, "model": first["model"], "hosts": int(first["hosts"]),
            "bandwidth": first["bandwidth"], "bandwidth_bps": _float(first.get("bandwidth_bps")),
            "gpu_scale": _float(first.get("gpu_scale"), 0.0), "p100_equiv_gbps": equivalent_gbps(first),
            "optimizer": optimizer_label(first.get("optimizer")),
            "slice_size": first.get("slice_size") or "default", "efficiency_factor": first.get("efficiency_factor"),
            "unit": first["unit"], "n": len(runs), "iterations": iterations, "throughput": value, "low": low,
            "high": high, "run_min": min(run_values), "run_max": max(run_values), "bound_throughput": bound,
            "pct_of_bound": 100 * value / bound if bound else None, "cpu_total_pct": max(cpu) if cpu else None,
            "cpu_host_max_pct": max(cpu_host) if cpu_host else None, "legacy": first.get("legacy") == "True",
            "load_max": max(max(_float(r.get("load_1m_before")), _float(r.get("load_1m_after"))) for r in runs),
            "busy_max": max((_float(r["busy_pct_before"]) for r in runs if r.get("busy_pct_before") not in (None, "")),
                            default=None),
            "dirty": any(str(r.get("git_dirty")) == "True" for r in runs),
            "forced": any(str(r.get("forced")) == "True" for r in runs),
        })
    by_key: dict[tuple, dict[str, float]] = {}
    for p in points:
        by_key.setdefault(p["key"], {})[p["kvstore"]] = p["throughput"]
    for p in points:
        peers = by_key[p["key"]]
        for peer in ("dist_sync", "horovod", "mxnet-p3"):
            p[f"vs_{peer}"] = p["throughput"] / peers[peer] if peer in peers and peer != p["kvstore"] else None
    return points


def optimizer_label(recorded: str | None) -> str:
    """"sgd" for the reviewed SGD (momentum + weight decay, recorded with its settings), else as recorded."""
    recorded = recorded or "none"
    return "sgd" if recorded.startswith("sgd(") else recorded


def equivalent_gbps(row: dict) -> float | None:
    if row.get("p100_equiv_gbps"):
        return _float(row["p100_equiv_gbps"])
    rate, scale = _float(row.get("bandwidth_bps")), _float(row.get("gpu_scale"))
    return rate / scale / 1e9 if rate and scale else None


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if value >= 100 else f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def _link(p: dict) -> str:
    eq = p["p100_equiv_gbps"]
    return f"{p['bandwidth']} ({eq:g} Gbps)" if eq else p["bandwidth"]


def setting(p: dict) -> str:
    """What a point changes from the defaults (slice size, calibrated efficiency), or ""."""
    parts = []
    if p.get("slice_size") not in (None, "", "default"):
        parts.append(f"slice {int(_float(p['slice_size'])):,}")
    factor = _float(p.get("efficiency_factor"), 1.0)
    if factor != 1.0:
        parts.append(f"efficiency ×{factor:g}")
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
        iqr = "-" if p["legacy"] else f"{_num(p['low'])}–{_num(p['high'])}"
        runs = "-" if p["n"] == 1 else f"{_num(p['run_min'])}–{_num(p['run_max'])}"
        lines.append(f"| {p['model']} | {p['hosts']} | {_link(p)} | {p['optimizer']} | {system} "
                     f"| {_num(p['throughput'])} {p['unit']}/s | {_num(p100_equivalent(p))} | {iqr} | {runs} | "
                     f"{p['n']} | "
                     f"{_num(p['pct_of_bound'], 0)}% | "
                     f"{_ratio(p['vs_dist_sync'])} | {_ratio(p['vs_horovod'])} | {_num(p['cpu_total_pct'], 0)} |")
    return "\n".join(lines)


def verdicts(points: Sequence[dict]) -> list[str]:
    """One sentence per comparison: where p3kv stands against every other system, from the medians, and
    whether the interquartile ranges overlap (then the order is not established)."""
    sentences = []
    by_key: dict[tuple, list[dict]] = {}
    for p in points:
        by_key.setdefault(p["key"], []).append(p)
    for members in by_key.values():
        mine = next((p for p in members if p["kvstore"] == "p3"), None)
        if mine is None:
            continue
        parts = []
        for other in members:
            if other is mine:
                continue
            ratio = mine["throughput"] / other["throughput"]
            overlap = mine["low"] <= other["high"] and other["low"] <= mine["high"] and mine["n"] > 1
            word = "ahead of" if ratio > 1 else "behind"
            parts.append(f"{word} {LABEL.get(other['kvstore'], other['kvstore'])} ({ratio:.2f}×"
                         f"{', IQRs overlap' if overlap else ''})")
        if parts:
            variant = f", {setting(mine)}" if setting(mine) else ""
            sentences.append(f"- {mine['model']}, {mine['hosts']} hosts, {_link(mine)}{variant}, optimizer "
                             f"{mine['optimizer']}: "
                             f"p3kv {_num(mine['throughput'])} {mine['unit']}/s, {_num(mine['pct_of_bound'], 0)}% of "
                             f"the bound, " + ", ".join(parts) + ".")
    return sentences


def slice_sentences(points: Sequence[dict]) -> list[str]:
    """The fastest slice size by median, and the sizes whose IQR overlaps its (not told apart from it)."""
    sized = [p for p in points if p.get("slice_size") not in (None, "", "default")]
    if not sized:
        return []
    best = max(sized, key=lambda p: p["throughput"])
    ties = [p for p in sized if p is not best and p["low"] <= best["high"] and best["low"] <= p["high"]]
    line = (f"- Fastest slice size by median: {int(_float(best['slice_size'])):,} ({_num(best['throughput'])} "
            f"{best['unit']}/s)")
    if ties:
        line += "; IQRs overlap with " + ", ".join(f"{int(_float(p['slice_size'])):,} ({_num(p['throughput'])})"
                                                   for p in sorted(ties, key=lambda p: int(_float(p["slice_size"]))))
    return [line + "."]


SATURATED = 0.9  # of the machine's cores: above it, a point measures CPU contention, not the links
MIN_REPEATS = 3  # the reviewed settings: at least this many repeats per point


def dilation_sentences(points: Sequence[dict], cpus: int) -> list[str]:
    """Per --gpu-scale, the most CPU any system's hosts used together; the least dilation (largest scale) at
    which none came near the machine's cores."""
    scales = sorted({p["gpu_scale"] for p in points if p["cpu_total_pct"] is not None})
    if not scales:
        return []
    peak = {s: max(p["cpu_total_pct"] for p in points if p["gpu_scale"] == s and p["cpu_total_pct"] is not None)
            for s in scales}
    free = [s for s in scales if peak[s] < SATURATED * 100 * cpus]
    lines = ["- CPU of all hosts together (the most of any system) per --gpu-scale: " +
             ", ".join(f"{s:g}: {peak[s]:.0f}%" for s in scales) + f" of {100 * cpus}%."]
    if free:
        lines.append(f"- Least dilation with the CPUs below {SATURATED:.0%} of {cpus} cores: --gpu-scale "
                     f"{max(free):g}.")
    else:
        lines.append(f"- The CPUs were above {SATURATED:.0%} of {cpus} cores at every scale measured.")
    return lines


def saturation_sentences(points: Sequence[dict], cpus: int) -> list[str]:
    """The points at which a system's hosts together used more than SATURATED of the machine's cores, and which
    systems: there the cores, not the links, may limit them, and their numbers understate them."""
    limit = SATURATED * 100 * cpus
    hot: dict[tuple, list[str]] = {}
    for p in points:
        if p["cpu_total_pct"] is not None and p["cpu_total_pct"] > limit:
            key = (p["model"], p["hosts"], _link(p), setting(p))
            hot.setdefault(key, []).append(f"{LABEL.get(p['kvstore'], p['kvstore'])} {p['cpu_total_pct']:.0f}%")
    if not hot:
        return []
    where = "; ".join(f"{m}, {h} hosts, {link}{f', {extra}' if extra else ''} ({', '.join(systems)})"
                      for (m, h, link, extra), systems in hot.items())
    return [f"- Near the CPU limit (the hosts together above {SATURATED:.0%} of {cpus} cores): {where}. There the "
            "cores, not the links, may limit the systems named, and their numbers understate them."]


def utilisation_sentences(rows: Sequence[dict], folder: pathlib.Path) -> list[str]:
    """Per system, how busy the links were during the timed iterations (benchmarks/analysis/link_utilisation.py)."""
    from benchmarks.analysis import link_utilisation

    found = link_utilisation.summary(rows, folder)
    if not found:
        return []
    parts = [f"{LABEL.get(kv, kv)} {100 * s['busy']:.0f}% busy, idle in {100 * s['idle']:.0f}% of the samples"
             for kv, s in sorted(found.items(), key=lambda item: -item[1]["busy"])]
    n = sorted({s["n"] for s in found.values()})
    return [f"- Links during the timed iterations (mean rate over the link rate, both directions, every host; idle: "
            f"10-ms samples below {link_utilisation.IDLE:.0%} of it; median of {', '.join(map(str, n))} runs): "
            + "; ".join(parts) + "."]


def _rows(path: pathlib.Path) -> list[dict]:
    return bench_rows.read_runs(path)


def reviewed_block(name: str, results: pathlib.Path) -> str:
    """A sweep's table and sentences from results/sweeps/<name>.csv."""
    path = results / "sweeps" / f"{name}.csv"
    points = aggregate(_rows(path))
    if not points:
        return ("Not measured yet with the reviewed settings: "
                f"`sudo .venv/bin/python -m benchmarks.suites.sweeps {name}` (or `make sweeps`) writes "
                f"`benchmarks/results/sweeps/{name}.csv`.")
    flags = []
    if any(p["dirty"] for p in points):
        flags.append("some rows ran on a dirty tree (--allow-dirty)")
    if any(p["forced"] for p in points):
        flags.append("some rows started on a busy machine (--force)")
    commits = sorted({str(r.get("git_commit"))[:7] for r in _rows(path) if str(r.get("smoke")) != "True"})
    if len(commits) > 1:
        flags.append(f"rows from {len(commits)} commits ({', '.join(commits)})")
    load = max(p["load_max"] for p in points)
    busy = [p["busy_max"] for p in points if p["busy_max"] is not None]
    idle = f"; CPUs busy before a run at most {max(busy):.0f}% (5-second sample)" if busy else ""
    head = (f"From `benchmarks/results/sweeps/{name}.csv` ({sum(p['n'] for p in points)} runs{idle}; highest "
            f"1-minute load before/after a run {load:.2f}, the runs' own included"
            f"{'; ' + '; '.join(flags) if flags else ''}). Throughput: median over "
            "every timed iteration of every repeat, in emulated time (P100-equiv.: divided by --gpu-scale, the rate "
            "real P100s on the equivalent links would reach); IQR: its 25–75% range; repeat medians: the range of the "
            "per-repeat medians; bound: headers included.")
    extra = []
    missing = [m for m in SWEEP_MODELS.get(name, ()) if m not in {p["model"] for p in points}]
    if missing:
        extra.append(f"- Not measured yet: {', '.join(missing)} "
                     f"(`sudo .venv/bin/python -m benchmarks.suites.sweeps {name} "
                     f"--models {' '.join(missing)}` appends them).")
    if name == "slice":
        extra += slice_sentences(points)
    rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
    cpus = int(_float(rows[0].get("cpus"), 2)) if rows else 2
    if name == "dilation":
        extra = dilation_sentences(points, cpus)
    else:
        extra += saturation_sentences(points, cpus)
    if name == "utilisation":
        extra += utilisation_sentences(_rows(path), results / "sweeps" / "utilisation")
    return "\n".join([head, "", point_table(points), "", *verdicts(points), *extra])


def legacy_block(results: pathlib.Path) -> str:
    """The rows measured before the reviewed settings: shown as they are, optimizer none, n=1."""
    parts = []
    for name in LEGACY_RUNS:
        points = [p for p in aggregate(_rows(results / LEGACY / f"{name}.csv")) if p["legacy"]]
        if points:
            parts += [f"`{name}.csv` (bound: payload only):", "", point_table(points), ""]
    if not parts:
        return "No rows from before the reviewed settings."
    return "\n".join(parts).rstrip()


def status_block(results: pathlib.Path) -> str:
    """Which result files satisfy the reviewed settings and which predate them."""
    lines = ["| file | rows (ok) | optimizer | repeats per point (n) | bound | satisfies 1–4 |",
             "|---|---|---|---|---|---|"]
    files = sorted((results / "sweeps").glob("*.csv")) + [results / LEGACY / f"{n}.csv" for n in LEGACY_RUNS]
    for path in files:
        if path.name.endswith("_iterations.csv") or not path.exists():
            continue
        rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
        if not rows:
            continue
        legacy = rows[0]["legacy"] == "True"
        optimizers = sorted({optimizer_label(r.get("optimizer")) for r in rows})
        counts = [p["n"] for p in aggregate(rows)]  # the repeats each point has, not the ones planned
        repeats = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        short = sum(n < MIN_REPEATS for n in counts)
        verdict = "no (predates them)" if legacy else "yes"
        if short and not legacy:
            verdict = f"not yet: {short} of {len(counts)} points have fewer than {MIN_REPEATS} repeats"
        lines.append(f"| `{path.relative_to(results.parent.parent)}` | {len(rows)} | {', '.join(optimizers)} | "
                     f"{repeats} | {'payload only' if legacy else 'headers included'} | {verdict} |")
    return "\n".join(lines)


def summary_block(path: pathlib.Path, command: str) -> str:
    """A runner's own summary (its markdown file, title line dropped), or how to produce it."""
    if not path.exists():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"Not measured yet: `{command}` writes `{where}`."
    lines = path.read_text().strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip()


SERVER_TARGET = 2.0  # the hot-path issue's target: a slice's server CPU at most this many times the memory floor
SERVER_OPTIMIZERS = (("none", "aggregate only"), ("sgd", "SGD momentum"), ("adam", "Adam"))


def server_slice_block(results: pathlib.Path) -> str:
    """server_bench.py's work / floor ratios, condensed: every optimizer at the default slice for each W, and the
    other slice sizes at the smallest W; then the spread per optimizer and the points above the target."""
    path = results / "server_slice.csv"
    if not path.exists():
        return "Not measured yet: `make bench-server` writes `benchmarks/results/server_slice.csv`."
    rows = _plain_rows(path)
    ratio = {(r["optimizer"], int(r["count"]), int(r["workers"])): float(r["ratio_median"]) for r in rows}
    counts = sorted({c for _, c, _ in ratio})
    workers = sorted({w for _, _, w in ratio})
    default = 50_000 if 50_000 in counts else counts[0]
    others = [c for c in counts if c != default]
    optimizers = [(o, label) for o, label in SERVER_OPTIMIZERS if any(k[0] == o for k in ratio)]

    def cell(o: str, c: int, w: int) -> str:
        return f"{ratio[(o, c, w)]:.2f}" if (o, c, w) in ratio else "-"

    def size(c: int) -> str:
        return f"{c // 1000}k" if c % 1000 == 0 else f"{c:,}"

    lines = ["| slice, W | " + " | ".join(label for _, label in optimizers) + " |",
             "|---|" + "---|" * len(optimizers)]
    lines += [f"| {size(default)}, W={w} | " + " | ".join(cell(o, default, w) for o, _ in optimizers) + " |"
              for w in workers]
    if others:
        lines.append(f"| {' / '.join(size(c) for c in others)}, W={workers[0]} | "
                     + " | ".join(" / ".join(cell(o, c, workers[0]) for c in others) for o, _ in optimizers) + " |")
    first = rows[0]
    dirty = str(first.get("git_dirty", "")) == "True" or "git_dirty" not in first
    busy = first.get("busy_pct_before")
    head = (f"`benchmarks/results/server_slice.csv`, commit {first.get('commit', '?')[:12]}"
            f"{' (the tree had uncommitted changes, or the run predates that column)' if dirty else ''}: "
            f"median of {first.get('repeats', '?')} repeats of work / floor; "
            + (f"CPUs {float(busy):.0f}% busy over a 5-second sample before it, " if busy not in (None, "") else
               "no CPU sample before it (the run predates the run guard), ")
            + f"1-minute load {first.get('load_1m_before', '?')} before, {first.get('load_1m_after', '?')} after.")
    sentences = []
    for o, label in optimizers:
        values = [v for k, v in ratio.items() if k[0] == o]
        above = sorted((k for k, v in ratio.items() if k[0] == o and v > SERVER_TARGET), key=lambda k: (k[1], k[2]))
        where = ", ".join(f"{size(c)} with W={w} ({ratio[(o, c, w)]:.2f})" for _, c, w in above)
        sentences.append(f"- {label}: {min(values):.2f}–{max(values):.2f}× the floor over the {len(values)} "
                         "pairs of slice size and W; "
                         + (f"above the {SERVER_TARGET:g}× target at {where}." if above else
                            f"within the {SERVER_TARGET:g}× target everywhere."))
    return "\n".join([head, "", *lines, "", *sentences])


def startup_sentences(results: pathlib.Path) -> str:
    """What importing mxnet at server start-up does to the first step and the job's CPU, per place of the
    optimizer: medians over the repeats of results/startup.csv (startup_bench.py)."""
    path = results / "startup.csv"
    if not path.exists():
        return "Not measured yet: `make bench-startup` writes `benchmarks/results/startup.csv`."
    rows = [r for r in _plain_rows(path) if r["status"] == "ok"]

    def median(update: str, preload: str, column: str) -> float | None:
        values = [float(r[column]) for r in rows if r["optimizer_on"] == update and r["preload_mxnet"] == preload]
        return statistics.median(values) if values else None

    lines = []
    for update in ("servers", "workers"):
        first = median(update, "1", "first_step_s"), median(update, "0", "first_step_s")
        cpu = median(update, "1", "cpu_s"), median(update, "0", "cpu_s")
        if None in first or None in cpu:
            continue
        lines.append(f"- Optimizer on the {update}: with the preload the first step comes "
                     f"{'earlier' if first[0] < first[1] else 'later'} (median {first[0]:.2f} s against "
                     f"{first[1]:.2f} s without), and the job uses {cpu[0]:.2f} s of CPU against {cpu[1]:.2f} s "
                     f"({cpu[0] / cpu[1]:.2f}×).")
    return "\n".join(lines) or "No completed jobs in `benchmarks/results/startup.csv`."


# The runners whose own summaries the README shows: block name -> (summary file, command that writes it).
def sim_validation_block(results: pathlib.Path) -> str:
    """Per system: how close the simulator came to the reviewed emulated-cluster points (results/sim_validation.csv,
    written by `python -m benchmarks.sim.run validate`)."""
    rows = _plain_rows(results / "sim_validation.csv")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run validate` writes `benchmarks/results/sim_validation.csv`."
    lines = ["| system | points | within 10% | fast / slow | fast / slow by over 10% | median error | errors from … to "
             "| worst |", "|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(r)
    for label, mine in [*sorted(groups.items()), ("all", rows)]:
        errors = [abs(_float(r["rel_error"])) for r in mine]
        worst = max(mine, key=lambda r: abs(_float(r["rel_error"])))
        eq = _float(worst.get("p100_equiv_gbps"))
        link = f"{worst['bandwidth']} ({eq:g} Gbps)" if eq else worst["bandwidth"]
        where = f" ({worst['model']}, {worst['hosts']} hosts, {link})" if label != "all" else ""
        signed = [_float(r["rel_error"]) for r in mine]
        spread = f"{100 * min(signed):+.1f}% … {100 * max(signed):+.1f}%"
        worst_error = f"{100 * _float(worst['rel_error']):+.1f}%"
        direction = f"{sum(e < 0 for e in signed)} / {sum(e > 0 for e in signed)}"
        far = f"{sum(e < -0.10 for e in signed)} / {sum(e > 0.10 for e in signed)}"
        lines.append(f"| {label} | {len(mine)} | {sum(e <= 0.10 for e in errors)} | {direction} | {far} | "
                     f"{100 * statistics.median(errors):.1f}% | {spread} | {worst_error}{where} |")
    return "\n".join(lines)


GPU_ORDER = ("p100", "v100", "a100", "h100")  # benchmarks/sim/model.py's compute axis, slowest first


def _plain_rows(path: pathlib.Path) -> list[dict]:
    """A CSV that is not a run CSV (the simulator's), as it is."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _sim_rows(results: pathlib.Path, sweep: str) -> list[dict]:
    return _plain_rows(results / f"sim_paper_{sweep}.csv")


def _sim_ratio(rows: Sequence[dict], key: tuple, system: str, base: str) -> float | None:
    """p3kv's simulated throughput over `base`'s at the point `key` (model, gpu, hosts, gbps)."""
    found = {(r["model"], r["gpu"], r["hosts"], r["gbps"], r["system"]): _float(r["throughput"]) for r in rows}
    mine, theirs = found.get((*key, system)), found.get((*key, base))
    return mine / theirs if mine and theirs else None


def _cite(table: dict, sweep: str, model: str) -> str:
    where, value = table.get((sweep, model), (None, None))
    if value is None:
        return "-"
    unit = "Gbps" if sweep == "bandwidth" else "machines"
    return f"{value:.2f}×" + (f" ({where} {unit})" if where else "")


def sim_paper_block(results: pathlib.Path) -> str:
    """The simulated paper-scale sweeps per model: p3kv's best gain over dist_sync across the link rates (and
    over Horovod there), and at 8 machines, beside the paper's numbers (benchmarks/sim/paper.py's PAPER)."""
    bandwidth, scale = _sim_rows(results, "bandwidth"), _sim_rows(results, "scale")
    if not bandwidth:
        return "Not run yet: `python -m benchmarks.sim.run bandwidth` writes `benchmarks/results/sim_paper_*.csv`."
    from benchmarks.sim import paper

    lines = ["| model | best p3kv / dist_sync (link) | paper | p3kv / Horovod there | p3kv / dist_sync at 8 "
             "machines | paper |", "|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in bandwidth):
        gains = [(g, _sim_ratio(bandwidth, (model, "p100", "4", g), "p3", "dist_sync"))
                 for g in dict.fromkeys(r["gbps"] for r in bandwidth if r["model"] == model)]
        gbps, best = max(((g, v) for g, v in gains if v), key=lambda item: item[1])
        versus = _sim_ratio(bandwidth, (model, "p100", "4", gbps), "p3", "horovod")
        at8 = _sim_ratio(scale, (model, "p100", "8", "10"), "p3", "dist_sync") if scale else None

        lines.append(f"| {model} | {best:.2f}× ({_float(gbps):g} Gbps) | {_cite(paper.PAPER, 'bandwidth', model)} | "
                     f"{f'{versus:.2f}×' if versus else '-'} | {f'{at8:.2f}×' if at8 else '-'} | "
                     f"{_cite(paper.PAPER, 'scale', model)} |")
    return "\n".join(lines)


def sim_slice_block(results: pathlib.Path) -> str:
    """The simulated slice-size sweep (10 Gbps, 4 machines): throughput per slice size relative to 50,000, with
    free CPU and with this machine's fitted costs (4 cores per host)."""
    rows = _sim_rows(results, "slice")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run slice` writes `benchmarks/results/sim_paper_slice.csv`."
    sizes = sorted({int(r["slice_size"]) for r in rows})
    found = {(r["model"], r["cpu"], int(r["slice_size"])): _float(r["throughput"]) for r in rows}
    lines = ["| model | CPU | " + " | ".join(f"{z:,}" for z in sizes) + " |", "|---|---|" + "---|" * len(sizes)]
    for model in dict.fromkeys(r["model"] for r in rows):
        for cpu in ("ideal", "measured"):
            base = found.get((model, cpu, 50_000))
            if base:
                lines.append(f"| {model} | {cpu} | " + " | ".join(
                    f"{found[(model, cpu, z)] / base:.2f}" if (model, cpu, z) in found else "-" for z in sizes) + " |")
    return "\n".join(lines)


def sim_future_block(results: pathlib.Path) -> str:
    """Past the paper: p3kv's simulated throughput over dist_sync and over Horovod per model, GPU and link rate."""
    rows = _sim_rows(results, "future")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run future` writes `benchmarks/results/sim_paper_future.csv`."
    rates = list(dict.fromkeys(r["gbps"] for r in rows))
    lines = ["| model | GPU | " + " | ".join(f"{_float(g):g} Gbps: vs dist_sync / vs Horovod" for g in rates) + " |",
             "|---|---|" + "---|" * len(rates)]
    for model in dict.fromkeys(r["model"] for r in rows):
        gpus = dict.fromkeys(r["gpu"] for r in rows if r["model"] == model)
        for gpu in sorted(gpus, key=lambda g: GPU_ORDER.index(g) if g in GPU_ORDER else len(GPU_ORDER)):
            cells = []
            for g in rates:
                key = (model, gpu, "4", g)
                a, b = _sim_ratio(rows, key, "p3", "dist_sync"), _sim_ratio(rows, key, "p3", "horovod")
                cells.append(f"{a:.2f}× / {b:.2f}×" if a and b else "-")
            lines.append(f"| {model} | {gpu} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SUMMARIES = {
    "kvstore": ("kvstore_bench.md", "make bench-kvstore"),
    "accuracy": ("accuracy/accuracy.md", "make bench-accuracy"),
    "kvstore-slice": ("kvstore_bench_slice10000/kvstore_bench.md",
                      "python -m benchmarks.suites.kvstore_bench --systems p3-noopt --slice-size 10000"),
    "startup": ("startup.md", "make bench-startup"),
    "link-overhead": ("link_overhead.md", "sudo .venv/bin/python -m benchmarks.suites.link_overhead"),
    "soak": ("soak.md", "python -m benchmarks.suites.soak_bench --iters 3000"),
}


def _estimate_block(results: pathlib.Path) -> str:
    from benchmarks.suites import sweeps  # imports this module: loaded only when the block is written

    return sweeps.estimate_block(results / "sweeps")


def blocks(results: pathlib.Path = RESULTS) -> dict[str, Callable[[], str]]:
    named: dict[str, Callable[[], str]] = {"status": lambda: status_block(results),
                                           "legacy": lambda: legacy_block(results)}
    named["estimate"] = lambda: _estimate_block(results)
    named["sim-validation"] = lambda: sim_validation_block(results)
    named["sim-paper"] = lambda: sim_paper_block(results)
    named["sim-future"] = lambda: sim_future_block(results)
    named["sim-slice"] = lambda: sim_slice_block(results)
    named["server-slice"] = lambda: server_slice_block(results)
    named["startup-effect"] = lambda: startup_sentences(results)
    for name, (file, command) in SUMMARIES.items():
        named[name] = (lambda f=file, c=command: summary_block(results / f, c))
    for name in ("demo", "bandwidth", "sensitivity", "dilation", "ablation", "slice", "scale", "utilisation"):
        named[name] = (lambda n=name: reviewed_block(n, results))
    return named


BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)


def render(text: str, results: pathlib.Path = RESULTS) -> str:
    """`text` with every known block's body replaced by what the CSVs give now."""
    makers = blocks(results)

    def replace(match: re.Match) -> str:
        maker = makers.get(match["name"])
        if maker is None:
            raise SystemExit(f"README block bench:{match['name']} is not one report.py writes ({', '.join(makers)})")
        return f"{match.group(1)}{maker()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def stale_bound_rows(sweeps_dir: pathlib.Path) -> list[str]:
    """"file:run_id" of every reviewed row whose stored bound is not what wire_bound.py gives now."""
    from benchmarks.suites import cluster_job, sweeps

    return [f"{p.name}:{run_id}" for p in sweeps.run_csvs(sweeps_dir)
            for run_id in bench_rows.stale_bounds(p, cluster_job.bound_columns)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=pathlib.Path, default=README)
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    documents = [args.readme, args.results_dir / LEGACY / "README.md"]
    rendered = {d: (d.read_text(), render(d.read_text(), args.results_dir)) for d in documents if d.exists()}
    if args.check:
        stale = stale_bound_rows(args.results_dir / "sweeps")
        if stale:
            LOG.error("%d rows' bound columns differ from wire_bound.py as it is now (%s%s); run python "
                      "benchmarks/suites/sweeps.py rebound", len(stale), ", ".join(stale[:3]),
                      ", ..." if len(stale) > 3 else "")
            return 1
        stale_documents = [str(d) for d, (text, new) in rendered.items() if new != text]
        if stale_documents:
            LOG.error("%s: benchmark blocks differ from the CSVs; run python -m benchmarks.report",
                      ", ".join(stale_documents))
            return 1
        return 0
    for document, (text, new) in rendered.items():
        if new != text:
            document.write_text(new)
            LOG.info("rewrote the benchmark blocks of %s", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
