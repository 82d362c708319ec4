"""The paper's evaluation (section 5), reproduced in shape on an emulated cluster; one command per sweep.

    python -m benchmarks.suites.sweeps bandwidth     # throughput vs link rate, 4 models, 6 points each, all 4 systems
    python -m benchmarks.suites.sweeps slice         # p3kv's slice size 5k ... 1M at a link-bound point
    python -m benchmarks.suites.sweeps ablation      # VGG-19 at 30 Gbps-equiv.: slicing only, priority only, both
    python -m benchmarks.suites.sweeps scale         # 2 / 4 / 8 hosts, all 4 systems
    python -m benchmarks.suites.sweeps sensitivity   # the calibrated efficiency x0.5, x1, x2 at the headline points
    python -m benchmarks.suites.sweeps dilation      # the headline points at 3 dilations: results must not move
    python -m benchmarks.suites.sweeps demo          # make demo's comparison
    python -m benchmarks.suites.sweeps utilisation   # tx/rx of every link over time, dist_sync vs p3kv vs Horovod
                                              # (also fig_utilisation_links.png, see link_utilisation.py)
    python -m benchmarks.suites.sweeps shallow       # the headline points with 1 ms link queues, not 50 ms
    python -m benchmarks.suites.sweeps cubic         # the headline points under TCP CUBIC, not the machine's BBR
    python -m benchmarks.suites.sweeps torch         # PyTorch: p3kv.torch (both placements) vs DDP (gloo),
                                              # ResNet-50 and VGG-19 at 3 rates each, >= 5 repeats, CIs
    python -m benchmarks.suites.sweeps estimate      # how long each sweep takes (from the bound and older rows),
                                              # and into how many --slice parts of <= --window hours it splits
    python -m benchmarks.suites.sweeps bandwidth --resume --slice 2/5   # one 2-hour slice of a long sweep
    python -m benchmarks.suites.sweeps plot NAME     # redraw a figure from its CSV
    python -m benchmarks.suites.sweeps rebound       # rewrite the rows' bound columns after a change to wire_bound.py

Every run trains with SGD (momentum 0.9, wd 1e-4: on the servers for p3kv and dist_sync, on the workers for MXNet's P3
and Horovod), 3 repeats in a freshly shuffled order, 2 warm-up + 20 timed iterations, under the run guard (clean tree,
idle machine; see cluster_bench.py). Each sweep appends to results/sweeps/<name>.csv (and <name>_iterations.csv;
delete them to start over; --resume runs only the runs they lack; --slice K/N runs the K-th of N parts of whole
rounds, see sweep_slices.py) and draws results/sweeps/fig_<name>.png with the IQR as error bars; `python -m
benchmarks.report` then rewrites the tables of docs/benchmarks.md. Compute is emulated with each model's calibrated
P100 efficiency (benchmarks/workloads/shapes/*.json) and time dilated by --gpu-scale: a P100 at scale s on links of
rate b has the compute/network ratio of real P100s on links of rate b/s ("P100-equivalent"), which is how every point
below is chosen. Each point uses the least dilation its link allows: links up to --link-max (2 Gbit: what 2 cores move
without saturating, see `dilation`) run undilated (scale 1, link = equivalent), faster equivalents at scale = link-max
/ equivalent on a link-max link; and no larger than the hosts' CPU quotas allow: each host's processes get --host-cpus
x scale cores (benchmarks/emulation/cpu_limit.py), and the quotas of a point may add up to 90% of the machine, so on 2
cores with --host-cpus 4 (the default) 4 hosts run at 0.11 or less, 8 at 0.05, 2 at 0.22. Every row records its scale,
the quota, each host's CPU and throttled time and the run's fidelity verdict (fidelity.py).
Each system runs at its tuned best setting for the point where results/tuning/best.json has one (`python -m benchmarks
tune`; --untuned: the defaults), recorded in every row's baseline_setting column.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import pathlib
import sys
from collections.abc import Sequence

from benchmarks.analysis import bench_rows, torch_comparison
from benchmarks.analysis.points import link_burst, optimizer_label
from benchmarks.emulation import cfs_bandwidth, cpu_limit, emulated_cluster, link_shaping, run_guard, thread_cap
from benchmarks.suites import baseline_settings, cluster_args, cluster_bench, sweep_slices, torch_systems
from benchmarks.suites import sweep_estimate as estimate_text
from benchmarks.suites.sweep_estimate import (  # noqa: F401  (the callers' names: sweeps.estimate_seconds, ...)
    GATE_S,
    SLICE_FACTORS,
    Factors,
    estimate_seconds,
    measured_factors,
    measured_rows,
    point_seconds,
    slice_weight,
)
from benchmarks.suites.sweep_plots import SYSTEM_COLORS, plot, plot_links  # noqa: F401  (SYSTEM_COLORS: the tests')

LOG = logging.getLogger("sweeps")
RESULTS = cluster_bench.RESULTS / "sweeps"

SYSTEMS = list(cluster_bench.SYSTEMS)
MODELS = ["resnet50_v1", "inceptionv3", "sockeye", "vgg19"]  # the bandwidth sweep's, and the README block's

LINK_MAX_GBPS = 2.0  # the fastest emulated link; faster P100-equivalents are reached by dilation

# P100-equivalent Gbps per model: >= 6 points over 1-30, ResNet-50 at 4 (the paper's headline) and VGG-19 at 15.
EQUIVALENTS = {"resnet50_v1": [1, 2, 4, 10, 20, 30], "inceptionv3": [1, 2, 4, 10, 20, 30],
               "sockeye": [1, 2, 4, 10, 20, 30], "vgg19": [2, 5, 10, 15, 20, 30]}

SLICE_POINT = ("resnet50_v1", 2)  # link-bound: 0.62 s of traffic vs 0.16 s of compute per iteration, 4 hosts
SLICE_SIZES = [5_000, 20_000, 50_000, 200_000, 1_000_000]
ABLATION = ("vgg19", 30, ["dist_sync", "p3-priority-split", "p3-slicing-only", "p3"])
SCALE = (["resnet50_v1", "sockeye", "vgg19"], 10, [2, 4, 8])
SENSITIVITY = ([("resnet50_v1", 4), ("vgg19", 15)], [0.5, 1.0, 2.0])
# The dilation check (issue 26): the headline points (ResNet-50 at 4 Gbps-equivalent, VGG-19 at 15, the paper's)
# at three dilations each, every one within 4 hosts' CPU quotas on 2 cores (ResNet-50's 4 CPUs per host: 4 x 4 x 0.1
# = 1.6 cores of 1.8; VGG-19's 8, cluster_args.MODEL_HOST_CPUS: 4 x 8 x 0.055 = 1.76): a faithful emulation gives
# each system the same P100-equivalent throughput, and every ratio, at all three.
DILATION = {"resnet50_v1": (4, [0.05, 0.075, 0.1]), "vgg19": (15, [0.035, 0.045, 0.055])}

UTILISATION = ("sockeye", 10, ["dist_sync", "p3", "horovod"])
# The headline points with shallow link queues (issue 26 item 5): 1 ms of queue beyond the bucket's 1 ms burst
# instead of 50 ms, in emulated time (at a dilation of 0.1: 10 ms of queue and 10 ms of bucket in real
# time). A queue that holds about one burst is what a shallow-buffered switch port gives a few synchronised senders:
# their bursts collide and drop where the deep queue absorbed them.
HEADLINE = [("resnet50_v1", 4), ("vgg19", 15)]
SHALLOW = (HEADLINE, 1.0)
# The headline points under TCP CUBIC (Linux's usual default) instead of this machine's BBR, which paces and keeps
# about one bandwidth-delay product in flight where CUBIC fills the 50 ms queues until they drop.
CUBIC = (HEADLINE, "cubic")


def link(equivalent_gbps: float, scale: float) -> str:
    """The emulated link rate (tc syntax, Mbit) of a P100-equivalent rate at dilation `scale`."""
    mbit = round(equivalent_gbps * scale * 1000)
    return f"{mbit // 1000}gbit" if mbit % 1000 == 0 else f"{mbit}mbit"


def least_dilation(equivalent_gbps: float, link_max_gbps: float = LINK_MAX_GBPS) -> float:
    """The largest --gpu-scale (least dilation) whose link for `equivalent_gbps` stays within link_max."""
    return min(1.0, link_max_gbps / equivalent_gbps)


def cpu_fit(hosts: int, host_cpus: float | None) -> float:
    """The largest --gpu-scale whose CPU quotas fit this machine, rounded down to 0.01 (1.0 without limits)."""
    if host_cpus is None:
        return 1.0
    fit = cpu_limit.largest_fitting_scale(hosts, host_cpus, os.cpu_count() or 1)
    return min(1.0, math.floor(fit * 100 + 1e-9) / 100)


def _point(name: str, args: argparse.Namespace, model: str, kvstore: str, equivalent: float,
           **settings) -> cluster_bench.Point:
    hosts = settings.pop("hosts", args.hosts)
    host_cpus = cluster_bench.host_cpus_from_args(args, model)
    scale = (settings.pop("gpu_scale", None) or args.gpu_scale
             or min(least_dilation(equivalent, args.link_max), cpu_fit(hosts, host_cpus)))
    settings.setdefault("link_queue_ms", getattr(args, "link_queue_ms", emulated_cluster.DEFAULT_QUEUE_MS))
    settings.setdefault("cfs_period_gpu_ms", getattr(args, "cfs_period_gpu_ms", cfs_bandwidth.PERIOD_GPU_MS))
    settings.setdefault("thread_cap", getattr(args, "thread_cap", False))
    settings.setdefault("tcp_trace", getattr(args, "tcp_trace", False))
    return cluster_bench.Point(model=model, kvstore=kvstore, hosts=hosts, host_cpus=host_cpus, link_rx=args.link_rx,
                               bandwidth=link(equivalent, scale), compute="emulated", batch_size=args.batch_size,
                               gpu="p100", gpu_scale=scale, optimizer=args.optimizer, warmup=args.warmup,
                               iters=args.iters, tag=name, timeout=args.timeout, **settings)


def sweep_bandwidth(args):
    return [_point("bandwidth", args, m, kv, eq) for m in args.models for eq in args.equivalents.get(m, [])
            for kv in args.kvstores]


def sweep_slice(args):
    model, eq = SLICE_POINT
    return [_point("slice", args, model, "p3", eq, slice_size=size) for size in SLICE_SIZES]


def sweep_ablation(args):
    model, eq, kvs = ABLATION
    return [_point("ablation", args, model, kv, eq) for kv in kvs]


def sweep_scale(args):
    models, eq, host_counts = SCALE
    return [_point("scale", args, m, kv, eq, hosts=h) for m in models for h in host_counts for kv in args.kvstores]


def sweep_sensitivity(args):
    points, factors = SENSITIVITY
    return [_point("sensitivity", args, m, kv, eq, efficiency_factor=f) for m, eq in points for f in factors
            for kv in args.kvstores]


def sweep_dilation(args):
    chosen = [m for m in DILATION if m in args.models] or list(DILATION)  # --models picks among the two
    return [_point("dilation", args, m, kv, DILATION[m][0], gpu_scale=s) for m in chosen for s in DILATION[m][1]
            for kv in args.kvstores]


def _headline(name: str, args, **settings) -> list[cluster_bench.Point]:
    chosen = [(m, eq) for m, eq in HEADLINE if m in args.models] or HEADLINE  # --models picks among the two
    return [_point(name, args, m, kv, eq, **settings) for m, eq in chosen for kv in args.kvstores]


def sweep_demo(args):
    return [_point("demo", args, "resnet50_v1", kv, 10) for kv in args.kvstores]


def sweep_utilisation(args):
    model, eq, kvs = UTILISATION
    return [_point("utilisation", args, model, kv, eq) for kv in kvs]


SWEEPS = {"bandwidth": sweep_bandwidth, "slice": sweep_slice, "ablation": sweep_ablation, "scale": sweep_scale,
          "sensitivity": sweep_sensitivity, "dilation": sweep_dilation, "demo": sweep_demo,
          "utilisation": sweep_utilisation,
          "shallow": lambda args: _headline("shallow", args, link_queue_ms=SHALLOW[1]),
          "cubic": lambda args: _headline("cubic", args, tcp_congestion=CUBIC[1]),
          "torch": lambda args: torch_systems.sweep(args, _point)}


ALL = ("demo", "bandwidth", "slice", "ablation", "scale", "sensitivity", "dilation", "utilisation", "shallow",
       "cubic", "torch")
WINDOW_H = 2.0  # the idle window one slice of a long sweep should fit (estimate --window)


def _signature(settings: dict) -> tuple:
    """A run's identity for --resume, from a Point's fields or a CSV row's columns alike."""
    def number(value) -> float | None:
        return None if value in (None, "") else float(value)

    dilated = str(settings["compute"]) == "emulated"  # a row records its scale, CPUs (if limited) only then
    return (str(settings["tag"]), str(settings["model"]), str(settings["kvstore"]), int(settings["hosts"]),
            str(settings["layout"]), str(settings["bandwidth"]), str(settings["compute"]),
            int(settings["batch_size"]),  # host_cpus: None in rows from before CPU limits, never a limited run
            *(number(settings.get(k)) if dilated else None for k in ("gpu_scale", "efficiency_factor", "host_cpus")),
            number(settings["slice_size"]), optimizer_label(str(settings["optimizer"])),
            int(settings["warmup"]), int(settings["iters"]), int(settings["repeat"]),
            number(settings.get("link_queue_ms")) or emulated_cluster.DEFAULT_QUEUE_MS,  # older rows: 50 ms
            number(settings.get("cfs_period_us")),  # the CFS period the hosts got ("" / None: no quota)
            link_burst(settings),  # the links' bucket in bytes (None: uncapped)
            number(settings.get("tcp_rto_min_ms")) or link_shaping.KERNEL_RTO_MIN_MS,  # "" / None: the kernel's
            number(settings.get("horovod_cycle_ms")),  # Horovod's dilated cycle ("": other systems, older rows)
            number(settings.get("priority_hold_ms")),  # p3kv's sender hold ("": other systems, older p3kv rows)
            number(settings.get("thread_cap_cores")),  # each thread's cap ("": threads uncapped, older rows)
            number(settings.get("omp_threads")) or 1.0,  # OpenMP threads per process ("": older rows ran one)
            str(settings.get("tcp_congestion_control") or link_shaping.LEGACY_CONGESTION_CONTROL),  # "": older, BBR
            # torch: the weight copy and the gradient passes ("": older rows, the host's; torch_systems.py)
            str(settings.get("weight_copy") or ""), str(settings.get("gradient_work") or ""),
            baseline_settings.identity(str(settings.get("baseline_setting") or "")))


def not_yet_run(points: Sequence[cluster_bench.Point], csv_path: pathlib.Path, redo_unfaithful: bool = False
                ) -> list[cluster_bench.Point]:
    """The points without an ok, non-smoke row (with `redo_unfaithful`: one not judged unfaithful) of the same
    settings, system and repeat in csv_path: what is left of an interrupted sweep (--resume, --redo-unfaithful)."""
    done = {_signature(r) for r in bench_rows.read_runs(csv_path) if str(r.get("smoke")) != "True"
            and not (redo_unfaithful and bench_rows.verdict(r) is False)}
    return [p for p in points if _signature(_settings(p)) not in done]


def _settings(point: cluster_bench.Point) -> dict:
    """A point's fields with the conditions its row records as derived columns (period, bucket)."""
    return {**dataclasses.asdict(point), "cfs_period_us": point.cfs_period_us, "link_burst_bytes":
            point.link_burst_bytes, "tcp_rto_min_ms": point.tcp_rto_min_real_ms, "horovod_cycle_ms":
            point.horovod_cycle_real_ms, "thread_cap_cores": point.thread_cap_cores, "omp_threads":
            thread_cap.omp_threads(point.host_cpus, point.thread_cap_cores),
            "tcp_congestion_control": point.tcp_congestion or link_shaping.machine_congestion_control(),
            "priority_hold_ms": baseline_settings.priority_hold_ms(os.environ)
            if cluster_bench.KVSTORES[point.kvstore][0] == "p3" else None,
            **torch_systems.emulation_columns(point.kvstore)}


def sweep_points(name: str, args: argparse.Namespace) -> list[cluster_bench.Point]:
    """Every run of sweep `name` in its interleaved order, each system at its tuned best where there is one."""
    repeats = max(args.repeats, torch_systems.SWEEP_REPEATS if name == "torch" else 1)
    points = cluster_bench.interleave(SWEEPS[name](args), repeats, args.seed)
    return baseline_settings.from_args(points, args)


def estimates(args: argparse.Namespace, results_dir: pathlib.Path) -> tuple[list[tuple[str, float, float]], str]:
    """Per sweep: (name, seconds for all its runs, seconds for the runs its CSV in `results_dir` lacks), and
    where the factors the bound is scaled by come from (see measured_factors)."""
    factors = measured_factors(results_dir.parent)
    rows = []
    own = runs = 0
    for name in ALL:
        points = sweep_points(name, args)
        left = not_yet_run(points, results_dir / f"{name}.csv")
        rows.append((name, estimate_seconds(points, 1, factors), estimate_seconds(left, 1, factors)))
        own += sum(point_seconds(p, factors)[1] for p in points)
        runs += len(points)
    source = (f"start-up, shutdown and idle sample per job: its model and system's, else {factors.overhead_s:.0f} s;"
              f" s/iter: {own} of {runs} runs from their own point's measured rows (scaled to the run's dilation), "
              f"the others {factors.slowdown:.2f} x the header-inclusive bound; from {factors.source}")
    return rows, source


def slice_plan(args: argparse.Namespace, results_dir: pathlib.Path, window_s: float) -> list[tuple[str, int, float]]:
    """Per sweep: (name, the fewest --slice parts whose runs each fit `window_s`, the longest part's seconds)."""
    factors = measured_factors(results_dir.parent)
    return [(name, *sweep_slices.slices_for(sweep_points(name, args), window_s,
                                            lambda ps: estimate_seconds(ps, 1, factors), slice_weight))
            for name in ALL]


def estimate_block(results_dir: pathlib.Path = RESULTS) -> str:
    """The README's table of run times: each sweep in full, and what `make sweeps` (--resume) would still run."""
    return estimate_text.table(*estimates(parse_args(["estimate"]), results_dir))


def run_csvs(results_dir: pathlib.Path) -> list[pathlib.Path]:
    """The run CSVs of the reviewed sweeps (not their _iterations files)."""
    return [p for p in sorted(results_dir.glob("*.csv")) if not p.stem.endswith("_iterations")]


def write_summary(name: str, results_dir: pathlib.Path, skipped: dict[str, str] | None = None) -> str:
    """The sweep's summary table (results_dir/NAME.md) from its CSV; returns it."""
    rows = [r for r in bench_rows.read_runs(results_dir / f"{name}.csv") if r["tag"] == name]
    table = cluster_bench.summary(rows) + torch_comparison.table(rows, include_smoke=True)  # torch's: vs DDP, CIs
    table += cluster_bench.skipped_lines(skipped)
    (results_dir / f"{name}.md").write_text(table)
    return table


def rebound(results_dir: pathlib.Path = RESULTS) -> dict[pathlib.Path, int]:
    """Rewrites every reviewed row's bound from wire_bound.py as it is now (after a change to the header model):
    {csv: rows changed}. `python -m benchmarks.report --check` fails while a row's bound differs."""
    from benchmarks.suites import cluster_job

    return {p: bench_rows.rewrite_bounds(p, cluster_job.bound_columns) for p in run_csvs(results_dir)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", choices=[*SWEEPS, "estimate", "plot", "rebound"])
    parser.add_argument("name", nargs="?", help="with plot: which sweep's figure to redraw")
    parser.add_argument("--models", nargs="+", default=MODELS, help="bandwidth sweep: which models")
    parser.add_argument("--equivalents", dest="only_equivalents", nargs="+", type=float, metavar="GBPS",
                        help="bandwidth sweep: only these P100-equivalent rates of each model's (4: ResNet-50's)")
    parser.add_argument("--kvstores", nargs="+", default=SYSTEMS, choices=list(cluster_bench.KVSTORES))
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gpu-scale", type=float, default=None, help="one dilation for every point (default: "
                        "the least each point's link allows, see --link-max)")
    parser.add_argument("--link-max", type=float, default=LINK_MAX_GBPS, help="fastest emulated link, Gbit/s")
    parser.add_argument("--optimizer", choices=("sgd", "none"), default="sgd")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    cluster_bench.add_cpu_arguments(parser)
    cluster_bench.add_queue_argument(parser)
    parser.add_argument("--resume", action="store_true", help="skip the runs the sweep's CSV already holds (same "
                        "settings, system and repeat, status ok): continue an interrupted sweep")
    cluster_args.add_redo_argument(parser)
    parser.add_argument("--slice", help="K/N: run only the K-th of N parts of the sweep (whole rounds, about "
                        "equal estimated time; `estimate --window H` says how many parts fit H hours each)")
    parser.add_argument("--window", type=float, default=WINDOW_H, help="estimate: hours one slice may take")
    baseline_settings.add_arguments(parser)
    cluster_bench.add_condition_arguments(parser)
    args = parser.parse_args(argv)
    args.models = [cluster_bench.MODEL_ALIASES.get(m, m) for m in args.models]
    args.equivalents = EQUIVALENTS
    if args.only_equivalents:
        args.equivalents = {m: [g for g in gs if g in args.only_equivalents] for m, gs in EQUIVALENTS.items()}
        if not any(args.equivalents.get(m) for m in args.models):
            parser.error(f"--equivalents: no point of {', '.join(args.models)} at those rates (sweeps.EQUIVALENTS)")
    if args.host_cpus is not None and args.host_cpus <= 0:
        parser.error("--host-cpus must be positive")
    if args.sweep == "plot" and args.name not in SWEEPS:
        parser.error(f"plot what? one of {', '.join(SWEEPS)}")
    try:
        args.slice = sweep_slices.parse(args.slice) if args.slice else None
    except ValueError as e:
        parser.error(str(e))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.sweep == "estimate":
        plan = slice_plan(args, args.results_dir, args.window * 3600)
        sys.stdout.write(estimate_text.report(*estimates(args, args.results_dir), plan, args.window))
        return 0
    if args.sweep == "rebound":
        for path, changed in rebound(args.results_dir).items():
            LOG.info("%s: %d rows' bound rewritten", path.name, changed)
            if changed and path.stem in SWEEPS:  # its summary and figure show the bound too
                write_summary(path.stem, args.results_dir)
                plot(path.stem, bench_rows.read_runs(path), args.results_dir / f"fig_{path.stem}.png")
        return 0
    name = args.name if args.sweep == "plot" else args.sweep
    csv_path = args.results_dir / f"{name}.csv"
    figure = args.results_dir / f"fig_{name}.png"
    if args.sweep == "plot":
        plot(name, bench_rows.read_runs(csv_path), figure)
        plot_links(name, args.results_dir)
        return 0
    points = sweep_points(name, args)
    reason = emulated_cluster.why_unavailable() or cluster_bench.congestion_problem(points)
    if reason:
        LOG.error("cannot build the emulated cluster: %s", reason)
        return 2
    if args.slice:
        factors = measured_factors(args.results_dir.parent)
        points = sweep_slices.select(points, *args.slice, slice_weight)
        LOG.info("--slice %d/%d: %d runs, estimated %.1f h in full", *args.slice, len(points),
                 estimate_seconds(points, 1, factors) / 3600)
    points, skipped = cluster_bench.drop_unavailable(points)
    if args.resume or args.redo_unfaithful:
        left = not_yet_run(points, csv_path, args.redo_unfaithful)
        LOG.info("--resume: %d of %d done in %s; %d to go", len(points) - len(left), len(points), csv_path, len(left))
        points = left
    try:
        rows = cluster_bench.run_points(points, csv_path, cluster_bench.conditions_from_args(args),
                                        utilisation_dir=args.results_dir / "utilisation"
                                        if name == "utilisation" else None)
    except (run_guard.Refused, cpu_limit.QuotaRefused, cpu_limit.CpuLimitError) as e:
        LOG.error("%s", e)
        return 3
    sys.stdout.write("\n" + write_summary(name, args.results_dir, skipped))
    plot(name, bench_rows.read_runs(csv_path), figure, include_smoke=args.smoke)
    plot_links(name, args.results_dir)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
