"""Changes the servers' optimizer (or its states) right after a step's pushpulls, without waiting for them, and
saves the final weights: the change must apply between two iterations for every slice of every key, as on
MXNet's dist_sync (whose workers wait for their pushes: its pushpull is synchronous to the servers' reply).

usage: optimizer_swap.py OUT_DIR --change set|again|load|keep

Two keys of SIZE elements, every worker's gradient (rank + 1) * (step + 1) (the servers sum 3 * (step + 1): Adam
normalises a constant gradient away, so that dropped, kept and restarted states would all look alike). Steps 0
and 1 run and finish; step 2's gradients come out of a slow engine operation, so its pushes leave well after the
script has gone on to the change; step 3 follows the change.
--change set: SGD(lr=1), then kv.set_optimizer(SGD(lr=0.5)) (exact arithmetic: -3, -9, -18, then -24; -13.5 for
    slices that the new optimizer updated at step 2).
--change again: Adam, then kv.set_optimizer(a new Adam) (Module.init_optimizer(force_init=True)): dist_sync's
    servers make a new Updater, so m, v and the update counts start afresh.
--change load: Adam; states saved after step 0 and loaded right after step 2's pushpulls.
--change keep: Adam, then kv.set_optimizer(the same Adam, keep_states=True) stating the update counts (as
    p3kv.mxnet.sockeye_train does): the run must be Adam's uninterrupted one.
The result file holds what MXNet's own optimizer computes on the whole array with the change between step 2 and
step 3 ("expected"), for the test to compare bit for bit.
"""

import argparse
import copy
import os
import sys

import mxnet as mx
import numpy as np

import p3kv  # noqa: F401  (makes kvstore='p3' available)

SIZE = 60_000
KEYS = (0, 1)
STEPS = 4
SLOW_STEP = 2


def gradient(rank, step, slow):
    value = mx.nd.full((SIZE,), (rank + 1) * (step + 1), dtype="float32")
    if not slow:
        return value
    # A slow engine operation (a few hundred ms) that the gradient depends on: its pushes leave after the
    # script has gone on to the optimizer change.
    big = mx.nd.ones((1200, 1200))
    for _ in range(4):
        big = mx.nd.dot(big, big) * (1.0 / 1200)
    return mx.nd.broadcast_add(value, big.sum().reshape((1,)) * 0)


def first_optimizer(change):
    return mx.optimizer.SGD(learning_rate=1.0) if change == "set" else mx.optimizer.Adam(learning_rate=0.01)


def expected(change):
    """MXNet's optimizer on one whole array (what a dist_sync server runs), the change between steps 2 and 3."""
    opt = first_optimizer(change)
    w = mx.nd.zeros((SIZE,))
    state = opt.create_state_multi_precision(0, w)
    saved = None
    for s in range(STEPS):
        if s == SLOW_STEP + 1:
            if change in ("set", "again"):  # a new optimizer: dist_sync's servers make a new Updater (no states)
                opt = mx.optimizer.SGD(learning_rate=0.5) if change == "set" else first_optimizer(change)
                state = opt.create_state_multi_precision(0, w)
            elif change == "load":  # Updater.set_states: the saved states, the optimizer's counts go on
                state = saved
        opt.update_multi_precision(0, w, mx.nd.full((SIZE,), 3.0 * (s + 1)), state)
        if s == 0:
            saved = copy.deepcopy(state)
    return w.asnumpy()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--change", choices=("set", "again", "load", "keep"), required=True)
    args = p.parse_args()
    kv = mx.kv.create("p3")
    rank = kv.rank
    weights = {key: mx.nd.zeros((SIZE,)) for key in KEYS}
    for key in KEYS:
        kv.init(key, weights[key])
    kv.set_optimizer(first_optimizer(args.change))
    path = os.path.join(args.out, f"states-rank{rank}")
    for s in range(STEPS):
        for key in KEYS:
            kv.pushpull(key, gradient(rank, s, s == SLOW_STEP), out=weights[key])
        if s == 0 and args.change == "load":
            kv.save_optimizer_states(path)
        if s < SLOW_STEP:
            mx.nd.waitall()
            continue
        if s > SLOW_STEP:
            break
        if args.change == "set":
            kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5))
        elif args.change == "again":
            kv.set_optimizer(first_optimizer(args.change))
        elif args.change == "load":
            kv.load_optimizer_states(path)
        else:
            again = first_optimizer(args.change)
            again.begin_num_update = again.num_update = SLOW_STEP + 1  # every key was updated 3 times
            kv.set_optimizer(again, keep_states=True)
    mx.nd.waitall()
    results = {f"w{key}": weights[key].asnumpy() for key in KEYS}
    results["expected"] = expected(args.change)
    np.savez(os.path.join(args.out, f"swap-rank{rank}.npz"), **results)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
