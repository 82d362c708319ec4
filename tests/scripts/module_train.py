"""Trains a small symbolic MLP with Module.fit for a few epochs on fixed per-worker data, with the kvstore
named on the command line, and saves this worker's final arg params to OUT_DIR/<kvstore>-rank<r>.npz.

usage: module_train.py KVSTORE OUT_DIR [--epochs N]

Set MXNET_UPDATE_ON_KVSTORE=0 to make the workers update (servers then sum gradients).
"""

import argparse
import logging
import os
import sys

import mxnet as mx
import numpy as np

import p3kv  # noqa: F401  (makes kvstore='p3' available)

BATCH = 8


def build_symbol():
    data = mx.sym.Variable("data")
    # Names whose alphabetical order is not forward order (Module keeps its own, forward, order anyway).
    h = mx.sym.FullyConnected(data, num_hidden=32, name="zfc")
    h = mx.sym.Activation(h, act_type="relu", name="relu1")
    h = mx.sym.FullyConnected(h, num_hidden=16, name="afc")
    h = mx.sym.Activation(h, act_type="tanh", name="tanh1")
    h = mx.sym.FullyConnected(h, num_hidden=4, name="mfc")
    return mx.sym.SoftmaxOutput(h, name="softmax")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()

    mx.random.seed(7)
    mod = mx.mod.Module(build_symbol(), context=mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 10))], label_shapes=[("softmax_label", (BATCH,))])
    mod.init_params(mx.init.Xavier())
    # The kvstore by name, as fit() would create it (kvstore='p3' goes through p3kv's _create_kvstore patch);
    # created before fit() only so that this worker knows its rank, and with it its data.
    mod.init_optimizer(kvstore=args.kvstore, optimizer="sgd",
                       optimizer_params={"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    rank = mod._kvstore.rank
    rng = np.random.RandomState(100 + rank)
    x = rng.rand(4 * BATCH, 10).astype(np.float32)
    y = rng.randint(0, 4, size=(4 * BATCH,)).astype(np.float32)
    train = mx.io.NDArrayIter(x, y, batch_size=BATCH, shuffle=False)
    logging.getLogger().setLevel(logging.WARNING)
    mod.fit(train, num_epoch=args.epochs, eval_metric="acc")  # bound, initialised, optimizer set: fit trains
    arg_params, _ = mod.get_params()
    np.savez(os.path.join(args.out, f"{args.kvstore}-rank{rank}.npz"),
             **{name: a.asnumpy() for name, a in arg_params.items()})
    mx.nd.waitall()
    print(f"rank {rank} done, update_on_kvstore={int(mod._update_on_kvstore)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
