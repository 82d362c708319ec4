"""One worker of the emulated-cluster benchmark (started by benchmarks/cluster_bench.py through the launcher).

Trains --model through MXNet's kvstore interface: kvstore 'p3' in p3kv jobs, 'dist_sync' in the baselines
(P3_BASELINE=dist_sync, or mxnet-p3: dist_sync with ps-lite's P3 van). Two compute modes:

* ``emulated``: the model's real parameter arrays; every layer's forward/backward is an engine operation that
  takes its profiled time (benchmarks/emulated_compute.py). No optimizer: the servers sum the gradients, which is
  the same traffic.
* ``none``: as emulated with zero-time layers: push + pull only.
* ``real``: the real network (benchmarks/real_models.py) trained with gluon.Trainer (SGD) on synthetic data.

The loop is an ordinary training loop: queue forward, backward and one pushpull per parameter (priority: minus
its layer's forward index), then wait for the forward result (as a metric update would), so communication
overlaps backward and the next forward exactly as in real training. Iteration time is the interval between
consecutive forward completions. Each rank writes <out>.rank<r>.json with its iteration times.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import sys
import time

LOG = logging.getLogger("cluster_worker")
MODES = ("p3kv", "dist_sync", "mxnet-p3")


def mode_from_env() -> str:
    mode = os.environ.get("P3_BASELINE", "") or "p3kv"
    if mode not in MODES:
        raise SystemExit(f"P3_BASELINE={mode!r} is not one of dist_sync, mxnet-p3 (unset means p3kv)")
    if mode == "mxnet-p3" and os.environ.get("DMLC_PS_VAN_TYPE") != "p3":
        raise SystemExit("mode mxnet-p3 needs DMLC_PS_VAN_TYPE=p3 (the launcher's --kvstore mxnet-p3 sets it)")
    return mode


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in ("mxnet", "p3kv", "gluoncv", "sockeye", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def create_kvstore(mode: str):
    import mxnet as mx

    if mode == "p3kv":
        import p3kv  # noqa: F401  (registers kvstore 'p3')

        return mx.kv.create("p3")
    return mx.kv.create("dist_sync")


class EmulatedTraining:
    def __init__(self, args: argparse.Namespace, mode: str):
        import emulated_compute

        description = emulated_compute.load_description(args.model)
        # compute "none": the same loop with zero-time layers (push + pull only).
        scale = math.inf if args.compute == "none" else args.gpu_scale
        self.model = emulated_compute.EmulatedModel(description, args.batch_size,
                                                     emulated_compute.Profile(args.gpu, scale))
        self.samples = args.batch_size * int(description.get("tokens_per_sample", 1))
        self.unit = description.get("sample_unit", "images")
        self.compute_s = self.model.compute_seconds
        self.kv = create_kvstore(mode)
        for key, weight in enumerate(self.model.weights):  # increasing order: P3StoreDist assigns keys so
            self.kv.init(key, weight)

    def step(self):
        loss = self.model.forward()
        self.model.backward()
        grads, weights = self.model.grads, self.model.weights
        for key in reversed(range(len(grads))):
            self.kv.pushpull(key, grads[key], out=weights[key], priority=self.model.priority(key))
        return loss


class RealTraining:
    def __init__(self, args: argparse.Namespace, mode: str):
        import mxnet as mx
        import real_models
        from mxnet import autograd, gluon

        self.mx, self.autograd = mx, autograd
        self.model = real_models.build(args.model, args.batch_size, mx.cpu())
        self.batch = self.model.batch()
        self.samples = self.model.samples_per_batch
        self.unit = "tokens" if args.model == "sockeye" else "images"
        self.compute_s = self._compute_only_seconds()
        kvstore = "p3" if mode == "p3kv" else "dist_sync"
        if mode == "p3kv":
            import p3kv  # noqa: F401
        # MXNet's P3 port needs the update on the workers (DESIGN.md); the others update on the servers.
        self.trainer = gluon.Trainer(self.model.net.collect_params(), "sgd", {"learning_rate": 1e-4},
                                     kvstore=kvstore, update_on_kvstore=mode != "mxnet-p3")
        self.batch_size = args.batch_size

    def _compute_only_seconds(self) -> float:
        """Forward + backward without communication (second of two runs), the compute part of the bound."""
        seconds = 0.0
        for _ in range(2):
            start = time.perf_counter()
            with self.autograd.record():
                loss = self.model.loss(*self.batch)
            loss.backward()
            self.mx.nd.waitall()
            seconds = time.perf_counter() - start
        return seconds

    def step(self):
        with self.autograd.record():
            loss = self.model.loss(*self.batch)
        loss.backward()
        self.trainer.step(self.batch_size)
        return loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--compute", choices=("emulated", "real", "none"), default="emulated")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--gpu", default="p100")
    parser.add_argument("--gpu-scale", type=float, default=1.0)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--out", required=True, help="result path prefix: writes <out>.rank<r>.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(message)s")
    mode = mode_from_env()
    start = time.perf_counter()
    training = (RealTraining if args.compute == "real" else EmulatedTraining)(args, mode)
    import mxnet as mx

    times: list[float] = []
    last = None
    rank = num_workers = -1
    for it in range(args.warmup + args.iters):
        training.step().wait_to_read()
        if it == 0:  # Gluon's Trainer creates its kvstore in the first step
            kv = training.trainer._kvstore if args.compute == "real" else training.kv
            rank, num_workers = kv.rank, kv.num_workers
            LOG.info("rank %d/%d %s %s %s batch %d: first iteration after %.1f s; compute %.3f s/iter", rank,
                     num_workers, mode, args.model, args.compute, args.batch_size, time.perf_counter() - start,
                     training.compute_s)
        now = time.perf_counter()
        if last is not None and it >= args.warmup:
            times.append(now - last)
        last = now
        if times and len(times) % args.log_interval == 0:
            recent = times[-args.log_interval:]
            LOG.info("rank %d iter %d: %.1f %s/s (%.3f s/iter over the last %d)", rank, it + 1,
                     training.samples / statistics.median(recent), training.unit, statistics.median(recent),
                     len(recent))
    mx.nd.waitall()
    result = {"rank": rank, "num_workers": num_workers, "mode": mode, "model": args.model,
              "compute": args.compute, "batch_size": args.batch_size, "samples_per_batch": training.samples,
              "unit": training.unit, "compute_s": training.compute_s, "iter_s": times,
              "median_s": statistics.median(times) if times else None, "versions": versions()}
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    LOG.info("rank %d: median %.4f s/iter, %.1f %s/s", rank, result["median_s"] or 0,
             training.samples / result["median_s"] if result["median_s"] else 0, training.unit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
