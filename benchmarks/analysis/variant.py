"""A sweep that changes one condition at points another sweep measured (the shallow queues, TCP CUBIC): each
system's throughput beside the reference rows' at the same point, every other setting equal (points.POINT_KEY)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from benchmarks.analysis.points import LABEL, POINT_KEY, aggregate

# Per varied column: how its value reads in a sentence.
WORDING = {"link_queue_ms": lambda v: f"{v} ms queues", "tcp_congestion_control": lambda v: v.upper()}


class Pair(NamedTuple):
    """One system at one point: P100-equivalent throughput (median of every rank's iterations, faithful runs)
    under the varied condition and under the reference's, and the runs behind each."""

    model: str
    link: str
    equivalent_gbps: float
    system: str
    condition: str
    reference_condition: str
    throughput: float
    reference: float
    n: int
    reference_n: int

    @property
    def ratio(self) -> float:
        return self.throughput / self.reference


def _reduced(key: tuple, column: str) -> tuple:
    """A point's key without its sweep (tag) and the varied column: what must match between the two sweeps."""
    return tuple(v for k, v in zip(POINT_KEY, key) if k not in ("tag", column))


def pairs(rows: Sequence[dict], reference: Sequence[dict], column: str) -> list[Pair]:
    """Every system at every point of `rows` that `reference` measured too, in the order of `rows`."""
    word = WORDING.get(column, lambda v: f"{column}={v}")
    index = POINT_KEY.index(column)
    theirs = {(_reduced(p["key"], column), p["kvstore"]): p for p in aggregate(reference)}
    found = []
    for p in aggregate(rows):
        ref = theirs.get((_reduced(p["key"], column), p["kvstore"]))
        if ref is not None:
            scale = p["gpu_scale"] or 1.0
            found.append(Pair(p["model"], p["bandwidth"], p["p100_equiv_gbps"], LABEL.get(p["kvstore"], p["kvstore"]),
                              word(p["key"][index]), word(ref["key"][index]), p["throughput"] / scale,
                              ref["throughput"] / scale, p["n"], ref["n"]))
    return found


def sentences(rows: Sequence[dict], reference: Sequence[dict], column: str, reference_name: str) -> list[str]:
    """One line per point of `rows` with a match in `reference`: each system under both conditions."""
    found: dict[tuple, list[str]] = {}
    for p in pairs(rows, reference, column):
        found.setdefault((p.model, p.link, p.equivalent_gbps, p.condition, p.reference_condition), []).append(
            f"{p.system} {p.throughput:,.1f} against {p.reference:,.1f} ({p.ratio:.3f}×; n = {p.n} and "
            f"{p.reference_n})")
    return [f"- {model}, {link} ({eq:g} Gbps): P100-equivalent throughput under {mine} against {ref_word} "
            f"(`{reference_name}`, the same point): {', '.join(each)}."
            for (model, link, eq, mine, ref_word), each in found.items()]
