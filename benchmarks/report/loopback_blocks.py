"""The blocks of the loopback and single-process benchmarks: a runner's own summary copied, the server's CPU per
slice against its memory floor, and the start-up effect."""

from __future__ import annotations

import csv
import pathlib
import statistics

from benchmarks.paths import ROOT


def summary_block(path: pathlib.Path, command: str) -> str:
    """A runner's own summary (its markdown file, title line dropped), or how to produce it."""
    if not path.exists():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"Not measured yet: `{command}` writes `{where}`."
    lines = path.read_text().strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip()


SERVER_TARGET = 2.0  # the hot-path issue's target: a slice's server CPU at most this many times the memory floor


SERVER_OPTIMIZERS = (("none", "aggregate only"), ("sgd", "SGD momentum"), ("adam", "Adam"))


def server_slice_block(results: pathlib.Path) -> str:
    """server_bench.py's work / floor ratios, condensed: every optimizer at the default slice for each W, and the
    other slice sizes at the smallest W; then the spread per optimizer and the points above the target."""
    path = results / "server_slice.csv"
    if not path.exists():
        return "Not measured yet: `make bench-server` writes `benchmarks/results/server_slice.csv`."
    rows = plain_rows(path)
    ratio = {(r["optimizer"], int(r["count"]), int(r["workers"])): float(r["ratio_median"]) for r in rows}
    counts = sorted({c for _, c, _ in ratio})
    workers = sorted({w for _, _, w in ratio})
    default = 50_000 if 50_000 in counts else counts[0]
    others = [c for c in counts if c != default]
    optimizers = [(o, label) for o, label in SERVER_OPTIMIZERS if any(k[0] == o for k in ratio)]

    def cell(o: str, c: int, w: int) -> str:
        return f"{ratio[(o, c, w)]:.2f}" if (o, c, w) in ratio else "-"

    def size(c: int) -> str:
        return f"{c // 1000}k" if c % 1000 == 0 else f"{c:,}"

    lines = ["| slice, W | " + " | ".join(label for _, label in optimizers) + " |",
             "|---|" + "---|" * len(optimizers)]
    lines += [f"| {size(default)}, W={w} | " + " | ".join(cell(o, default, w) for o, _ in optimizers) + " |"
              for w in workers]
    if others:
        lines.append(f"| {' / '.join(size(c) for c in others)}, W={workers[0]} | "
                     + " | ".join(" / ".join(cell(o, c, workers[0]) for c in others) for o, _ in optimizers) + " |")
    first = rows[0]
    dirty = str(first.get("git_dirty", "")) == "True" or "git_dirty" not in first
    busy = first.get("busy_pct_before")
    head = (f"`benchmarks/results/server_slice.csv`, commit {first.get('commit', '?')[:12]}"
            f"{' (the tree had uncommitted changes, or the run predates that column)' if dirty else ''}: "
            f"median of {first.get('repeats', '?')} repeats of work / floor; "
            + (f"CPUs {float(busy):.0f}% busy over a 5-second sample before it, " if busy not in (None, "") else
               "no CPU sample before it (the run predates the run guard), ")
            + f"1-minute load {first.get('load_1m_before', '?')} before, {first.get('load_1m_after', '?')} after.")
    sentences = []
    for o, label in optimizers:
        values = [v for k, v in ratio.items() if k[0] == o]
        above = sorted((k for k, v in ratio.items() if k[0] == o and v > SERVER_TARGET), key=lambda k: (k[1], k[2]))
        where = ", ".join(f"{size(c)} with W={w} ({ratio[(o, c, w)]:.2f})" for _, c, w in above)
        sentences.append(f"- {label}: {min(values):.2f}–{max(values):.2f}× the floor over the {len(values)} "
                         "pairs of slice size and W; "
                         + (f"above the {SERVER_TARGET:g}× target at {where}." if above else
                            f"within the {SERVER_TARGET:g}× target everywhere."))
    return "\n".join([head, "", *lines, "", *sentences])


def startup_sentences(results: pathlib.Path) -> str:
    """What importing mxnet at server start-up does to the first step and the job's CPU, per place of the
    optimizer: medians over the repeats of results/startup.csv (startup_bench.py)."""
    path = results / "startup.csv"
    if not path.exists():
        return "Not measured yet: `make bench-startup` writes `benchmarks/results/startup.csv`."
    rows = [r for r in plain_rows(path) if r["status"] == "ok"]

    def median(update: str, preload: str, column: str) -> float | None:
        values = [float(r[column]) for r in rows if r["optimizer_on"] == update and r["preload_mxnet"] == preload]
        return statistics.median(values) if values else None

    lines = []
    for update in ("servers", "workers"):
        first = median(update, "1", "first_step_s"), median(update, "0", "first_step_s")
        cpu = median(update, "1", "cpu_s"), median(update, "0", "cpu_s")
        if None in first or None in cpu:
            continue
        lines.append(f"- Optimizer on the {update}: with the preload the first step comes "
                     f"{'earlier' if first[0] < first[1] else 'later'} (median {first[0]:.2f} s against "
                     f"{first[1]:.2f} s without), and the job uses {cpu[0]:.2f} s of CPU against {cpu[1]:.2f} s "
                     f"({cpu[0] / cpu[1]:.2f}×).")
    return "\n".join(lines) or "No completed jobs in `benchmarks/results/startup.csv`."


def plain_rows(path: pathlib.Path) -> list[dict]:
    """A CSV that is not a run CSV (the simulator's), as it is."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
