"""p3kv's ratio to each baseline at every point of a sweep, with 95% confidence intervals from the hierarchical
bootstrap over jobs, then iterations (bootstrap.py), and whether a ratio stays the same across dilations.

The dilation sweep runs one P100-equivalent comparison at several --gpu-scale values. A faithful emulation gives
the same ratio at each; this table is where that is checked, so every ratio carries its CI. Runs the fidelity
monitors judged unfaithful, smoke runs and runs without iterations are left out (points.shown)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.analysis import bench_rows, bootstrap
from benchmarks.analysis.points import LABEL, POINT_KEY, equivalent_gbps, key_value, number, shown

SUBJECT = "p3"
BASELINES = ("dist_sync", "mxnet-p3", "horovod")


def job_array(row: dict) -> np.ndarray:
    """A run's timed iterations as (iterations, ranks) seconds, cut to the shortest rank."""
    ranks = bench_rows.rank_iterations(row)
    n = min(len(r) for r in ranks)
    return np.array([r[:n] for r in ranks], dtype=float).T


def point_runs(rows: Sequence[dict], systems: Sequence[str], key: Callable[[dict], tuple] | None = None,
               include_smoke: bool = False) -> dict[tuple, dict[str, list[dict]]]:
    """{point key: {system: its shown, ok runs with iterations}} for `systems`, in the order the points first
    appear. `key`: a row's point (default: points.POINT_KEY's columns); smoke runs only with `include_smoke`."""
    def default_key(r: dict) -> tuple:
        return tuple(key_value(r, c) for c in POINT_KEY)

    points: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if (r.get("kvstore") in systems and r.get("status") == "ok" and shown(r)
                and (include_smoke or str(r.get("smoke")) != "True") and bench_rows.rank_iterations(r)):
            points.setdefault((key or default_key)(r), {}).setdefault(r["kvstore"], []).append(r)
    return points


def jobs(runs: Sequence[dict]) -> tuple[list[np.ndarray], float]:
    """The jobs of one system at one point and the samples of one iteration of all its workers."""
    return [job_array(r) for r in runs], int(runs[0]["workers"]) * number(runs[0]["samples_per_batch"])


def ratios(rows: Sequence[dict], subject: str = SUBJECT, baselines: Sequence[str] = BASELINES,
           resamples: int = bootstrap.RESAMPLES) -> list[dict]:
    """Per point where `subject` ran: its first row, its throughput and runs, and {baseline: Estimate of
    subject / baseline} for every baseline that ran there too."""
    found = []
    for by_system in point_runs(rows, (subject, *baselines)).values():
        if subject not in by_system:
            continue
        mine, samples = jobs(by_system[subject])
        versus = {}
        for b in baselines:
            if b in by_system:
                theirs, their_samples = jobs(by_system[b])
                versus[b] = bootstrap.ratio(mine, theirs, samples, their_samples, resamples=resamples)
        found.append({"row": by_system[subject][0], "runs": {s: len(r) for s, r in by_system.items()},
                      "throughput": bootstrap.throughput(mine, samples, resamples=resamples), "versus": versus})
    return found


def _ci(e: bootstrap.Estimate, digits: int = 2) -> str:
    return f"{e.value:.{digits}f} ({e.low:.{digits}f}-{e.high:.{digits}f})"


def table(found: Sequence[dict], subject: str = SUBJECT, baselines: Sequence[str] = BASELINES) -> str:
    """Markdown: one line per point, the subject's P100-equivalent throughput (measured / --gpu-scale) and its
    ratio to each baseline, each with its 95% CI; "" when `found` is empty."""
    if not found:
        return ""
    names = [LABEL.get(b, b) for b in baselines]
    lines = ["| model | hosts | P100-equiv. Gbit/s | --gpu-scale | runs per system | "
             f"{LABEL.get(subject, subject)}, P100-equiv. (95% CI) | " + " | ".join(f"vs {n} (95% CI)" for n in names)
             + " |", "|---|---|---|---|---|---|" + "---|" * len(baselines)]
    for f in sorted(found, key=lambda f: (f["row"]["model"], -number(f["row"]["gpu_scale"], 1.0))):
        row = f["row"]
        scale = number(row.get("gpu_scale"), 1.0) or 1.0
        equivalent = equivalent_gbps(row)
        t = f["throughput"]
        runs = sorted(set(f["runs"].values()))
        cells = [_ci(f["versus"][b]) if b in f["versus"] else "-" for b in baselines]
        lines.append(f"| {row['model']} | {row['hosts']} | {f'{equivalent:g}' if equivalent else 'uncapped'} | "
                     f"{scale:g} | {'-'.join(map(str, runs))} | "
                     f"{t.value / scale:.1f} ({t.low / scale:.1f}-{t.high / scale:.1f}) {row.get('unit', 'images')}/s"
                     f" | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def invariance_sentences(found: Sequence[dict], subject: str = SUBJECT,
                         baselines: Sequence[str] = BASELINES) -> list[str]:
    """Per model, P100-equivalent bandwidth and baseline measured at two or more --gpu-scale values: the ratios,
    and whether one value lies inside every CI (the dilation did not change the comparison) or not."""
    groups: dict[tuple, list[dict]] = {}
    for f in found:
        equivalent = equivalent_gbps(f["row"])
        groups.setdefault((f["row"]["model"], f["row"]["hosts"], f"{equivalent:g}" if equivalent else "uncapped"),
                          []).append(f)
    lines = []
    for (model, hosts, equivalent), group in groups.items():
        group = sorted(group, key=lambda f: -number(f["row"]["gpu_scale"], 1.0))
        for b in baselines:
            at = [(number(f["row"]["gpu_scale"], 1.0), f["versus"][b]) for f in group if b in f["versus"]]
            if len(at) < 2:
                continue
            low, high = max(e.low for _, e in at), min(e.high for _, e in at)
            spread = ", ".join(f"{e.value:.2f} at {s:g}" for s, e in at)
            same = (f"one value ({low:.2f}-{high:.2f}) lies inside every CI: the dilation did not change it"
                    if low <= high else "no one value lies inside every CI: the dilation changed it")
            lines.append(f"- {model}, {hosts} hosts, {equivalent} Gbit/s P100-equivalent: "
                         f"{LABEL.get(subject, subject)} / {LABEL.get(b, b)} {spread}; {same}.")
    return lines
