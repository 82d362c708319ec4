"""cluster_worker.py's real-compute mode on the host's accelerator: the worker `fab bench` runs on real clusters.

    python -m benchmarks.workloads.device_worker --model resnet50_v1 --compute real --out PREFIX ...
    (cluster_worker's options)

The same training loop, timing and result file as benchmarks/workloads/cluster_worker.py (imported, not copied), with
two
differences: the model and its batch live on the first GPU the worker sees when the host has one (the launcher gives
parameter-server workers no local rank: run one worker per GPU host, or pick the GPU with the hosts file's gpus=,
which sets CUDA_VISIBLE_DEVICES; Horovod ranks take the GPU of their local rank), else on the CPU; and --model
also takes `tiny-mlp` (a 3-layer perceptron on synthetic data, for smoke tests of the deployment). The result
file's prefix gains the device (PREFIX.<device>.rank<r>.json), which the collector reads back.

cluster_worker builds its real models on mx.cpu(); this wrapper substitutes its own `real_models.build` for the
one cluster_worker calls, so a --device option there would make this file unnecessary.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

from benchmarks.workloads import cluster_worker, real_models

TINY = "tiny-mlp"


def device() -> mx.Context:
    """A visible GPU when the host has any (Horovod ranks: the one of their local rank), else the CPU."""
    gpus = mx.context.num_gpus()
    if not gpus:
        return mx.cpu()
    return mx.gpu(int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % gpus)


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
        argv[i] = f"{argv[i]}.{ctx.device_type}{ctx.device_id if ctx.device_type == 'gpu' else ''}"
    return cluster_worker.main(argv)


if __name__ == "__main__":
    sys.exit(main())
