"""The accuracy benchmark's results (suites/accuracy.py's rows): time to each target accuracy, final accuracy
and iteration time per system with their spread over repeats, whether the systems made the same updates, the
paper's numbers beside ours, and the figure."""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Sequence

from benchmarks.analysis import bench_rows, bench_stats

LABELS = {"p3": "p3kv (P3)", "dist_sync": "MXNet dist_sync", "dist_async": "MXNet dist_async (ASGD)"}


# The paper's Fig. 15 (appendix B.2), as its text states them.
PAPER = {"setting": "ResNet-110 on CIFAR-10, 4 machines, 1 Gbps", "final": {"P3": 93.0, "ASGD": 88.0},
         "to_80_speedup": 6.0}


def time_to(rows: Sequence[dict], target: float) -> float | None:
    """Seconds until the test accuracy first reached `target` (rows of one run), None if it never did."""
    return next((float(r["time_s"]) for r in rows if float(r["test_accuracy"]) >= target), None)


def runs_of(rows: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            runs.setdefault((r["system"], int(r["repeat"])), []).append(r)
    for run in runs.values():
        run.sort(key=lambda r: int(r["iteration"]))
    return runs


def iteration_spread(jobs: Sequence[dict], system: str) -> bench_stats.Spread | None:
    """Seconds per iteration of `system` over every timed iteration of every repeat (run rows, bench_rows)."""
    times = [bench_rows.iteration_times(j) for j in jobs if j.get("kvstore") == system and j.get("status") == "ok"]
    return bench_stats.spread(times) if any(times) else None


def same_updates_sentence(runs: dict[tuple[str, int], list[dict]]) -> str | None:
    """Whether p3kv and dist_sync drew the same curve in every repeat both ran: they compute the same updates, so
    every evaluation's test accuracy and loss (as the CSV prints them) must match."""
    repeats = sorted(r for s, r in runs if s == "p3" and ("dist_sync", r) in runs)
    if not repeats:
        return None

    def curve(system: str, repeat: int) -> list[tuple[str, str, str]]:
        return [(r["iteration"], r["test_accuracy"], r.get("test_loss")) for r in runs[(system, repeat)]]

    differ = [r for r in repeats if curve("p3", r) != curve("dist_sync", r)]
    evaluations = len(runs[("p3", repeats[0])])
    if not differ:
        return (f"In all {len(repeats)} repeats p3kv and dist_sync gave the same test accuracy and loss (as the CSV "
                f"prints them) at every one of the {evaluations} evaluations: the same updates, as they must.")
    return (f"p3kv and dist_sync drew different curves in repeat(s) {', '.join(map(str, differ))} of "
            f"{len(repeats)}: they should compute the same updates.")


def spread_sentences(runs: dict[tuple[str, int], list[dict]], jobs: Sequence[dict]) -> list[str]:
    """Final accuracy over the repeats per system, and whether p3kv's and dist_sync's iteration IQRs overlap."""
    finals = []
    for system in dict.fromkeys(s for s, _ in runs):
        values = [100 * float(run[-1]["test_accuracy"]) for (s, _), run in runs.items() if s == system]
        span = f"{min(values):.1f}%" if min(values) == max(values) else f"{min(values):.1f}–{max(values):.1f}%"
        finals.append(f"{LABELS.get(system, system)} {span}")
    sentences = [f"Final test accuracy over the repeats: {', '.join(finals)}."]
    p3, ds = iteration_spread(jobs, "p3"), iteration_spread(jobs, "dist_sync")
    if p3 and ds:
        overlap = p3.q1_s <= ds.q3_s and ds.q1_s <= p3.q3_s
        sentences.append(f"Seconds per iteration: p3kv median {p3.median_s:.3f} (IQR {p3.q1_s:.3f}–{p3.q3_s:.3f}), "
                         f"dist_sync {ds.median_s:.3f} (IQR {ds.q1_s:.3f}–{ds.q3_s:.3f}): the IQRs "
                         + ("overlap." if overlap else "do not overlap."))
    return sentences


def summary(rows: Sequence[dict], targets: Sequence[float], jobs: Sequence[dict] = ()) -> str:
    """Markdown table per system: final accuracy, time to each target (medians over repeats), s/iter: median
    and interquartile range over all iterations of all repeats from the run rows `jobs` (bench_stats), or, for
    curves written before those rows existed, the median of each run's recorded median (no IQR)."""
    runs = runs_of(rows)
    systems = list(dict.fromkeys(system for system, _ in runs))
    header = (["system", "runs", "final test accuracy", "median s/iter"] + [f"time to {t:.0%}" for t in targets]
              + ["s/iter IQR"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ttas: dict[str, dict[float, float | None]] = {}
    for system in systems:
        mine = [run for (s, _), run in runs.items() if s == system]
        final = statistics.median(float(run[-1]["test_accuracy"]) for run in mine)
        spread = iteration_spread(jobs, system)
        per_iter = spread.median_s if spread else statistics.median(float(run[0]["median_iter_s"]) for run in mine)
        iqr = f"{spread.q1_s:.3f}–{spread.q3_s:.3f}" if spread else "-"
        ttas[system] = {}
        cells = []
        for t in targets:
            times = [time_to(run, t) for run in mine]
            reached = [x for x in times if x is not None]
            value = statistics.median(reached) if len(reached) == len(times) else None
            ttas[system][t] = value
            cells.append(f"{value:.1f} s" if value is not None else f"not reached ({len(reached)}/{len(times)})")
        lines.append(f"| {LABELS.get(system, system)} | {len(mine)} | {100 * final:.1f}% | {per_iter:.3f} | "
                     + " | ".join(cells) + f" | {iqr} |")
    notes = []
    for t in targets:
        asgd = ttas.get("dist_async", {}).get(t)
        for system in ("p3", "dist_sync"):
            mine = ttas.get(system, {}).get(t)
            if asgd and mine:
                notes.append(f"{LABELS[system]} reached {t:.0%} {asgd / mine:.2f}x as fast as ASGD")
    if not rows:
        return "No runs.\n"
    first = rows[0]
    loads = [float(r[k]) for r in rows for k in ("load_1m_before", "load_1m_after") if r.get(k) not in (None, "")]
    settings = (f"Settings: {first.get('hosts', '?')} hosts (one worker + one server each), "
                f"{first.get('bandwidth', '?')} links, {first.get('model', '?')} ({first.get('params', '?')} "
                f"parameters) on {first.get('dataset', '?')}, batch {first.get('batch_size', '?')} per worker, "
                f"{first.get('optimizer', '?')} (lr {first.get('lr', '?')}, momentum {first.get('momentum', '?')}, "
                f"wd {first.get('wd', '?')}), {first.get('compute_s', '?')} s/iteration emulated compute, "
                f"{first.get('iters', '?')} iterations, test accuracy every {first.get('eval_every', '?')}, seed "
                f"{first.get('seed', '?')}; 1-minute load "
                + (f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?")
                + f" on {first.get('cpus', '?')} cores; commit {str(first.get('git_commit', '?'))[:10]}"
                + (" (uncommitted changes)" if any(str(r.get("git_dirty")) == "True" for r in rows) else "")
                + ("; some runs started on a busy machine (--force)" if any(str(r.get("forced")) == "True"
                                                                           for r in rows) else "") + ".")
    paper = (f"The paper (Fig. 15, {PAPER['setting']}): P3 {PAPER['final']['P3']:.0f}% vs ASGD "
             f"{PAPER['final']['ASGD']:.0f}% final top-1 accuracy; P3 reached 80% about {PAPER['to_80_speedup']:.0f}x "
             "as fast.")
    facts = [f for f in (same_updates_sentence(runs), *spread_sentences(runs, jobs)) if f]
    return (settings + "\n\n" + "\n".join(lines) + "\n\n" + ("; ".join(notes) + ".\n\n" if notes else "")
            + " ".join(facts) + "\n\n" + paper + "\n")


def plot(rows: Sequence[dict], path: pathlib.Path, title: str, target: float) -> None:
    """Test accuracy against time and against iterations, and the paper's Fig. 15 numbers beside ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs_of(rows)
    if not runs:
        return
    colors = {"p3": "tab:blue", "dist_sync": "tab:gray", "dist_async": "tab:orange"}
    fig, (by_time, by_iter, paper) = plt.subplots(1, 3, figsize=(15, 4.2))
    seen = set()
    for (system, _), run in runs.items():
        label = None if system in seen else LABELS.get(system, system)
        seen.add(system)
        xs_t = [float(r["time_s"]) for r in run]
        xs_i = [int(r["iteration"]) for r in run]
        ys = [100 * float(r["test_accuracy"]) for r in run]
        # dist_sync dashed on top: where it equals p3kv (per iteration), both stay visible.
        style, z = ("--", 3) if system == "dist_sync" else ("-", 2)
        by_time.plot(xs_t, ys, style, color=colors.get(system), label=label, zorder=z)
        by_iter.plot(xs_i, ys, style, color=colors.get(system), label=label, zorder=z)
    for ax, xlabel in ((by_time, "wall-clock time (s)"), (by_iter, "iteration (per worker)")):
        ax.axhline(100 * target, color="tab:red", linewidth=0.7, linestyle=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    by_time.set_title(title, fontsize=9)
    by_iter.set_title("per iteration\n(p3kv and dist_sync compute the same updates)", fontsize=9)
    final = {s: 100 * statistics.median(float(run[-1]["test_accuracy"]) for (x, _), run in runs.items() if x == s)
             for s in dict.fromkeys(s for s, _ in runs)}
    names = ["paper: P3", "paper: ASGD"] + [f"ours: {LABELS.get(s, s)}" for s in final]
    values = [PAPER["final"]["P3"], PAPER["final"]["ASGD"], *final.values()]
    bars = paper.barh(names, values, color=["tab:blue", "tab:orange"] + [colors.get(s, "tab:gray") for s in final],
                      alpha=0.8)
    paper.bar_label(bars, fmt="%.1f%%", fontsize=8)
    paper.set_xlim(0, 110)
    paper.invert_yaxis()
    paper.set_xlabel("final test accuracy (%)")
    paper.set_title(f"the paper's Fig. 15 ({PAPER['setting']}:\nP3 reached 80% ~{PAPER['to_80_speedup']:.0f}x "
                    "sooner than ASGD) beside ours", fontsize=8, loc="right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
