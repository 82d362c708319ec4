"""A long sweep in slices that each fit one idle window (`sweeps.py NAME --slice K/N`, `sweeps.py estimate
--window HOURS`).

A slice is a run of whole rounds: one round of a comparison is every system of a point once, in its shuffled order
(cluster_bench.interleave), and is never split, so every ratio compares runs made side by side. The rounds are
taken comparison by comparison (every round of the first point, then of the next, ...) and cut into N contiguous
parts of about equal estimated time (each round goes to the part its midpoint falls in). So a comparison stays in
one slice, interleaved as in a full run, unless a part boundary falls inside it (at most N - 1 do, between two of
its rounds), and a comparison longer than the window (an 8-host point, a slow VGG-19 point) is spread over
consecutive slices round by round instead of making one slice too long for any window. Slices are cut from the
sweep's full list, not from what is left, and by an estimate with fixed factors (sweeps.SLICE_FACTORS), not the
measured ones that change as rows accumulate, so K/N names the same runs in every invocation (with the same
options); with --resume a slice runs only what its CSV lacks.
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


def by_round(points: Sequence) -> dict[tuple, list]:
    """The points of each round of each comparison, keyed (group, repeat): comparison by comparison in first-seen
    order, each comparison's rounds in order (the unit a slice never splits)."""
    rounds: dict[tuple, list] = {}
    for group, members in by_comparison(points).items():
        for p in members:
            rounds.setdefault((group, p.repeat), []).append(p)
    return rounds


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
    """The rounds, (group, repeat), of each of the N slices (some may be empty when there are fewer rounds than
    N), cut by `weight` (a fixed estimate: the cut must not move as measured rows change the sweeps' factors)."""
    cost = {r: weight(members) for r, members in by_round(points).items()}
    out: list[list[tuple]] = [[] for _ in range(n)]
    for g, k in zip(cost, cut(list(cost.values()), n)):
        out[k].append(g)
    return out


def select(points: Sequence, k: int, n: int, weight: Callable[[Sequence], float]) -> list:
    """The points of slice K of N, in their original (interleaved) order."""
    mine = set(parts(points, n, weight)[k - 1])
    return [p for p in points if (p.group(), p.repeat) in mine]


def slices_for(points: Sequence, window_s: float, seconds: Callable[[Sequence], float],
               weight: Callable[[Sequence], float] | None = None) -> tuple[int, float]:
    """(the fewest slices, cut by `weight` as `select` cuts them, whose every one takes at most `window_s` by
    `seconds`; the longest slice's seconds). When one round alone exceeds the window: the fewest slices none of
    which is longer than that round."""
    weight = weight or seconds
    groups = by_round(points)
    if not groups:
        return 0, 0.0
    cost = [seconds(members) for members in groups.values()]
    fixed = [weight(members) for members in groups.values()]  # the cut, as `parts` makes it
    target = max(window_s, *cost)
    n = min(len(groups), max(1, math.ceil(sum(cost) / target)))
    while True:
        per_part = [0.0] * n
        for c, k in zip(cost, cut(fixed, n)):
            per_part[k] += c
        if max(per_part) <= target or n >= len(groups):
            return n, max(per_part)
        n += 1
