"""The PyTorch comparison's table (sweeps.py torch): per point, each torch system's throughput and its ratio to DDP,
with 95% confidence intervals from the hierarchical bootstrap over jobs, then iterations (bootstrap.py), the same
statistics as the demo's. Runs the fidelity monitors judged unfaithful are left out and counted, as in the points
tables (points.shown)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap
from benchmarks.analysis.points import equivalent_gbps, number, setting_identity
from benchmarks.analysis.ratio_table import job_array, point_runs
from benchmarks.analysis.superseded import outdated_by

BASELINE = "ddp"
SYSTEMS = ("ddp", "torch-p3kv", "torch-p3kv-server")  # suites/torch_systems.py's, in the table's order
LABEL = {"ddp": "DDP (gloo)", "torch-p3kv": "p3kv.torch, worker placement",
         "torch-p3kv-server": "p3kv.torch, server placement"}
POINT = ("model", "hosts", "bandwidth", "gpu_scale", "batch_size", "efficiency_factor", "host_cpus", "tag")


def _point_key(row: dict) -> tuple:
    return tuple(str(row.get(k, "")) for k in POINT)


def _runs(rows: Sequence[dict], include_smoke: bool) -> dict[tuple, dict[str, list[dict]]]:
    return point_runs(rows, SYSTEMS, key=_point_key, include_smoke=include_smoke)


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


def _point_rows(rows: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Every ok, non-smoke run of a torch system per point, faithful or not (for the counts)."""
    found: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kvstore") in SYSTEMS and r.get("status") == "ok" and str(r.get("smoke")) != "True":
            found.setdefault(_point_key(r), []).append(r)
    return found


def _left_out(runs: Sequence[dict]) -> str:
    """Why a system has no faithful run at a point: the count and the most throttled host's share."""
    if not runs:
        return "not run yet"
    throttled = max(number(r.get("throttled_max_pct")) for r in runs)
    why = f": a host's CPU throttled up to {throttled:.0f}% of the timed window" if throttled > 0 else ""
    return f"no faithful run ({len(runs)} left out{why})"


def tuning_sentences(best: dict) -> list[str]:
    """One sentence per tuning grid DDP ran (results/tuning/best.json, suites/tune.py): each cell's throughput
    against the chosen one, and why it was chosen."""
    found = []
    for comparison, entries in best.items():
        entry = entries.get(BASELINE) if isinstance(entries, dict) else None
        if not entry or entry.get("smoke"):
            continue
        chosen = entry["throughput"]
        others = [f"{cell} {100 * (1 - cell_result['throughput'] / chosen):.1f}% slower"
                  for cell, cell_result in entry.get("cells", {}).items() if cell_result["throughput"] < chosen]
        found.append(f"DDP's tuning grid at {entry.get('comparison', comparison)} ({entry['repeats']} repeats per "
                     f"cell, `{entry['csv']}`): {entry['label']}; {', '.join(others) or 'no cell slower'} "
                     f"({entry['reason']}).")
    return found


def grid_choices(best: Mapping, tuning: pathlib.Path) -> dict[tuple, str]:
    """DDP's chosen label per point of the table (_grid_key), from best.json's entries (suites/tune.py). The point
    is read from the newest DDP row of the entry's grid CSV (the grid's own conditions), so nothing is rebuilt from
    the entry's key; smoke entries and entries whose CSV is missing are skipped."""
    found: dict[tuple, str] = {}
    for entries in best.values():
        entry = entries.get(BASELINE) if isinstance(entries, Mapping) else None
        path = tuning / str(entry.get("csv", "")) if entry else None
        if not entry or entry.get("smoke") or path is None or not path.is_file():
            continue
        rows = [r for r in bench_rows.read_runs(path) if r.get("kvstore") == BASELINE]
        if rows:
            found[_grid_key(max(rows, key=lambda r: str(r.get("timestamp", ""))))] = entry["label"]
    return found


def _grid_key(row: dict) -> tuple:
    """A point as its grid and the sweep both write it: the table's point less the tag (tune's rows say "tune")."""
    return tuple(str(row.get(k, "")) for k in POINT if k != "tag")


def setting_cell(runs: Sequence[dict], chosen: str | None = None) -> str:
    """DDP's setting at a point, from its runs' labels and `chosen`, the label its tuning grid chose (grid_choices;
    None: no grid ran there). Runs from before the grid say "default (untuned)"; where the grid chose the setting
    they ran, the cell gives the grid's label once and how many runs ran it before the grid. Where it chose
    another, the runs' labels stay and the cell names the grid's choice, which `sweeps torch` has not run yet."""
    labels = [str(r.get("baseline_setting") or "default") for r in runs]
    if chosen is None:  # no grid known: a tuned label on some runs (the sweep applied it) stands for the grid's
        tuned = {label for label in labels if "(tuned" in label}
        chosen = tuned.pop() if len(tuned) == 1 else None
    if not labels:
        return "-"
    if chosen is not None and {setting_identity(label) for label in labels} == {setting_identity(chosen)}:
        before = sum(other != chosen for other in labels)
        return chosen + (f"; {before} of {len(labels)} runs ran it before the grid" if before else "")
    ran = ", ".join(sorted(set(labels)))
    return ran + (f"; the grid has since chosen {chosen}" if chosen is not None and chosen not in labels else "")


def _outdated_note(runs: Sequence[dict]) -> str:
    """How many of a point's shown runs predate a change to the emulation (superseded.outdated_by), and which:
    `sweeps torch --resume` reruns them and `superseded --move` then retires them."""
    found: dict[str, int] = {}
    for r in runs:
        what = outdated_by(r)
        if what:
            found[what] = found.get(what, 0) + 1
    return "".join(f"; {n} from before {what}" for what, n in sorted(found.items()))


def headline(rows: Sequence[dict], resamples: int = bootstrap.RESAMPLES, chosen: Mapping[tuple, str] | None = None
             ) -> str:
    """The README's PyTorch lines: per point of the torch sweep, DDP's P100-equivalent throughput, each p3kv.torch
    placement's ratio to it with its 95% CI, DDP's setting (with `chosen`, grid_choices' labels, where its grid
    ran) and how many runs were faithful. "" without torch rows."""
    every = _point_rows(rows)
    if not every:
        return ""
    shown_runs = _runs(rows, include_smoke=False)
    lines = ["| model | P100-equivalent link | DDP (gloo) | p3kv.torch, worker placement | p3kv.torch, server "
             "placement | DDP's setting | faithful runs |", "|---|---|---|---|---|---|---|"]
    for key, runs in sorted(every.items(), key=lambda item: (item[1][0]["model"], equivalent_gbps(item[1][0]) or 0)):
        first = runs[0]
        by_system = shown_runs.get(key, {})
        scale = number(first.get("gpu_scale"), 1.0) or 1.0
        base_jobs, base_samples = _jobs(by_system, BASELINE)
        cells = []
        if base_jobs:
            rate = bootstrap.throughput(base_jobs, base_samples, resamples=resamples)
            cells.append(f"{rate.value / scale:.1f} {first.get('unit', 'images')}/s")
        else:
            cells.append(_left_out([r for r in runs if r["kvstore"] == BASELINE]))
        for system in SYSTEMS[1:]:
            mine, samples = _jobs(by_system, system)
            if mine and base_jobs:
                r = bootstrap.ratio(mine, base_jobs, samples, base_samples, resamples=resamples)
                cells.append(f"{r.value:.2f}× ({r.low:.2f}–{r.high:.2f})")
            elif mine:
                cells.append("- (no faithful DDP run to compare with)")
            else:
                cells.append(_left_out([r for r in runs if r["kvstore"] == system]))
        shown = [r for v in by_system.values() for r in v]
        equivalent = equivalent_gbps(first)
        setting = setting_cell(by_system.get(BASELINE, []), (chosen or {}).get(_grid_key(first)))
        lines.append(f"| {first['model']} | {f'{equivalent:g} Gbps' if equivalent else 'uncapped'} | "
                     f"{' | '.join(cells)} | {setting} | "
                     f"{len(shown)} of {len(runs)}{_outdated_note(shown)} |")
    hosts_of: dict[str, set[str]] = {}  # per model: its hosts (VGG-19's default CPUs per host differ)
    for runs in every.values():
        for r in runs:
            hosts_of.setdefault(r["model"], set()).add(
                f"{r['hosts']} emulated hosts of {number(r.get('host_cpus')):g} CPUs each")
    conditions = ", ".join(f"{model} on {' or '.join(sorted(hosts))}" for model, hosts in sorted(hosts_of.items()))
    return ("\n".join(lines) + "\n\nRatios: p3kv.torch's throughput over DDP's, with the 95% CI of the hierarchical "
            "bootstrap over jobs, then iterations (benchmarks/analysis/bootstrap.py), from "
            f"`benchmarks/results/sweeps/torch.csv` ({conditions}, CPU, compute and links dilated alike; runs the "
            "fidelity monitors failed are left out and counted; runs from before a change to the emulation are "
            "counted in the last column, with the change).")
