"""The sentences under a sweep's table: which system leads each comparison and whether the interquartile ranges
settle it, the slice-size optimum, the least dilation 2 cores allow, points near the CPU limit, link utilisation."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from benchmarks.analysis.points import LABEL, fmt, link_label, number, setting


def verdicts(points: Sequence[dict]) -> list[str]:
    """One sentence per comparison: where p3kv stands against every other system, from the medians, and
    whether the interquartile ranges overlap (then the order is not established)."""
    sentences = []
    by_key: dict[tuple, list[dict]] = {}
    for p in points:
        by_key.setdefault(p["key"], []).append(p)
    for members in by_key.values():
        mine = next((p for p in members if p["kvstore"] == "p3"), None)
        if mine is None:
            continue
        parts = []
        for other in members:
            if other is mine:
                continue
            ratio = mine["throughput"] / other["throughput"]
            overlap = mine["low"] <= other["high"] and other["low"] <= mine["high"] and mine["n"] > 1
            word = "ahead of" if ratio > 1 else "behind"
            parts.append(f"{word} {LABEL.get(other['kvstore'], other['kvstore'])} ({ratio:.2f}×"
                         f"{', IQRs overlap' if overlap else ''})")
        if parts:
            variant = f", {setting(mine)}" if setting(mine) else ""
            sentences.append(f"- {mine['model']}, {mine['hosts']} hosts, {link_label(mine)}{variant}, optimizer "
                             f"{mine['optimizer']}: "
                             f"p3kv {fmt(mine['throughput'])} {mine['unit']}/s, {fmt(mine['pct_of_bound'], 0)}% of "
                             f"the bound, " + ", ".join(parts) + ".")
    return sentences


def slice_sentences(points: Sequence[dict]) -> list[str]:
    """The fastest slice size by median, and the sizes whose IQR overlaps its (not told apart from it)."""
    sized = [p for p in points if p.get("slice_size") not in (None, "", "default")]
    if not sized:
        return []
    best = max(sized, key=lambda p: p["throughput"])
    ties = [p for p in sized if p is not best and p["low"] <= best["high"] and best["low"] <= p["high"]]
    line = (f"- Fastest slice size by median: {int(number(best['slice_size'])):,} ({fmt(best['throughput'])} "
            f"{best['unit']}/s)")
    if ties:
        line += "; IQRs overlap with " + ", ".join(f"{int(number(p['slice_size'])):,} ({fmt(p['throughput'])})"
                                                   for p in sorted(ties, key=lambda p: int(number(p["slice_size"]))))
    return [line + "."]


SATURATED = 0.9  # of the machine's cores: above it, a point measures CPU contention, not the links


MIN_REPEATS = 3  # the reviewed settings: at least this many repeats per point


def dilation_sentences(points: Sequence[dict], cpus: int) -> list[str]:
    """Per --gpu-scale, the most CPU any system's hosts used together; the least dilation (largest scale) at
    which none came near the machine's cores."""
    scales = sorted({p["gpu_scale"] for p in points if p["cpu_total_pct"] is not None})
    if not scales:
        return []
    peak = {s: max(p["cpu_total_pct"] for p in points if p["gpu_scale"] == s and p["cpu_total_pct"] is not None)
            for s in scales}
    free = [s for s in scales if peak[s] < SATURATED * 100 * cpus]
    lines = ["- CPU of all hosts together (the most of any system) per --gpu-scale: " +
             ", ".join(f"{s:g}: {peak[s]:.0f}%" for s in scales) + f" of {100 * cpus}%."]
    if free:
        lines.append(f"- Least dilation with the CPUs below {SATURATED:.0%} of {cpus} cores: --gpu-scale "
                     f"{max(free):g}.")
    else:
        lines.append(f"- The CPUs were above {SATURATED:.0%} of {cpus} cores at every scale measured.")
    return lines


def saturation_sentences(points: Sequence[dict], cpus: int) -> list[str]:
    """The points at which a system's hosts together used more than SATURATED of the machine's cores, and which
    systems: there the cores, not the links, may limit them, and their numbers understate them."""
    limit = SATURATED * 100 * cpus
    hot: dict[tuple, list[str]] = {}
    for p in points:
        if p["cpu_total_pct"] is not None and p["cpu_total_pct"] > limit:
            key = (p["model"], p["hosts"], link_label(p), setting(p))
            hot.setdefault(key, []).append(f"{LABEL.get(p['kvstore'], p['kvstore'])} {p['cpu_total_pct']:.0f}%")
    if not hot:
        return []
    where = "; ".join(f"{m}, {h} hosts, {link}{f', {extra}' if extra else ''} ({', '.join(systems)})"
                      for (m, h, link, extra), systems in hot.items())
    return [f"- Near the CPU limit (the hosts together above {SATURATED:.0%} of {cpus} cores): {where}. There the "
            "cores, not the links, may limit the systems named, and their numbers understate them."]


def utilisation_sentences(rows: Sequence[dict], folder: pathlib.Path) -> list[str]:
    """Per system, how busy the links were during the timed iterations (benchmarks/analysis/link_utilisation.py)."""
    from benchmarks.analysis import link_utilisation

    found = link_utilisation.summary(rows, folder)
    if not found:
        return []
    parts = [f"{LABEL.get(kv, kv)} {100 * s['busy']:.0f}% busy, idle in {100 * s['idle']:.0f}% of the samples"
             for kv, s in sorted(found.items(), key=lambda item: -item[1]["busy"])]
    n = sorted({s["n"] for s in found.values()})
    return [f"- Links during the timed iterations (mean rate over the link rate, both directions, every host; idle: "
            f"10-ms samples below {link_utilisation.IDLE:.0%} of it; median of {', '.join(map(str, n))} runs): "
            + "; ".join(parts) + "."]
