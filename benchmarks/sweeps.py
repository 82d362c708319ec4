"""The paper's evaluation (section 5), reproduced in shape on an emulated cluster; one command per sweep.

    python benchmarks/sweeps.py bandwidth     # throughput vs link rate, 4 models, p3 / dist_sync / mxnet-p3
    python benchmarks/sweeps.py ablation      # slicing only, priority only, both (VGG-19)
    python benchmarks/sweeps.py slice         # slice size 5k ... 1M (p3)
    python benchmarks/sweeps.py scale         # 2 / 4 / 8 hosts
    python benchmarks/sweeps.py utilisation   # tx/rx of every link over time, dist_sync vs p3
    python benchmarks/sweeps.py targets       # the issue's "what to beat" points (2+2 processes on 4 hosts)
    python benchmarks/sweeps.py plot NAME     # redraw a figure from its CSV

Each sweep appends its rows to results/sweep_<name>.csv (the cluster_bench.py columns; delete the file to start
over) and writes results/sweep_<name>.md (summary table) and results/fig_<name>.png. Figures mark the number
the paper reports where it has one. Compute is emulated (P100 profile, benchmarks/emulated_compute.py) with
time dilated by --gpu-scale: a P100 at scale s on links of rate b has the compute/network ratio of real P100s
on links of rate b/s, so the x axes show that "P100-equivalent" bandwidth next to the emulated link rate.
Runs are slow on a 2-core machine (VGG-19 moves 575 MB per worker per iteration): defaults are sized so each
sweep takes 5-30 minutes; --iters/--models/--bandwidths shrink or grow them.
"""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import statistics
import sys
from collections.abc import Sequence

import cluster_bench
import emulated_cluster

LOG = logging.getLogger("sweeps")
RESULTS = cluster_bench.RESULTS
PEERS = ("p3", "dist_sync", "mxnet-p3")
# What the paper reports (section 5), shown on the figures.
PAPER_BANDWIDTH = {"resnet50_v1": "paper: +26% at 4 Gbps", "inceptionv3": "paper: +18% (max)",
                   "vgg19": "paper: +66% at 15 Gbps", "sockeye": "paper: +38% (max)"}
PAPER_ABLATION = "paper (VGG-19, 30 Gbps): slicing alone +49%"
PAPER_SLICE = "paper: optimum at 50,000"
PAPER_SCALE = {"vgg19": "paper: +61% at 8 machines", "sockeye": "paper: +18% at 8 machines",
               "resnet50_v1": "paper: about equal at 10 Gbps"}


# VGG-19 computes 5x more per image than ResNet-50 and moves 5.6x more bytes: at a P100 slowed 5x (not 10x) and
# faster links its iterations stay a few seconds long on this machine. Plots show P100-equivalent bandwidth.
GPU_SCALE = {"vgg19": 0.2}
DEFAULT_SCALE = 0.1
BANDWIDTHS = {"vgg19": ["1gbit", "2gbit", "3gbit"]}


def _points(name: str, args: argparse.Namespace, **settings) -> list[cluster_bench.Point]:
    model = settings["model"]
    scale = args.gpu_scale or GPU_SCALE.get(model, DEFAULT_SCALE)
    base = dict(hosts=args.hosts, compute="emulated", batch_size=args.batch_size, gpu="p100",
                gpu_scale=scale, warmup=args.warmup, iters=args.iters, tag=name, timeout=args.timeout)
    base.update(settings)
    return [cluster_bench.Point(**base)]


def sweep_bandwidth(args: argparse.Namespace) -> list[cluster_bench.Point]:
    points = []
    for model in args.models:
        for bandwidth in args.bandwidths or BANDWIDTHS.get(model, ["300mbit", "1gbit", "3gbit"]):
            for kv in args.kvstores:
                points += _points("bandwidth", args, model=model, kvstore=kv, bandwidth=bandwidth)
    return points


def sweep_ablation(args: argparse.Namespace) -> list[cluster_bench.Point]:
    kvs = ("dist_sync", "p3-priority-only", "p3-slicing-only", "p3")
    return [p for model in args.models for kv in kvs
            for p in _points("ablation", args, model=model, kvstore=kv, bandwidth=args.bandwidths[0])]


def sweep_slice(args: argparse.Namespace) -> list[cluster_bench.Point]:
    return [p for model in args.models for size in args.slice_sizes
            for p in _points("slice", args, model=model, kvstore="p3", bandwidth=args.bandwidths[0],
                             slice_size=size)]


def sweep_scale(args: argparse.Namespace) -> list[cluster_bench.Point]:
    return [p for model in args.models for hosts in args.host_counts for kv in args.kvstores
            for p in _points("scale", args, model=model, kvstore=kv, bandwidth=args.bandwidths[0], hosts=hosts)]


def sweep_utilisation(args: argparse.Namespace) -> list[cluster_bench.Point]:
    return [p for model in args.models for kv in ("dist_sync", "p3")
            for p in _points("utilisation", args, model=model, kvstore=kv, bandwidth=args.bandwidths[0])]


def sweep_targets(args: argparse.Namespace) -> list[cluster_bench.Point]:
    """The issue's "what to beat" points: 2 workers + 2 servers on 4 hosts (separate), MXNet peers measured
    here before p3kv existed: push+pull only (VGG-19 8.5 / 5.5 s/iter, ResNet-50 0.95 / 0.88 s/iter at 1 Gbit)
    and ResNet-50 training at batch 4 with one thread (1.16 / 1.08 s/iter at 1 Gbit, 3.42 / 3.05 at 300 Mbit)."""
    settings = [("resnet50_v1", "none", "1gbit", 4), ("vgg19", "none", "1gbit", 4),
                ("resnet50_v1", "real", "1gbit", 4), ("resnet50_v1", "real", "300mbit", 4)]
    return [p for model, compute, bandwidth, batch in settings for kv in args.kvstores
            for p in _points("targets", args, model=model, kvstore=kv, bandwidth=bandwidth, compute=compute,
                             batch_size=batch, layout="separate", hosts=4)]


SWEEPS = {
    # name: (function, default models, default link rates, default iterations)
    "bandwidth": (sweep_bandwidth, ["resnet50_v1", "inceptionv3", "sockeye", "vgg19"], None, 8),
    "ablation": (sweep_ablation, ["vgg19"], ["2gbit"], 6),
    "slice": (sweep_slice, ["resnet50_v1"], ["1gbit"], 8),
    "scale": (sweep_scale, ["resnet50_v1", "sockeye", "vgg19"], ["1gbit"], 6),  # p3 vs dist_sync by default
    "utilisation": (sweep_utilisation, ["sockeye"], ["1gbit"], 6),
    "targets": (sweep_targets, ["resnet50_v1"], ["1gbit"], 8),
}


def read_rows(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r["status"] == "ok"]


def _median(rows: Sequence[dict], column: str) -> float:
    return statistics.median(float(r[column]) for r in rows)


def _equivalent(rate: float, scale: float) -> str:
    return f"{rate / scale / 1e9:g}"


def plot(name: str, rows: Sequence[dict], path: pathlib.Path, samples_dir: pathlib.Path | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("tag") == name]
    if not rows and name != "utilisation":
        LOG.warning("no rows for sweep %s: nothing to plot", name)
        return
    if name == "bandwidth":
        models = list(dict.fromkeys(r["model"] for r in rows))
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
        for ax, model in zip(axes[0], models):
            mine = [r for r in rows if r["model"] == model]
            rates = sorted({float(r["bandwidth_bps"]) for r in mine})
            scale = float(mine[0]["gpu_scale"])
            for kv in PEERS:
                ys = [_median([r for r in mine if r["kvstore"] == kv and float(r["bandwidth_bps"]) == x],
                              "throughput") if any(r["kvstore"] == kv and float(r["bandwidth_bps"]) == x
                                                   for r in mine) else float("nan") for x in rates]
                ax.plot([x / 1e9 for x in rates], ys, marker="o", label=kv)
            bound = [_median([r for r in mine if float(r["bandwidth_bps"]) == x], "bound_throughput") for x in rates]
            ax.plot([x / 1e9 for x in rates], bound, "k--", label="physical bound")
            ax.set_xscale("log")
            ax.set_xticks([x / 1e9 for x in rates], [f"{x / 1e9:g}\n({_equivalent(x, scale)})" for x in rates])
            ax.minorticks_off()
            ax.set_xlabel("link Gbit/s (P100-equivalent)")
            ax.set_ylabel(f"{mine[0]['unit']}/s")
            ax.set_title(f"{model}\n{PAPER_BANDWIDTH.get(model, '')}", fontsize=9)
            ax.legend(fontsize=7)
    elif name == "targets":
        fig, ax = plt.subplots(figsize=(8, 3.8))
        cases = list(dict.fromkeys((r["model"], r["compute"], r["bandwidth"]) for r in rows))
        width = 0.8 / (len(PEERS) + 1)
        for j, kv in enumerate(PEERS):
            ys = [_median([r for r in rows if (r["model"], r["compute"], r["bandwidth"]) == c and r["kvstore"] == kv],
                          "median_s") if any((r["model"], r["compute"], r["bandwidth"]) == c and r["kvstore"] == kv
                                             for r in rows) else 0 for c in cases]
            ax.bar([i + j * width for i in range(len(cases))], ys, width, label=kv)
        ax.bar([i + len(PEERS) * width for i in range(len(cases))],
               [_median([r for r in rows if (r["model"], r["compute"], r["bandwidth"]) == c], "bound_s")
                for c in cases], width, color="k", alpha=0.3, label="physical bound")
        ax.set_xticks([i + 1.5 * width for i in range(len(cases))],
                      [f"{m}\n{'push+pull' if c == 'none' else c}, {b}" for m, c, b in cases], fontsize=8)
        ax.set_ylabel("seconds per iteration (lower is better)")
        ax.set_title("2 workers + 2 servers on 4 hosts", fontsize=9)
        ax.legend(fontsize=8)
    elif name in ("ablation", "slice"):
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        key = "kvstore" if name == "ablation" else "slice_size"
        labels = list(dict.fromkeys(r[key] for r in rows))
        if name == "slice":
            labels.sort(key=int)
        values = [_median([r for r in rows if r[key] == label], "throughput") for label in labels]
        if name == "ablation":
            bars = ax.bar(labels, values, color=["tab:gray", "tab:orange", "tab:green", "tab:blue"][:len(labels)])
            ax.bar_label(bars, fmt="%.1f")
            ax.set_title(f"{rows[0]['model']}, {rows[0]['hosts']} hosts, {rows[0]['bandwidth']}\n{PAPER_ABLATION}",
                         fontsize=9)
        else:
            ax.plot([int(x) for x in labels], values, marker="o")
            ax.set_xscale("log")
            ax.axvline(50_000, color="tab:red", linestyle=":", label=PAPER_SLICE)
            ax.set_xlabel("slice size (parameters)")
            ax.legend(fontsize=8)
            ax.set_title(f"p3, {rows[0]['model']}, {rows[0]['hosts']} hosts, {rows[0]['bandwidth']}", fontsize=9)
        ax.axhline(_median(rows, "bound_throughput"), color="k", linestyle="--", label="physical bound")
        ax.set_ylabel(f"{rows[0]['unit']}/s")
    elif name == "scale":
        models = list(dict.fromkeys(r["model"] for r in rows))
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
        for ax, model in zip(axes[0], models):
            mine = [r for r in rows if r["model"] == model]
            hosts = sorted({int(r["hosts"]) for r in mine})
            for kv in PEERS:
                have = [h for h in hosts if any(r["kvstore"] == kv and int(r["hosts"]) == h for r in mine)]
                ax.plot(have, [_median([r for r in mine if r["kvstore"] == kv and int(r["hosts"]) == h],
                                       "throughput") for h in have], marker="o", label=kv)
            ax.plot(hosts, [_median([r for r in mine if int(r["hosts"]) == h], "bound_throughput") for h in hosts],
                    "k--", label="physical bound")
            ax.set_xticks(hosts)
            ax.set_xlabel("hosts (1 worker + 1 server each)")
            ax.set_ylabel(f"{mine[0]['unit']}/s")
            ax.set_title(f"{model}, {mine[0]['bandwidth']}\n{PAPER_SCALE.get(model, '')}", fontsize=9)
            ax.legend(fontsize=7)
    else:  # utilisation
        files = sorted((samples_dir or RESULTS / "utilisation").glob("*.csv"))
        if not files:
            LOG.warning("no utilisation samples to plot")
            return
        fig, axes = plt.subplots(len(files), 1, figsize=(9, 2.6 * len(files)), squeeze=False)
        for ax, path_ in zip(axes[:, 0], files):
            series = emulated_cluster.read_samples(str(path_))
            for host, samples in sorted(series.items())[:2]:
                times, tx, rx = zip(*samples)
                for values, style, what in ((tx, "-", "tx"), (rx, ":", "rx")):
                    rates = [(b - a) * 8 / 1e9 / max(t1 - t0, 1e-6) for a, b, t0, t1 in
                             zip(values, values[1:], times, times[1:])]
                    smooth = [statistics.fmean(rates[max(0, i - 4):i + 1]) for i in range(len(rates))]
                    ax.plot(times[1:], smooth, style, linewidth=0.8, label=f"host {host} {what}")
            ax.set_title(path_.stem, fontsize=9)
            ax.set_ylabel("Gbit/s")
            ax.legend(fontsize=7, ncol=4, loc="upper right")
        axes[-1, 0].set_xlabel("seconds (50 ms moving average of 10 ms samples)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    LOG.info("wrote %s", path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", choices=[*SWEEPS, "plot"])
    parser.add_argument("name", nargs="?", help="with plot: which sweep's figure to redraw")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--bandwidths", nargs="+", help="link rates (tc syntax); the first one for sweeps at one")
    parser.add_argument("--kvstores", nargs="+", default=list(PEERS), choices=list(cluster_bench.KVSTORES))
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--host-counts", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--slice-sizes", nargs="+", type=int,
                        default=[5_000, 20_000, 50_000, 200_000, 1_000_000])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--gpu-scale", type=float, help=f"default {DEFAULT_SCALE}, VGG-19 {GPU_SCALE['vgg19']}")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    name = args.name if args.sweep == "plot" else args.sweep
    if name not in SWEEPS:
        parser.error(f"plot what? one of {', '.join(SWEEPS)}")
    csv_path = args.results_dir / f"sweep_{name}.csv"
    figure = args.results_dir / f"fig_{name}.png"
    samples = args.results_dir / "utilisation"
    if args.sweep == "plot":
        plot(name, read_rows(csv_path), figure, samples)
        return 0
    function, models, bandwidths, iters = SWEEPS[name]
    args.models = [cluster_bench.MODEL_ALIASES.get(m, m) for m in (args.models or models)]
    args.bandwidths = args.bandwidths or bandwidths
    if name == "scale" and args.kvstores == list(PEERS):
        args.kvstores = ["p3", "dist_sync"]  # the paper's scalability figure compares these two
    args.iters = args.iters or iters
    reason = emulated_cluster.why_unavailable()
    if reason:
        LOG.error("cannot build the emulated cluster: %s", reason)
        return 2
    rows = cluster_bench.run_points(function(args), csv_path, utilisation_dir=samples if name == "utilisation"
                                    else None)
    table = cluster_bench.summary([r for r in read_rows(csv_path) if r["tag"] == name])
    (args.results_dir / f"sweep_{name}.md").write_text(table)
    sys.stdout.write("\n" + table)
    plot(name, read_rows(csv_path), figure, samples)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
