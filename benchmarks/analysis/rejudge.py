"""Rows measured before fidelity rule 1 changed for capped runs, judged again (fidelity.py's module doc).

Until 2026-12-03 a run whose host was throttled over 5% of its timed window failed, with or without per-thread
caps. With the caps that throttling is the contention of a real host of --host-cpus CPUs, so such a run is now
faithful and flagged CPU-bound. A capped row whose only failure is that throttling note is rewritten: faithful
True, the note replaced by the flag. Nothing else in a row changes; uncapped rows and rows with any other
failure stay as they are.

    python -m benchmarks.analysis.rejudge                   # every run CSV under benchmarks/results/
    python -m benchmarks.analysis.rejudge path/to/runs.csv  # or these
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import pathlib
import re
import sys
from collections.abc import Sequence

from benchmarks.emulation import fidelity
from benchmarks.paths import RESULTS

LOG = logging.getLogger("rejudge")

THROTTLED = re.compile(r"^cpu: (host \d+ throttled [\d.]+% of the timed window \([\d.]+ of [\d.]+ s, limit [\d.]+%\))$")


def rejudged(row: dict) -> dict | None:
    """The row under the current rule 1, or None where it does not change."""
    if str(row.get("faithful")) != "False" or not row.get("thread_cap_cores"):
        return None
    notes = row.get("fidelity_notes") or ""
    failed = fidelity.failures(notes)
    if len(failed) != 1 or not (found := THROTTLED.match(failed[0])):
        return None
    kept = [fidelity.cpu_bound_flag(found.group(1)) if n == failed[0] else n for n in notes.split("; ")]
    return {**row, "faithful": "True", "fidelity_notes": "; ".join(kept)}


def rewrite(path: pathlib.Path) -> int:
    """Rewrites the rows of run CSV `path` that rule 1 now judges faithful (each such line in place, with its own
    line ending: the rest of the file stays byte for byte); how many there were."""
    with path.open(newline="") as f:
        lines = f.read().splitlines(keepends=True)
    if not lines:
        return 0
    header = next(csv.reader([lines[0]]))
    if "faithful" not in header or "fidelity_notes" not in header:
        return 0
    changed = 0
    for i, line in enumerate(lines[1:], start=1):
        values = next(csv.reader([line]), None)
        new = rejudged(dict(zip(header, values))) if values and len(values) == len(header) else None
        if new is None:
            continue
        out = io.StringIO()
        csv.writer(out, lineterminator=line[len(line.rstrip("\r\n")):] or "\n").writerow([new[k] for k in header])
        lines[i], changed = out.getvalue(), changed + 1
    if changed:
        with path.open("w", newline="") as f:
            f.write("".join(lines))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="*", type=pathlib.Path, help="run CSVs (default: every one under results/)")
    args = parser.parse_args(argv)
    paths = args.csv or sorted(p for p in RESULTS.rglob("*.csv") if not p.name.endswith("_iterations.csv"))
    for path in paths:
        n = rewrite(path)
        if n:
            LOG.info("%s: %d row(s) now faithful, flagged CPU-bound", path, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
