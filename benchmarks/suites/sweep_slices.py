"""A long sweep in slices that each fit one idle window (`sweeps.py NAME --slice K/N`, `sweeps.py estimate
--window HOURS`).

A slice is a run of whole comparisons: every system and every repeat of a point stay in one slice, so each
comparison is still measured in one sitting and interleaved as before. The comparisons keep the sweep's order
and are cut into N contiguous parts of about equal estimated time (each comparison goes to the part its
midpoint falls in). Slices are cut from the sweep's full list, not from what is left, and by an estimate with
fixed factors (sweeps.SLICE_FACTORS), not the measured ones that change as rows accumulate, so K/N names the same
runs in every invocation (with the same options); with --resume a slice runs only what its CSV lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def parse(text: str) -> tuple[int, int]:
    """"K/N" -> (K, N), 1 <= K <= N; ValueError naming the problem."""
    k, sep, n = text.partition("/")
    if not sep or not k.isdigit() or not n.isdigit() or not 1 <= int(k) <= int(n):
        raise ValueError(f"--slice {text!r}: write K/N with 1 <= K <= N (e.g. 2/5: the second of five slices)")
    return int(k), int(n)


def by_comparison(points: Sequence) -> dict[tuple, list]:
    """The points of each comparison group (Point.group()), groups in first-seen order."""
    groups: dict[tuple, list] = {}
    for p in points:
        groups.setdefault(p.group(), []).append(p)
    return groups


def cut(costs: Sequence[float], n: int) -> list[int]:
    """The slice (0..n-1) of each item, in order: contiguous parts of about equal cost, each item in the part its
    midpoint falls in."""
    total = sum(costs) or 1.0
    out, done = [], 0.0
    for c in costs:
        out.append(min(n - 1, int((done + c / 2) / total * n)))
        done += c
    return out


def parts(points: Sequence, n: int, weight: Callable[[Sequence], float]) -> list[list[tuple]]:
    """The comparison groups of each of the N slices (some may be empty when there are fewer groups than N),
    cut by `weight` (a fixed estimate: the cut must not move as measured rows change the sweeps' factors)."""
    cost = {g: weight(members) for g, members in by_comparison(points).items()}
    out: list[list[tuple]] = [[] for _ in range(n)]
    for g, k in zip(cost, cut(list(cost.values()), n)):
        out[k].append(g)
    return out


def select(points: Sequence, k: int, n: int, weight: Callable[[Sequence], float]) -> list:
    """The points of slice K of N, in their original (interleaved) order."""
    mine = set(parts(points, n, weight)[k - 1])
    return [p for p in points if p.group() in mine]


def slices_for(points: Sequence, window_s: float, seconds: Callable[[Sequence], float],
               weight: Callable[[Sequence], float] | None = None) -> tuple[int, float]:
    """(the fewest slices, cut by `weight` as `select` cuts them, whose every one takes at most `window_s` by
    `seconds`; the longest slice's seconds). When one comparison alone exceeds the window: the fewest slices none
    of which is longer than that comparison."""
    groups = by_comparison(points)
    if not groups:
        return 0, 0.0
    weight = weight or seconds
    cost = {g: seconds(members) for g, members in groups.items()}
    target = max(window_s, *cost.values())
    n = min(len(groups), max(1, math.ceil(sum(cost.values()) / target)))
    while True:
        longest = max(sum(cost[g] for g in part) for part in parts(points, n, weight))
        if longest <= target or n >= len(groups):
            return n, longest
        n += 1
