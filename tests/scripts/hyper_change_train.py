"""Trains a small Dense net with Gluon and changes the optimizer's hyperparameters mid-training; saves the final
weights. Run with kvstore p3 as a worker of a 2-worker job, or with kvstore `local` as one process that plays
both workers (two devices, device r getting worker r's batch): MXNet's local kvstore sums the two gradients as
the servers do, so both runs must end with the same weights.

usage: hyper_change_train.py KVSTORE OUT_DIR --change trainer|optimizer [--steps N]

--change trainer: trainer.set_learning_rate at steps 3 and 6 (Gluon's usual manual decay).
--change optimizer: at step 3 opt.lr and opt.wd, at step 4 a parameter's lr_mult, at step 5 opt.momentum (a
setting the servers' kernel holds), from step 6 a larger batch size given to trainer.step (rescale_grad).
No BatchNorm: its statistics would differ between one batch of 8 and two of 4.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import p3kv  # noqa: F401  (makes kvstore='p3' available)

BATCH = 4  # per worker


def batch_of(rank, step):
    rng = np.random.RandomState(1000 * rank + step)
    return rng.rand(BATCH, 6).astype(np.float32), rng.randint(0, 3, size=(BATCH,)).astype(np.float32)


def change(args, trainer, params, step) -> int:
    """Applies the schedule before `step`; returns the batch size to give trainer.step."""
    opt = trainer.optimizer
    if args.change == "trainer":
        if step == 3:
            trainer.set_learning_rate(0.05)
        elif step == 6:
            trainer.set_learning_rate(0.01)
        return BATCH
    if step == 3:
        opt.lr = 0.03
        opt.wd = 0.01
    elif step == 4:
        params.get("first_weight").lr_mult = 0.5
    elif step == 5:
        opt.momentum = 0.5
    return BATCH if step < 6 else 2 * BATCH


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--change", choices=("trainer", "optimizer"), required=True)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()

    mx.random.seed(7)
    local = args.kvstore != "p3"
    ctx = [mx.cpu(0), mx.cpu(1)] if local else [mx.cpu()]
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(8, in_units=6, activation="tanh", prefix="first_"))
        net.add(gluon.nn.Dense(3, in_units=8, prefix="second_"))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()
    params = net.collect_params()
    opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3)
    trainer = gluon.Trainer(params, opt, kvstore=args.kvstore, update_on_kvstore=False if local else None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rank = 0
    if not local:
        trainer._init_kvstore()  # to know this worker's rank before the first step
        rank = trainer._kvstore.rank
    for step in range(args.steps):
        batch_size = change(args, trainer, params, step)
        if local:  # device r holds worker r's batch
            pairs = [batch_of(r, step) for r in (0, 1)]
            xs = [mx.nd.array(x, ctx=c) for (x, _), c in zip(pairs, ctx)]
            ys = [mx.nd.array(y, ctx=c) for (_, y), c in zip(pairs, ctx)]
        else:
            x, y = batch_of(rank, step)
            xs, ys = [mx.nd.array(x)], [mx.nd.array(y)]
        with autograd.record():
            losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
        autograd.backward(losses)
        trainer.step(batch_size)
    np.savez(os.path.join(args.out, f"{args.kvstore}-rank{rank}.npz"),
             **{name: p.data(ctx[0]).asnumpy() for name, p in params.items()})
    mx.nd.waitall()
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
