"""A sweep that changes one condition at points another sweep measured (the shallow queues, TCP CUBIC): each
system's throughput beside the reference rows' at the same point, every other setting equal (points.POINT_KEY)."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.analysis.points import LABEL, POINT_KEY, aggregate

# Per varied column: how its value reads in a sentence.
WORDING = {"link_queue_ms": lambda v: f"{v} ms queues", "tcp_congestion_control": lambda v: v.upper()}


def _reduced(key: tuple, column: str) -> tuple:
    """A point's key without its sweep (tag) and the varied column: what must match between the two sweeps."""
    return tuple(v for k, v in zip(POINT_KEY, key) if k not in ("tag", column))


def sentences(rows: Sequence[dict], reference: Sequence[dict], column: str, reference_name: str) -> list[str]:
    """Per point of `rows` with a match in `reference`: each system's P100-equivalent throughput (median of every
    rank's iterations, faithful runs) under the varied condition and under the reference's, and their ratio."""
    word = WORDING.get(column, lambda v: f"{column}={v}")
    theirs = {(_reduced(p["key"], column), p["kvstore"]): p for p in aggregate(reference)}
    found: dict[tuple, list[str]] = {}
    index = POINT_KEY.index(column)
    for p in aggregate(rows):
        ref = theirs.get((_reduced(p["key"], column), p["kvstore"]))
        if ref is None:
            continue
        scale = p["gpu_scale"] or 1.0
        found.setdefault((p["model"], p["bandwidth"], p["p100_equiv_gbps"], word(p["key"][index]),
                          word(ref["key"][index])), []).append(
            f"{LABEL.get(p['kvstore'], p['kvstore'])} {p['throughput'] / scale:,.1f} against "
            f"{ref['throughput'] / scale:,.1f} ({p['throughput'] / ref['throughput']:.3f}×; n = {p['n']} and "
            f"{ref['n']})")
    return [f"- {model}, {link} ({eq:g} Gbps): P100-equivalent throughput under {mine} against {ref_word} "
            f"(`{reference_name}`, the same point and settings): {', '.join(each)}."
            for (model, link, eq, mine, ref_word), each in found.items()]
