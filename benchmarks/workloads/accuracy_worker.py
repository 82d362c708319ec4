"""One worker of the accuracy benchmark (started by benchmarks/suites/accuracy.py through the launcher).

Trains a small MLP in Gluon on scikit-learn's bundled handwritten digits (`load_digits`: 1797 8x8 images, shipped
inside the package, nothing downloaded) with SGD momentum + weight decay on the servers, and measures held-out
test accuracy every --eval-every iterations against wall-clock time. --system picks the kvstore: p3 (p3kv),
dist_sync (MXNet's synchronous parameter server) or dist_async (MXNet's asynchronous SGD, the paper's ASGD); the
launcher runs MXNet's ps-lite servers for the last two (`--kvstore dist_sync`: same processes, the worker's
kvstore type decides whether the servers wait for every worker).

Data and seeds are fixed: the train/test split, the weights' initialisation and every worker's batches depend only
on --seed and the worker's rank, so p3kv and dist_sync compute the same updates and must give the same
per-iteration losses and accuracies (tests/test_accuracy.py checks it). Each worker trains on its own shard.

Emulated compute (--compute-s, seconds per iteration on a virtual device, split over the layers by parameter
count, backward twice forward): an engine operation per layer that takes its time and computes nothing
(p3kv's EngineBridge.emulate_compute, as in benchmarks/emulation/emulated_compute.py). It reads the layer's weights in
the
forward pass and writes its gradients in the backward pass, so pushes wait for it and the next forward of layer
k waits for layer k's new weights, as on a GPU; the real MLP is tiny and costs almost no CPU.

Rank 0 snapshots its weights every --eval-every iterations (an engine copy: training does not wait) and
evaluates the snapshots after training, each at the time its iteration's forward pass ended.
Each rank writes <out>.rank<r>.json.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from benchmarks.workloads import worker_output

LOG = logging.getLogger("accuracy_worker")
SYSTEMS = ("p3", "dist_sync", "dist_async")
BACKWARD_FACTOR = 2.0


def load_data(seed: int):
    """(x_train, x_test, y_train, y_test) as float32 arrays: a stratified 80/20 split fixed by `seed`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    return train_test_split(x, digits.target.astype("float32"), test_size=0.2, random_state=seed,
                            stratify=digits.target)


def batches(n_train: int, rank: int, num_workers: int, batch_size: int, seed: int):
    """Endless index batches of this rank's shard, reshuffled every epoch with a generator seeded by (seed, rank)."""
    import numpy as np

    shard = np.random.RandomState(seed).permutation(n_train)[rank::num_workers]
    rng = np.random.RandomState(seed * 1000 + rank + 1)
    while True:
        order = shard[rng.permutation(len(shard))]
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def build_net(hidden: int, layers: int, seed: int):
    import mxnet as mx
    from mxnet import gluon

    net = gluon.nn.Sequential()
    for _ in range(layers):
        net.add(gluon.nn.Dense(hidden, activation="relu", in_units=hidden if len(net) else 64))
    net.add(gluon.nn.Dense(10, in_units=hidden))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    return net


class EmulatedCompute:
    """Per-layer engine operations that take the layers' time on a virtual device (see the module docstring)."""

    def __init__(self, net, compute_s: float):
        import mxnet as mx

        from p3kv import _p3

        self._bridge = _p3.EngineBridge.load(mx.libinfo.find_lib_path()[0])
        self.layers = [[p for p in block.collect_params().values()] for block in net]
        sizes = [sum(p.data().size for p in params) for params in self.layers]
        forward_total = compute_s / (1 + BACKWARD_FACTOR)
        self.forward_s = [forward_total * s / sum(sizes) for s in sizes]
        self._acts = [mx.nd.zeros((1,)) for _ in self.layers]
        self._act_grads = [mx.nd.zeros((1,)) for _ in self.layers]

    def _op(self, reads, writes, seconds: float) -> None:
        self._bridge.emulate_compute([a.handle.value for a in reads], [a.handle.value for a in writes], seconds)

    def forward(self) -> None:
        for k, params in enumerate(self.layers):
            reads = [p.data() for p in params] + ([self._acts[k - 1]] if k else [])
            self._op(reads, [self._acts[k]], self.forward_s[k])

    def backward(self) -> None:
        last = len(self.layers) - 1
        for k in range(last, -1, -1):
            params = self.layers[k]
            reads = [self._acts[k], *(p.data() for p in params)] + ([self._act_grads[k + 1]] if k < last else [])
            self._op(reads, [self._act_grads[k], *(p.grad() for p in params)], self.forward_s[k] * BACKWARD_FACTOR)

    @property
    def done(self):
        """An array that is ready when the last queued forward op is."""
        return self._acts[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--iters", type=int, default=200, help="iterations per worker")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compute-s", type=float, default=0.0, help="emulated compute per iteration (seconds)")
    worker_output.add_out_argument(p, per_rank=True)
    args = p.parse_args(argv)
    worker_output.start_logging(rank_lines=True)

    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    if args.system == "p3":
        import p3kv  # noqa: F401  (registers kvstore 'p3')

    x_train, x_test, y_train, y_test = load_data(args.seed)
    net = build_net(args.hidden, args.layers, args.seed)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    kv = mx.kv.create(args.system)
    rank, workers = kv.rank, kv.num_workers
    # The gradient is the mean over every worker's batch (the servers sum the workers' gradients; ASGD applies each
    # worker's alone). It is fixed before the optimizer is sent to the servers, so trainer.step(1) keeps it.
    optimizer = mx.optimizer.SGD(learning_rate=args.lr, momentum=args.momentum, wd=args.wd,
                                 rescale_grad=1.0 / (args.batch_size * workers))
    trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=kv, update_on_kvstore=True)
    trainer._init_kvstore()  # before the clock: connecting and broadcasting the initial weights is not training
    emulated = EmulatedCompute(net, args.compute_s) if args.compute_s > 0 else None
    test_x, test_y = mx.nd.array(x_test), y_test.astype("int64")

    eval_net = build_net(args.hidden, args.layers, args.seed)  # the trainer's net refuses new weights (dist kvstore)
    eval_params = list(eval_net.collect_params().values())

    def evaluate() -> tuple[float, float]:
        out = eval_net(test_x)
        loss = float(loss_fn(out, mx.nd.array(y_test)).mean().asscalar())
        return float((out.argmax(axis=1).asnumpy().astype("int64") == test_y).mean()), loss

    LOG.info("rank %d/%d %s: %d train / %d test digits, MLP %dx%d, %d iterations, compute %.3f s/iter", rank,
             workers, args.system, len(x_train), len(x_test), args.layers, args.hidden, args.iters, args.compute_s)
    losses, iter_s, snapshots = [], [], []
    params = list(net.collect_params().values())
    source = batches(len(x_train), rank, workers, args.batch_size, args.seed)
    start = last = time.perf_counter()
    for it in range(args.iters):
        index = next(source)
        data, label = mx.nd.array(x_train[index]), mx.nd.array(y_train[index])
        if emulated:
            emulated.forward()
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        if emulated:
            emulated.backward()
        trainer.step(1)
        losses.append(float(loss.mean().asscalar()))  # waits for this forward, as a metric update would
        if emulated:
            emulated.done.wait_to_read()
        now = time.perf_counter()
        iter_s.append(now - last)
        last = now
        if (it + 1) % 25 == 0:
            LOG.info("rank %d iter %d: training loss %.4f, %.1f s", rank, it + 1, losses[-1], now - start)
        if rank == 0 and ((it + 1) % args.eval_every == 0 or it + 1 == args.iters):
            # A copy is an engine op that runs once this iteration's update has landed: nothing waits for it, so
            # evaluating costs the training no time. The snapshots are evaluated after training.
            snapshots.append((it + 1, now - start, [p.data().copy() for p in params]))
    train_s = time.perf_counter() - start
    mx.nd.waitall()
    evals = []
    for iteration, seconds, weights in snapshots:
        for param, weight in zip(eval_params, weights):
            param.set_data(weight)
        accuracy, test_loss = evaluate()
        evals.append({"iteration": iteration, "time_s": round(seconds, 4), "test_accuracy": accuracy,
                      "test_loss": test_loss, "train_loss": losses[iteration - 1]})
        LOG.info("rank 0 iter %d: test accuracy %.4f, test loss %.4f, %.1f s", iteration, accuracy, test_loss,
                 seconds)
    result = {"rank": rank, "num_workers": workers, "system": args.system, "iters": args.iters,
              "batch_size": args.batch_size, "hidden": args.hidden, "layers": args.layers, "lr": args.lr,
              "momentum": args.momentum, "wd": args.wd, "seed": args.seed, "compute_s": args.compute_s,
              "params": int(sum(p.data().size for p in net.collect_params().values())),
              "train_s": train_s, "losses": losses, "iter_s": iter_s,
              "evals": evals, "weight_checksum": float(sum(np.abs(p.data().asnumpy()).sum() for p in params)),
              "versions": worker_output.versions("mxnet", "p3kv", "scikit-learn", "numpy")}
    worker_output.write_rank(args.out, rank, result)
    LOG.info("rank %d: %d iterations in %.1f s", rank, args.iters, result["train_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
