"""Figures for the simulator's results (matplotlib, Agg)."""

from __future__ import annotations

import pathlib

from benchmarks.sim import model as model_lib
from benchmarks.sim import paper


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def validation(rows: list[dict], path: pathlib.Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 5))
    for i, kv in enumerate(sorted({r["kvstore"] for r in rows})):
        for split, marker in (("fit", "o"), ("held-out", "x")):
            pts = [r for r in rows if r["kvstore"] == kv and r.get("split", "held-out") == split]
            if pts:
                ax.scatter([r["measured_s"] for r in pts], [r["simulated_s"] for r in pts], marker=marker, s=14,
                           color=f"C{i}", label=f"{kv} ({split})")
    top = max(max(r["measured_s"], r["simulated_s"]) for r in rows) * 1.1
    for f, style in ((1.0, "-"), (1.1, ":"), (0.9, ":")):
        ax.plot([0.1, top], [0.1 * f, top * f], "k" + style, lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured s/iter (emulated cluster)", ylabel="simulated s/iter",
           title="simulator vs emulated cluster (dotted: ±10%; o fit, x held out)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep(rows: list[dict], key: str, sweep_name: str, path: pathlib.Path, xlabel: str) -> None:
    """One panel per model: p3's speedup over dist_sync (and the other systems') against `key`."""
    plt = _plt()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.4), squeeze=False)
    for ax, m in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == m and r["gpu"] == "p100"]
        base = {r[key]: r["throughput"] for r in mine if r["system"] == "dist_sync"}
        for s in sorted({r["system"] for r in mine} - {"dist_sync"}):
            pts = sorted((r[key], r["throughput"] / base[r[key]]) for r in mine if r["system"] == s and r[key] in base)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, label=s)
        for tag in (sweep_name, "slicing-only"):
            if (tag, m) in paper.PAPER and (tag == sweep_name or sweep_name == "bandwidth"):
                x, y = paper.PAPER[(tag, m)]
                label = "paper: P3 vs MXNet" if tag == sweep_name else "paper: slicing only"
                if x is None:
                    ax.axhline(y, color="r", ls="--", lw=0.8, label=label + " (max)")
                else:
                    ax.plot([x], [y], "r*" if tag == sweep_name else "mx", ms=10, label=label)
        ax.axhline(1.0, color="gray", lw=0.6)
        ax.set(title=m, xlabel=xlabel, ylabel="throughput / dist_sync")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def slices(rows: list[dict], path: pathlib.Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for m in sorted({r["model"] for r in rows}):
        for cpu in ("ideal", "measured"):
            pts = sorted((r["slice_size"], r["throughput"]) for r in rows if r["model"] == m and r["cpu"] == cpu)
            best = max(y for _, y in pts)
            ax.plot([x for x, _ in pts], [y / best for _, y in pts], marker="o", ms=3, label=f"{m} ({cpu} CPU)")
    ax.axvline(50_000, color="r", ls="--", lw=0.8, label="paper's optimum (50k)")
    ax.set(xscale="log", xlabel="slice size (elements)", ylabel="throughput / best", title="p3, 4 x 10 Gbps, P100")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def future(rows: list[dict], path: pathlib.Path) -> None:
    plt = _plt()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.4), squeeze=False)
    t = {(r["model"], r["gpu"], r["gbps"], r["system"]): r["throughput"] for r in rows}
    gpus = ("p100", "v100", "a100", "h100")
    # The x axis is a compute speed-up over the P100 profile; the GPU names are rough positions (model.py).
    labels = [f"{g}{'?' if g == 'h100' else ''}\nx{model_lib.GPU_SPEEDUP[g]:.1f}" for g in gpus]
    for ax, m in zip(axes[0], models):
        for g in sorted({r["gbps"] for r in rows}):
            ax.plot(labels, [t[(m, gpu, g, "p3")] / t[(m, gpu, g, "dist_sync")] for gpu in gpus], marker="o",
                    label=f"p3/dist_sync {g:g} Gbps")
            ax.plot(labels, [t[(m, gpu, g, "p3")] / t[(m, gpu, g, "horovod")] for gpu in gpus], ls=":", marker=".",
                    label=f"p3/horovod {g:g} Gbps")
        ax.axhline(1.0, color="gray", lw=0.6)
        ax.set(title=m, ylabel="throughput ratio", xlabel="compute speed-up over P100 (h100?: unverified)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def utilisation(series: dict[str, list[tuple[float, float, float]]], path: pathlib.Path, title: str) -> None:
    """series: system -> [(t, egress Gbps, ingress Gbps)] of host 0."""
    plt = _plt()
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.2 * len(series)), sharex=True, squeeze=False)
    for ax, (name, pts) in zip(axes[:, 0], series.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label="host 0 out")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], lw=0.8, label="host 0 in")
        ax.set(title=name, ylabel="Gbit/s")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
