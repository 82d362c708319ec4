"""cluster_worker.py's real-compute mode on the host's accelerator: the worker `fab bench` runs on real clusters.

    python -m benchmarks.workloads.device_worker --model resnet50_v1 --compute real --out PREFIX ...
    (cluster_worker's options)

The same training loop, timing and result file as benchmarks/workloads/cluster_worker.py (imported, not copied),
with two differences: the model and its batch live on the visible GPU of the worker's local rank when the host has
GPUs (p3kv.launch numbers every host's workers: LOCAL_RANK for p3kv's and MXNet's, HOROVOD_LOCAL_RANK for
Horovod's; a host running several workers gives each its own GPU; the hosts file's gpus= sets
CUDA_VISIBLE_DEVICES, which GPUs are visible), else on the CPU; and --model also takes `tiny-mlp` (a 3-layer
perceptron on synthetic data, for smoke tests of the deployment). The result file's prefix gains the device and
the local rank (PREFIX.<device>.local<k>.rank<r>.json), which the collector reads back.

cluster_worker builds its real models on mx.cpu(); this wrapper substitutes its own `real_models.build` for the
one cluster_worker calls, so a --device option there would make this file unnecessary.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

import mxnet as mx
import numpy as np

from benchmarks.workloads import cluster_worker, real_models

LOG = logging.getLogger("device_worker")
TINY = "tiny-mlp"


def local_rank(environ: Mapping[str, str]) -> tuple[int, int]:
    """(this worker's index among its host's workers, how many the host runs): Horovod's (HOROVOD_LOCAL_RANK,
    _SIZE), else the launcher's (LOCAL_RANK, LOCAL_WORLD_SIZE: p3kv.launch gives them to every worker of p3kv and
    of MXNet's baselines), else (0, 1)."""
    for rank, size in (("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if environ.get(rank, "").isdigit():
            return int(environ[rank]), int(environ.get(size, "1")) if environ.get(size, "").isdigit() else 1
    return 0, 1


def gpu_index(environ: Mapping[str, str], gpus: int) -> int | None:
    """The visible GPU this worker trains on, by its local rank (several workers on a host each get their own
    while there are enough; a warning names the sharing where there are not), or None: no GPU, the CPU."""
    if not gpus:
        return None
    rank, size = local_rank(environ)
    if size > gpus:
        LOG.warning("%d workers on this host share %d visible GPUs: worker %d uses GPU %d (set gpus= in the hosts "
                    "file, or fewer workers per host, for one GPU each)", size, gpus, rank, rank % gpus)
    return rank % gpus


def device() -> mx.Context:
    """The GPU of this worker's local rank when the host has any visible (CUDA_VISIBLE_DEVICES, which the hosts
    file's gpus= sets, chooses which), else the CPU."""
    index = gpu_index(os.environ, mx.context.num_gpus())
    return mx.cpu() if index is None else mx.gpu(index)


def tiny_mlp(batch_size: int, ctx: mx.Context) -> real_models.RealModel:
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(256, activation="relu"), mx.gluon.nn.Dense(256, activation="relu"),
            mx.gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    rng = np.random.RandomState(real_models.SEED)
    data = mx.nd.array(rng.uniform(-1, 1, (batch_size, 64)), ctx=ctx)
    labels = mx.nd.array(rng.randint(0, 10, batch_size), ctx=ctx)
    return real_models.RealModel(TINY, net, (data, labels), mx.gluon.loss.SoftmaxCrossEntropyLoss(), batch_size,
                                 batch_size)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ctx = device()
    build = real_models.build

    def build_on_device(model: str, batch_size: int, _ctx: mx.Context, **kwargs) -> real_models.RealModel:
        if model != TINY:
            return build(model, batch_size, ctx, **kwargs)
        real = tiny_mlp(batch_size, ctx)
        real.net.hybridize(static_alloc=True)
        real.net(*real.batch()[:-1])  # shapes are known once one forward pass has run
        mx.nd.waitall()
        return real

    real_models.build = build_on_device
    if "--out" in argv:
        i = argv.index("--out") + 1
        device_name = f"{ctx.device_type}{ctx.device_id if ctx.device_type == 'gpu' else ''}"
        argv[i] = f"{argv[i]}.{device_name}.local{local_rank(os.environ)[0]}"
    return cluster_worker.main(argv)


if __name__ == "__main__":
    sys.exit(main())
