"""One worker of benchmarks/suites/startup_bench.py: a Gluon Trainer on kvstore 'p3' whose first step it times from the
job's launch (STARTUP_T0, seconds since the epoch). Worker 0 writes one JSON line to --out.

usage: startup_worker.py --out FILE --update-on-kvstore 1|0 [--steps N]
"""

import argparse
import os
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import p3kv  # noqa: F401  (makes kvstore='p3' available)
from benchmarks.workloads import worker_output

WIDTH = 1024  # 4 Dense layers of 1024: about 3 M parameters, enough slices for every server
BATCH = 16


def main() -> None:
    t0 = float(os.environ["STARTUP_T0"])
    p = argparse.ArgumentParser()
    worker_output.add_out_argument(p, required=True)
    p.add_argument("--update-on-kvstore", type=int, choices=(0, 1), required=True)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    imported = time.time() - t0
    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    for _ in range(3):
        net.add(gluon.nn.Dense(WIDTH, activation="relu"))
    net.add(gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4},
                            kvstore="p3", update_on_kvstore=bool(args.update_on_kvstore))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)  # the data does not matter here; the kvstore (and its rank) exists after step 1
    stamps = []
    for _ in range(args.steps):
        x = mx.nd.array(rng.rand(BATCH, WIDTH).astype(np.float32))
        y = mx.nd.array(rng.randint(0, 10, size=(BATCH,)).astype(np.float32))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(BATCH)
        for param in net.collect_params().values():
            param.data().wait_to_read()
        stamps.append(time.time() - t0)
    if trainer._kvstore.rank == 0:
        worker_output.append_line(args.out, {"imported_s": imported, "first_step_s": stamps[0],
                                             "last_step_s": stamps[-1],
                                             "later_step_s": (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)})


if __name__ == "__main__":
    main()
