"""Trains a small Conv + BatchNorm + Dense net with Gluon for a few steps on fixed per-worker data, with the
kvstore named on the command line, and saves the final parameters of this worker.

usage: gluon_train.py KVSTORE OUT_DIR [--optimizer sgd|adam] [--update-on-kvstore 0|1] [--steps N]
       [--devices N] [--save-states] [--fail-optimizer]
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import p3kv  # noqa: F401  (makes kvstore='p3' available)


def build_net():
    net = gluon.nn.HybridSequential()
    # Names chosen so that alphabetical order (Gluon's key order) is neither forward nor backward order:
    # forward is bconv, dbn, adense, cdense.
    with net.name_scope():
        net.add(gluon.nn.Conv2D(4, 3, padding=1, in_channels=2, prefix="bconv_"))
        net.add(gluon.nn.BatchNorm(in_channels=4, prefix="dbn_"))
        net.add(gluon.nn.Activation("relu"))
        net.add(gluon.nn.Dense(16, in_units=144, prefix="adense_"))
        net.add(gluon.nn.Dense(3, in_units=16, prefix="cdense_"))
    return net


class Exploding(mx.optimizer.SGD):
    """An optimizer whose update fails on the servers at the third step."""

    def update(self, index, weight, grad, state):
        if self.num_update >= 3:
            raise ValueError(f"exploding optimizer at step {self.num_update}")
        super().update(index, weight, grad, state)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--update-on-kvstore", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--save-states", action="store_true")
    p.add_argument("--fail-optimizer", action="store_true")
    args = p.parse_args()

    mx.random.seed(42)
    ctx = [mx.cpu(i) for i in range(args.devices)]
    net = build_net()
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()
    batch = 4 * len(ctx)
    if args.fail_optimizer:
        opt = Exploding(learning_rate=0.05)
    elif args.optimizer == "sgd":
        opt = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=1e-3)
    else:
        opt = mx.optimizer.Adam(learning_rate=0.01, wd=1e-4)
    trainer = gluon.Trainer(net.collect_params(), opt, kvstore=args.kvstore,
                            update_on_kvstore=bool(args.update_on_kvstore))
    # Create the kvstore now, to know this worker's rank; first set the gradient scale trainer.step(batch)
    # would set, since a distributed kvstore fixes it when it ships the optimizer.
    trainer._optimizer.rescale_grad = 1.0 / batch
    trainer._init_kvstore()
    kv = trainer._kvstore
    rank = kv.rank
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(args.steps):
        rng = np.random.RandomState(1000 * rank + step)
        x = rng.rand(batch, 2, 6, 6).astype(np.float32)
        y = rng.randint(0, 3, size=(batch,)).astype(np.float32)
        xs = gluon.utils.split_and_load(x, ctx)
        ys = gluon.utils.split_and_load(y, ctx)
        with autograd.record():
            losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
        autograd.backward(losses)
        trainer.step(x.shape[0])
    params = {name: p.data(ctx[0]).asnumpy() for name, p in net.collect_params().items()}
    np.savez(os.path.join(args.out, f"{args.kvstore}-rank{kv.rank}.npz"), **params)
    if args.save_states and args.update_on_kvstore:
        trainer.save_states(os.path.join(args.out, f"states-rank{kv.rank}"))
    mx.nd.waitall()
    print(f"rank {kv.rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
