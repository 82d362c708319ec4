"""Trains gluon_train.py's net with kvstore='p3' step after step until MXNet raises, for tests that kill a node.

Prints ``step N`` once step N's loss is read, which waits for the forward pass, which waits for the weights the
previous step's pushpull writes: a step is printed only after the servers answered the step before. When a node
dies, the engine operation of a pushpull fails and the next read raises ``mxnet.base.MXNetError``; the script then
prints ``MXNETERROR after <seconds> s: <message on one line>`` (the seconds since the last printed step) and exits
with EXIT_MXNET_ERROR. Gives up after --max-steps steps (exit 0): a node that never failed is the test's failure.
"""

import argparse
import sys
import time

import mxnet as mx
import numpy as np
from gluon_train import build_net
from mxnet import autograd, gluon

import p3kv  # noqa: F401  (makes kvstore='p3' available)

EXIT_MXNET_ERROR = 7
BATCH = 4


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=10_000)
    args = p.parse_args()
    mx.random.seed(42)
    net = build_net()
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore="p3")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    last = time.monotonic()
    try:
        for step in range(args.max_steps):
            x = mx.nd.array(rng.rand(BATCH, 2, 6, 6))
            y = mx.nd.array(rng.randint(0, 3, size=(BATCH,)))
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(BATCH)
            loss.asnumpy()  # the read a training loop does sooner or later (logging, metrics)
            print(f"step {step}", flush=True)
            last = time.monotonic()
        mx.nd.waitall()
    except mx.base.MXNetError as e:
        message = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"MXNETERROR after {time.monotonic() - last:.2f} s: {message}", flush=True)
        return EXIT_MXNET_ERROR
    print(f"no failure in {args.max_steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
