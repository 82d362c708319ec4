"""The sweeps' figures (results/sweeps/fig_<name>.png): medians with the IQR as error bars, the header-inclusive
bound dashed, P100-equivalent rates so that points at different dilations compare, and what the paper reports."""

from __future__ import annotations

import logging
import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import LABEL, aggregate, link_label

LOG = logging.getLogger("sweeps")


# What the paper reports (section 5), shown on the figures.
PAPER_BANDWIDTH = {"resnet50_v1": "paper: +26% at 4 Gbps", "inceptionv3": "paper: +18% (max)",
                   "vgg19": "paper: +66% at 15 Gbps", "sockeye": "paper: +38% (max)"}


PAPER_ABLATION = "paper (VGG-19, 30 Gbps): slicing alone +49%"
PAPER_SLICE = "paper: optimum at 50,000"


PAPER_SCALE = {"vgg19": "paper: +61% at 8 machines", "sockeye": "paper: +18% at 8 machines",
               "resnet50_v1": "paper: about equal at 10 Gbps"}


def undilated(p: dict) -> float:
    """What a point's rates are multiplied by to read as real P100s': 1 / --gpu-scale (emulated time runs slower by
    that factor), 1 where compute is not dilated."""
    return 1.0 / p["gpu_scale"] if p.get("gpu_scale") else 1.0


# One colour per system in every panel and figure, so that a system reads the same across them.
SYSTEM_COLORS = {"p3": "tab:orange", "dist_sync": "tab:green", "mxnet-p3": "tab:blue", "horovod": "tab:red",
                 "p3-slicing-only": "tab:purple", "p3-priority-split": "tab:brown", "p3-priority-only": "tab:gray",
                 "ddp": "tab:pink", "torch-p3kv": "tab:olive", "torch-p3kv-server": "tab:cyan"}


def plot(name: str, rows: Sequence[dict], path: pathlib.Path, include_smoke: bool = False) -> None:
    """The sweep's figure: medians with the IQR as error bars, the header-inclusive bound dashed (smoke rows
    only for a smoke run's own figure). The line figures plot P100-equivalent rates (measured / --gpu-scale), so
    points at different dilations compare: the emulated wall-clock rate falls with the dilation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = aggregate([r for r in rows if r.get("tag") == name], include_smoke)
    if not points:
        LOG.warning("no rows for sweep %s: nothing to plot", name)
        return

    def errorbar(ax, xs, mine, label, **style):
        ax.errorbar(xs, [p["throughput"] * undilated(p) for p in mine],
                    yerr=[[(p["throughput"] - p["low"]) * undilated(p) for p in mine],
                          [(p["high"] - p["throughput"]) * undilated(p) for p in mine]],
                    marker="o", capsize=3, label=label, **style)

    if name in ("bandwidth", "scale", "sensitivity", "dilation", "torch"):  # torch: as bandwidth, its systems
        x_of = {"bandwidth": lambda p: p["p100_equiv_gbps"], "torch": lambda p: p["p100_equiv_gbps"],
                "scale": lambda p: p["hosts"],
                "sensitivity": lambda p: float(p["efficiency_factor"]), "dilation": lambda p: p["gpu_scale"]}[name]
        panel_of = {"bandwidth": lambda p: p["model"], "torch": lambda p: p["model"], "scale": lambda p: p["model"],
                    "sensitivity": lambda p: f"{p['model']}, {p['p100_equiv_gbps']:g} Gbps-equiv.",
                    "dilation": lambda p: f"{p['model']}, {p['p100_equiv_gbps']:g} Gbps-equiv."}[name]
        panels = list(dict.fromkeys(panel_of(p) for p in points))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), squeeze=False)
        for ax, panel in zip(axes[0], panels):
            mine = [p for p in points if panel_of(p) == panel]
            order = list(SYSTEM_COLORS)  # every system has one (tests/test_sweeps.py): a new one must be added
            for kv in sorted({p["kvstore"] for p in mine}, key=order.index):
                series = sorted((p for p in mine if p["kvstore"] == kv), key=x_of)
                errorbar(ax, [x_of(p) for p in series], series, LABEL.get(kv, kv),
                         color=SYSTEM_COLORS[kv])
            xs = sorted({x_of(p) for p in mine})
            ax.plot(xs, [statistics.median(p["bound_throughput"] * undilated(p) for p in mine if x_of(p) == x)
                         for x in xs], "k--", label="bound (headers incl.)")
            if name in ("bandwidth", "sensitivity", "dilation", "torch"):
                ax.set_xscale("log")
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
                ax.minorticks_off()
            ax.set_xlabel({"bandwidth": "P100-equivalent Gbps", "torch": "P100-equivalent Gbps",
                           "scale": "hosts (1 worker + 1 server each)",
                           "sensitivity": "efficiency x calibrated", "dilation": "--gpu-scale (1 = undilated)"}[name])
            ax.set_ylabel(f"P100-equivalent {mine[0]['unit']}/s\n(measured / --gpu-scale)", fontsize=8)
            extra = PAPER_BANDWIDTH.get(mine[0]["model"], "") if name == "bandwidth" else (
                PAPER_SCALE.get(mine[0]["model"], "") if name == "scale" else "")
            ax.set_title(f"{panel}\n{extra}", fontsize=9)
            ax.legend(fontsize=7)
    else:  # one bar per system (ablation, demo, utilisation, shallow) or per slice size
        key = "slice_size" if name == "slice" else "kvstore"
        fig, ax = plt.subplots(figsize=(7, 3.8))
        if name == "slice":
            points = sorted(points, key=lambda p: int(p["slice_size"]))
        labels = [str(p[key]) if key == "slice_size" else LABEL.get(p[key], p[key])
                  for p in points]
        several = len({p["model"] for p in points}) > 1  # the shallow sweep's two headline points side by side
        if several:
            labels = [f"{p['model']}, {link_label(p)}\n{label}" for p, label in zip(points, labels)]
        errors = [[p["throughput"] - p["low"] for p in points], [p["high"] - p["throughput"] for p in points]]
        bars = ax.bar(range(len(points)), [p["throughput"] for p in points], yerr=errors, capsize=4,
                      color="tab:blue")
        ax.bar_label(bars, fmt="%.1f", label_type="center")
        ax.set_xticks(range(len(points)), labels, fontsize=7, rotation=15)
        ax.axhline(statistics.median(p["bound_throughput"] for p in points), color="k", linestyle="--",
                   label="bound (headers incl.)")
        first = points[0]
        note = {"ablation": PAPER_ABLATION, "slice": PAPER_SLICE}.get(name, "")
        where = (f"{first['hosts']} hosts" if several
                 else f"{first['model']}, {first['hosts']} hosts, {link_label(first)}")
        ax.set_title(f"{where}\n{note}", fontsize=9)
        scales = sorted({p["gpu_scale"] for p in points if p["gpu_scale"]})
        ax.set_ylabel(f"{first['unit']}/s (emulated time, --gpu-scale {'/'.join(f'{g:g}' for g in scales)})"
                      if scales else f"{first['unit']}/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    LOG.info("wrote %s", path)


def plot_links(name: str, results_dir: pathlib.Path) -> None:
    """The utilisation sweep's second figure: host 0's link over time for every system (link_utilisation.py)."""
    if name != "utilisation":
        return
    from benchmarks.analysis import link_utilisation

    rows = [r for r in bench_rows.read_runs(results_dir / "utilisation.csv") if r.get("tag") == name]
    link_utilisation.plot(rows, results_dir / "utilisation", results_dir / "fig_utilisation_links.png", LABEL)
