"""Older rows a faithful rerun replaces, moved out of the reviewed sweeps into results/legacy/ (issue 26 item 8).

A row of results/sweeps/<name>.csv is superseded when it has no fidelity verdict (it predates the monitors), was
judged unfaithful or ran under conditions since found unfaithful (`outdated`), and a current row of the same point
and system that the monitors judged faithful exists in the same file; and, faithful or not, when it ran another
setting of its system than the point's newest faithful run at a tuned setting (`retuned`: after `tune` chose a new
best, `--resume` reruns the system at it, and the tables must not pool the two settings). Only those move, to
results/legacy/superseded_<name>.csv (their iterations to its _iterations file): a row that nothing faithful
replaces stays where the tables read it, however old, except in a sweep whose comparison changed (RETIRED): there
every row without a verdict moves once a faithful row exists. A run's iterations are copied with it and left in
place while a kept row shares its run_id (older sweeps repeated run_ids after --resume).
The tuning grids' files (results/tuning/) stay as they are: tune.choose_best itself leaves out their unfaithful runs
and those from before a change to the emulation, and records how many in best.json, so no table reads them.

    python -m benchmarks.analysis.superseded            # what would move, per sweep
    python -m benchmarks.analysis.superseded --move     # move it; then python -m benchmarks.report
"""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import sys
from collections.abc import Sequence

from benchmarks.analysis import bench_rows
from benchmarks.analysis.points import equivalent_gbps, key_value, optimizer_label, setting_identity
from benchmarks.paths import RESULTS
from benchmarks.suites import torch_systems

LOG = logging.getLogger("superseded")
# Sweeps whose comparison changed: every row without a verdict is from the old one, which nothing reruns, so it
# moves once the file holds faithful rows of the new one (a rerun of the old comparison could not be told apart).
RETIRED = {"dilation": "the comparison moved from 10 Gbit/s P100-equivalent without CPU limits to 4 Gbit/s with "
                       "them (the dilation must scale CPU like compute and links)"}
# A point and system, whatever its dilation, CPU limit or run: what a faithful rerun replaces.
SAME = ("tag", "model", "kvstore", "hosts", "layout", "compute", "batch_size", "efficiency_factor", "slice_size",
        "link_queue_ms", "tcp_congestion_control")


# Sweeps whose variable is the dilation itself: there a run at one --gpu-scale replaces none at another (an
# unfaithful run at 0.05 is that dilation's verdict, not an old row).
BY_DILATION = ("dilation",)


def point_of(row: dict, by_dilation: bool = False) -> tuple:
    gbps = equivalent_gbps(row)
    return (*(key_value(row, k) for k in SAME), optimizer_label(row.get("optimizer")),
            round(gbps, 3) if gbps else row.get("bandwidth"), key_value(row, "gpu_scale") if by_dilation else "")


def is_p3kv(kvstore: str) -> bool:
    """Whether a row's system is p3kv (MXNet's kvstore 'p3', its ablations p3-*, p3kv.torch torch-p3kv*)."""
    return kvstore == "p3" or kvstore.startswith(("p3-", "torch-p3kv"))


def outdated_by(row: dict) -> str:
    """What a row the monitors passed predates, if it no longer measures what a rerun would ("" if current): an
    emulated Horovod run from before its cycle time was dilated (no horovod_cycle_ms;
    cluster_job.Point.horovod_cycle_real_ms), under conditions since found unfaithful; an emulated p3kv run from
    before the sender's priority hold (no priority_hold_ms; sender.h), whose transport has since changed; a
    CPU-limited run whose threads were not capped at one dilated CPU (no thread_cap_cores; thread_cap.py, on by
    default since): one thread could run at its host's whole quota, which the monitors do not see; a capped run
    from before its processes had the host's CPU count of OpenMP threads (no omp_threads; thread_cap.omp_threads):
    a server's sums and updates then ran on one of the host's CPUs; a p3kv.torch server-placement run from before
    its copy of the new weights into the parameters ran on the virtual GPU (no weight_copy): the training loop's
    thread made it, CPU a GPU host does not spend; a p3kv.torch or DDP run from before the systems' own passes over
    the gradients during backward ran on the virtual GPU (no gradient_work; emulation/gradient_work.py): the training
    loop's thread made them (DDP's bucket copies, p3kv.torch's scaling into its send buffers) at its cap."""
    if row.get("compute") != "emulated":
        return ""
    if row.get("kvstore") in torch_systems.SYSTEMS and not row.get("gradient_work"):
        return "the gradient passes on the virtual GPU"
    if row.get("kvstore") == "torch-p3kv-server" and not row.get("weight_copy"):
        return "the weight copy on the virtual GPU"
    if row.get("kvstore") == "horovod" and not row.get("horovod_cycle_ms"):
        return "its cycle time was dilated"
    if is_p3kv(str(row.get("kvstore", ""))) and not row.get("priority_hold_ms"):
        return "the priority hold"
    if row.get("host_cpus") and not row.get("thread_cap_cores"):
        return "per-thread caps"
    if row.get("thread_cap_cores") and not row.get("omp_threads"):
        return "OpenMP threads per host"
    return ""


def outdated(row: dict) -> bool:
    """Whether a row is outdated (outdated_by): a rerun replaces it as it replaces an unfaithful one."""
    return bool(outdated_by(row))


def _replaces(row: dict) -> bool:
    """Whether a row can replace others: an ok, faithful, current run that is not a smoke run."""
    return (row.get("status") == "ok" and bench_rows.verdict(row) is True and str(row.get("smoke")) != "True"
            and not outdated(row))


def retuned(rows: Sequence[dict], by_dilation: bool = False) -> dict[tuple, str]:
    """Per point and system, the setting (its identity) of the newest run that can replace others and ran a tuned
    setting (a baseline_setting label with "(tuned", tune's labels): that system's current best there. Runs at
    the defaults without a tuning ("default (untuned)", --untuned) never set it."""
    newest: dict[tuple, tuple[str, str]] = {}
    for r in rows:
        if _replaces(r) and "(tuned" in str(r.get("baseline_setting") or ""):
            key, stamp = point_of(r, by_dilation), str(r.get("timestamp") or "")
            if key not in newest or stamp >= newest[key][0]:
                newest[key] = (stamp, setting_identity(str(r["baseline_setting"])))
    return {key: setting for key, (_, setting) in newest.items()}


def superseded(rows: Sequence[dict], retired: bool = False, by_dilation: bool = False) -> list[int]:
    """The positions of the rows (ok or not) that a faithful, current row of the same point and system replaces
    (at the same --gpu-scale only, with `by_dilation`): those without a faithful verdict, and outdated ones; in a
    retired sweep's file (RETIRED) with any faithful row, every row without a verdict as well; and every row at
    another setting than the point's current tuned one (`retuned`)."""
    replaced = {point_of(r, by_dilation) for r in rows if _replaces(r)}
    current = retuned(rows, by_dilation)

    def other_setting(r: dict) -> bool:
        setting = current.get(point_of(r, by_dilation))
        return setting is not None and setting_identity(str(r.get("baseline_setting") or "")) != setting
    def unfaithful_and_replaced(r: dict) -> bool:
        return (bench_rows.verdict(r) is not True or outdated(r)) and (
            point_of(r, by_dilation) in replaced or (retired and replaced and bench_rows.verdict(r) is None))
    return [i for i, r in enumerate(rows) if other_setting(r) or unfaithful_and_replaced(r)]


def _read(path: pathlib.Path) -> tuple[list[str], list[dict]]:
    if not path.exists():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _write(path: pathlib.Path, fields: Sequence[str], rows: Sequence[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def _append(path: pathlib.Path, fields: Sequence[str], rows: Sequence[dict]) -> None:
    """Adds `rows` to the file; where the schema gained columns since its rows were written, the file gets them
    (empty in its older rows, as bench_rows.write_run does)."""
    old_fields, old = _read(path)
    union = [*old_fields, *(f for f in fields if f not in old_fields)] if old else list(fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, union, [*old, *rows])


def move(sweep_csv: pathlib.Path, legacy_dir: pathlib.Path, dry_run: bool = False) -> int:
    """Moves the superseded rows of one sweep's CSV (and their iterations); returns how many."""
    fields, rows = _read(sweep_csv)
    if "faithful" not in fields:
        return 0  # nothing in it was judged: nothing can have been replaced
    gone = set(superseded(rows, retired=sweep_csv.stem in RETIRED, by_dilation=sweep_csv.stem in BY_DILATION))
    if not gone or dry_run:
        return len(gone)
    moved = [r for i, r in enumerate(rows) if i in gone]
    by_position = [r for i, r in enumerate(rows) if i not in gone]
    _append(legacy_dir / f"superseded_{sweep_csv.name}", fields, moved)
    _write(sweep_csv, fields, by_position)
    iterations = bench_rows.iterations_path(sweep_csv)
    iteration_fields, iteration_rows = _read(iterations)
    if iteration_rows:
        kept_ids = {r.get("run_id") for r in by_position}
        moved_ids = {r.get("run_id") for r in moved}
        _append(bench_rows.iterations_path(legacy_dir / f"superseded_{sweep_csv.name}"), iteration_fields,
                [r for r in iteration_rows if r.get("run_id") in moved_ids])
        _write(iterations, iteration_fields, [r for r in iteration_rows
                                              if r.get("run_id") not in moved_ids or r.get("run_id") in kept_ids])
    LOG.info("%s: moved %d rows a faithful rerun replaces to %s", sweep_csv.name, len(moved), legacy_dir)
    return len(moved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--move", action="store_true", help="move them (default: only say what would move)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    legacy = args.results_dir / "legacy"
    for path in sorted((args.results_dir / "sweeps").glob("*.csv")):
        if path.stem.endswith("_iterations"):
            continue
        count = move(path, legacy, dry_run=not args.move)
        LOG.info("%s: %d rows %s", path.name, count, "moved" if args.move else "a faithful rerun replaces")
    return 0


if __name__ == "__main__":
    sys.exit(main())
