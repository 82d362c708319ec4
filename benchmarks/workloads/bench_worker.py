"""One worker of the transport benchmark: push + broadcast every array of a model, no model compute.

Run under the launcher, in any of three modes::

    python -m p3kv.launch -n 2 -s 2 --kvstore p3 -- python -m benchmarks.workloads.bench_worker --model resnet50_v1
    python -m p3kv.launch -n 2 -s 2 --kvstore dist_sync -- python -m benchmarks.workloads.bench_worker ...
    python -m p3kv.launch -n 2 -s 2 --kvstore mxnet-p3 -- python -m benchmarks.workloads.bench_worker ...

The mode is P3_BASELINE (``dist_sync`` or ``mxnet-p3``, set by the launcher) or p3kv when it is unset. Each
iteration pushes every array in backward order (last layer first) with priority -key, keys being forward order
(first layer most urgent), receives the aggregated arrays back and waits for all of them. Worker 0 appends one
JSON line to --out. After the timed iterations one more, untimed, iteration pushes rank + 1 from every worker
and checks that every element received equals W (W + 1) / 2. (MXNet's pushpull writes the result into the
gradient array too, so gradients are refilled first.)
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import statistics
import sys
import time

import numpy as np

from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import model_shapes, worker_output

LOG = logging.getLogger("bench_worker")
MODES = ("p3kv", "dist_sync", "mxnet-p3")
# Environment that changes what the MXNet baselines do; recorded with every result.
MXNET_KNOBS = ("DMLC_PS_VAN_TYPE", "DMLC_PS_WATER_MARK", "MXNET_KVSTORE_SLICE_THRESHOLD",
               "MXNET_KVSTORE_BIGARRAY_BOUND", "OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS")
MXNET_P3_DEFAULT_SLICE = 40_000  # P3StoreDist's default for MXNET_KVSTORE_SLICE_THRESHOLD


def load_shapes(model: str, shapes_dir: pathlib.Path = SHAPES_DIR) -> list[dict]:
    return model_shapes.load(model, shapes_dir)["params"]


def mode_from_env() -> str:
    mode = os.environ.get("P3_BASELINE", "") or "p3kv"
    if mode not in MODES:
        raise SystemExit(f"P3_BASELINE={mode!r} is not one of dist_sync, mxnet-p3 (unset means p3kv)")
    return mode


class MXNetRunner:
    """dist_sync or MXNet's own P3 (dist_sync with DMLC_PS_VAN_TYPE=p3): kv.pushpull per array."""

    def __init__(self, mode: str, shapes: list[dict], slice_size: int | None):
        if mode == "mxnet-p3":
            if os.environ.get("DMLC_PS_VAN_TYPE") != "p3":
                raise SystemExit("mode mxnet-p3 needs DMLC_PS_VAN_TYPE=p3 in every process (the launcher's "
                                 "--kvstore mxnet-p3 sets it); without it this would measure plain dist_sync")
            if slice_size:
                # Read once by MXNet's P3StoreDist constructor, worker side only.
                os.environ["MXNET_KVSTORE_SLICE_THRESHOLD"] = str(slice_size)
            self.slice_size = int(os.environ.get("MXNET_KVSTORE_SLICE_THRESHOLD") or MXNET_P3_DEFAULT_SLICE)
        else:
            self.slice_size = None  # dist_sync does not slice (it splits arrays above MXNET_KVSTORE_BIGARRAY_BOUND)
        import mxnet as mx

        self.mx = mx
        self.kv = mx.kv.create("dist_sync")
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        self.grads = [mx.nd.full(p["shape"], self.rank + 1, dtype=p["dtype"]) for p in shapes]
        self.weights = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in shapes]
        # Increasing key order at init: P3StoreDist assigns server keys in init order.
        for key, weight in enumerate(self.weights):
            self.kv.init(key, weight)
        mx.nd.waitall()

    def refill(self) -> None:
        for grad in self.grads:
            grad[:] = self.rank + 1

    def iteration(self) -> None:
        for key in reversed(range(len(self.grads))):
            self.kv.pushpull(key, self.grads[key], out=self.weights[key], priority=-key)
        self.mx.nd.waitall()

    def result(self, key: int) -> np.ndarray:
        return self.weights[key].asnumpy()

    def barrier(self) -> None:
        self.kv._barrier()

    def close(self) -> None:
        self.mx.nd.waitall()
        del self.kv  # rank 0's destructor stops the servers


class P3Runner:
    """p3kv: P3Worker.push per array; the servers broadcast the aggregate into `out`."""

    def __init__(self, shapes: list[dict], slice_size: int | None):
        from p3kv.core.worker import P3Worker

        self.worker = P3Worker(slice_size=slice_size) if slice_size else P3Worker()
        self.slice_size = getattr(self.worker, "slice_size", None) or slice_size or _p3kv_default_slice()
        self.rank, self.num_workers = self.worker.rank, self.worker.num_workers
        self.grads = [np.full(p["shape"], self.rank + 1, dtype=p["dtype"]) for p in shapes]
        self.weights = [np.zeros(p["shape"], dtype=p["dtype"]) for p in shapes]
        for key, weight in enumerate(self.weights):
            self.worker.init(key, weight.copy(), out=weight)
        self.worker.wait()

    def refill(self) -> None:
        for grad in self.grads:
            grad[...] = self.rank + 1

    def iteration(self) -> None:
        for key in reversed(range(len(self.grads))):
            self.worker.push(key, self.grads[key], out=self.weights[key], priority=-key)
        self.worker.wait()

    def result(self, key: int) -> np.ndarray:
        return self.weights[key]

    def barrier(self) -> None:
        barrier = getattr(self.worker, "barrier", None)
        if barrier is not None:
            barrier()

    def close(self) -> None:
        self.worker.close()


def _p3kv_default_slice() -> int:
    from p3kv.core import config

    return int(config.get("P3_SLICE_SIZE"))


def check(runner, shapes: list[dict]) -> None:
    """Every element of every array must be the sum over workers of rank + 1."""
    expected = runner.num_workers * (runner.num_workers + 1) / 2
    for key in range(len(shapes)):
        got = runner.result(key)
        if not np.all(got == expected):
            bad = got[got != expected].ravel()[:4]
            raise SystemExit(f"key {key} ({shapes[key]['name']}): expected every element {expected}, got {bad}")


def run(args: argparse.Namespace) -> dict | None:
    mode = mode_from_env()
    shapes = load_shapes(args.model, args.shapes_dir)
    n_params = sum(int(np.prod(p["shape"])) for p in shapes)
    n_bytes = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in shapes)
    start = time.perf_counter()
    runner = MXNetRunner(mode, shapes, args.slice_size) if mode != "p3kv" else P3Runner(shapes, args.slice_size)
    LOG.info("rank %d/%d mode %s model %s: %d arrays, %.1fM params, init %.2f s", runner.rank,
             runner.num_workers, mode, args.model, len(shapes), n_params / 1e6, time.perf_counter() - start)
    times = []
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        runner.iteration()
        elapsed = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(elapsed)
        LOG.info("rank %d iteration %d%s: %.3f s", runner.rank, i, " (warmup)" if i < args.warmup else "", elapsed)
    runner.refill()
    runner.iteration()
    check(runner, shapes)
    runner.barrier()
    median, mean = statistics.median(times), statistics.fmean(times)
    row = {
        "mode": mode, "model": args.model, "n_workers": runner.num_workers,
        "n_servers": int(os.environ.get("DMLC_NUM_SERVER") or os.environ.get("P3_NUM_SERVER") or 0),
        "params": n_params, "arrays": len(shapes), "bytes": n_bytes, "warmup": args.warmup, "iters": args.iters,
        "median_s": median, "mean_s": mean, "min_s": min(times), "max_s": max(times),
        # bytes pushed plus bytes received by one worker per second, in Gbit/s
        "goodput": 2 * n_bytes * 8 / median / 1e9,
        "slice_size": runner.slice_size, "env": {k: os.environ.get(k) for k in MXNET_KNOBS},
        "versions": worker_output.versions("numpy", "mxnet", "p3kv"),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    LOG.info("rank %d: median %.4f s/iter, mean %.4f, goodput %.2f Gbit/s", runner.rank, median, mean,
             row["goodput"])
    rank = runner.rank
    runner.close()
    return row if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50_v1", help="resnet50_v1, vgg19, inceptionv3 (a shapes/*.json)")
    worker_output.add_iteration_arguments(parser, warmup=2, iters=10)
    parser.add_argument("--slice-size", type=int, default=None,
                        help="elements per slice for p3kv and mxnet-p3 (default: each system's own default)")
    worker_output.add_out_argument(parser)
    parser.add_argument("--shapes-dir", type=pathlib.Path, default=SHAPES_DIR)
    args = parser.parse_args(argv)
    worker_output.check_iterations(parser, args)
    worker_output.start_logging()
    row = run(args)
    if row is not None and args.out is not None:
        worker_output.append_line(args.out, row)
        LOG.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
