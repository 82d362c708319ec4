"""The demo's final screen, summary and figure from its rows: each system's throughput with a bootstrap CI, the
ratio p3kv / dist_sync with its CI, % of the bound, the CPU the hosts used, and the committed reference figure
for the same point (benchmarks/results/sweeps/), so that a newcomer can tell drift (both systems moved, the
ratio held) from a regression (the ratio moved)."""

from __future__ import annotations

import csv
import dataclasses
import pathlib
import statistics
from collections.abc import Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap, points
from benchmarks.analysis.points import LABEL, aggregate, fidelity_sentence, number, optimizer_label
from benchmarks.paths import RESULTS, ROOT

# What makes a committed row the same point as the demo's (the tag, iteration counts and repeats may differ).
SAME_POINT = tuple(k for k in points.POINT_KEY if k not in ("tag", "optimizer", "legacy"))
BASELINE = "dist_sync"


@dataclasses.dataclass(frozen=True)
class SystemResult:
    kvstore: str
    jobs: int
    iterations: int  # timed iterations per rank, all jobs
    unit: str
    throughput: bootstrap.Estimate
    bound_throughput: float
    cpu_total_pct: float  # median over jobs of the CPU all hosts' processes used, percent of one core


def iteration_arrays(iterations_csv: pathlib.Path) -> dict[str, np.ndarray]:
    """{run_id: (iterations, ranks) seconds} from an _iterations CSV (every rank's timed iterations)."""
    cells: dict[str, dict[tuple[int, int], float]] = {}
    with iterations_csv.open(newline="") as f:
        for r in csv.DictReader(f):
            cells.setdefault(r["run_id"], {})[(int(r["iteration"]), int(r["rank"]))] = float(r["time_s"])
    arrays = {}
    for run_id, times in cells.items():
        iterations = 1 + max(i for i, _ in times)
        ranks = 1 + max(k for _, k in times)
        arrays[run_id] = np.array([[times.get((i, k), np.nan) for k in range(ranks)] for i in range(iterations)])
    return arrays


def system_results(rows: Sequence[dict], arrays: dict[str, np.ndarray], resamples: int,
                   seed: int = 0) -> dict[str, SystemResult]:
    """Per system (in first-run order) its ok jobs' statistics."""
    by_system: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and r["run_id"] in arrays:
            by_system.setdefault(r["kvstore"], []).append(r)
    results = {}
    for kvstore, runs in by_system.items():
        jobs = [arrays[r["run_id"]] for r in runs]
        per_iteration = int(runs[0]["workers"]) * number(runs[0]["samples_per_batch"])
        results[kvstore] = SystemResult(
            kvstore, len(runs), sum(j.shape[0] for j in jobs), runs[0]["unit"],
            bootstrap.throughput(jobs, per_iteration, resamples=resamples, seed=seed),
            statistics.median(number(r["bound_throughput"]) for r in runs),
            statistics.median(number(r["cpu_total_pct"]) for r in runs))
    return results


def ratio(rows: Sequence[dict], arrays: dict[str, np.ndarray], system: str, resamples: int,
          seed: int = 0) -> bootstrap.Estimate | None:
    """`system`'s throughput over dist_sync's with its CI, or None without both."""
    def jobs_of(kvstore: str) -> tuple[list[np.ndarray], float]:
        runs = [r for r in rows if r.get("status") == "ok" and r["kvstore"] == kvstore and r["run_id"] in arrays]
        per_iteration = int(runs[0]["workers"]) * number(runs[0]["samples_per_batch"]) if runs else 0.0
        return [arrays[r["run_id"]] for r in runs], per_iteration

    (a, samples_a), (b, samples_b) = jobs_of(system), jobs_of(BASELINE)
    if not a or not b:
        return None
    return bootstrap.ratio(a, b, samples_a, samples_b, resamples=resamples, seed=seed)


def shown(path: pathlib.Path) -> str:
    """A path as the repository names it, when it lies inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def same_point(row: dict, demo_row: dict) -> bool:
    """Whether a committed row ran at the demo's point under the same conditions (points.POINT_KEY: the CPU
    quota, per-thread caps, link queue, ... but not the sweep's tag), whatever its optimizer's spelling."""
    def norm(key: str, row: dict) -> str:
        value = points.key_value(row, key)
        try:
            return f"{float(value):g}"
        except ValueError:
            return value

    return (all(norm(k, row) == norm(k, demo_row) for k in SAME_POINT)
            and optimizer_label(row.get("optimizer")) == optimizer_label(demo_row.get("optimizer")))


def reference(demo_row: dict, results_dir: pathlib.Path = RESULTS / "sweeps") -> tuple[list[dict], str] | None:
    """The committed points (points.aggregate) at the demo's point and where they come from, or None: the
    faithful rows (points.shown) of results/sweeps/demo.csv first, else of any sweep's CSV that has the point."""
    csvs = [results_dir / "demo.csv"] + [p for p in sorted(results_dir.glob("*.csv"))
                                        if p.name != "demo.csv" and not p.stem.endswith("_iterations")]
    for path in csvs:
        rows = [r for r in bench_rows.read_runs(path)
                if str(r.get("smoke")) != "True" and points.shown(r) and same_point(r, demo_row)]
        for tag in dict.fromkeys(r["tag"] for r in rows):
            tagged = [r for r in rows if r["tag"] == tag]
            if {BASELINE, "p3"} <= {r["kvstore"] for r in tagged}:
                commits = sorted({r["git_commit"][:8] for r in tagged})
                dates = sorted(r["timestamp"][:10] for r in tagged)
                first = tagged[0]
                where = (f"{shown(path)}, commit {', '.join(commits)}, "
                         f"{dates[0]}{'' if dates[0] == dates[-1] else ' to ' + dates[-1]}, "
                         f"{first['repeats']} repeats x {first['iters']} iterations (median of rank 0's)")
                return aggregate(tagged), where
    return None


def _pct(value: float, of: float) -> str:
    return f"{100 * (value / of - 1):+.0f}%" if of else "-"


def screen(rows: Sequence[dict], arrays: dict[str, np.ndarray], *, resamples: int = bootstrap.RESAMPLES,
           results_dir: pathlib.Path = RESULTS / "sweeps", seed: int = 0, wall_s: float | None = None,
           files: Sequence[pathlib.Path] = (), skipped: dict[str, str] | None = None) -> str:
    """The final screen (also the summary .md): one block, about 20 lines."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return "No job finished: see the log lines above.\n"
    first = ok[0]
    systems = system_results(ok, arrays, resamples, seed)
    level = f"{100 * bootstrap.LEVEL:g}%"
    eq = number(first.get("p100_equiv_gbps"))
    lines = [f"p3kv demo: {first['model']}, {first['hosts']} emulated hosts, {first['bandwidth']} links, P100 compute "
             f"x{number(first['gpu_scale']):g}" + (f" ({eq:g} Gbps P100-equivalent)" if eq else ""),
             f"batch {first['batch_size']}/worker, optimizer {optimizer_label(first['optimizer'])}; "
             f"{first['repeats']} interleaved repeats x ({first['warmup']} warm-up + {first['iters']} timed "
             "iterations) per system",
             f"{level} CIs: hierarchical bootstrap (jobs, then iterations; every rank), {resamples} resamples", ""]
    cores = int(number(first.get("cpus"), 0)) or 0
    lines.append(f"{'system':12s} {'throughput (' + level + ' CI)':34s} {'% of bound':>10s} "
                 f"{'CPU % (all hosts' + (f', of {100 * cores}' if cores else '') + ')':>26s}  jobs")
    for kv, s in systems.items():
        t = s.throughput
        lines.append(f"{LABEL.get(kv, kv):12s} {f'{t.value:7.1f} ({t.low:.1f}-{t.high:.1f}) {s.unit}/s':34s} "
                     f"{100 * t.value / s.bound_throughput:9.0f}% {s.cpu_total_pct:26.0f}  {s.jobs}")
    lines.append("")
    for kv in systems:
        if kv == BASELINE:
            continue
        r = ratio(ok, arrays, kv, resamples, seed)
        if r is None:
            continue
        verdict = ("the CI excludes 1.0: a clear difference at this point" if r.excludes(1.0) else
                   "the CI includes 1.0: no clear difference in this run (more --repeats narrow it)")
        lines.append(f"{LABEL.get(kv, kv)} / {BASELINE}: {r.value:.2f}x ({level} CI {r.low:.2f}-{r.high:.2f}); "
                     f"{verdict}")
    bound = next(iter(systems.values()))
    lines.append(f"bound: {bound.bound_throughput:.1f} {bound.unit}/s (max of compute and the busiest link's "
                 "bytes per iteration, headers included)")
    found = reference(first, results_dir)
    lines.append("")
    if found is None:
        lines.append("committed reference: none at this point in benchmarks/results/sweeps/")
    else:
        committed, where = found
        ref = {p["kvstore"]: p for p in committed}
        lines.append(f"committed reference: {where}")
        parts = [f"{LABEL.get(kv, kv)} {p['throughput']:.1f}" for kv, p in ref.items() if kv in systems]
        ref_ratio = ref.get("p3", {}).get("vs_dist_sync")
        lines.append("  " + ", ".join(parts) + f" {bound.unit}/s" + (f"; p3kv / dist_sync {ref_ratio:.2f}x"
                                                                        if ref_ratio else ""))
        moved = [f"{LABEL.get(kv, kv)} {_pct(s.throughput.value, ref[kv]['throughput'])}"
                 for kv, s in systems.items() if kv in ref]
        ours = ratio(ok, arrays, "p3", resamples, seed) if "p3" in systems else None
        if ref_ratio and ours is not None:
            consistent = not ours.excludes(ref_ratio)
            lines.append(f"  this run against it: {', '.join(moved)}; the committed ratio is "
                         + ("inside this run's CI: the systems compare as committed (a shift of both is drift)"
                            if consistent else "outside this run's CI: the comparison changed (a regression or an "
                            "improvement, unless the machine was busy: see conditions)"))
        else:
            lines.append(f"  this run against it: {', '.join(moved)}")
    waited = sum(number(r.get("idle_wait_s")) for r in rows)
    warnings = [r for r in rows if r.get("idle_warning")]
    loads = [number(r.get(k)) for r in rows for k in ("load_1m_before", "load_1m_after")]
    dirty = " (uncommitted changes)" if str(first.get("git_dirty")) == "True" else ""
    lines += ["", f"conditions: 1-minute load {min(loads):.1f}-{max(loads):.1f} on {cores or '?'} cores; the idle gate "
              f"waited {waited:.0f} s in all; tree {first['git_commit'][:8]}{dirty}",
              f"  {len(warnings)} of {len(rows)} jobs started on a busy machine (recorded), the first: "
              f"{warnings[0]['idle_warning']}" if warnings else "  every job started on an idle machine"]
    verdict = fidelity_sentence(rows, include_smoke=True)
    if verdict:  # the screen pools every job; the sweeps' tables keep only faithful ones
        lines.append(f"fidelity: {verdict.replace(' are left out', ' are in the numbers above')} Each job's "
                     "fidelity_notes column says which monitor failed it, with its numbers.")
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        lines.append(f"failed jobs: {', '.join(r['kvstore'] + ' repeat ' + str(r['repeat']) for r in failed)}")
    for kv, why in (skipped or {}).items():
        lines.append(f"{LABEL.get(kv, kv)} skipped: {why}")
    if wall_s is not None:
        lines.append(f"took {wall_s:.0f} s" + (f"; wrote {', '.join(str(f) for f in files)}" if files else ""))
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], arrays: dict[str, np.ndarray], path: pathlib.Path, resamples: int,
         seed: int = 0) -> None:
    """Bar chart of each system's throughput with its bootstrap CI as error bars, the bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = system_results(rows, arrays, resamples, seed)
    if not systems:
        return
    values = [s.throughput.value for s in systems.values()]
    errors = [[s.throughput.value - s.throughput.low for s in systems.values()],
              [s.throughput.high - s.throughput.value for s in systems.values()]]
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar([LABEL.get(kv, kv) for kv in systems], values, yerr=errors, capsize=4,
                  color=["tab:blue" if kv.startswith("p3") else "tab:gray" for kv in systems])
    ax.bar_label(bars, fmt="%.1f", label_type="center")
    bound = statistics.median(s.bound_throughput for s in systems.values())
    ax.axhline(bound, color="tab:red", linestyle="--", label=f"bound {bound:.1f} (headers included)")
    first = next(r for r in rows if r.get("status") == "ok")
    ax.set_ylabel(f"{first['unit']}/s, all workers ({100 * bootstrap.LEVEL:g}% CI)")
    ax.set_title(f"{first['model']}, {first['hosts']} hosts, {first['bandwidth']} links, x{first['gpu_scale']} "
                 f"compute, {first['repeats']} repeats", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
