"""The dilation check's verdict: where the dilation sweep ran one P100-equivalent comparison at several
--gpu-scale values, did every system's P100-equivalent throughput, and p3kv's ratio to every baseline, stay
within GOAL across them?

Time dilation is faithful only when slowing every resource by one factor leaves the answer alone (Gupta et al.,
NSDI'06); a system whose throughput moves with the factor is measuring the machine. The spread of a series is its
largest value over its smallest, less one, on the point estimates (each with its bootstrap CI, ratio_table.py,
so a reader sees whether a spread is larger than the noise). Faithful runs only (points.shown).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks.analysis import bootstrap, ratio_table
from benchmarks.analysis.points import LABEL, POINT_KEY, cpu_bound, equivalent_gbps, key_value, number

GOAL = 0.05  # the most a throughput or a ratio may move across dilations (issue 26)
MIN_DILATIONS = 3
# The point's columns its dilation changes: the link's rate, and the CPU cap and timers dilated with it.
DILATED = ("bandwidth", "gpu_scale", "thread_cap_cores", "cfs_period_us", "tcp_rto_min_ms", "link_burst_bytes")


@dataclasses.dataclass(frozen=True)
class Series:
    """One quantity at each dilation: (gpu_scale, estimate), least dilated (largest scale) first."""

    name: str
    at: tuple[tuple[float, bootstrap.Estimate], ...]

    @property
    def spread(self) -> float:
        values = [e.value for _, e in self.at]
        return max(values) / min(values) - 1

    @property
    def passes(self) -> bool:
        return self.spread <= GOAL

    @property
    def common(self) -> tuple[float, float] | None:
        """The values inside every dilation's CI, or None where no one value is."""
        low, high = max(e.low for _, e in self.at), min(e.high for _, e in self.at)
        return (low, high) if low <= high else None


@dataclasses.dataclass(frozen=True)
class Check:
    model: str
    hosts: int
    equivalent_gbps: float
    unit: str
    runs: dict[str, list[int]]  # system: its runs at each dilation, in the series' order
    cpu_bound: dict[str, int]  # system: its runs flagged CPU-bound (fidelity.py rule 1), where any were
    systems: tuple[Series, ...]  # P100-equivalent throughput
    ratios: tuple[Series, ...]  # p3kv over each baseline

    @property
    def scales(self) -> list[float]:
        return [s for s, _ in self.systems[0].at]

    @property
    def failures(self) -> list[Series]:
        return [s for s in (*self.systems, *self.ratios) if not s.passes]


def checks(rows: Sequence[dict], resamples: int = bootstrap.RESAMPLES) -> list[Check]:
    """One Check per (model, hosts, P100-equivalent link) measured at MIN_DILATIONS or more --gpu-scale values by
    every system there, in the order the points first appear."""
    systems = (ratio_table.SUBJECT, *ratio_table.BASELINES)
    groups: dict[tuple, dict[float, dict[str, list[dict]]]] = {}
    for by_system in ratio_table.point_runs(rows, systems).values():
        row = next(iter(by_system.values()))[0]
        if equivalent_gbps(row) is None:
            continue
        scale = number(row.get("gpu_scale"), 1.0) or 1.0
        group = groups.setdefault(_comparison(row), {})
        if len(by_system.get(ratio_table.SUBJECT, ())) >= len(group.get(scale, {}).get(ratio_table.SUBJECT, ())):
            group[scale] = by_system  # two points at one dilation (another CFS period, say): the better measured
    found = []
    for (model, hosts, equivalent, *_), by_scale in groups.items():
        scales = sorted(by_scale, reverse=True)
        present = [s for s in systems if all(s in by_scale[x] for x in scales)]
        if len(scales) < MIN_DILATIONS or ratio_table.SUBJECT not in present:
            continue
        estimates = {s: tuple((x, _p100(by_scale[x][s], x, resamples)) for x in scales) for s in present}
        mine = {x: ratio_table.jobs(by_scale[x][ratio_table.SUBJECT]) for x in scales}
        ratios = []
        for b in present[1:]:
            at = []
            for x in scales:
                (ours, our_samples), (theirs, their_samples) = mine[x], ratio_table.jobs(by_scale[x][b])
                at.append((x, bootstrap.ratio(ours, theirs, our_samples, their_samples, resamples=resamples)))
            ratios.append(Series(f"{LABEL[ratio_table.SUBJECT]} / {LABEL.get(b, b)}", tuple(at)))
        bound = {s: n for s in present if (n := sum(cpu_bound(r) for x in scales for r in by_scale[x][s]))}
        found.append(Check(model, hosts, equivalent, str(by_scale[scales[0]][present[0]][0].get("unit", "images")),
                           {s: [len(by_scale[x][s]) for x in scales] for s in present}, bound,
                           tuple(Series(LABEL.get(s, s), estimates[s]) for s in present), tuple(ratios)))
    return found


def _comparison(row: dict) -> tuple:
    """What a dilation check holds fixed: the point's columns but those the dilation changes, its P100-equivalent
    link, and whether its threads were capped (capped and uncapped runs are different emulations)."""
    return (row["model"], int(row["hosts"]), equivalent_gbps(row), bool(number(row.get("thread_cap_cores"))),
            *(key_value(row, c) for c in POINT_KEY if c not in DILATED))


def _p100(runs: Sequence[dict], scale: float, resamples: int) -> bootstrap.Estimate:
    """A system's throughput at one dilation in P100-equivalent units (emulated rate over --gpu-scale)."""
    e = bootstrap.throughput(*ratio_table.jobs(runs), resamples=resamples)
    return bootstrap.Estimate(e.value / scale, e.low / scale, e.high / scale)


def _values(series: Series, digits: int) -> str:
    values = [f"{e.value:,.{digits}f}" for _, e in series.at]
    return f"{', '.join(values[:-1])} and {values[-1]}"


def sentences(found: Sequence[Check]) -> list[str]:
    """Per check, one paragraph for the README: the verdict, the conditions, each system's P100-equivalent
    throughput and each ratio at every dilation with its spread, and what failed."""
    lines = []
    for c in found:
        verdict = "passes" if not c.failures else "fails"
        scales = ", ".join(f"{s:g}" for s in c.scales)
        counts = sorted({n for per_scale in c.runs.values() for n in per_scale})
        runs = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        each = "; ".join(f"{s.name} {_values(s, 0)} ({s.spread:.1%})" for s in c.systems)
        versus = "; ".join(f"{r.name} {_values(r, 2)} ({r.spread:.1%}, " + (
            "one value inside every 95% CI)" if r.common else "no one value inside every 95% CI)") for r in c.ratios)
        text = (f"**The dilation check {verdict} at {c.model}'s {c.equivalent_gbps:g} Gbps-equivalent point** "
                f"({c.hosts} hosts, --gpu-scale {scales}, {runs} faithful runs per system at each; the goal: every "
                f"value below within {GOAL:.0%} across the dilations). P100-equivalent {c.unit}/s at each (spread): "
                f"{each}. Ratios: {versus}.")
        if c.failures:
            text += f" Beyond {GOAL:.0%}: {', '.join(s.name for s in c.failures)}."
        if c.cpu_bound:
            text += (" CPU-bound (a host ran out of its CPUs, fidelity.py rule 1): " + ", ".join(
                f"{LABEL.get(s, s)} in {n} of {sum(c.runs[s])} runs" for s, n in c.cpu_bound.items()) + ".")
        lines.append(text)
    return lines
