"""The benchmark tables of docs/benchmarks.md and the README's headline, with the sentences around them,
generated from the result CSVs.

    python -m benchmarks.report            # rewrite every <!-- bench:NAME --> ... <!-- /bench:NAME --> block
    python -m benchmarks.report --check    # exit 1 if a block differs from what the CSVs give now

Every number in a block comes from the rows: per point (a model, link, host count, optimizer, ... and system)
the median throughput over every timed iteration of every repeat, its interquartile range, the range of the
per-repeat medians, n (repeats), the header-inclusive bound and the CPU the hosts used. Rows from before the
reviewed schema (results/legacy/: no optimizer, one run, payload-only bound) are not results: the README's
status table only names their files, and their tables go to results/legacy/README.md (the same blocks), with
optimizer "none" and n=1. Rows marked smoke are never shown.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import re
import sys
from collections.abc import Callable, Sequence

from benchmarks.analysis import bench_rows, torch_comparison
from benchmarks.paths import RESULTS, ROOT
from benchmarks.report.headline import headline_block
from benchmarks.report.loopback_blocks import server_slice_block, startup_sentences, summary_block
from benchmarks.report.paper_table import paper_table_block
from benchmarks.report.sim_blocks import (
    sim_future_block,
    sim_paper_block,
    sim_slice_block,
    sim_summary_block,
    sim_validation_block,
)
from benchmarks.report.sweep_blocks import (
    LEGACY,
    dilation_summary,
    legacy_block,
    reviewed_block,
    status_block,
    variant_summary,
)

LOG = logging.getLogger("report")
SWEEPS_DIR = RESULTS / "sweeps"  # rows that satisfy the reviewed schema (optimizer, repeats, load, headers)


README = ROOT / "README.md"
DOCS = ROOT / "docs" / "benchmarks.md"  # the tables; the README shows the headline only
TORCH_DOC = ROOT / "docs" / "torch.md"  # the PyTorch comparison's table (bench:torch)


SUMMARIES = {
    "kvstore": ("kvstore_bench.md", "make bench-kvstore"),
    "accuracy": ("accuracy/accuracy.md", "make bench-accuracy"),
    "kvstore-slice": ("kvstore_bench_slice10000/kvstore_bench.md",
                      "python -m benchmarks.suites.kvstore_bench --systems p3-noopt --slice-size 10000"),
    "startup": ("startup.md", "make bench-startup"),
    "link-overhead": ("link_overhead.md", "sudo .venv/bin/python -m benchmarks.suites.link_overhead"),
    "soak": ("soak.md", "python -m benchmarks.suites.soak_bench --iters 10000"),
    "priority-hold": ("priority_hold/summary.md", "the runs in benchmarks/analysis/priority_hold.py's docstring, "
                      "then python -m benchmarks.analysis.priority_hold"),
    "priority-hold-traces": ("priority_hold/traces.md", "P3_TRACE=PREFIX on one run of each, then python -m "
                             "benchmarks.analysis.trace_anatomy PREFIX ..."),
    "tcp-trace": ("tcp_trace/summary.md", "the traced runs in benchmarks/analysis/tcp_trace.py's docstring, then "
                  "python -m benchmarks.analysis.tcp_trace"),
    "torch-loopback": ("torch_loopback.md", "python -m benchmarks torch_loopback --model resnet50_v1 --workers 2 "
                       "--repeats 5 --csv benchmarks/results/torch_loopback.csv"),
}


def _estimate_block(results: pathlib.Path) -> str:
    from benchmarks.suites import sweeps  # imports this module: loaded only when the block is written

    return sweeps.estimate_block(results / "sweeps")


def _torch_headline(results: pathlib.Path) -> str:
    """p3kv.torch against DDP per point of the torch sweep, and DDP's tuning grids."""
    best_path = results / "tuning" / "best.json"
    best = json.loads(best_path.read_text()) if best_path.exists() else {}
    table = torch_comparison.headline(bench_rows.read_runs(results / "sweeps" / "torch.csv"),
                                      chosen=torch_comparison.grid_choices(best, results / "tuning"))
    if not table:
        return ("Not measured yet: `python -m benchmarks.suites.sweeps torch` writes "
                "`benchmarks/results/sweeps/torch.csv`.")
    grids = torch_comparison.tuning_sentences(best)
    return "\n".join([table, *([""] + grids if grids else [])])


def blocks(results: pathlib.Path = RESULTS) -> dict[str, Callable[[], str]]:
    named: dict[str, Callable[[], str]] = {"status": lambda: status_block(results),
                                           "legacy": lambda: legacy_block(results)}
    named["estimate"] = lambda: _estimate_block(results)
    named["headline"] = lambda: headline_block(results)
    named["torch-headline"] = lambda: _torch_headline(results)
    named["cubic-headline"] = lambda: variant_summary("cubic", results)
    named["dilation-check"] = lambda: dilation_summary(results)
    named["paper-comparison"] = lambda: paper_table_block(results)
    named["sim-validation"] = lambda: sim_validation_block(results)
    named["sim-summary"] = lambda: sim_summary_block(results)
    named["sim-paper"] = lambda: sim_paper_block(results)
    named["sim-future"] = lambda: sim_future_block(results)
    named["sim-slice"] = lambda: sim_slice_block(results)
    named["server-slice"] = lambda: server_slice_block(results)
    named["startup-effect"] = lambda: startup_sentences(results)
    for name, (file, command) in SUMMARIES.items():
        named[name] = (lambda f=file, c=command: summary_block(results / f, c))
    for name in ("demo", "bandwidth", "sensitivity", "dilation", "ablation", "slice", "scale", "utilisation",
                 "shallow", "cubic", "torch"):
        named[name] = (lambda n=name: reviewed_block(n, results))
    return named


BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)


def render(text: str, results: pathlib.Path = RESULTS) -> str:
    """`text` with every known block's body replaced by what the CSVs give now."""
    makers = blocks(results)

    def replace(match: re.Match) -> str:
        maker = makers.get(match["name"])
        if maker is None:
            raise SystemExit(f"README block bench:{match['name']} is not one report.py writes ({', '.join(makers)})")
        return f"{match.group(1)}{maker()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def stale_bound_rows(sweeps_dir: pathlib.Path) -> list[str]:
    """"file:run_id" of every reviewed row whose stored bound is not what wire_bound.py gives now."""
    from benchmarks.suites import cluster_job, sweeps

    return [f"{p.name}:{run_id}" for p in sweeps.run_csvs(sweeps_dir)
            for run_id in bench_rows.stale_bounds(p, cluster_job.bound_columns)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=pathlib.Path, action="append", dest="documents",
                        help="rewrite (or check) only this document; repeatable (default: README.md, "
                        "docs/benchmarks.md, docs/torch.md and results/legacy/README.md)")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    documents = args.documents or [README, DOCS, TORCH_DOC, args.results_dir / LEGACY / "README.md"]
    rendered = {d: (d.read_text(), render(d.read_text(), args.results_dir)) for d in documents if d.exists()}
    if args.check:
        stale = stale_bound_rows(args.results_dir / "sweeps")
        if stale:
            LOG.error("%d rows' bound columns differ from wire_bound.py as it is now (%s%s); run python "
                      "benchmarks/suites/sweeps.py rebound", len(stale), ", ".join(stale[:3]),
                      ", ..." if len(stale) > 3 else "")
            return 1
        stale_documents = [str(d) for d, (text, new) in rendered.items() if new != text]
        if stale_documents:
            LOG.error("%s: benchmark blocks differ from the CSVs; run python -m benchmarks.report",
                      ", ".join(stale_documents))
            return 1
        return 0
    for document, (text, new) in rendered.items():
        if new != text:
            document.write_text(new)
            LOG.info("rewrote the benchmark blocks of %s", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
