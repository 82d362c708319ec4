"""How long sweep runs take (`sweeps.py estimate`, `make sweeps-estimate`, `python -m benchmarks`): per run, its
warm-up and timed iterations at the iteration time its own point's measured rows showed (at any dilation, scaled to
the run's), or, for a point never measured, the header-inclusive bound times the slowdown the measured rows showed
over their bound; plus each job's time outside its timed iterations (its model and system's where they have runs: a
torch job of VGG-19 spent about 130 s there, one of ResNet-50 on MXNet 15 s, so one median for all made VGG-19's
torch sweep take 1.5 times its estimate). And the fixed weights --slice cuts sweeps by.
"""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import equivalent_gbps as row_equivalent_gbps
from benchmarks.analysis.points import optimizer_label
from benchmarks.emulation import emulated_cluster, emulated_compute, wire_bound
from benchmarks.suites import cluster_bench

GATE_S = 5.0  # the run guard's idle sample before every run
OWN_OVERHEAD_RUNS = 3  # runs a (model, system) needs before its own start-up and shutdown time is used
# What --slice cuts a sweep by: the estimate with fixed factors, so K/N stays the same runs as rows accumulate.
SLICE_FACTORS = (30.0, 1.15, "fixed")


class Factors(NamedTuple):
    """What `estimate` turns a point into seconds with (measured_factors)."""

    overhead_s: float  # per job outside the timed iterations: start-up, shutdown, the run guard's idle sample
    slowdown: float  # measured s/iter over the header-inclusive bound, for points never measured
    source: str
    # s/iter x gpu_scale (the undilated iteration) per measured point (timing_key): a point measured before is
    # estimated from its own rows, at its own dilation
    per_iteration: Mapping[tuple, float] = {}
    # per (model, system) with OWN_OVERHEAD_RUNS or more runs: its own time outside the timed iterations (a
    # torch job of VGG-19: 35-60 s of start-up, its initial 548 MiB broadcast included, and its end; 15 s in all
    # for a ResNet-50 job of MXNet's)
    overhead_by: Mapping[tuple, float] = {}


def timing_key(model: str, kvstore: str, hosts: int, layout: str, equivalent_gbps: float | None, batch_size: int,
               efficiency_factor: float, slice_size: int | None, optimizer: str) -> tuple:
    """What a run's iteration time depends on, whatever its dilation, repeat or iteration count."""
    return (model, kvstore, int(hosts), layout or "colocated", round(equivalent_gbps or 0.0, 3), int(batch_size),
            round(float(efficiency_factor or 1.0), 4), int(slice_size) if slice_size else None,
            optimizer_label(optimizer))


def _row_key(r: dict) -> tuple:
    return timing_key(r["model"], r["kvstore"], int(r["hosts"]), r.get("layout") or "colocated", row_equivalent_gbps(r),
                      int(r["batch_size"]), float(r.get("efficiency_factor") or 1.0),
                      int(float(r["slice_size"])) if r.get("slice_size") else None, r.get("optimizer") or "none")


def _point_key(p: cluster_bench.Point) -> tuple:
    equivalent = emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale / 1e9 if p.bandwidth else None
    return timing_key(p.model, p.kvstore, p.hosts, p.layout, equivalent, p.batch_size, p.efficiency_factor,
                      p.slice_size, p.optimizer)


def measured_rows(results: pathlib.Path = cluster_bench.RESULTS) -> list[dict]:
    """Every ok, non-smoke emulated run under `results` with its wall time (the sweeps', the tuning grids', kept
    demo runs; not results/legacy/, whose points ran before the reviewed settings)."""
    rows = []
    for path in sorted(results.rglob("*.csv")):
        if path.stem.endswith("_iterations") or "legacy" in path.relative_to(results).parts:
            continue
        with path.open() as f:
            header = f.readline().split(",")
        if "run_id" not in header or "bound_s" not in header:
            continue
        rows += [r for r in bench_rows.read_runs(path) if r.get("compute") == "emulated" and r.get("median_s")
                 and r.get("bound_s") and r.get("wall_s") and r.get("gpu_scale") and str(r.get("smoke")) != "True"]
    return rows


def measured_factors(results: pathlib.Path = cluster_bench.RESULTS) -> Factors:
    """What `estimate` turns points into seconds with, from the measured rows (measured_rows) once there are any,
    else from the older rows of results/legacy/sweep_*.csv: per job, the time outside its timed iterations
    (CPU-limited runs' where there are 3 or more: the hosts' quotas slow their start-up); the slowdown over the
    bound; and each measured point's own iteration time (CPU-limited runs' where the point has any)."""
    rows, source = measured_rows(results), "the measured rows"
    if not rows:
        source = "the older rows"
        rows = [r for path in sorted((results / "legacy").glob("sweep_*.csv")) if not path.stem.endswith("_iterations")
                for r in bench_rows.read_runs(path)
                if r.get("compute") == "emulated" and r.get("median_s") and r.get("bound_s") and r.get("wall_s")]
    if not rows:
        return Factors(30.0, 1.15, "defaults")
    overhead, for_overhead = _overhead(rows)
    by_system: dict[tuple, list[dict]] = {}
    for r in rows:
        by_system.setdefault((r["model"], r["kvstore"]), []).append(r)
    overhead_by = {key: _overhead(runs)[0] + GATE_S for key, runs in by_system.items()
                   if len(runs) >= OWN_OVERHEAD_RUNS}
    slowdown = statistics.median(float(r["median_s"]) / float(r["bound_s"]) for r in rows)
    by_point: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("legacy") != "True" and r.get("gpu_scale"):
            try:
                by_point.setdefault(_row_key(r), []).append(r)
            except (KeyError, ValueError):  # a row without the settings a point needs: the bound's way
                continue
    per_iteration = {}
    for key, runs in by_point.items():
        chosen = [r for r in runs if str(r.get("cpu_limit", "")).startswith("cgroup")] or runs
        per_iteration[key] = statistics.median(float(r["median_s"]) * float(r["gpu_scale"]) for r in chosen)
    limited = all(str(r.get("cpu_limit", "")).startswith("cgroup") for r in for_overhead)
    overhead_from = f"{len(for_overhead)} {'CPU-limited ' if limited else ''}runs"
    return Factors(overhead + GATE_S, slowdown,
                   f"{source}: {len(rows)} runs, {len(per_iteration)} points with their own; overhead from "
                   f"{overhead_from}, {len(overhead_by)} model and system pairs with their own", per_iteration,
                   overhead_by)


def _overhead(rows: Sequence[dict]) -> tuple[float, Sequence[dict]]:
    """(the median time of `rows`' jobs outside their timed and warm-up iterations, the rows it is from): the
    CPU-limited runs' where there are OWN_OVERHEAD_RUNS or more (the hosts' quotas slow their start-up)."""
    limited = [r for r in rows if str(r.get("cpu_limit", "")).startswith("cgroup")]
    chosen = limited if len(limited) >= OWN_OVERHEAD_RUNS else rows
    median = statistics.median(float(r["wall_s"]) - (int(r["warmup"]) + int(r["iters"])) * float(r["median_s"])
                               for r in chosen)
    return max(median, 0.0), chosen


def point_seconds(p: cluster_bench.Point, factors: Factors) -> tuple[float, bool]:
    """(one run of the point in seconds, whether from its own measured rows)."""
    own = factors.per_iteration.get(_point_key(p))
    if own is not None:
        per_iteration, measured = own / p.gpu_scale, True
    else:
        sizes, nbytes = cluster_bench.model_arrays(p.model)
        description = emulated_compute.load_description(p.model)
        profile = emulated_compute.Profile(p.gpu, p.gpu_scale,
                                           emulated_compute.efficiency_of(description, p.efficiency_factor))
        compute = sum(layer.forward_s + layer.backward_s
                      for layer in emulated_compute.layers_of(description, p.batch_size, profile))
        comm = wire_bound.link_load(p.kvstore, sizes, nbytes, p.hosts, p.layout, p.slice_size).seconds(
            emulated_cluster.parse_rate(p.bandwidth))
        per_iteration, measured = max(compute, comm) * factors.slowdown, False
    overhead = factors.overhead_by.get((p.model, p.kvstore), factors.overhead_s)
    return (p.warmup + p.iters) * per_iteration + overhead, measured


def estimate_seconds(points: Sequence[cluster_bench.Point], repeats: int, factors: Factors | tuple) -> float:
    """Run time of the points: per run, (warm-up + timed iterations) x its measured iteration time (rows of the
    same point at any dilation, scaled to this one's), or else x the header-inclusive bound x the slowdown
    measured rows showed over their bound; plus each job's start-up, shutdown and idle sample (its model and
    system's, Factors.overhead_by, where measured)."""
    factors = Factors(*factors)
    return repeats * sum(point_seconds(p, factors)[0] for p in points)


def slice_weight(points: Sequence[cluster_bench.Point]) -> float:
    return estimate_seconds(points, 1, SLICE_FACTORS)


def table(rows: Sequence[tuple[str, float, float]], source: str) -> str:
    """The README's table of run times from sweeps.estimates: each sweep in full, and what `make sweeps` (--resume)
    would still run."""
    lines = ["| sweep | all runs | not yet in `results/sweeps/` |", "|---|---|---|"]
    lines += [f"| {name} | {full / 3600:.1f} h | {left / 3600:.1f} h |" for name, full, left in rows]
    lines.append(f"| all | {sum(r[1] for r in rows) / 3600:.1f} h | {sum(r[2] for r in rows) / 3600:.1f} h |")
    return "\n".join([*lines, "", f"Estimated by `sweeps.py estimate` ({source}), on an idle 2-core machine."])


def report(rows: Sequence[tuple[str, float, float]], source: str, plan: Sequence[tuple[str, int, float]],
           window_h: float) -> str:
    """What `sweeps.py estimate` prints: the times (sweeps.estimates) and the --slice parts (sweeps.slice_plan)."""
    lines = [f"{name:12s} {full / 3600:5.1f} h   not yet run: {left / 3600:5.1f} h" for name, full, left in rows]
    lines += [f"{'all':12s} {sum(r[1] for r in rows) / 3600:5.1f} h   not yet run: "
              f"{sum(r[2] for r in rows) / 3600:5.1f} h", f"({source})", "",
              f"Slices of at most {window_h:g} h (python -m benchmarks.suites.sweeps NAME --resume --slice K/N, "
              "K = 1..N):"]
    for name, n, longest in plan:
        over = "  (one round of a comparison alone is longer than the window)" if longest > window_h * 3600 else ""
        lines.append(f"{name:12s} N = {n:3d}   longest slice {longest / 3600:4.1f} h{over}")
    return "\n".join(lines) + "\n"
