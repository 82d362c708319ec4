"""What ps-lite's threads spend on a received message, fitted on the fit split's points (stages.py uses it).

Each capped run records, per role, the busiest threads of that role's busiest process in its timed window, as % of
one dilated CPU (the rows' thread_cpu, benchmarks/emulation/thread_usage.py): at most TOP of them. ps-lite's
threads all carry the interpreter's name, so which is ZMQ's I/O thread and which the engine's cannot be read from a
row; what can be read is how the work spreads: a few threads that each carry a large share (the chain a message
passes in turn, stages.py), and the OpenMP team's threads, each with a sliver. Threads standing for GPU-side work
(the virtual GPU's timer) are left out: the model runs them on the virtual GPU.

A thread's CPU per iteration, in core-seconds, is its % x the run's thread cap x the point's s/iter. What the
process received in an iteration (messages and payload bytes) follows from how the system cuts the model and places
it (ps.parts_of, with the point's settings): the busiest server gets W pushes of each of its parts, a worker one
reply of every part. Sending costs are not told apart from receiving here: they scale with the same parts.

The model, per system and role: the busiest `n` threads are serial stages, `n` being the most threads that carry at
least STAGE_SHARE of the process's CPU in any fit row; each stage's CPU per iteration is a line in messages and
bytes (per message, per byte; non-negative), fitted over the fit rows in relative error. ResNet-50's rows (many small
arrays) and VGG-19's (a few huge ones) are what tell the two apart. The threads past the stages are the OpenMP team
that the last stage leads: their CPU, over the team's other threads, is the loop, split in the model over the whole
team (the last stage's thread doing one share of it, which its measured CPU includes). A row that lists TOP threads
may leave team threads out; each is counted at the least listed one's CPU.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence

from benchmarks.emulation.thread_cap import GLOO_THREADS, GPU_SIDE, omp_threads
from benchmarks.emulation.thread_usage import TOP
from benchmarks.sim import model as model_lib
from benchmarks.sim import settings
from benchmarks.sim.cluster import CpuCosts
from benchmarks.sim.ps import SYSTEMS, parts_of
from benchmarks.sim.stages import ThreadCosts

STAGE_SHARE = 0.10
ROLES = ("server", "worker")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One run's process of one role: what it received per iteration and each CPU-side thread's core-seconds."""

    messages: float
    nbytes: float
    threads: tuple[float, ...]  # busiest first
    team: int  # OpenMP threads per process in that run (the last stage's thread among them)
    listed_all: bool  # the row lists every thread it has, not just the TOP busiest


def cpu_side(threads: Sequence[Sequence]) -> list[float]:
    """The % of one dilated CPU of each CPU-side thread of a row's [name, %, ...] entries, busiest first."""
    return sorted((float(t[1]) for t in threads if t[0] != GPU_SIDE and t[0] not in GLOO_THREADS), reverse=True)


def stage_count(cpu: Sequence[float], stage_share: float = STAGE_SHARE) -> int:
    total = sum(cpu)
    return sum(1 for c in cpu if total > 0 and c / total >= stage_share)


def fit_line(points: Iterable[tuple[float, float, float]]) -> CpuCosts:
    """The non-negative (per message, per byte) whose messages x a + bytes x b best matches each (messages, bytes,
    core-seconds) in relative error (least squares weighted by 1 / core-seconds)."""
    rows = [(m / c, b / c) for m, b, c in points if c > 0]
    if not rows:
        return CpuCosts()
    smm = sum(m * m for m, _ in rows)
    smb = sum(m * b for m, b in rows)
    sbb = sum(b * b for _, b in rows)
    sm = sum(m for m, _ in rows)
    sb = sum(b for _, b in rows)
    det = smm * sbb - smb * smb
    if det > 1e-12 * smm * sbb:
        a, b = (sm * sbb - sb * smb) / det, (sb * smm - sm * smb) / det
        if a >= 0 and b >= 0:
            return CpuCosts(a, b)
    # One of them at zero: the better of the two one-unknown fits (squared relative error).
    only_bytes = CpuCosts(0.0, sb / sbb) if sbb else CpuCosts()
    only_messages = CpuCosts(sm / smm, 0.0) if smm else CpuCosts()

    def error(c: CpuCosts) -> float:
        return sum((m * c.per_message + b * c.per_byte - 1) ** 2 for m, b in rows)

    return min(only_bytes, only_messages, key=error)


def samples(point: dict, traffic: dict[str, tuple[float, float]]) -> dict[str, list[Sample]]:
    """{role: one Sample per run of `point`} from its rows' thread_cpu texts; `traffic` is {role: (messages,
    bytes)} per iteration of the role's busiest process. Nothing for a point without per-thread caps."""
    cap = float(point.get("thread_cap_cores") or 0)
    seconds = float(point.get("median_s") or 0)
    quota = float(point.get("cpu_quota_cores") or 0)
    if cap <= 0 or seconds <= 0:
        return {}
    team = omp_threads(quota / cap if quota else None, cap)
    found: dict[str, list[Sample]] = {}
    for text in point.get("thread_cpu") or []:
        busiest = json.loads(text)
        for role in ROLES:
            entries = busiest.get(role) or []
            cpu = cpu_side(entries)
            if not cpu or role not in traffic:
                continue
            found.setdefault(role, []).append(Sample(*traffic[role], tuple(c / 100 * cap * seconds for c in cpu),
                                                     team, len(entries) < TOP))
    return found


def thread_costs(rows: Sequence[Sample], stage_share: float = STAGE_SHARE) -> ThreadCosts:
    """One role's ThreadCosts from its fit rows (the module doc)."""
    n = max(1, max(stage_count(r.threads, stage_share) for r in rows))
    stages = []
    for k in range(n):
        points = []
        for r in rows:
            own = r.threads[k] if k < len(r.threads) else 0.0
            if k == n - 1 and r.team > 1:  # its share of the team's loop is the loop's, below
                own = max(0.0, own - _rest(r, n) / (r.team - 1))
            points.append((r.messages, r.nbytes, own))
        stages.append(fit_line(points))
    team = fit_line((r.messages, r.nbytes, _rest(r, n) * r.team / (r.team - 1)) for r in rows if r.team > 1)
    return ThreadCosts(tuple(stages), team)


def _rest(r: Sample, n: int) -> float:
    """The core-seconds per iteration of the team's other threads: those past the stages, at most team - 1 of them
    (the least listed one's CPU for each the row leaves out)."""
    rest = list(r.threads[n:r.team - 1 + n])
    if not r.listed_all and rest and len(rest) < r.team - 1:
        rest += [rest[-1]] * (r.team - 1 - len(rest))
    return sum(rest)


def fitted(points: Iterable[dict], traffic: Callable[[dict], dict[str, tuple[float, float]]]
           ) -> dict[str, dict[str, ThreadCosts]]:
    """{system: {role: ThreadCosts}} from the fit split's points of ps-lite's systems (receivers "process") with
    thread_cpu; `traffic(point)` is what each role's busiest process received per iteration there. A system or
    role without such rows is left out (one thread pays the loopback-fitted cost)."""
    wanted = {name for name, system in SYSTEMS.items() if system.receivers == "process"}
    found: dict[str, dict[str, list[Sample]]] = {}
    for p in points:
        if p.get("split") != "fit" or p.get("kvstore") not in wanted or not p.get("thread_cpu"):
            continue
        for role, rows in samples(p, traffic(p)).items():
            found.setdefault(p["kvstore"], {}).setdefault(role, []).extend(rows)
    return {kv: {role: thread_costs(rows) for role, rows in by_role.items()} for kv, by_role in found.items()}


def as_dict(costs: dict[str, dict[str, ThreadCosts]]) -> dict:
    """JSON-friendly: {system: {role: {"stages": [[per message, per byte], ...], "team": [...]}}} (seconds)."""
    return {kv: {role: {"stages": [[c.per_message, c.per_byte] for c in t.stages],
                        "team": [t.team.per_message, t.team.per_byte]} for role, t in by_role.items()}
            for kv, by_role in costs.items()}


def traffic_of(parts: Sequence, workers: int, servers: int) -> dict[str, tuple[float, float]]:
    """{role: (messages, payload bytes)} per iteration at each role's busiest process: the server with the most
    bytes gets every worker's push of each of its parts; a worker gets one reply of every part."""
    per_server = [[0, 0] for _ in range(servers)]
    for p in parts:
        per_server[p.server][0] += 1
        per_server[p.server][1] += p.nbytes
    busiest = max(per_server, key=lambda mb: (mb[1], mb[0]))
    return {"server": (float(workers * busiest[0]), float(workers * busiest[1])),
            "worker": (float(len(parts)), float(sum(p.nbytes for p in parts)))}


def traffic(point: dict) -> dict[str, tuple[float, float]]:
    """traffic_of a ps-lite point of a validation CSV: its model cut with the point's settings (slice size,
    big-array bound) over its servers."""
    kv = point["kvstore"]
    env = settings.setting(kv, settings.parse_label(point.get("baseline_setting", "")))
    slice_size = int(point["slice_size"]) if point.get("slice_size") else None
    system = settings.apply_ps(SYSTEMS[kv], env, slice_size)
    hosts = int(point["hosts"])
    workers = hosts // 2 if point.get("layout") == "separate" else hosts
    return traffic_of(parts_of(model_lib.load(point["model"]), system, workers), workers, workers)
