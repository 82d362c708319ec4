"""Trains a small Conv + BatchNorm + Dense net with Gluon for a few steps on fixed per-worker data, with the
kvstore named on the command line, and saves the final parameters of this worker.

usage: gluon_train.py KVSTORE OUT_DIR [--optimizer sgd|adam] [--update-on-kvstore 0|1] [--steps N]
       [--devices N] [--checkpoint-at N] [--fail-optimizer] [--resume DIR --start-step N] [--mults]

--checkpoint-at N: right after step N's trainer.step (training goes on), writes Trainer.save_states to
OUT_DIR/states-rank<r>, then the parameters to OUT_DIR/checkpoint-rank<r>.npz. --resume DIR continues from such a
checkpoint: it loads that worker's parameters and the optimizer states (Trainer.load_states), and --start-step N
makes the data those of steps N, N+1, ... so that N steps + a resumed K steps see the same data as one job of
N+K steps. --mults sets per-parameter lr_mult/wd_mult (Gluon keeps them in
optimizer.param_dict, which pickling drops; MXNet's dist_sync servers then ignore them, so do not compare
--mults jobs with dist_sync). --fail-optimizer needs tests/scripts on the servers' PYTHONPATH.
"""

import argparse
import os
import sys
import time

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


def load_arrays(params, path, only_untrained=False):
    """Writes saved values into the parameters in place (Parameter.set_data would reset the kvstore)."""
    saved = np.load(path)
    for name, p in params.items():
        if only_untrained and p.grad_req != "null":
            continue
        for d in p.list_data():
            d[:] = saved[name]


def train(args, net, trainer, loss_fn, ctx, batch, rank):
    for step in range(args.start_step, args.start_step + args.steps):
        rng = np.random.RandomState(1000 * rank + step)
        x = rng.rand(batch, 2, 6, 6).astype(np.float32)
        y = rng.randint(0, 3, size=(batch,)).astype(np.float32)
        xs = gluon.utils.split_and_load(x, ctx)
        ys = gluon.utils.split_and_load(y, ctx)
        with autograd.record():
            losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
        autograd.backward(losses)
        trainer.step(x.shape[0])
        if step + 1 == args.checkpoint_at:
            # States first, while this step's pushpulls may still be in flight: save_states must wait for them.
            trainer.save_states(os.path.join(args.out, f"states-rank{rank}"))
            np.savez(os.path.join(args.out, f"checkpoint-rank{rank}.npz"),
                     **{name: p.data(ctx[0]).asnumpy() for name, p in net.collect_params().items()})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--update-on-kvstore", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rank-steps", metavar="N0,N1,...", help="steps per worker rank (overrides --steps): uneven "
                   "steps, as with data shards of different lengths")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--checkpoint-at", type=int, metavar="N")
    p.add_argument("--fail-optimizer", action="store_true")
    p.add_argument("--resume", metavar="DIR")
    p.add_argument("--start-step", type=int, default=0)
    p.add_argument("--mults", action="store_true")
    args = p.parse_args()

    mx.random.seed(42)
    ctx = [mx.cpu(i) for i in range(args.devices)]
    net = build_net()
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()
    params = net.collect_params()
    if args.mults:
        params.get("cdense_weight").lr_mult = 0.0  # frozen: must end where it started
        params.get("dbn_gamma").wd_mult = 0.0
        params.get("bconv_weight").lr_mult = 0.5
    batch = 4 * len(ctx)
    if args.fail_optimizer:
        from exploding_optimizer import Exploding

        opt = Exploding(learning_rate=0.05)
    elif args.optimizer == "sgd":
        opt = mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=1e-3)
    else:
        opt = mx.optimizer.Adam(learning_rate=0.01, wd=1e-4)
    trainer = gluon.Trainer(params, opt, kvstore=args.kvstore,
                            update_on_kvstore=bool(args.update_on_kvstore))
    # Create the kvstore now, to know this worker's rank; first set the gradient scale trainer.step(batch)
    # would set, since a distributed kvstore fixes it when it ships the optimizer.
    trainer._optimizer.rescale_grad = 1.0 / batch
    trainer._init_kvstore()
    kv = trainer._kvstore
    rank = kv.rank
    if args.rank_steps:
        args.steps = int(args.rank_steps.split(",")[rank])
    if args.resume:
        # Weights first: Trainer.load_states initialises the kvstore keys with worker 0's values. Then the
        # statistics only this worker computes (BatchNorm's running mean/var), which that overwrote.
        saved = os.path.join(args.resume, f"checkpoint-rank{rank}.npz")
        load_arrays(params, saved)
        trainer.load_states(os.path.join(args.resume, f"states-rank{rank}"))
        load_arrays(params, saved, only_untrained=True)
    # The starting point (worker 0's values; the kvstore broadcasts them at the first step), to tell that training
    # moved the weights.
    np.savez(os.path.join(args.out, f"{args.kvstore}-start-rank{rank}.npz"),
             **{name: p.data(ctx[0]).asnumpy() for name, p in params.items()})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    started = time.time()
    try:
        train(args, net, trainer, loss_fn, ctx, batch, rank)
        # Reading the values waits for every step: a failed update surfaces here at the latest.
        values = {name: p.data(ctx[0]).asnumpy() for name, p in params.items()}
    except mx.base.MXNetError as e:
        print(f"rank {rank}: MXNetError after {time.time() - started:.1f} s of training: {e}", flush=True)
        raise
    np.savez(os.path.join(args.out, f"{args.kvstore}-rank{kv.rank}.npz"), **values)
    mx.nd.waitall()
    print(f"rank {kv.rank} done (update_on_kvstore={int(trainer._update_on_kvstore)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
