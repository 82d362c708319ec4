"""How busy the emulated links were during a run's timed iterations: the paper's network-utilisation comparison
(section 5: P3 leaves the network idle less often and uses both directions better than the baseline, most for
Sockeye), from the link counters the utilisation sweep samples every 10 ms (emulated_cluster's sampler, one CSV
per run in results/sweeps/utilisation/).

The timed window of a run is the last seconds before its last busy sample (any host moving over 10% of the link
rate) that its slowest rank's timed iterations took (every rank's are in the row): its 20 timed iterations,
without start-up and the initial broadcast. Within it, per host and
direction, `busy` is the mean rate over the link rate and `idle` the share of 10-ms samples below 10% of it.

    python -m benchmarks.analysis.link_utilisation    # the table for results/sweeps/utilisation.csv, and its figure
"""

from __future__ import annotations

import pathlib
import statistics
import sys
from collections.abc import Sequence

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import LABEL
from benchmarks.emulation import emulated_cluster
from benchmarks.paths import RESULTS

SWEEPS = RESULTS / "sweeps"
IDLE = 0.10  # a direction moving less than this share of the link rate is idle


def samples_path(folder: pathlib.Path, row: dict) -> pathlib.Path:
    """Where the sweep's sampler wrote `row`'s counters (cluster_bench.run_points names it so)."""
    return folder / f"{row['model']}.{row['kvstore']}.{row['hosts']}h.{row['bandwidth']}.r{row['repeat']}.csv"


def rates(series: list[tuple[float, int, int]]) -> list[tuple[float, float, float]]:
    """(time, tx bit/s, rx bit/s) between consecutive counter samples."""
    out = []
    for (t0, tx0, rx0), (t1, tx1, rx1) in zip(series, series[1:]):
        if t1 > t0:
            out.append((t1, (tx1 - tx0) * 8 / (t1 - t0), (rx1 - rx0) * 8 / (t1 - t0)))
    return out


def timed_seconds(row: dict) -> float:
    """How long the run's timed iterations lasted: the slowest rank's (rank 0's in rows from before rank_iter_s)."""
    return max((sum(times) for times in bench_rows.rank_iterations(row)), default=0.0)


def run_utilisation(row: dict, folder: pathlib.Path) -> dict | None:
    """{"busy": mean share of the link rate, both directions, all hosts; "idle": share of idle samples} over the
    run's timed window, or None without its sample file."""
    path = samples_path(folder, row)
    if not path.exists():
        return None
    capacity = float(row["bandwidth_bps"])
    per_host = {h: rates(s) for h, s in emulated_cluster.read_samples(str(path)).items()}
    busy_times = [t for r in per_host.values() for t, tx, rx in r if max(tx, rx) > IDLE * capacity]
    if not busy_times:
        return None
    end = max(busy_times)
    start = end - timed_seconds(row)
    shares, idle = [], []
    for r in per_host.values():
        window = [(tx, rx) for t, tx, rx in r if start < t <= end]
        for direction in (0, 1):
            values = [w[direction] for w in window]
            if values:
                shares.append(statistics.fmean(values) / capacity)
                idle.append(sum(v < IDLE * capacity for v in values) / len(values))
    return {"busy": statistics.fmean(shares), "idle": statistics.fmean(idle)}


def summary(rows: Sequence[dict], folder: pathlib.Path) -> dict[str, dict]:
    """{system: {"busy", "idle" (medians over the repeats), "n"}} for the ok rows with sample files."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("status") == "ok" and str(row.get("smoke")) != "True":
            measured = run_utilisation(row, folder)
            if measured is not None:
                found.setdefault(row["kvstore"], []).append(measured)
    return {kv: {"busy": statistics.median(m["busy"] for m in ms), "idle": statistics.median(m["idle"] for m in ms),
                 "n": len(ms)} for kv, ms in found.items()}


def plot(rows: Sequence[dict], folder: pathlib.Path, path: pathlib.Path, labels: dict[str, str]) -> None:
    """Host 0's link (tx and rx, 50 ms moving average) over repeat 0 of every system, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in rows if r.get("status") == "ok" and int(r["repeat"]) == 0 and str(r.get("smoke")) != "True"
              and samples_path(folder, r).exists()]
    if not chosen:
        return
    fig, axes = plt.subplots(len(chosen), 1, figsize=(10, 2.6 * len(chosen)), squeeze=False)
    for ax, row in zip(axes[:, 0], chosen):
        series = rates(emulated_cluster.read_samples(str(samples_path(folder, row)))[0])
        for index, (name, style) in enumerate((("tx", "-"), ("rx", ":"))):
            values = [s[1 + index] / 1e9 for s in series]
            smooth = [statistics.fmean(values[max(0, i - 4):i + 1]) for i in range(len(values))]
            ax.plot([s[0] for s in series], smooth, style, linewidth=0.8, label=f"host 0 {name}")
        ax.axhline(float(row["bandwidth_bps"]) / 1e9, color="k", linewidth=0.5)
        ax.set_title(f"{labels.get(row['kvstore'], row['kvstore'])}: {row['model']}, {row['hosts']} hosts, "
                     f"{row['bandwidth']} (repeat 0)", fontsize=9)
        ax.set_ylabel("Gbit/s")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run's cluster started (50 ms moving average of 10 ms samples)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    rows = [r for r in bench_rows.read_runs(SWEEPS / "utilisation.csv") if r.get("tag") == "utilisation"]
    for kv, s in summary(rows, SWEEPS / "utilisation").items():
        sys.stdout.write(f"{LABEL.get(kv, kv)}: links {100 * s['busy']:.0f}% busy, {100 * s['idle']:.0f}% "
                         f"of samples idle (median of {s['n']} runs)\n")
    plot(rows, SWEEPS / "utilisation", SWEEPS / "fig_utilisation_links.png", LABEL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
