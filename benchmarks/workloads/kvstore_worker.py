"""One worker of the like-for-like kvstore benchmark: every system through MXNet's engine, same optimizer.

Run by benchmarks/suites/kvstore_bench.py, one system per job::

    python -m p3kv.launch -n 2 -s 2 --kvstore p3 -- python -m benchmarks.workloads.kvstore_worker --system p3
    python -m p3kv.launch -n 2 -s 2 --kvstore p3 -- python -m benchmarks.workloads.kvstore_worker --system p3-noopt
    python -m p3kv.launch -n 2 -s 2 --kvstore dist_sync -- \
        python -m benchmarks.workloads.kvstore_worker --system dist_sync
    python -m p3kv.launch -n 2 -s 2 --kvstore mxnet-p3 -- \
        python -m benchmarks.workloads.kvstore_worker --system mxnet-p3
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.workloads.kvstore_worker --system horovod

Every iteration hands every parameter array of the model (benchmarks/workloads/shapes/<model>.json) to the system in
backward order (last array first) with priority -layer (layer in forward order: the first layer is the most
urgent), as MXNet engine operations on mx.nd arrays, then waits once on every weight. The same SGD (momentum
0.9, wd 1e-4, rescale_grad 1/W) runs
- on the servers for p3 and dist_sync (kv.set_optimizer; kv.pushpull(key, grad, out=weight)),
- on the workers for mxnet-p3 (MXNet's P3 refuses server-side updates) and horovod: the summed gradient
  (kv.pushpull in place, or horovod.mxnet.allreduce_ with average=False over Gloo), then the same updater
  (mx.optimizer.get_updater) as an engine operation per key;
- nowhere for p3-noopt (p3kv's servers only sum: the cost of the optimizer is p3 minus p3-noopt).

Gradients are deterministic: key k of worker r in iteration i is base(seed, r, k) * (1 + i % 7) / 7, so all
systems do the same arithmetic and end with the same weights (--save-weights, worker 0). The refill of the
gradients happens before each iteration's clock starts. Worker 0 appends one JSON line (per-iteration times)
to --out.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import time

import numpy as np

from benchmarks.paths import SHAPES_DIR
from benchmarks.workloads import model_shapes, worker_output

LOG = logging.getLogger("kvstore_worker")
SYSTEMS = ("p3", "p3-noopt", "dist_sync", "mxnet-p3", "horovod")
SERVER_SIDE = ("p3", "dist_sync")  # the optimizer runs on the servers
# Environment that changes what a system does; recorded with every result.
KNOBS = ("P3_SLICE_SIZE", "P3_PRIORITY", "DMLC_PS_VAN_TYPE", "DMLC_PS_WATER_MARK", "MXNET_KVSTORE_SLICE_THRESHOLD",
         "MXNET_KVSTORE_BIGARRAY_BOUND", "OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS",
         "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD", "HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD")
LEARNING_RATE = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4


def load_model(model: str, shapes_dir: pathlib.Path, max_keys: int | None) -> tuple[list[dict], list[int]]:
    """The model's arrays in forward order and each array's layer index (forward order too)."""
    spec = model_shapes.load(model, shapes_dir)
    params = spec["params"]
    layer_of = list(range(len(params)))  # no layer table: one layer per array
    for layer, entry in enumerate(spec.get("layers", [])):
        for index in entry["params"]:
            layer_of[index] = layer
    if max_keys:
        params, layer_of = params[:max_keys], layer_of[:max_keys]
    return params, layer_of


def base_gradient(seed: int, rank: int, key: int, shape, dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, key])
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype) * 1e-2


def initial_weight(seed: int, key: int, shape, dtype) -> np.ndarray:
    rng = np.random.default_rng([seed, 1 << 20, key])  # the same on every worker
    return rng.uniform(-0.05, 0.05, size=shape).astype(dtype)


def make_optimizer(mx, num_workers: int):
    return mx.optimizer.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM, wd=WEIGHT_DECAY,
                            rescale_grad=1.0 / num_workers)


class KVStoreSystem:
    """p3, p3-noopt, dist_sync, mxnet-p3: one kvstore pushpull per key."""

    def __init__(self, mx, system: str, weights: list):
        self.mx, self.system = mx, system
        if system in ("p3", "p3-noopt"):
            import p3kv  # noqa: F401  registers 'p3' (the launcher's autoload does too)

            if os.environ.get("P3_BASELINE"):
                raise SystemExit(f"--system {system} runs under a baseline job (P3_BASELINE="
                                 f"{os.environ['P3_BASELINE']}): start it with python -m p3kv.launch --kvstore p3")
            self.kv = mx.kv.create("p3")
        else:
            expected = {"dist_sync": "dist_sync", "mxnet-p3": "mxnet-p3"}[system]
            if os.environ.get("P3_BASELINE") != expected:
                raise SystemExit(f"--system {system} needs python -m p3kv.launch --kvstore {expected} "
                                 f"(P3_BASELINE is {os.environ.get('P3_BASELINE')!r})")
            if system == "mxnet-p3" and os.environ.get("DMLC_PS_VAN_TYPE") != "p3":
                raise SystemExit("mxnet-p3 needs DMLC_PS_VAN_TYPE=p3 (the launcher's --kvstore mxnet-p3 sets it)")
            self.kv = mx.kv.create("dist_sync")
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        # Increasing key order at init: MXNet's P3StoreDist assigns server keys in init order.
        for key, weight in enumerate(weights):
            self.kv.init(key, weight)
        self.updater = None
        optimizer = make_optimizer(mx, self.num_workers)
        if system in SERVER_SIDE:
            self.kv.set_optimizer(optimizer)
        elif system == "mxnet-p3":
            self.updater = mx.optimizer.get_updater(optimizer)
        # kv.init keeps worker 0's value on the servers; every worker starts from the same weights anyway.
        mx.nd.waitall()

    def step(self, key: int, grad, weight, priority: int) -> None:
        if self.updater is None:  # p3, dist_sync: the servers update; p3-noopt: weight = summed gradient
            self.kv.pushpull(key, grad, out=weight, priority=priority)
        else:
            self.kv.pushpull(key, grad, out=grad, priority=priority)
            self.updater(key, grad, weight)

    def barrier(self) -> None:
        self.kv._barrier()

    def close(self) -> None:
        self.mx.nd.waitall()
        close = getattr(self.kv, "close", None)
        if close is not None:
            close()
        del self.kv  # MXNet: rank 0's destructor stops the servers


class HorovodSystem:
    """Ring allreduce over Gloo (horovod.mxnet.allreduce_, sum), then the worker-side updater."""

    def __init__(self, mx, weights: list):
        import horovod.mxnet as hvd

        self.mx, self.hvd = mx, hvd
        hvd.init()
        self.rank, self.num_workers = hvd.rank(), hvd.size()
        self.updater = mx.optimizer.get_updater(make_optimizer(mx, self.num_workers))
        for key, weight in enumerate(weights):
            hvd.broadcast_(weight, root_rank=0, name=f"init{key}")
        mx.nd.waitall()

    def step(self, key: int, grad, weight, priority: int) -> None:
        self.hvd.allreduce_(grad, average=False, name=str(key), priority=priority)
        self.updater(key, grad, weight)

    def barrier(self) -> None:
        self.hvd.allreduce(self.mx.nd.zeros(1), name="barrier").wait_to_read()

    def close(self) -> None:
        self.mx.nd.waitall()
        self.hvd.shutdown()


def run(args: argparse.Namespace) -> dict | None:
    import mxnet as mx

    params, layer_of = load_model(args.model, args.shapes_dir, args.max_keys)
    weights = [mx.nd.array(initial_weight(args.seed, k, p["shape"], p["dtype"]), dtype=p["dtype"])
               for k, p in enumerate(params)]
    start = time.perf_counter()
    system = HorovodSystem(mx, weights) if args.system == "horovod" else KVStoreSystem(mx, args.system, weights)
    rank = system.rank
    bases = [mx.nd.array(base_gradient(args.seed, rank, k, p["shape"], p["dtype"]), dtype=p["dtype"])
             for k, p in enumerate(params)]
    grads = [mx.nd.zeros(p["shape"], dtype=p["dtype"]) for p in params]
    mx.nd.waitall()
    n_params = sum(int(np.prod(p["shape"])) for p in params)
    n_bytes = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in params)
    LOG.info("rank %d/%d %s on %s: %d arrays, %.1fM params, set-up %.2f s", rank, system.num_workers, args.system,
             args.model, len(params), n_params / 1e6, time.perf_counter() - start)
    times = []
    for i in range(args.warmup + args.iters):
        scale = (1 + i % 7) / 7
        for grad, base in zip(grads, bases):
            grad[:] = base
            grad *= scale
        mx.nd.waitall()
        t0 = time.perf_counter()
        for key in reversed(range(len(params))):
            system.step(key, grads[key], weights[key], -layer_of[key])
        for weight in weights:
            weight.wait_to_read()
        elapsed = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(elapsed)
        LOG.info("rank %d iteration %d%s: %.4f s", rank, i, " (warm-up)" if i < args.warmup else "", elapsed)
    mx.nd.waitall()
    if rank == 0 and args.save_weights is not None:
        args.save_weights.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.save_weights, **{f"k{k}": w.asnumpy() for k, w in enumerate(weights)})
    system.barrier()
    row = {
        "system": args.system, "model": args.model, "workers": system.num_workers,
        "servers": int(os.environ.get("DMLC_NUM_SERVER") or os.environ.get("P3_NUM_SERVER") or 0),
        "arrays": len(params), "params": n_params, "bytes": n_bytes, "warmup": args.warmup, "iters": args.iters,
        "optimizer": "none" if args.system == "p3-noopt" else
        f"sgd(lr={LEARNING_RATE},momentum={MOMENTUM},wd={WEIGHT_DECAY},rescale_grad=1/{system.num_workers})",
        "update_on": "none" if args.system == "p3-noopt" else ("servers" if args.system in SERVER_SIDE else "workers"),
        "times_s": times, "env": {k: os.environ.get(k) for k in KNOBS},
        "versions": worker_output.versions("numpy", "mxnet", "p3kv", "horovod", p3kv_path=True),
    }
    system.close()
    return row if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--model", default="resnet50_v1", help="a benchmarks/workloads/shapes/<model>.json")
    parser.add_argument("--shapes-dir", type=pathlib.Path, default=SHAPES_DIR)
    parser.add_argument("--max-keys", type=int, default=None, help="only the first N arrays (tests)")
    worker_output.add_iteration_arguments(parser, warmup=3, iters=20)
    parser.add_argument("--seed", type=int, default=0)
    worker_output.add_out_argument(parser)
    parser.add_argument("--save-weights", type=pathlib.Path, default=None,
                        help="worker 0 writes its final weights here (.npz, key k as 'k<k>')")
    args = parser.parse_args(argv)
    worker_output.check_iterations(parser, args)
    worker_output.start_logging()
    row = run(args)
    if row is not None and args.out is not None:
        worker_output.append_line(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
