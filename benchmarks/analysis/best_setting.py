"""Which setting of a tuning grid a system runs at in the comparisons: the fastest cell, unless it is not faster
than the system's default beyond the 95% CI of their ratio (a tie keeps the default).

Every cell's statistic is the one the comparison tables use: the samples of one iteration of all workers over
the median iteration time of all ranks, all timed iterations and all repeats, with its hierarchical bootstrap CI
(bootstrap.py: jobs, then iterations within each). A cell measured only as a reference (Horovod's autotuner,
whose converged values the comparison jobs are too short to reach) is estimated and shown, never chosen. The jobs
are the independent units (bootstrap.py), so a cell leaves the default only when it and the default each have
at least MIN_JOBS of them: with fewer, the iterations of one job would make the CI look narrower than it is.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap

MIN_JOBS = 3  # repeats per cell (and of the default) before a cell may replace the default


@dataclasses.dataclass(frozen=True)
class Cell:
    """One grid cell's measurement: its label (baseline_setting) and the jobs' (iterations, ranks) times."""

    label: str
    jobs: tuple[np.ndarray, ...]
    samples_per_iteration: float
    default: bool = False
    reference: bool = False


@dataclasses.dataclass(frozen=True)
class Choice:
    chosen: Cell
    estimates: dict[str, bootstrap.Estimate]  # label -> throughput with its CI, every cell with jobs
    vs_default: bootstrap.Estimate | None  # the fastest eligible cell over the default (None: it is the default)
    reason: str


def choose(cells: Sequence[Cell], resamples: int = bootstrap.RESAMPLES, seed: int = 0, min_jobs: int = MIN_JOBS
           ) -> Choice:
    """The cell to run the system at (see the module's rule). Cells without jobs are left out; ValueError when
    no eligible cell has any."""
    measured = [c for c in cells if c.jobs]
    estimates = {c.label: bootstrap.throughput(c.jobs, c.samples_per_iteration, resamples=resamples, seed=seed)
                 for c in measured}
    eligible = [c for c in measured if not c.reference]
    if not eligible:
        raise ValueError("no cell of the grid has an ok run")
    fastest = max(eligible, key=lambda c: estimates[c.label].value)
    default = next((c for c in eligible if c.default), None)
    if fastest.default:
        return Choice(fastest, estimates, None, "the default is the fastest cell")
    if default is None:
        return Choice(fastest, estimates, None, "the fastest cell; the default cell has no ok run to compare with")
    ratio = bootstrap.ratio(fastest.jobs, default.jobs, fastest.samples_per_iteration,
                            default.samples_per_iteration, resamples=resamples, seed=seed)
    if min(len(fastest.jobs), len(default.jobs)) < min_jobs:
        return Choice(default, estimates, ratio, f"too few repeats to tell: the fastest cell is {ratio.value:.3f}x "
                      f"the default over {len(fastest.jobs)} and {len(default.jobs)} jobs (at least {min_jobs} "
                      "each needed); the default is kept")
    if ratio.low > 1.0:
        return Choice(fastest, estimates, ratio, f"faster than the default: {ratio.value:.3f}x (95% CI "
                      f"{ratio.low:.3f}-{ratio.high:.3f})")
    return Choice(default, estimates, ratio, f"tie: the fastest cell is {ratio.value:.3f}x the default (95% CI "
                  f"{ratio.low:.3f}-{ratio.high:.3f} includes 1); the default is kept")


def job_times(rows: Sequence[dict], iterations_csv: pathlib.Path) -> list[np.ndarray]:
    """Each row's (iterations, ranks) timed iterations: every rank's from the iterations file beside the run CSV,
    or rank 0's from the row (iter_s) where the file lacks the run or its run_id is not unique."""
    ids = collections.Counter(r.get("run_id") for r in rows)
    per_run: dict[str, dict[int, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    if iterations_csv.exists():
        wanted = {r.get("run_id") for r in rows}
        with iterations_csv.open(newline="") as f:
            for it in csv.DictReader(f):
                if it["run_id"] in wanted:
                    per_run[it["run_id"]][int(it["rank"])].append(float(it["time_s"]))
    jobs = []
    for r in rows:
        ranks = per_run.get(r.get("run_id")) if ids[r.get("run_id")] == 1 else None
        if ranks:
            n = min(len(t) for t in ranks.values())
            jobs.append(np.array([ranks[k][:n] for k in sorted(ranks)], dtype=float).T)
        else:
            jobs.append(np.array(bench_rows.iteration_times(r), dtype=float)[:, None])
    return [j for j in jobs if j.size]


def entry(choice: Choice, env: Mapping[str, str], label: str, grid: Sequence[str], **about) -> dict:
    """best.json's record of one system at one point: the chosen setting, its throughput with the CI, why, every
    cell's estimate (the grid it came from) and `about` (date, commit, csv, repeats, ...)."""
    est = choice.estimates[choice.chosen.label]
    cells = {label: {"throughput": round(e.value, 3), "ci": [round(e.low, 3), round(e.high, 3)]}
             for label, e in choice.estimates.items()}
    return {"setting": dict(env), "label": label, "default": choice.chosen.default,
            "throughput": round(est.value, 3), "ci": [round(est.low, 3), round(est.high, 3)],
            "vs_default": None if choice.vs_default is None else
            [round(choice.vs_default.value, 4), round(choice.vs_default.low, 4), round(choice.vs_default.high, 4)],
            "reason": choice.reason, "grid": list(grid), "cells": cells, **about}


def merge_best(path: pathlib.Path, point: str, entries: Mapping[str, dict]) -> dict:
    """Writes `entries` ({system: entry}) for `point` into best.json (other points and systems kept), atomically;
    returns the whole file's content."""
    best = json.loads(path.read_text()) if path.exists() else {}
    best.setdefault(point, {}).update(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(best, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return best
