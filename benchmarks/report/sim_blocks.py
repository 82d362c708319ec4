"""The simulator's blocks: its validation against the emulated cluster, and the paper's evaluation at paper scale
and past it (results/sim_*.csv, written by `python -m benchmarks.sim.run`)."""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis.points import LABEL, number
from benchmarks.report.loopback_blocks import plain_rows

SPLITS = ("fit", "held-out")
CAUSES = (("repeats' medians differ", "its repeats differ by more than 10%"),
          ("CPU it does not charge", "the hosts used more CPU than the model charges (20+ points of a core)"),
          ("more CPU than was used", "the model charges more CPU than the hosts used (20+ points)"),
          ("TCP retransmits", "TCP retransmitted (loss is not modelled)"),
          ("throttled", "a host's quota throttled it over 5% of the timed window"),
          ("virtual GPU completions", "the virtual GPU ran over 1 ms late"),
          ("no measured cause", "none of these was measured"))


def _pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def _goal_sentences(rows: Sequence[dict]) -> list[str]:
    held = [r for r in rows if r.get("split") == "held-out"]
    if not held:
        return ["No held-out point: nothing validates the simulator yet."]
    errors = [number(r["rel_error"]) for r in held]
    within = sum(abs(e) <= 0.10 for e in errors)
    share = within / len(errors)
    lines = [f"Held out: {within} of {len(errors)} points ({100 * share:.1f}%) within 10% - the goal of at least 80% "
             f"is {'met' if share >= 0.8 else 'not met'}."]
    per_system = {}
    for r in held:
        per_system.setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(number(r["rel_error"]))
    medians = {k: statistics.median(v) for k, v in sorted(per_system.items())}
    off = [k for k, v in medians.items() if abs(v) > 0.03]
    lines.append("Median signed error per system on held-out points: "
                 + ", ".join(f"{k} {_pct(v)}" for k, v in medians.items())
                 + (" - within ±3% for every system." if not off else
                    f" - the goal of ±3% (no systematic bias) is not met for {', '.join(off)}."))
    return lines


def _cause_sentence(rows: Sequence[dict]) -> str:
    misses = [r for r in rows if abs(number(r["rel_error"])) > 0.10]
    if not misses:
        return "No point misses by more than 10%."
    counts = [(text, sum(key in (r.get("note") or "") for r in misses)) for key, text in CAUSES]
    found = ", ".join(f"{text} at {n}" for text, n in counts if n)
    return (f"What the {len(misses)} points missing by more than 10% measured (`note` column; a point may have "
            f"several): {found}.")


def _rows_sentence(rows: Sequence[dict]) -> str:
    selection = rows[0].get("selection", "")
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.get("fidelity") or "unjudged"] = kinds.get(r.get("fidelity") or "unjudged", 0) + 1
    sources = sorted({r["source"] for r in rows})
    made = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    text = (f"Rows used: {selection} ({len(rows)} points: {made}; from {', '.join(f'`{s}`' for s in sources)}).")
    if "faithful rows only" not in selection:
        text += (" These measurements predate the faithful emulation, so the errors below compare the model of the "
                 "emulation as it now is with runs that did not yet keep its promises.")
    return text


def _fit_sentence(results: pathlib.Path) -> str:
    path = results / "sim_fit.json"
    if not path.exists():
        return ""
    import json

    fit = json.loads(path.read_text())
    threads = fit.get("thread_costs") or {}
    links = ", ".join(f"{LABEL.get(k, k)} {v * 1e9:.2f} ns/byte" for k, v in fit["links_s_per_byte"].items()
                      if k not in threads)
    text = (f"Fitted on emulated points (the fit split, {fit['fit_points']} points, nothing else): each system's "
            f"extra CPU per byte on the emulated links - {links}")
    if "link_efficiency" in fit:
        text += (f"; the share of the links' rate their TCP flows deliver while messages wait, one for every system: "
                 f"{100 * fit['link_efficiency']:.2f}%")
    if threads:
        def role(r: dict) -> str:
            total = sum(c[1] for c in r["stages"]) + r["team"][1]
            return f"{len(r['stages'])} serial threads and the OpenMP team, {total * 1e9:.2f} ns/byte in all"

        text += ("; and what each thread of " + " and ".join(LABEL.get(k, k) for k in threads)
                 + " spends per message and per byte received, from the runs' thread_cpu (their links' CPU "
                 "included: " + "; ".join(f"{LABEL.get(k, k)} server {role(v['server'])}, worker {role(v['worker'])}"
                                           for k, v in threads.items() if "server" in v and "worker" in v) + ")")
    return text + ". Everything else comes from loopback benchmarks (`benchmarks/sim/costs.py`)."


def sim_summary_block(results: pathlib.Path) -> str:
    """The README's one paragraph on how well the simulator predicts runs it was not fitted on, from
    results/sim_validation.csv: held-out points within 10%, and each system's count and median signed error."""
    rows = [r for r in plain_rows(results / "sim_validation.csv") if r.get("split") == "held-out"]
    if not rows:
        return "The simulator has no held-out validation yet (`python -m benchmarks.sim.run validate`)."
    errors = [number(r["rel_error"]) for r in rows]
    within = sum(abs(e) <= 0.10 for e in errors)
    per_system: dict[str, list[float]] = {}
    for r in rows:
        per_system.setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(number(r["rel_error"]))
    ordered = sorted(per_system.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    systems = "; ".join(f"{k} {sum(abs(e) <= 0.10 for e in v)} of {len(v)} (median {_pct(statistics.median(v))})"
                        for k, v in ordered)
    return (f"Simulator validation, on faithful runs only (`benchmarks/results/sim_validation.csv`): {within} of "
            f"{len(errors)} held-out points within 10% ({100 * within / len(errors):.1f}%; the goal is at least "
            f"80%); per system, points within 10% and the median signed error (negative: the simulator is too fast): "
            f"{systems}. The misses and what their runs measured: [docs/benchmarks.md](docs/benchmarks.md), "
            "\"Simulator\".")


def sim_validation_block(results: pathlib.Path) -> str:
    """Per split (fit, held out) and system: how close the simulator came to the emulated-cluster points
    (results/sim_validation.csv, written by `python -m benchmarks.sim.run validate`), with the sentences that
    explain its error, all generated from the CSV (and results/sim_fit.json)."""
    rows = plain_rows(results / "sim_validation.csv")
    if not rows:
        return "Not run yet: `python -m benchmarks.sim.run validate` writes `benchmarks/results/sim_validation.csv`."
    if "split" not in rows[0]:
        return ("`benchmarks/results/sim_validation.csv` predates the held-out split: run "
                "`python -m benchmarks.sim.run validate` again.")
    lines = [_rows_sentence(rows), "",
             "| split | system | points | within 10% | median signed error | median abs error | errors from … to "
             "| worst |", "|---|---|---|---|---|---|---|---|"]
    for split in SPLITS:
        mine_split = [r for r in rows if r["split"] == split]
        groups: dict[str, list[dict]] = {}
        for r in mine_split:
            groups.setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(r)
        for label, mine in [*sorted(groups.items()), ("all", mine_split)]:
            if not mine:
                continue
            signed = [number(r["rel_error"]) for r in mine]
            typical = 100 * statistics.median(abs(e) for e in signed)
            worst = max(mine, key=lambda r: abs(number(r["rel_error"])))
            eq = number(worst.get("p100_equiv_gbps"))
            link = f"{worst['bandwidth']} ({eq:g} Gbps)" if eq else worst["bandwidth"]
            where = f" ({worst['model']}, {worst['hosts']} hosts, {link})" if label != "all" else ""
            lines.append(f"| {split} | {label} | {len(mine)} | {sum(abs(e) <= 0.10 for e in signed)} | "
                         f"{_pct(statistics.median(signed))} | {typical:.1f}% | "
                         f"{_pct(min(signed))} … {_pct(max(signed))} | {_pct(number(worst['rel_error']))}{where} |")
    lines += ["", *_goal_sentences(rows), _cause_sentence(rows)]
    fit = _fit_sentence(results)
    if fit:
        lines.append(fit)
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
    return "\n".join([*lines, "", _versus_sentence(bandwidth, results)])


def _versus_sentence(bandwidth: Sequence[dict], results: pathlib.Path) -> str:
    """How MXNet's P3 and Horovod compare with p3kv over every paper-scale and past-the-paper point."""
    ratios = [v for key in {(r["model"], r["gpu"], r["hosts"], r["gbps"]) for r in bandwidth}
              if (v := _sim_ratio(bandwidth, key, "p3", "mxnet-p3"))]
    future = _sim_rows(results, "future")
    behind = [(rows, key) for rows in (bandwidth, _sim_rows(results, "scale"), future)
              for key in {(r["model"], r["gpu"], r["hosts"], r["gbps"]) for r in rows}
              if (v := _sim_ratio(rows, key, "p3", "horovod")) and v < 0.99]
    parts = []
    if ratios:
        parts.append(f"With CPU free, p3kv's simulated throughput over MXNet's P3 ranges from {min(ratios):.2f}× to "
                     f"{max(ratios):.2f}× over the paper-scale bandwidth points")
    torch = {key: v for key in {(r["model"], r["gpu"], r["hosts"], r["gbps"]) for r in bandwidth}
             if (v := _sim_ratio(bandwidth, key, "torch-p3kv", "ddp"))}
    if torch:
        (model, _, _, gbps), best = max(torch.items(), key=lambda item: item[1])
        parts.append(f"p3kv.torch (worker placement) over PyTorch DDP ranges from {min(torch.values()):.2f}× to "
                     f"{best:.2f}× ({model} at {number(gbps):g} Gbps)")
    parts.append(f"p3kv is behind Horovod by more than 1% at {len(behind)} paper-scale or past-the-paper points"
                 if behind else "p3kv is never more than 1% behind Horovod at any paper-scale or past-the-paper point")
    return "; ".join(parts) + " (`sim_paper_*.csv`)."


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
