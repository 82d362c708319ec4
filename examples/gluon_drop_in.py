"""P3 as a drop-in for Gluon: the two marked lines are all that differs from a dist_sync script.

    python -m p3kv.launch -n 2 -s 2 -- python examples/gluon_drop_in.py --kvstore p3
    python -m p3kv.launch -n 2 -s 2 --kvstore dist_sync -- python examples/gluon_drop_in.py --kvstore dist_sync
"""

import argparse
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import p3kv  # noqa: F401  # <- 1: registers kvstore 'p3'


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvstore", default="p3", help="p3, or dist_sync to compare")  # <- 2: kvstore='p3'
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()

    mx.random.seed(0)  # same initial weights everywhere (the kvstore also broadcasts worker 0's)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(),
            gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(), gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    kv = mx.kv.create(args.kvstore)  # or pass the name to gluon.Trainer; created here to know the rank
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    # Synthetic data: 10 classes of 3x32x32 images, each class a noisy copy of a fixed pattern.
    patterns = np.random.RandomState(1).rand(10, 3, 32, 32).astype(np.float32)
    rng = np.random.RandomState(100 + kv.rank)  # each worker draws its own batches
    start = None
    for step in range(args.steps):
        labels = rng.randint(0, 10, args.batch_size)
        x = mx.nd.array(patterns[labels] + 0.5 * rng.randn(args.batch_size, 3, 32, 32).astype(np.float32))
        y = mx.nd.array(labels)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch_size * kv.num_workers)  # servers sum the workers' gradients: average them
        if step == 0:
            mx.nd.waitall()
            start = time.time()  # after the first step: it includes set-up and parameter broadcast
    mx.nd.waitall()
    elapsed = time.time() - start

    checksum = sum(float(p.data().abs().sum().asscalar()) for p in net.collect_params().values())
    throughput = (args.steps - 1) * args.batch_size / elapsed if args.steps > 1 else float("nan")
    print(f"worker {kv.rank}/{kv.num_workers} kvstore={kv.type}: {throughput:.1f} samples/s, "
          f"final loss {loss.mean().asscalar():.4f}, weight checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    main()
