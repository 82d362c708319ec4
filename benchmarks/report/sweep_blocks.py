"""The blocks of the emulated-cluster sweeps: one table with its sentences per reviewed sweep
(results/sweeps/<name>.csv), the rows from before the reviewed settings (results/legacy/), and the status table
that says which file satisfies them."""

from __future__ import annotations

import json
import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis import bench_rows, dilation_check, ratio_table, torch_comparison, undilated_cpu, variant
from benchmarks.analysis.points import (
    LABEL,
    aggregate,
    fidelity_sentence,
    key_value,
    number,
    optimizer_label,
    point_table,
    ranks_phrase,
    shown,
)
from benchmarks.report.sentences import (
    MIN_REPEATS,
    dilation_sentences,
    saturation_sentences,
    slice_sentences,
    utilisation_sentences,
    verdicts,
)
from benchmarks.suites import sweeps

LEGACY = "legacy"  # results/legacy/: rows from before that schema, and the figures drawn from them


LEGACY_RUNS = ("demo", "sweep_bandwidth", "sweep_ablation", "sweep_slice", "sweep_scale", "sweep_utilisation",
               "sweep_targets")


# The sweeps that change one condition at the bandwidth sweep's headline points, and the column they change.
VARIANTS = {"shallow": "link_queue_ms", "cubic": "tcp_congestion_control"}
# The models each --models sweep covers (sweeps.py runs these by default): a block names those without rows yet.
SWEEP_MODELS = {"bandwidth": tuple(sweeps.MODELS)}


def _rows(path: pathlib.Path) -> list[dict]:
    return bench_rows.read_runs(path)


def reviewed_block(name: str, results: pathlib.Path) -> str:
    """A sweep's table and sentences from results/sweeps/<name>.csv."""
    path = results / "sweeps" / f"{name}.csv"
    points = aggregate(_rows(path))
    judged = fidelity_sentence(_rows(path))
    if not points and judged:
        return f"No faithful runs yet in `benchmarks/results/sweeps/{name}.csv`: {judged}"
    if not points:
        return ("Not measured yet with the reviewed settings: "
                f"`sudo .venv/bin/python -m benchmarks.suites.sweeps {name}` (or `make sweeps`) writes "
                f"`benchmarks/results/sweeps/{name}.csv`.")
    flags = []
    if any(p["dirty"] for p in points):
        flags.append("some rows ran on a dirty tree (--allow-dirty)")
    if any(p["forced"] for p in points):
        flags.append("some rows started on a busy machine (--force)")
    commits = sorted({str(r.get("git_commit"))[:7] for r in _rows(path) if str(r.get("smoke")) != "True"})
    if len(commits) > 1:
        flags.append(f"rows from {len(commits)} commits ({', '.join(commits)})")
    load = max(p["load_max"] for p in points)
    busy = [p["busy_max"] for p in points if p["busy_max"] is not None]
    idle = f"; CPUs busy before a run at most {max(busy):.0f}% (5-second sample)" if busy else ""
    used = [r for r in _rows(path) if shown(r) and str(r.get("smoke")) != "True"]
    tcp = "/".join(sorted({key_value(r, "tcp_congestion_control").upper() for r in used}))
    head = (f"From `benchmarks/results/sweeps/{name}.csv` ({sum(p['n'] for p in points)} runs{idle}; highest "
            f"1-minute load before/after a run {load:.2f}, the runs' own included; links under TCP {tcp}"
            f"{'; ' + '; '.join(flags) if flags else ''}). Throughput: median over "
            f"{ranks_phrase(used)} timed iterations of every repeat, in emulated time (P100-equiv.: divided by "
            "--gpu-scale, the rate "
            "real P100s on the equivalent links would reach); IQR: its 25–75% range; repeat medians: the range of the "
            "per-repeat medians; bound: headers included." + (f" {judged}" if judged else ""))
    extra = []
    missing = [m for m in SWEEP_MODELS.get(name, ()) if m not in {p["model"] for p in points}]
    if missing:
        extra.append(f"- Not measured yet: {', '.join(missing)} "
                     f"(`sudo .venv/bin/python -m benchmarks.suites.sweeps {name} "
                     f"--models {' '.join(missing)}` appends them).")
    if name == "slice":
        extra += slice_sentences(points)
    rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
    cpus = int(number(rows[0].get("cpus"), 2)) if rows else 2
    if name == "dilation":  # p3kv's ratios with their CIs, and whether the dilation changed them
        found = ratio_table.ratios(rows)
        extra = dilation_sentences(points, cpus)
        if found:
            extra += ["", ratio_table.table(found), "", *ratio_table.invariance_sentences(found)]
        undilated = undilated_cpu.sentences(undilated_cpu.fits(rows))
        extra += ["", *undilated] if undilated else []
    else:
        extra += saturation_sentences(points, cpus)
    if name == "utilisation":
        extra += utilisation_sentences(_rows(path), results / "sweeps" / "utilisation")
    if name == "torch":  # each system against DDP, with the bootstrap's CIs
        extra.append(torch_comparison.table(_rows(path)))
    if name in VARIANTS:  # p3kv's ratios with their CIs, what each system lost, and against the reference rows
        found = ratio_table.ratios(rows)
        reference = results / "sweeps" / "bandwidth.csv"
        extra += (["", ratio_table.table(found)] if found else []) + ["", *loss_sentences(rows)]
        extra += variant.sentences(rows, _rows(reference), VARIANTS[name], "sweeps/bandwidth.csv")
    return "\n".join([head, "", point_table(points), "", *verdicts(points), *extra])


def loss_sentences(rows: Sequence[dict]) -> list[str]:
    """Per point, each system's packets dropped by the link queues and TCP segments retransmitted (all hosts),
    median per job over the shown runs."""
    found: dict[tuple, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        if r.get("status") == "ok" and shown(r) and r.get("qdisc_drops_total") not in (None, ""):
            key = (r["model"], r["bandwidth"], number(r.get("p100_equiv_gbps")))
            found.setdefault(key, {}).setdefault(LABEL.get(r["kvstore"], r["kvstore"]), []).append(
                (number(r["qdisc_drops_total"]), number(r.get("tcp_retrans_total"))))
    lines = []
    for (model, link, eq), systems in found.items():
        each = ", ".join(f"{s} {statistics.median(d for d, _ in v):,.0f} dropped / "
                         f"{statistics.median(t for _, t in v):,.0f} retransmitted" for s, v in systems.items())
        lines.append(f"- {model}, {link} ({eq:g} Gbps): packets the link queues dropped / TCP segments "
                     f"retransmitted per job (all hosts, median): {each}.")
    return lines


def legacy_block(results: pathlib.Path) -> str:
    """The rows measured before the reviewed settings: shown as they are, optimizer none, n=1."""
    parts = []
    for name in LEGACY_RUNS:
        points = [p for p in aggregate(_rows(results / LEGACY / f"{name}.csv")) if p["legacy"]]
        if points:
            parts += [f"`{name}.csv` (bound: payload only):", "", point_table(points), ""]
    if not parts:
        return "No rows from before the reviewed settings."
    return "\n".join(parts).rstrip()


def status_block(results: pathlib.Path) -> str:
    """Which result files satisfy the reviewed settings and which predate them."""
    lines = ["| file | rows (ok) | optimizer | repeats per point (n) | bound | satisfies 1–4 |",
             "|---|---|---|---|---|---|"]
    files = sorted((results / "sweeps").glob("*.csv")) + [results / LEGACY / f"{n}.csv" for n in LEGACY_RUNS]
    for path in files:
        if path.name.endswith("_iterations.csv") or not path.exists():
            continue
        rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
        if not rows:
            continue
        legacy = rows[0]["legacy"] == "True"
        optimizers = sorted({optimizer_label(r.get("optimizer")) for r in rows})
        counts = [p["n"] for p in aggregate(rows)]  # the faithful repeats each point has, not the ones planned
        repeats = "-" if not counts else (f"{min(counts)}" if min(counts) == max(counts)
                                          else f"{min(counts)}–{max(counts)}")
        short = sum(n < MIN_REPEATS for n in counts)
        verdict = "no (predates them)" if legacy else "yes"
        if not counts and not legacy:
            verdict = "not yet: no faithful run"
        elif short and not legacy:
            verdict = f"not yet: {short} of {len(counts)} points have fewer than {MIN_REPEATS} repeats"
        lines.append(f"| `{path.relative_to(results.parent.parent)}` | {len(rows)} | {', '.join(optimizers)} | "
                     f"{repeats} | {'payload only' if legacy else 'headers included'} | {verdict} |")
    return "\n".join(lines)


def variant_summary(name: str, results: pathlib.Path) -> str:
    """The README's lines on a sweep of VARIANTS: p3kv's ratios with their CIs at each of its points, and each
    system under the varied condition against the bandwidth sweep's rows at the same point."""
    path = results / "sweeps" / f"{name}.csv"
    rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
    found = ratio_table.ratios(rows)
    if not found:
        return f"Not measured yet: `sudo .venv/bin/python -m benchmarks.suites.sweeps {name}` writes `{path.name}`."
    moved = variant.pairs(rows, _rows(results / "sweeps" / "bandwidth.csv"), VARIANTS[name])
    condition = moved[0].condition if moved else name
    points = []
    for f in sorted(found, key=lambda f: f["row"]["model"]):
        row, t = f["row"], f["throughput"]
        scale = number(row.get("gpu_scale"), 1.0) or 1.0
        versus = ", ".join(f"{e.value:.2f}× ({e.low:.2f}–{e.high:.2f}) {LABEL.get(b, b)}"
                           for b, e in f["versus"].items())
        points.append(f"{row['model']} at {number(row.get('p100_equiv_gbps')):g} Gbps {t.value / scale:,.0f} "
                      f"{row.get('unit', 'images')}/s, {versus}")
    each: dict[str, list[str]] = {}
    for p in moved:
        each.setdefault(p.model, []).append(f"{p.system} {p.ratio:.2f}×")
    against = "; ".join(f"{model} {', '.join(v)}" for model, v in each.items())
    reference = moved[0].reference_condition if moved else "the bandwidth sweep's"
    grids = _grids_under(results, rows)
    settings = (f"Each system at the setting its grid chose under {condition} where one ran ({'; '.join(grids)}), "
                f"else the one it ran under {reference}" if grids else f"Every system at the setting it ran under "
                f"{reference}")
    return (f"Under {condition} instead of {reference} (`benchmarks/results/sweeps/{name}.csv`; "
            f"{fidelity_sentence(rows)} {settings}): p3kv "
            f"{'; '.join(points)}. Each system's throughput under {condition} over its own under {reference} at the "
            f"same point (`benchmarks/results/sweeps/bandwidth.csv`): {against}.")


def _grids_under(results: pathlib.Path, rows: Sequence[dict]) -> list[str]:
    """The tuning grids (best.json) that ran under the rows' TCP congestion control, where it is not the machine's
    default: "p3kv at resnet50_v1 (its label)" each."""
    algorithms = {r.get("tcp_congestion_control") for r in rows} - {None, ""}
    best = results / "tuning" / "best.json"
    if not algorithms or not best.exists():
        return []
    found = json.loads(best.read_text())
    return [f"{LABEL.get(system, system)} at {key.split('.')[0]} ({entry['label']}, `results/tuning/{key}.md`)"
            for key, systems in sorted(found.items()) for system, entry in systems.items()
            if any(key.endswith(f".tcp-{a}") for a in algorithms) and not entry.get("smoke")]


def dilation_summary(results: pathlib.Path) -> str:
    """The README's dilation check: per headline point measured at three or more dilations, its verdict and the
    numbers behind it (analysis/dilation_check.py), from the faithful runs of results/sweeps/dilation.csv."""
    path = results / "sweeps" / "dilation.csv"
    rows = [r for r in _rows(path) if str(r.get("smoke")) != "True"]
    found = dilation_check.checks(rows)
    if not found:
        return (f"Not measured yet at {dilation_check.MIN_DILATIONS} dilations: `sudo .venv/bin/python -m "
                "benchmarks.suites.sweeps dilation` writes `benchmarks/results/sweeps/dilation.csv`.")
    dates = sorted({str(r.get("timestamp", ""))[:10] for r in rows if shown(r)} - {""})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    tcp = "/".join(sorted({key_value(r, "tcp_congestion_control").upper() for r in rows if shown(r)}))
    head = (f"From `benchmarks/results/sweeps/dilation.csv` (runs from {when}, links under TCP {tcp}; "
            f"{fidelity_sentence(rows)} Throughput: the median over every rank's timed iterations of every run; "
            "p3kv's throughput and every ratio with its 95% CI (the bootstrap over jobs, then iterations): "
            "docs/benchmarks.md, \"Dilation\".)")
    found = sorted(found, key=lambda c: (c.equivalent_gbps, c.model))  # the headline's order: ResNet-50 first
    return "\n\n".join([head, *dilation_check.sentences(found)])
