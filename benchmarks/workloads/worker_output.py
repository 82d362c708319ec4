"""The tail every benchmark worker shares: its --out argument, its log format, the versions that ran, and how
its result reaches the runner (one JSON line appended by worker 0, or one JSON file per rank)."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import platform
import sys


def add_out_argument(parser: argparse.ArgumentParser, per_rank: bool = False, required: bool = False) -> None:
    """--out: a file worker 0 appends its JSON line to, or (`per_rank`) a prefix every rank writes
    <out>.rank<r>.json under."""
    if per_rank:
        parser.add_argument("--out", required=True, help="result path prefix: writes <out>.rank<r>.json")
    else:
        parser.add_argument("--out", type=pathlib.Path, default=None, required=required,
                            help="worker 0 appends its JSON line here")


def add_iteration_arguments(parser: argparse.ArgumentParser, warmup: int, iters: int) -> None:
    """--warmup (untimed) and --iters (timed) iterations; check_iterations validates them after parsing."""
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters)


def check_iterations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be >= 1 and --warmup >= 0")


def start_logging(rank_lines: bool = False) -> None:
    """The workers' log format. `rank_lines`: on stdout without the level, the lines the emulated-cluster runner
    relays as "[host<i>] ..." while a job runs; else on stderr at BENCH_LOG_LEVEL (default INFO)."""
    if rank_lines:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(message)s")
    else:
        logging.basicConfig(level=os.environ.get("BENCH_LOG_LEVEL", "INFO"),
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")


def versions(*packages: str, p3kv_path: bool = False) -> dict:
    """Python's version and each installed package's (None when missing), read from package metadata so that a
    worker that never imports mxnet does not have to. `p3kv_path`: also which checkout runs (an editable
    install may point elsewhere than the one being measured)."""
    found: dict = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    if p3kv_path:
        spec = importlib.util.find_spec("p3kv")
        found["p3kv_path"] = str(pathlib.Path(spec.origin).parent) if spec and spec.origin else None
    return found


def append_line(path: pathlib.Path, row: dict) -> None:
    """Appends `row` as one JSON line to `path` (creating its folder): the runner reads the last line."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def write_rank(prefix: str, rank: int, result: dict) -> pathlib.Path:
    """Writes `result` to <prefix>.rank<rank>.json (one file per rank, which the runner collects)."""
    path = pathlib.Path(f"{prefix}.rank{rank}.json")
    path.write_text(json.dumps(result))
    return path


# The folder in which an emulated-cluster runner counts the workers that have built their models (cluster_job.py:
# per-thread caps begin when all have, thread_cap.py); unset elsewhere (fab bench, the loopback benches).
READY_ENV = "BENCH_READY_DIR"


def mark_ready() -> None:
    """Says this worker has built its model and is about to iterate: a file named after its pid in the folder
    $BENCH_READY_DIR, which the runner counts; nothing where no runner asked (unset)."""
    folder = os.environ.get(READY_ENV)
    if not folder:
        return
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(folder) / str(os.getpid())).touch()


def mark_progress() -> None:
    """Says this worker finished an iteration: touches its ready marker, whose age the runner watches to stop a
    job that has stalled (benchmarks/emulation/job_watch.py); nothing where no runner asked."""
    folder = os.environ.get(READY_ENV)
    if folder:
        try:
            os.utime(pathlib.Path(folder) / str(os.getpid()))
        except OSError:  # no marker (mark_ready was not called): nothing to watch
            pass


def ready_count(folder: str) -> int:
    """How many workers have said they are ready in `folder` (mark_ready)."""
    try:
        return len(os.listdir(folder))
    except OSError:
        return 0


def leave_without_gloo_teardown() -> None:
    """Ends a gloo rank that has written its result and passed the job's last barrier, skipping gloo's teardown
    at exit, which hangs or aborts now and then in torch 2.13 on CPU (tests/torch_jobs.py): logs and streams are
    flushed first, then the process exits 0 at once."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
