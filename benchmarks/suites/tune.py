"""`python -m benchmarks tune`: each system's own settings tuned at one comparison point, so that every
comparison runs each baseline (and p3kv) at its best, not at defaults nobody checked (runs as root).

    sudo .venv/bin/python -m benchmarks tune --model resnet50_v1 --equivalent 10       # the demo's point
    sudo .venv/bin/python -m benchmarks tune --headline                               # ResNet-50 @ 4, 10; VGG-19 @ 15
    python -m benchmarks tune --headline --estimate                                   # how long, nothing run

The grid per system (baseline_settings.py has the defaults and where in each project's source they were read):
- horovod: HOROVOD_FUSION_THRESHOLD {16, 64, 128 MiB} x HOROVOD_CYCLE_TIME {1, 5, 10 ms} (0.28.1's default:
  128 MiB, 1 ms), and its autotuner (HOROVOD_AUTOTUNE=1) as a reference cell: the autotuner scores a setting
  every 5 x HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE iterations and repeats its Bayesian search for each value of its
  categorical settings (horovod/common/parameter_manager.{h,cc}): rounds of ~11 scores, more than a job holds. Its
  cell warms up AUTOTUNE_WARMUP iterations and writes the autotuner's log (every setting scored) beside the CSV;
  its throughput (the autotuner still exploring) is shown, never chosen.
- dist_sync: MXNET_KVSTORE_BIGARRAY_BOUND {10^5, 10^6 (default), 10^7} elements.
- mxnet-p3: MXNET_KVSTORE_SLICE_THRESHOLD {40,000 (its default), 50,000 (p3kv's), 100,000} elements.
- p3: P3_SLICE_SIZE {25k, 50k (default), 100k} at the default socket buffer, and P3_SOCKET_BUFFER {32 KiB,
  512 KiB} at 50k (one factor at a time: 5 cells).
- ddp (PyTorch DDP, gloo; not in the default --systems): DDP_BUCKET_CAP_MB {5, 25 (DDP's default, first bucket 1
  MiB), 100} MiB.
--cell 'VAR=VALUE ...' (repeatable) replaces the grid of the system whose variables it names. --slice K/N runs the K-th
of N parts of the cells (every repeat of a cell in one part, the parts of about equal estimated time), so that a
long grid (VGG-19's: about 7 h) runs in idle windows of --window hours (`--estimate --window 2` says into how many);
a system's best setting is written only once every cell of its grid has runs.

Every cell is a job of cluster_job.py at the point, its setting in the job's environment and in the row's
baseline_setting column; all cells of all systems run --repeats rounds, each round in a freshly shuffled order
(seeded), under the run guard. Rows go through bench_rows.py into RESULTS_DIR/<point>.csv (every rank's iterations
in <point>_iterations.csv); --resume runs only the cells and repeats the CSV lacks, --choose-only none (it only
chooses again, e.g. after a change to how a best is chosen; no root needed). Then, per system, over the runs
the fidelity monitors judged faithful, the best setting (analysis/best_setting.py: the fastest cell, or the default
when the fastest is within the 95% CI of it) goes into RESULTS_DIR/best.json with its CI, the grid, the date and the
commit; the comparison suites read it (--best, --untuned).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import random
import sys
import time
from collections.abc import Sequence

from benchmarks.analysis import bench_rows, best_setting
from benchmarks.emulation import cpu_limit, emulated_cluster, run_guard
from benchmarks.suites import baseline_settings, cluster_args, cluster_bench, sweep_estimate, sweep_slices, sweeps
from benchmarks.suites.baseline_settings import DEFAULTS, MIB, env_text
from benchmarks.suites.cluster_job import Point

LOG = logging.getLogger("tune")
SYSTEMS = ("horovod", "dist_sync", "mxnet-p3", "p3")
TORCH_SYSTEMS = ("ddp",)  # tuned when --systems names them (the PyTorch comparison, suites/torch_systems.py)
HEADLINE = (("resnet50_v1", 4.0), ("resnet50_v1", 10.0), ("vgg19", 15.0))  # (model, P100-equivalent Gbit/s)
AUTOTUNE_WARMUP = 150  # iterations before the autotuner cell's timed ones (see the module's docstring)
AUTOTUNE_ENV = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
                "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "10"}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One setting of one system: the variables (all of the system's tuned ones, so the default is exact)."""

    system: str
    env: tuple[tuple[str, str], ...]
    reference: bool = False  # measured and shown, never chosen
    warmup: int | None = None  # None: the point's

    @property
    def default(self) -> bool:
        return dict(self.env) == DEFAULTS[self.system]

    @property
    def label(self) -> str:
        suffix = " (default)" if self.default else " (reference only)" if self.reference else ""
        return env_text(dict(self.env)) + suffix


def cell(system: str, **values) -> Cell:
    """A cell of `system` with `values` over its defaults."""
    return Cell(system, tuple({**DEFAULTS[system], **{k: str(v) for k, v in values.items()}}.items()))


def grid(system: str) -> list[Cell]:
    if system == "horovod":
        cells = [cell(system, HOROVOD_FUSION_THRESHOLD=mib * MIB, HOROVOD_CYCLE_TIME=ms)
                 for mib in (16, 64, 128) for ms in (1, 5, 10)]
        return [*cells, Cell(system, tuple(AUTOTUNE_ENV.items()), reference=True, warmup=AUTOTUNE_WARMUP)]
    if system == "dist_sync":
        return [cell(system, MXNET_KVSTORE_BIGARRAY_BOUND=n) for n in (100_000, 1_000_000, 10_000_000)]
    if system == "mxnet-p3":
        return [cell(system, MXNET_KVSTORE_SLICE_THRESHOLD=n) for n in (40_000, 50_000, 100_000)]
    if system == "p3":
        return ([cell(system, P3_SLICE_SIZE=n) for n in (25_000, 50_000, 100_000)]
                + [cell(system, P3_SOCKET_BUFFER=n) for n in (32 << 10, 512 << 10)])
    if system == "ddp":
        return [cell(system, DDP_BUCKET_CAP_MB=mib) for mib in (5, 25, 100)]
    raise ValueError(f"no grid for {system!r}: one of {', '.join(SYSTEMS + TORCH_SYSTEMS)}")


def parse_cell(text: str) -> Cell:
    """"VAR=VALUE VAR=VALUE": a cell of the one system whose variables these are (the rest at its defaults)."""
    values = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if not values or len(values) != len(text.split()):
        raise ValueError(f"--cell {text!r}: write VAR=VALUE pairs separated by spaces")
    owners = {s for s, defaults in DEFAULTS.items() for k in values if k in defaults}
    unknown = [k for k in values if not any(k in d for d in DEFAULTS.values())]
    if unknown or len(owners) != 1:
        known = "; ".join(f"{s}: {', '.join(d)}" for s, d in DEFAULTS.items())
        raise ValueError(f"--cell {text!r}: name the variables of one system ({known})")
    return cell(owners.pop(), **values)


def cells_for(systems: Sequence[str], custom: Sequence[Cell] = ()) -> list[Cell]:
    """Each system's grid, or the --cell cells given for it."""
    return [c for s in systems for c in ([c for c in custom if c.system == s] or grid(s))]


def cell_slice(cells: Sequence[Cell], k: int, n: int, base_points_: Sequence[Point], repeats: int
               ) -> list[Cell]:
    """The cells of part K of N: cut in grid order by each cell's estimated time at every point (all its repeats;
    a fixed estimate, sweeps' SLICE_FACTORS, so that K/N names the same cells in every invocation)."""
    def cost(c: Cell) -> float:
        return sum(sweep_estimate.slice_weight(tuning_points(b, [c], repeats, 0, pathlib.Path(".")))
                   for b in base_points_)

    parts = sweep_slices.cut([cost(c) for c in cells], n)
    return [c for c, part in zip(cells, parts) if part == k - 1]


def tuning_points(base: Point, cells: Sequence[Cell], repeats: int, seed: int, results_dir: pathlib.Path
                  ) -> list[Point]:
    """Every cell at `base` (its system and setting), `repeats` rounds, each in a freshly shuffled order."""
    rng = random.Random(seed)
    autotune_log = results_dir / f"{baseline_settings.point_key(base)}.autotune.csv"
    ordered = []
    for repeat in range(repeats):
        order = list(cells)
        rng.shuffle(order)
        for position, c in enumerate(order):
            env = dict(c.env)
            if c.reference and "HOROVOD_AUTOTUNE" in env:
                env["HOROVOD_AUTOTUNE_LOG"] = str(autotune_log)  # the last repeat's stays: what it settled on
            ordered.append(dataclasses.replace(base, kvstore=c.system, setting_env=tuple(env.items()),
                                               baseline_setting=c.label, warmup=base.warmup if c.warmup is None
                                               else c.warmup, repeat=repeat, repeats=repeats, order=position))
    return ordered


def conditions(settings: dict) -> tuple:
    """A run's identity without its repeat (the sweeps' --resume identity): the runs of one setting under the same
    emulation, which one choice may pool; a row from before a change to the emulation has other conditions."""
    return sweeps._signature({**settings, "repeat": 0})


def point_conditions(point: Point) -> tuple:
    return conditions(sweeps._settings(point))


def choose_best(csv_path: pathlib.Path, base: Point, cells: Sequence[Cell], include_smoke: bool = False,
                grid: Sequence[Point] | None = None) -> dict[str, dict]:
    """{system: best.json entry} from every ok row of the tuning CSV that belongs to one of `cells` at `base`'s
    iterations (rows of other invocations included: a resumed grid pools its repeats), except runs the fidelity
    monitors judged unfaithful: a setting is chosen on the runs the tables would show (their count is recorded).
    With `grid` (the runs the grid would make now), where a system has rows run under the same conditions, only
    those count: a row from before a change to the emulation (its --resume identity differs, so the grid ran its
    cell again) is left out and counted, never pooled with the new runs. A system none of whose rows has the
    grid's conditions (rows older than a column of them) keeps every row.
    A smoke grid (`include_smoke`) checks the machinery on a few iterations of a busy machine, where the monitors
    often fail a run; it keeps those runs, and its entry is marked smoke, which the comparisons never read."""
    rows = [r for r in bench_rows.read_runs(csv_path)
            if (include_smoke or str(r.get("smoke")) != "True") and int(r["iters"]) == base.iters]
    older = []
    if grid is not None:
        now = {point_conditions(p) for p in grid}
        same = [conditions(r) in now for r in rows]
        current = {r["kvstore"] for r, s in zip(rows, same) if s}
        older = [r for r, s in zip(rows, same) if r["kvstore"] in current and not s]
        rows = [r for r, s in zip(rows, same) if r["kvstore"] not in current or s]
    unfaithful = [] if include_smoke else [r for r in rows if bench_rows.verdict(r) is False]
    rows = [r for r in rows if include_smoke or bench_rows.verdict(r) is not False]
    entries = {}
    for system in dict.fromkeys(c.system for c in cells):
        mine = [c for c in cells if c.system == system]
        measured = []
        for c in mine:
            runs = [r for r in rows if r["kvstore"] == system and r.get("baseline_setting") == c.label
                    and int(r["warmup"]) == (base.warmup if c.warmup is None else c.warmup)]
            if not runs and not c.reference:
                judged = sum(r["kvstore"] == system and r.get("baseline_setting") == c.label for r in unfaithful)
                if judged:  # e.g. compute that is not emulated: never faithful (fidelity.py), so never a result
                    LOG.warning("%s: every run of cell %s in %s (%d) was judged unfaithful; no best setting (--smoke "
                                "keeps them, as a check of the machinery)", system, c.label, csv_path, judged)
                else:
                    LOG.warning("%s: cell %s has no run in %s yet (another --slice?); its best setting waits for "
                                "the whole grid", system, c.label, csv_path)
                break
            spi = float(runs[0]["workers"]) * float(runs[0]["samples_per_batch"]) if runs else 1.0
            measured.append(best_setting.Cell(c.label, tuple(best_setting.job_times(
                runs, bench_rows.iterations_path(csv_path))), spi, c.default, c.reference))
        if len(measured) < len(mine):
            continue
        try:
            choice = best_setting.choose(measured)
        except ValueError:
            LOG.warning("%s: no cell has an ok run in %s; no best setting", system, csv_path)
            continue
        chosen = next(c for c in mine if c.label == choice.chosen.label)
        env = dict(chosen.env)
        label = f"default (tuned: {env_text(env)})" if chosen.default else f"{env_text(env)} (tuned)"
        used = [r for r in rows if r["kvstore"] == system]
        entries[system] = best_setting.entry(
            choice, env, label, [c.label for c in mine], csv=csv_path.name,
            date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=used[-1].get("git_commit", ""),
            runs=len(used), unfaithful_left_out=sum(r["kvstore"] == system for r in unfaithful),
            older_left_out=sum(r["kvstore"] == system for r in older),
            repeats=max(int(r["repeat"]) for r in used) + 1, iters=base.iters,
            warmup=base.warmup, smoke=any(str(r.get("smoke")) == "True" for r in used))
    return entries


def summary(point: str, entries: dict[str, dict]) -> str:
    lines = [f"Tuning at {point}: throughput with 95% CI per cell; the chosen setting first", ""]
    for system, e in entries.items():
        lines.append(f"{system}: {e['label']}: {e['throughput']:.1f} ({e['ci'][0]:.1f}-{e['ci'][1]:.1f}); "
                     f"{e['reason']}")
        lines += [f"    {label}: {c['throughput']:.1f} ({c['ci'][0]:.1f}-{c['ci'][1]:.1f})"
                  for label, c in e["cells"].items()]
    return "\n".join(lines) + "\n"


def base_points(args: argparse.Namespace) -> list[Point]:
    """The point(s) to tune: --headline's, or the one given (--equivalent, or --bandwidth and --gpu-scale)."""
    wanted = HEADLINE if args.headline else [(args.model, args.equivalent)]
    points = []
    for model, equivalent in wanted:
        host_cpus = cluster_bench.host_cpus_from_args(args, model)
        if equivalent is not None:  # the sweeps' rule (sweeps._point), CPU quotas included, so the keys match
            scale = args.gpu_scale or min(sweeps.least_dilation(equivalent, args.link_max),
                                          sweeps.cpu_fit(args.hosts, host_cpus))
            bandwidth = sweeps.link(equivalent, scale)
        else:
            scale, bandwidth = args.gpu_scale or 1.0, args.bandwidth
        points.append(Point(model=model, kvstore="", hosts=args.hosts, bandwidth=bandwidth, compute=args.compute,
                            batch_size=args.batch_size, gpu_scale=scale, optimizer=args.optimizer,
                            warmup=args.warmup, iters=args.iters, tag="tune", timeout=args.timeout,
                            log_interval=max(1, args.iters), host_cpus=host_cpus,
                            link_rx=getattr(args, "link_rx", "softirq"),
                            cfs_period_gpu_ms=args.cfs_period_gpu_ms, thread_cap=args.thread_cap,
                            tcp_congestion=args.tcp_congestion, tcp_trace=args.tcp_trace))
    return points


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50_v1", choices=cluster_bench.MODELS)
    p.add_argument("--equivalent", type=float, help="P100-equivalent Gbit/s: link and dilation as the sweeps "
                   "choose them (sweeps.least_dilation), so the key matches the sweeps' point")
    p.add_argument("--bandwidth", default="2gbit", help="without --equivalent: every host's link (tc syntax)")
    p.add_argument("--gpu-scale", type=float, default=None, help="the dilation (default: the sweeps' for "
                   "--equivalent, else 1)")
    p.add_argument("--link-max", type=float, default=sweeps.LINK_MAX_GBPS)
    p.add_argument("--headline", action="store_true", help=f"tune each of {HEADLINE} in turn")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--compute", choices=("emulated", "real", "none"), default="emulated")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--optimizer", choices=("sgd", "none"), default="sgd")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS + TORCH_SYSTEMS)
    p.add_argument("--cell", action="append", default=[], help="'VAR=VALUE ...': replaces its system's grid "
                   "(repeat for several cells)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--results-dir", type=pathlib.Path, default=baseline_settings.TUNING, help="where the "
                   "tuning CSVs and best.json go (default benchmarks/results/tuning)")
    p.add_argument("--resume", action="store_true", help="run only the cells and repeats the CSV lacks")
    p.add_argument("--choose-only", action="store_true", help="run nothing: choose each system's best setting "
                   "again from the runs its CSV has (after a change to how a best is chosen; needs no root)")
    cluster_args.add_redo_argument(p)
    p.add_argument("--estimate", action="store_true", help="print how long it would take, run nothing")
    p.add_argument("--slice", help="K/N: run only the K-th of N parts of the cells (see the module's doc)")
    p.add_argument("--window", type=float, default=sweeps.WINDOW_H, help="--estimate: hours one slice may take")
    cluster_bench.add_cpu_arguments(p)
    cluster_bench.add_condition_arguments(p)
    p.add_argument("--tcp-congestion", type=cluster_args.congestion_control, default=None, metavar="NAME",
                   help="tune under this TCP congestion control "
                   "(the point's key then ends .tcp-NAME; a comparison under it without an entry of its own runs "
                   "the machine's default's best). Default: the machine's")
    args = p.parse_args(argv)
    try:
        args.cells = [parse_cell(text) for text in args.cell]
    except ValueError as e:
        p.error(str(e))
    if args.hosts < 2 or args.iters < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--hosts must be >= 2, --iters and --repeats >= 1, --warmup >= 0")
    args.bandwidth = cluster_bench.checked_bandwidth(p, args.bandwidth)
    try:
        args.slice = sweep_slices.parse(args.slice) if args.slice else None
    except ValueError as e:
        p.error(str(e))
    return args


def chosen_cells(args: argparse.Namespace) -> list[Cell]:
    """The cells this invocation runs: each system's grid (or its --cell cells), and of them --slice's part."""
    cells = cells_for(args.systems, args.cells)
    return cell_slice(cells, *args.slice, base_points(args), args.repeats) if args.slice else cells


def estimate_seconds(args: argparse.Namespace, cells: Sequence[Cell] | None = None) -> float:
    """The bound scaled as the sweeps' estimate does (sweeps.estimate_seconds)."""
    factors = sweeps.measured_factors()
    cells = chosen_cells(args) if cells is None else cells
    return sum(sweeps.estimate_seconds(tuning_points(b, cells, args.repeats, args.seed, args.results_dir), 1,
                                       factors) for b in base_points(args))


def slice_count(args: argparse.Namespace) -> tuple[int, float]:
    """(the fewest --slice parts whose every one takes at most --window hours, the longest part's seconds). Where
    one cell alone is longer than the window, the fewest parts none of which is longer than that cell."""
    cells = cells_for(args.systems, args.cells)
    points = base_points(args)
    target = max(args.window * 3600, *(estimate_seconds(args, [c]) for c in cells))
    n = 1
    while True:
        longest = max(estimate_seconds(args, cell_slice(cells, k, n, points, args.repeats)) for k in range(1, n + 1))
        if longest <= target or n >= len(cells):
            return n, longest
        n += 1


def tune_point(base: Point, args: argparse.Namespace) -> int:
    key = baseline_settings.point_key(base)
    csv_path = args.results_dir / f"{key}.csv"
    cells = chosen_cells(args)
    points, skipped = cluster_bench.drop_unavailable(tuning_points(base, cells, args.repeats, args.seed,
                                                                   args.results_dir))
    if args.slice:
        LOG.info("--slice %d/%d: %d of the grid's cells: %s", *args.slice, len(cells),
                 "; ".join(f"{c.system} {c.label}" for c in cells))
    if args.choose_only:
        if not csv_path.exists():
            LOG.error("--choose-only: %s has no runs yet: run the grid first (without --choose-only)", csv_path)
            return 2
        points = []
    elif args.resume or args.redo_unfaithful:
        left = sweeps.not_yet_run(points, csv_path, args.redo_unfaithful)
        LOG.info("--resume: %d of %d runs are already in %s", len(points) - len(left), len(points), csv_path)
        points = left
    LOG.info("%s: %d jobs (%d cells x %d repeats)", key, len(points), len(cells), args.repeats)
    rows = [] if args.choose_only else cluster_bench.run_points(points, csv_path,
                                                                cluster_bench.conditions_from_args(args))
    whole = cells_for(args.systems, args.cells)  # a system's best is chosen over its whole grid, every slice's runs
    tuned = [c for c in whole if c.system not in skipped and c.system in {m.system for m in cells}]
    entries = choose_best(csv_path, base, tuned, include_smoke=args.smoke,
                          grid=tuning_points(base, tuned, args.repeats, args.seed, args.results_dir))
    for entry in entries.values():  # what another dilation of the same comparison looks its setting up by
        entry.update(comparison=baseline_settings.comparison_key(base), gpu_scale=base.gpu_scale)
    merged = best_setting.merge_best(args.results_dir / "best.json", key, entries)
    text = summary(key, merged.get(key, {}))  # every system tuned at the point, whichever invocation chose it
    (args.results_dir / f"{key}.md").write_text(text)
    sys.stdout.write("\n" + text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.estimate:
        sys.stdout.write(f"{estimate_seconds(args) / 3600:.1f} h (estimated as the sweeps are: "
                         f"{sweeps.measured_factors()[2]}), on an idle 2-core machine\n")
        n, longest = slice_count(args)
        sys.stdout.write(f"in slices of at most {args.window:g} h: --slice K/{n}, K = 1..{n}, the longest "
                         f"{longest / 3600:.1f} h" + (" (one cell alone is longer)" if longest > args.window * 3600
                                                      else "") + "\n")
        return 0
    reason = None if args.choose_only else emulated_cluster.why_unavailable()
    if reason:
        LOG.error("cannot build the emulated cluster: %s", reason)
        return 2
    code = 0
    try:
        for base in base_points(args):
            code = max(code, tune_point(base, args))
    except (run_guard.Refused, cpu_limit.QuotaRefused, cpu_limit.CpuLimitError) as e:
        LOG.error("%s", e)
        return 3
    return code


if __name__ == "__main__":
    sys.exit(main())
