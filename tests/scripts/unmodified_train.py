"""An MXNet training script that knows nothing of p3kv, in the style of MXNet's image-classification examples:
the kvstore is a command-line string handed to Module.fit. Under `python -m p3kv.launch` (p3 jobs) the launcher's
start-up hook makes `--kv-store p3` work without any change here.

    python train_mlp.py --kv-store p3 [--num-epochs 3] [--create-kv]

--create-kv creates the kvstore first with mx.kvstore.create and passes the object to fit, as the examples'
common/fit.py does (each worker then takes its own shard of the data). Prints one line per worker:
    rank R/W kvstore MODULE.CLASS type=TYPE accuracy=A checksum=C
"""

import argparse
import logging

import mxnet as mx
import numpy as np


def get_mlp(num_classes):
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(data, num_hidden=64, name="fc1")
    net = mx.sym.Activation(net, act_type="relu", name="relu1")
    net = mx.sym.FullyConnected(net, num_hidden=32, name="fc2")
    net = mx.sym.Activation(net, act_type="relu", name="relu2")
    net = mx.sym.FullyConnected(net, num_hidden=num_classes, name="fc3")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def synthetic_data(num_examples, num_features, num_classes, seed):
    """Gaussian blobs around fixed class centres: learnable in a few epochs."""
    centres = np.random.RandomState(0).randn(num_classes, num_features) * 2
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, num_classes, size=num_examples)
    data = centres[labels] + rng.randn(num_examples, num_features)
    return data.astype(np.float32), labels.astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description="train an MLP on synthetic data",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--kv-store", type=str, default="device", help="key-value store type")
    parser.add_argument("--num-epochs", type=int, default=3, help="max num of epochs")
    parser.add_argument("--batch-size", type=int, default=16, help="the batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="initial learning rate")
    parser.add_argument("--num-examples", type=int, default=512, help="the number of training examples")
    parser.add_argument("--num-classes", type=int, default=4, help="the number of classes")
    parser.add_argument("--disp-batches", type=int, default=8, help="show progress for every n batches")
    parser.add_argument("--create-kv", action="store_true", help="mx.kvstore.create first, pass the object to fit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)-15s %(message)s")

    kv = mx.kvstore.create(args.kv_store) if args.create_kv else args.kv_store
    rank, num_workers = (kv.rank, kv.num_workers) if args.create_kv else (0, 1)
    x, y = synthetic_data(args.num_examples, 20, args.num_classes, seed=1)
    shard = slice(rank * len(x) // num_workers, (rank + 1) * len(x) // num_workers)
    train = mx.io.NDArrayIter(x[shard], y[shard], args.batch_size, shuffle=True, last_batch_handle="discard")
    val_x, val_y = synthetic_data(256, 20, args.num_classes, seed=2)
    val = mx.io.NDArrayIter(val_x, val_y, args.batch_size)

    mx.random.seed(3)
    np.random.seed(3)
    model = mx.mod.Module(context=mx.cpu(), symbol=get_mlp(args.num_classes))
    model.fit(train, begin_epoch=0, num_epoch=args.num_epochs, eval_data=val, eval_metric="acc", kvstore=kv,
              optimizer="sgd", optimizer_params={"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4},
              initializer=mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2),
              batch_end_callback=mx.callback.Speedometer(args.batch_size, args.disp_batches))

    accuracy = dict(model.score(val, "acc"))["accuracy"]
    store = model._kvstore  # the kvstore fit used (None: it trained without one)
    arg_params, _ = model.get_params()
    checksum = sum(float(np.abs(a.asnumpy()).astype(np.float64).sum()) for a in arg_params.values())
    kind = f"{type(store).__module__}.{type(store).__name__} type={getattr(store, 'type', None)}"
    rank, num_workers = (store.rank, store.num_workers) if store is not None else (0, 1)
    print(f"rank {rank}/{num_workers} kvstore {kind} accuracy={accuracy:.4f} checksum={checksum:.6f}", flush=True)


if __name__ == "__main__":
    main()
