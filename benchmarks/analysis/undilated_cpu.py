"""How much of each emulated host's CPU does not scale with the dilation (issue 26: every resource dilated alike).

Under a faithful dilation a host's work per emulated second is the same at every --gpu-scale, so its CPU in real
cores is proportional to the scale: cpu = k * gpu_scale. A cost paid per real second instead (a timer that is not
dilated, a polling loop, the emulation's own helpers) adds a constant: cpu = k * gpu_scale + c0. A least-squares
line through every run's mean host CPU against its scale (numpy.polyfit) estimates c0, per system and host size;
at a scale s the quota is host_cpus * s cores, so c0 takes c0 / (host_cpus * s) of it there, a share that grows as
the dilation deepens. Runs whose hosts were throttled used less CPU than they asked for, so c0 is a lower bound
where they are many (the counts are given)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.analysis.points import LABEL, number
from benchmarks.analysis.superseded import outdated_by


def _host_cores(row: dict) -> float | None:
    """A run's mean CPU per host in real cores (cpu_host_pct is per host, in % of one core)."""
    shares = [number(x) for x in str(row.get("cpu_host_pct") or "").split(";") if x.strip()]
    return sum(shares) / len(shares) / 100 if shares else None


def fits(rows: Sequence[dict]) -> list[dict]:
    """Per (model, system, host_cpus, what its rows predate: superseded.outdated_by, "" if current) measured at two
    or more scales: the line's slope (cores per unit of scale), its intercept c0 (cores), the scales, the run count
    and how many of the runs the monitors failed."""
    groups: dict[tuple, list[tuple[float, float, bool]]] = {}
    for r in rows:
        cores, scale, host_cpus = _host_cores(r), number(r.get("gpu_scale")), number(r.get("host_cpus"))
        if r.get("status") != "ok" or str(r.get("smoke")) == "True" or not cores or not scale or not host_cpus:
            continue
        failed = str(r.get("faithful")).strip() == "False"
        groups.setdefault((r["model"], r["kvstore"], host_cpus, outdated_by(r)), []).append((scale, cores, failed))
    found = []
    for (model, system, host_cpus, old), runs in groups.items():
        scales = sorted({s for s, _, _ in runs})
        if len(scales) < 2:
            continue
        slope, intercept = np.polyfit([s for s, _, _ in runs], [c for _, c, _ in runs], 1)
        found.append({"model": model, "system": system, "host_cpus": host_cpus, "slope": float(slope),
                      "c0": float(intercept), "scales": scales, "runs": len(runs),
                      "unfaithful": sum(f for _, _, f in runs), "outdated": old})
    return found


def sentences(found: Sequence[dict]) -> list[str]:
    """One line per fit: c0 in % of a core and as a share of the quota at the deepest and the least dilation."""
    lines = []
    for f in found:
        low, high = f["scales"][0], f["scales"][-1]
        share = [100 * f["c0"] / (f["host_cpus"] * s) for s in (low, high)]
        name = LABEL.get(f["system"], f["system"]) + (f" (runs from before {f['outdated']})" if f["outdated"] else "")
        lines.append(f"  - {f['model']}, {name}: {100 * f['c0']:.1f}% of a core per "
                     f"host does not scale with the dilation ({share[0]:.0f}% of the quota at --gpu-scale {low:g}, "
                     f"{share[1]:.0f}% at {high:g}; {f['runs']} runs, {f['unfaithful']} of them failed by the "
                     "monitors).")
    if lines:
        lines.insert(0, "- CPU per host that does not scale with the dilation (benchmarks/analysis/undilated_cpu.py: "
                        "a least-squares line through each run's mean host CPU against --gpu-scale, its value at 0):")
    return lines
