"""The PyTorch comparison's table (sweeps.py torch): per point, each torch system's throughput and its ratio to DDP,
with 95% confidence intervals from the hierarchical bootstrap over jobs, then iterations (bootstrap.py), the same
statistics as the demo's. Runs the fidelity monitors judged unfaithful are left out and counted, as in the points
tables (points.shown)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.analysis import bootstrap
from benchmarks.analysis.points import equivalent_gbps, number
from benchmarks.analysis.ratio_table import job_array, point_runs

BASELINE = "ddp"
SYSTEMS = ("ddp", "torch-p3kv", "torch-p3kv-server")  # suites/torch_systems.py's, in the table's order
LABEL = {"ddp": "DDP (gloo)", "torch-p3kv": "p3kv.torch, worker placement",
         "torch-p3kv-server": "p3kv.torch, server placement"}
POINT = ("model", "hosts", "bandwidth", "gpu_scale", "batch_size", "efficiency_factor", "host_cpus", "tag")


def _runs(rows: Sequence[dict], include_smoke: bool) -> dict[tuple, dict[str, list[dict]]]:
    return point_runs(rows, SYSTEMS, key=lambda r: tuple(str(r.get(k, "")) for k in POINT), include_smoke=include_smoke)


def _jobs(by_system: dict[str, list[dict]], system: str) -> tuple[list[np.ndarray], float]:
    """`system`'s jobs at a point and the samples of one iteration of all its workers."""
    runs = by_system.get(system, [])
    per_iteration = int(runs[0]["workers"]) * number(runs[0]["samples_per_batch"]) if runs else 0.0
    return [job_array(r) for r in runs], per_iteration


def table(rows: Sequence[dict], include_smoke: bool = False, resamples: int = bootstrap.RESAMPLES) -> str:
    """Markdown: one line per point and system, P100-equivalent throughput (measured / gpu_scale) with its CI, and
    the ratio to DDP with its CI, after a blank line; "" when no row is a torch system's."""
    points = _runs(rows, include_smoke)
    if not points:
        return ""
    lines = ["", "| model | hosts | P100-equiv. Gbit/s | system | runs | throughput (95% CI), P100-equivalent | "
             f"vs {LABEL[BASELINE]} (95% CI) | update placement |", "|---|---|---|---|---|---|---|---|"]
    for by_system in points.values():
        first = next(iter(by_system.values()))[0]
        scale = number(first.get("gpu_scale"), 1.0) or 1.0
        base_jobs, base_samples = _jobs(by_system, BASELINE)
        for system in SYSTEMS:
            mine, samples = _jobs(by_system, system)
            if not mine:
                continue
            rate = bootstrap.throughput(mine, samples, resamples=resamples)
            versus = "-"
            if system != BASELINE and base_jobs:
                r = bootstrap.ratio(mine, base_jobs, samples, base_samples, resamples=resamples)
                versus = f"{r.value:.2f} ({r.low:.2f}-{r.high:.2f})"
            equivalent = equivalent_gbps(first)
            lines.append(f"| {first['model']} | {first['hosts']} | {f'{equivalent:g}' if equivalent else 'uncapped'} | "
                         f"{LABEL[system]} | {len(mine)} | "
                         f"{rate.value / scale:.1f} ({rate.low / scale:.1f}-{rate.high / scale:.1f}) "
                         f"{first.get('unit', 'images')}/s | {versus} | "
                         f"{by_system[system][0].get('update_placement', '')} |")
    return "\n".join(lines) + "\n"
