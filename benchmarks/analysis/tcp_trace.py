"""What the socket monitor saw (`--tcp-trace`, emulation/socket_monitor.py), per system at each traced point,
beside the simulator's signed error there: the measurement issue 28 needs before the simulator's network model
changes. The simulator shares each link among the flows with data for it at once, at full rate (a fluid, max-min
model); tcp_unsaturated_pct is the share of the flows' waiting time in which no link on the flow's path ran at its
rate, which that model never allows. If TCP's own dynamics are what the simulator leaves out, systems with more of
it are predicted too fast by more.

The traced runs (as root, on an idle machine; each sweep's own conditions and each system's tuned setting):

    python -m benchmarks.suites.sweeps bandwidth --models resnet50_v1 --equivalents 4 --repeats 6 --tcp-trace \
        --results-dir benchmarks/results/tcp_trace
    python -m benchmarks.suites.sweeps bandwidth --models inceptionv3 --equivalents 4 --repeats 2 --tcp-trace \
        --results-dir benchmarks/results/tcp_trace
    python -m benchmarks.suites.sweeps cubic --models resnet50_v1 --repeats 2 --tcp-trace \
        --results-dir benchmarks/results/tcp_trace
    python -m benchmarks.analysis.tcp_trace                  # results/tcp_trace/*.csv -> results/tcp_trace/summary.md

Per system and point: the traced runs' median of each tcp_* column (faithful runs only) and of the mean number of
flows waiting on unsaturated paths (unsaturated flow-seconds over the timed window's seconds), what held those flows
(tcp_unsaturated_limits: the runs' unsaturated flow-seconds pooled, split by the flow's limit, in %) and, of its
full-window share under BBR, why the window was full (tcp_cwnd_causes, pooled the same way), the traced
throughput against the untraced rows of the same point in results/sweeps/ (the monitor's own cost: it reads every
socket every 50 ms on a thread of the runner), and the simulator's signed error at that point
(results/sim_validation.csv, negative: predicted faster than measured)."""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import statistics
import sys
from collections.abc import Sequence

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import LABEL
from benchmarks.paths import RESULTS

LOG = logging.getLogger("tcp_trace")
TRACES = RESULTS / "tcp_trace"
POINT = ("tag", "model", "hosts", "bandwidth", "gpu_scale")  # the sweep (tag) and where in it
SHOWN = (("tcp_unsaturated_pct", "unsaturated % of waiting"),
         ("unsaturated_flows", "flows waiting unsaturated (mean)"), ("tcp_rwnd_limited_pct", "rwnd-limited % of busy"),
         ("tcp_sndbuf_limited_pct", "sndbuf-limited % of busy"), ("tcp_retrans_pct", "retransmitted % of bytes"),
         ("tcp_flows", "flows at once"), ("tcp_unsaturated_bw_share", "BBR estimates / link (pacing share)"),
         ("tcp_cwnd_rtt_inflation", "RTT / min RTT (cwnd share)"))


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def key(row: dict) -> tuple:
    """A point and system: the rows one line of the summary pools (a row from before the congestion column: BBR)."""
    return (*(str(row.get(c) or "") for c in POINT), str(row.get("tcp_congestion_control") or "bbr"), row["kvstore"])


def unsaturated_flows(row: dict) -> float | None:
    """How many flows on average waited with no link on their path at its rate during the timed window: the
    unsaturated flow-seconds over the window's seconds (a share alone hides how much waiting there was)."""
    backlogged, share, window = (_number(row.get(c)) for c in ("tcp_backlogged_s", "tcp_unsaturated_pct",
                                                               "timed_window_s"))
    if backlogged is None or share is None or not window:
        return None
    return backlogged * share / 100 / window


def _split(text) -> dict[str, float]:
    """"name:share;..." as {name: share}."""
    return {name: float(share) for name, _, share in
            (part.partition(":") for part in filter(None, str(text or "").split(";")))}


def held_by(rows: Sequence[dict], column: str = "tcp_unsaturated_limits") -> str:
    """The runs' unsaturated flow-time pooled and split by what held the flows (tcp_unsaturated_limits), largest
    first, in %; "-" when no run recorded the split. With column="tcp_cwnd_causes": the window-held share of it
    (BBR), split by why the window was full."""
    pooled: dict[str, float] = {}
    for row in rows:
        # The run's unsaturated flow-seconds (a row without the window still counts).
        weight = (_number(row.get("tcp_backlogged_s")) or 0.0) * (_number(row.get("tcp_unsaturated_pct")) or 0.0)
        if column != "tcp_unsaturated_limits":
            weight *= _split(row.get("tcp_unsaturated_limits")).get("cwnd", 0.0)
        for name, share in _split(row.get(column)).items():
            pooled[name] = pooled.get(name, 0.0) + weight * share
    total = sum(pooled.values())
    if not total:
        return "-"
    return ", ".join(f"{name} {100 * v / total:.0f}" for name, v in sorted(pooled.items(), key=lambda kv: -kv[1])
                     if 100 * v / total >= 0.5)


def _median(rows: Sequence[dict], column: str) -> float | None:
    if column == "unsaturated_flows":
        values = [v for v in map(unsaturated_flows, rows) if v is not None]
        return statistics.median(values) if values else None
    values = [v for v in (_number(r.get(column)) for r in rows) if v is not None]
    return statistics.median(values) if values else None


def untraced(folder: pathlib.Path) -> dict[tuple, list[float]]:
    """{point and system: throughputs of faithful runs without a trace} from the sweeps' CSVs."""
    found: dict[tuple, list[float]] = {}
    for path in sorted(folder.glob("*.csv")):
        if path.stem.endswith("_iterations"):
            continue
        for row in bench_rows.read_runs(path):
            if bench_rows.verdict(row) and _number(row.get("tcp_unsaturated_pct")) is None:
                found.setdefault(key(row), []).append(float(row["throughput"]))
    return found


def sim_errors(path: pathlib.Path) -> dict[tuple, float]:
    """{point and system: the simulator's signed relative error} (BBR rows: the simulator validates on those)."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {key({**row, "tag": pathlib.Path(row["source"]).stem, "tcp_congestion_control": "bbr"}):
                float(row["rel_error"]) for row in csv.DictReader(f)}


def summary(traced: Sequence[dict], plain: dict[tuple, list[float]], errors: dict[tuple, float]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for row in traced:
        if bench_rows.verdict(row) is not False and _number(row.get("tcp_unsaturated_pct")) is not None:
            groups.setdefault(key(row), []).append(row)
    head = ["point", "system", "runs", *(label for _, label in SHOWN), "unsaturated flows held by (%)",
            "full windows because (%)",
            "throughput traced / untraced",
            "simulator's error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in sorted(groups):
        rows = groups[k]
        tag, model, hosts, bandwidth, scale, congestion, system = k
        values = []
        for column, _ in SHOWN:
            m = _median(rows, column)
            values.append("-" if m is None else f"{m:.0f}" if column == "tcp_flows" else
                          f"{m:.2f}" if column in ("unsaturated_flows", "tcp_unsaturated_bw_share",
                                                   "tcp_cwnd_rtt_inflation") else f"{m:.1f}")
        mine = statistics.median(float(r["throughput"]) for r in rows)
        base = plain.get(k)
        cost = f"{mine:.2f} / {statistics.median(base):.2f} ({mine / statistics.median(base):.3f}×, n = " \
            f"{len(rows)} and {len(base)})" if base else f"{mine:.2f} / - (no untraced rows)"
        error = errors.get(k)
        why = held_by(rows, "tcp_cwnd_causes")
        lines.append(f"| {tag}: {model}, {hosts} hosts, {bandwidth} (scale {scale}), {congestion} | "
                     f"{LABEL.get(system, system)} | {len(rows)} | " + " | ".join(values) +
                     f" | {held_by(rows)} | {why} | {cost} | {'-' if error is None else f'{100 * error:+.1f}%'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", type=pathlib.Path, default=TRACES, help="folder of traced runs' CSVs")
    p.add_argument("--sweeps", type=pathlib.Path, default=RESULTS / "sweeps", help="the untraced rows")
    p.add_argument("--validation", type=pathlib.Path, default=RESULTS / "sim_validation.csv")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    traced = [r for path in sorted(args.traces.glob("*.csv")) if not path.stem.endswith("_iterations")
              for r in bench_rows.read_runs(path)]
    if not traced:
        LOG.error("no traced runs in %s: run a sweep with --tcp-trace --results-dir %s first", args.traces,
                  args.traces)
        return 2
    text = summary(traced, untraced(args.sweeps), sim_errors(args.validation))
    (args.traces / "summary.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
