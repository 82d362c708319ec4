"""How ps-lite's processes split a message's CPU over their threads, measured at the fit split's points.

Each capped run records, per role, the busiest threads of that role's busiest process in its timed window, as % of
one dilated CPU (the rows' thread_cpu, benchmarks/emulation/thread_usage.py). ps-lite's threads all carry the
interpreter's name, so which thread is ZMQ's I/O thread and which the engine's cannot be read from a row; what can
be read is how the work spreads: a few threads that each carry a large share (the chain a message passes in turn:
stages.py), and the OpenMP team's threads, each with a sliver. Here a thread is a stage when it carries at least
STAGE_SHARE of the listed threads' CPU; the rest is the OpenMP loop. Threads standing for GPU-side work (the
virtual GPU's timer) are left out: the model runs them on the virtual GPU. The shares of a system are the median
over its fit-split rows, stage by stage, with as many stages as most rows have.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence

from benchmarks.emulation.thread_cap import GLOO_THREADS, GPU_SIDE
from benchmarks.sim.ps import SYSTEMS

STAGE_SHARE = 0.10
ROLES = ("server", "worker")


def shares(threads: Sequence[Sequence], stage_share: float = STAGE_SHARE) -> tuple[float, ...]:
    """One process's stage shares from its busiest threads ([name, % of one dilated CPU, % throttled], busiest
    first): each CPU-side thread carrying at least `stage_share` of their CPU, busiest first."""
    cpu = [float(t[1]) for t in threads if t[0] != GPU_SIDE and t[0] not in GLOO_THREADS]
    total = sum(cpu)
    if total <= 0:
        return ()
    return tuple(round(c / total, 4) for c in sorted(cpu, reverse=True) if c / total >= stage_share)


def median_stages(per_row: Iterable[tuple[float, ...]]) -> tuple[float, ...]:
    """The median share of each stage over rows, with as many stages as most rows have (ties: fewer)."""
    rows = [r for r in per_row if r]
    if not rows:
        return ()
    counts = [len(r) for r in rows]
    n = min(set(counts), key=lambda c: (-counts.count(c), c))
    chosen = [r for r in rows if len(r) == n]
    return tuple(round(statistics.median(r[k] for r in chosen), 4) for k in range(n))


def measured(points: Iterable[dict]) -> dict[str, dict[str, tuple[float, ...]]]:
    """{system: {"server": shares, "worker": shares}} from the fit split's points of ps-lite's systems (receivers
    "process"), each point carrying its rows' thread_cpu texts; a system without such rows is left out (one
    thread pays it all)."""
    wanted = {name for name, system in SYSTEMS.items() if system.receivers == "process"}
    found: dict[str, dict[str, list]] = {}
    for p in points:
        if p.get("split") != "fit" or p.get("kvstore") not in wanted:
            continue
        for text in p.get("thread_cpu") or []:
            busiest = json.loads(text)
            for role in ROLES:
                if busiest.get(role):
                    found.setdefault(p["kvstore"], {}).setdefault(role, []).append(shares(busiest[role]))
    return {kv: {role: median_stages(by_role.get(role, [])) for role in ROLES} for kv, by_role in found.items()}
