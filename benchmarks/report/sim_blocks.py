"""The simulator's blocks: its validation against the emulated cluster, and the paper's evaluation at paper scale
and past it (results/sim_*.csv, written by `python -m benchmarks.sim.run`)."""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis.points import LABEL, number
from benchmarks.report.loopback_blocks import plain_rows


# The runners whose own summaries the README shows: block name -> (summary file, command that writes it).
def sim_validation_block(results: pathlib.Path) -> str:
    """Per system: how close the simulator came to the reviewed emulated-cluster points (results/sim_validation.csv,
    written by `python -m benchmarks.sim.run validate`)."""
    rows = plain_rows(results / "sim_validation.csv")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run validate` writes `benchmarks/results/sim_validation.csv`."
    lines = ["| system | points | within 10% | fast / slow | fast / slow by over 10% | median error | errors from … to "
             "| worst |", "|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(r)
    for label, mine in [*sorted(groups.items()), ("all", rows)]:
        errors = [abs(number(r["rel_error"])) for r in mine]
        worst = max(mine, key=lambda r: abs(number(r["rel_error"])))
        eq = number(worst.get("p100_equiv_gbps"))
        link = f"{worst['bandwidth']} ({eq:g} Gbps)" if eq else worst["bandwidth"]
        where = f" ({worst['model']}, {worst['hosts']} hosts, {link})" if label != "all" else ""
        signed = [number(r["rel_error"]) for r in mine]
        spread = f"{100 * min(signed):+.1f}% … {100 * max(signed):+.1f}%"
        worst_error = f"{100 * number(worst['rel_error']):+.1f}%"
        direction = f"{sum(e < 0 for e in signed)} / {sum(e > 0 for e in signed)}"
        far = f"{sum(e < -0.10 for e in signed)} / {sum(e > 0.10 for e in signed)}"
        lines.append(f"| {label} | {len(mine)} | {sum(e <= 0.10 for e in errors)} | {direction} | {far} | "
                     f"{100 * statistics.median(errors):.1f}% | {spread} | {worst_error}{where} |")
    return "\n".join(lines)


GPU_ORDER = ("p100", "v100", "a100", "h100")  # benchmarks/sim/model.py's compute axis, slowest first


def _sim_rows(results: pathlib.Path, sweep: str) -> list[dict]:
    return plain_rows(results / f"sim_paper_{sweep}.csv")


def _sim_ratio(rows: Sequence[dict], key: tuple, system: str, base: str) -> float | None:
    """p3kv's simulated throughput over `base`'s at the point `key` (model, gpu, hosts, gbps)."""
    found = {(r["model"], r["gpu"], r["hosts"], r["gbps"], r["system"]): number(r["throughput"]) for r in rows}
    mine, theirs = found.get((*key, system)), found.get((*key, base))
    return mine / theirs if mine and theirs else None


def _cite(table: dict, sweep: str, model: str) -> str:
    where, value = table.get((sweep, model), (None, None))
    if value is None:
        return "-"
    unit = "Gbps" if sweep == "bandwidth" else "machines"
    return f"{value:.2f}×" + (f" ({where} {unit})" if where else "")


def sim_paper_block(results: pathlib.Path) -> str:
    """The simulated paper-scale sweeps per model: p3kv's best gain over dist_sync across the link rates (and
    over Horovod there), and at 8 machines, beside the paper's numbers (benchmarks/sim/paper.py's PAPER)."""
    bandwidth, scale = _sim_rows(results, "bandwidth"), _sim_rows(results, "scale")
    if not bandwidth:
        return "Not run yet: `python -m benchmarks.sim.run bandwidth` writes `benchmarks/results/sim_paper_*.csv`."
    from benchmarks.sim import paper

    lines = ["| model | best p3kv / dist_sync (link) | paper | p3kv / Horovod there | p3kv / dist_sync at 8 "
             "machines | paper |", "|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in bandwidth):
        gains = [(g, _sim_ratio(bandwidth, (model, "p100", "4", g), "p3", "dist_sync"))
                 for g in dict.fromkeys(r["gbps"] for r in bandwidth if r["model"] == model)]
        gbps, best = max(((g, v) for g, v in gains if v), key=lambda item: item[1])
        versus = _sim_ratio(bandwidth, (model, "p100", "4", gbps), "p3", "horovod")
        at8 = _sim_ratio(scale, (model, "p100", "8", "10"), "p3", "dist_sync") if scale else None

        lines.append(f"| {model} | {best:.2f}× ({number(gbps):g} Gbps) | {_cite(paper.PAPER, 'bandwidth', model)} | "
                     f"{f'{versus:.2f}×' if versus else '-'} | {f'{at8:.2f}×' if at8 else '-'} | "
                     f"{_cite(paper.PAPER, 'scale', model)} |")
    return "\n".join(lines)


def sim_slice_block(results: pathlib.Path) -> str:
    """The simulated slice-size sweep (10 Gbps, 4 machines): throughput per slice size relative to 50,000, with
    free CPU and with this machine's fitted costs (4 cores per host)."""
    rows = _sim_rows(results, "slice")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run slice` writes `benchmarks/results/sim_paper_slice.csv`."
    sizes = sorted({int(r["slice_size"]) for r in rows})
    found = {(r["model"], r["cpu"], int(r["slice_size"])): number(r["throughput"]) for r in rows}
    lines = ["| model | CPU | " + " | ".join(f"{z:,}" for z in sizes) + " |", "|---|---|" + "---|" * len(sizes)]
    for model in dict.fromkeys(r["model"] for r in rows):
        for cpu in ("ideal", "measured"):
            base = found.get((model, cpu, 50_000))
            if base:
                lines.append(f"| {model} | {cpu} | " + " | ".join(
                    f"{found[(model, cpu, z)] / base:.2f}" if (model, cpu, z) in found else "-" for z in sizes) + " |")
    return "\n".join(lines)


def sim_future_block(results: pathlib.Path) -> str:
    """Past the paper: p3kv's simulated throughput over dist_sync and over Horovod per model, GPU and link rate."""
    rows = _sim_rows(results, "future")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run future` writes `benchmarks/results/sim_paper_future.csv`."
    rates = list(dict.fromkeys(r["gbps"] for r in rows))
    lines = ["| model | GPU | " + " | ".join(f"{number(g):g} Gbps: vs dist_sync / vs Horovod" for g in rates) + " |",
             "|---|---|" + "---|" * len(rates)]
    for model in dict.fromkeys(r["model"] for r in rows):
        gpus = dict.fromkeys(r["gpu"] for r in rows if r["model"] == model)
        for gpu in sorted(gpus, key=lambda g: GPU_ORDER.index(g) if g in GPU_ORDER else len(GPU_ORDER)):
            cells = []
            for g in rates:
                key = (model, gpu, "4", g)
                a, b = _sim_ratio(rows, key, "p3", "dist_sync"), _sim_ratio(rows, key, "p3", "horovod")
                cells.append(f"{a:.2f}× / {b:.2f}×" if a and b else "-")
            lines.append(f"| {model} | {gpu} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
