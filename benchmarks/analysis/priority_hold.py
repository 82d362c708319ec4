"""What the sender's priority hold (P3_PRIORITY_HOLD_MS, cpp/src/sender.h) changes at a link-bound point: p3kv
with its default hold and with none (0, how p3kv sent before the hold), beside a baseline, run one after another
in one session on the idle machine into results/priority_hold/rows.csv:

    P3_PRIORITY_HOLD_MS=0 python -m benchmarks.suites.cluster_bench --kvstore torch-p3kv ... --csv <that file>
    python -m benchmarks.suites.cluster_bench --kvstore torch-p3kv ddp ... --csv <that file>
    python -m benchmarks.analysis.priority_hold    # writes results/priority_hold/summary.md

Per point and variant (system, and p3kv's hold from the rows' priority_hold_ms): faithful runs, throughput with
its 95% CI (bootstrap.py: jobs, then iterations), the spread of one job's iterations (coefficient of variation,
median over jobs), and the ratio of each variant to the no-hold p3kv run of the same system, with its CI.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap
from benchmarks.analysis.points import LABEL, number, shown
from benchmarks.analysis.ratio_table import job_array
from benchmarks.paths import RESULTS

FOLDER = RESULTS / "priority_hold"
POINT = ("model", "hosts", "bandwidth", "p100_equiv_gbps", "gpu_scale", "host_cpus")


def variant(row: dict) -> str:
    """The system, and for p3kv its hold: 'torch-p3kv, hold 1000 ms'."""
    hold = row.get("priority_hold_ms", "")
    return row["kvstore"] if hold in ("", None) else f"{row['kvstore']}, hold {float(hold):g} ms"


def _groups(rows: Sequence[dict]) -> dict[tuple, dict[str, list[dict]]]:
    found: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r.get("status") == "ok" and shown(r) and bench_rows.rank_iterations(r):
            found.setdefault(tuple(str(r.get(k, "")) for k in POINT), {}).setdefault(variant(r), []).append(r)
    return found


def _jobs(runs: Sequence[dict]) -> tuple[list[np.ndarray], float]:
    return [job_array(r) for r in runs], int(runs[0]["workers"]) * number(runs[0]["samples_per_batch"])


def _cv(run: dict) -> float:
    iters = job_array(run)[:, 0]
    return float(np.std(iters) / np.mean(iters))


def _ci(e: bootstrap.Estimate, digits: int) -> str:
    return f"{e.value:.{digits}f} ({e.low:.{digits}f}-{e.high:.{digits}f})"


def table(rows: Sequence[dict], resamples: int = bootstrap.RESAMPLES) -> str:
    """Markdown, one line per point and variant; "" when no row qualifies."""
    lines = []
    for point, by_variant in _groups(rows).items():
        for name, runs in sorted(by_variant.items()):
            jobs, samples = _jobs(runs)
            tput = bootstrap.throughput(jobs, samples, resamples=resamples)
            unheld = f"{runs[0]['kvstore']}, hold 0 ms"
            versus = "-"
            if unheld in by_variant and name != unheld:
                their, their_samples = _jobs(by_variant[unheld])
                versus = _ci(bootstrap.ratio(jobs, their, samples, their_samples, resamples=resamples), 2)
            bound = statistics.median(number(r["pct_of_bound"]) for r in runs)
            model, hosts, bandwidth, gbps = point[:4]
            lines.append(f"| {LABEL.get(model, model)} | {hosts} | {bandwidth} ({float(gbps):g} Gbps) | {name} | "
                         f"{len(runs)} | {_ci(tput, 1)} {runs[0]['unit']}/s | "
                         f"{statistics.median(_cv(r) for r in runs):.3f} | {bound:.0f}% | {versus} |")
    if not lines:
        return ""
    left_out = sum(1 for r in rows if r.get("status") == "ok" and not shown(r))
    head = ("| model | hosts | link (P100-equiv.) | system | faithful runs | throughput (95% CI) | "
            "iteration CV | % of bound | vs hold 0 (95% CI) |\n|---|---|---|---|---|---|---|---|---|")
    note = f"\n\n{left_out} run(s) the fidelity monitors judged unfaithful are left out." if left_out else ""
    return head + "\n" + "\n".join(lines) + note + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    rows = bench_rows.read_runs(FOLDER / "rows.csv")
    text = table(rows)
    (FOLDER / "summary.md").write_text("# p3kv's priority hold at a link-bound point\n\n"
                                       "Written by `python -m benchmarks.analysis.priority_hold` from rows.csv "
                                       "(every run's conditions are in its row).\n\n" + text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
