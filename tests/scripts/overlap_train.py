"""Trains a net whose backward takes a while and whose last layer is large, on kvstore 'p3', and records when
the next forward pass reaches its first layer, to show from the trace that communication overlaps both
backward and the next forward.

usage: overlap_train.py OUT_DIR [--steps N]     (run with P3_TRACE set, under python -m p3kv.launch)

Forward: conv "afirst" (the first layer) -> marker -> 3 convs -> pool -> dense "zlast" (the last layer, 16.8M
parameters, 67 MB). The marker's backward sleeps 20 ms (standing for the layers a real net has there), so the
last layer's slices are on the wire well before the first layer's gradient exists; the rest of backward is short
(12x12 inputs) next to the last layer's transfer, so the first layer's gradient is ready while the last layer's
slices are still queued, even with a fast server. The marker is a CustomOp that passes its input through and
appends time.time_ns() to a list each time its forward runs, i.e. as soon as the first layer's forward output
exists. Writes
OUT_DIR/overlap-rank<r>.json: {"marks": [ns per step], "keys": {name: kvstore key}}.
"""

import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import p3kv  # noqa: F401  (makes kvstore='p3' available)

MARKS = []  # time.time_ns() of each forward of the marker, in order
BACKWARD_SECONDS = 0.02


class Marker(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        MARKS.append(time.time_ns())
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        time.sleep(BACKWARD_SECONDS)  # stands for the backward of layers a real net has here
        self.assign(in_grad[0], req[0], out_grad[0])


@mx.operator.register("p3_overlap_marker")
class MarkerProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ["data"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return Marker()


class MarkerBlock(gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.Custom(x, op_type="p3_overlap_marker")


CLASSES = 32768


def build_net():
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(16, 3, padding=1, in_channels=3, prefix="afirst_"))
        net.add(MarkerBlock())
        net.add(gluon.nn.Activation("relu"))
        for i, channels in enumerate((32, 64, 32)):
            net.add(gluon.nn.Conv2D(channels, 3, padding=1, in_channels=(16, 32, 64)[i], activation="relu",
                                    prefix=f"mid{i}_"))
        net.add(gluon.nn.MaxPool2D(3))
        net.add(gluon.nn.Flatten())
        net.add(gluon.nn.Dense(CLASSES, in_units=32 * 4 * 4, prefix="zlast_"))
    return net


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    mx.random.seed(3)
    net = build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    batch = 8
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore="p3")
    # Create the kvstore now, to know this worker's rank, with the gradient scale trainer.step(batch) sets.
    trainer._optimizer.rescale_grad = 1.0 / batch
    trainer._init_kvstore()
    rank = trainer._kvstore.rank
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(args.steps):
        rng = np.random.RandomState(10 * rank + step)
        x = mx.nd.array(rng.rand(batch, 3, 12, 12).astype(np.float32))
        y = mx.nd.array(rng.randint(0, CLASSES, size=(batch,)).astype(np.float32))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)  # returns at once: nothing in this loop waits for the kvstore
    mx.nd.waitall()
    keys = {p.name: i for i, p in enumerate(trainer._params)}
    with open(os.path.join(args.out, f"overlap-rank{rank}.json"), "w") as f:
        json.dump({"marks": MARKS, "keys": keys}, f)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
