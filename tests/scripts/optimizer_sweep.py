"""Trains a few arrays of each configuration of a list of MXNet optimizers through the kvstore API with the
optimizer on the servers (kv.set_optimizer, then pushpull(grad, out=weight)), and saves every final weight.

usage: optimizer_sweep.py KVSTORE OUT_DIR [--save-load] [--only NAME ...]

Every worker pushes deterministic gradients (seeded by worker, step and key), so a p3 job and a dist_sync job
must end with the same weights. Each configuration uses its own keys (three arrays that span several slices
when P3_SLICE_SIZE is small) and gets a fresh optimizer, as after a set_optimizer on either system.
--save-load (p3 only: MXNet's dist_sync cannot save server states): after step 2 of each configuration, saves
the servers' states with the optimizer, replaces the optimizer with one that keeps other states (the servers then
drop every slice's state and update count), then loads the file: the run can then only end where MXNet's
uninterrupted update does if save/load carried every slice's state and every key's count.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np

import p3kv  # noqa: F401  (makes kvstore='p3' available)

SHAPES = [(7,), (13, 11), (5, 40)]
STEPS = 5
SAVE_AT = 2


def configs():
    """(name, dtype, optimizer factory) for every case the servers must run like dist_sync's."""
    from custom_optimizers import ScaledSGD

    sched = lambda: mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.1)  # noqa: E731
    common = {"rescale_grad": 0.5, "wd": 1e-3}
    cases = [
        ("sgd", "float32", lambda: mx.optimizer.SGD(learning_rate=0.1, **common)),
        ("sgd_momentum_clip", "float32",
         lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, clip_gradient=0.3, **common)),
        ("sgd_scheduler", "float32", lambda: mx.optimizer.SGD(momentum=0.9, lr_scheduler=sched(), **common)),
        ("sgd_mults", "float32", lambda: _mults(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, **common))),
        ("sgd_fp16_multi_precision", "float16",
         lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, multi_precision=True, **common)),
        ("nag", "float32", lambda: mx.optimizer.NAG(learning_rate=0.1, momentum=0.9, **common)),
        ("adam", "float32", lambda: mx.optimizer.Adam(learning_rate=0.01, **common)),
        ("adam_fp16_multi_precision", "float16",
         lambda: mx.optimizer.Adam(learning_rate=0.01, multi_precision=True, **common)),
        ("rmsprop", "float32", lambda: mx.optimizer.RMSProp(learning_rate=0.01, **common)),
        ("rmsprop_centered", "float32",
         lambda: mx.optimizer.RMSProp(learning_rate=0.01, centered=True, clip_weights=0.5, **common)),
        ("adagrad", "float32", lambda: mx.optimizer.AdaGrad(learning_rate=0.05, **common)),
        ("adadelta", "float32", lambda: mx.optimizer.AdaDelta(**common)),
        ("adamax", "float32", lambda: mx.optimizer.Adamax(learning_rate=0.01, **common)),
        ("signum", "float32", lambda: mx.optimizer.Signum(learning_rate=0.01, momentum=0.9, wd_lh=0.01, **common)),
        ("ftrl", "float32", lambda: mx.optimizer.Ftrl(learning_rate=0.1, **common)),
        ("ftml", "float32", lambda: mx.optimizer.FTML(learning_rate=0.01, **common)),
        # DCASGD with momentum fails in MXNet 1.9.1 itself (`if mom:` on an NDArray), on every system.
        ("dcasgd", "float32", lambda: mx.optimizer.DCASGD(learning_rate=0.1, **common)),
        ("user_subclass", "float32", lambda: ScaledSGD(learning_rate=0.1, momentum=0.9, **common)),
        # MXNet's own update on float16 slices: the float32 copy of the weights from the float32 sum, as dist_sync.
        ("user_subclass_fp16_multi_precision", "float16",
         lambda: ScaledSGD(learning_rate=0.1, momentum=0.9, multi_precision=True, **common)),
    ]
    return cases


def _mults(opt):
    """Per-index multipliers (keys of this case are set once known; see run_case)."""
    opt._p3_test_mults = True
    return opt


def run_case(kv, case_index, name, dtype, make, save_load, out_dir):
    rank = kv.rank
    base = 100 * (case_index + 1)
    keys = [base + i for i in range(len(SHAPES))]
    weights = {}
    for key, shape in zip(keys, SHAPES):
        init = np.random.RandomState(key).uniform(-1, 1, shape).astype(dtype)
        weights[key] = mx.nd.array(init, dtype=dtype)
        kv.init(key, weights[key])
    opt = make()
    if getattr(opt, "_p3_test_mults", False):
        opt.set_lr_mult({keys[0]: 0.5, keys[2]: 0.0})
        opt.set_wd_mult({keys[1]: 0.0})
    kv.set_optimizer(opt)
    for step in range(STEPS):
        for i, key in reversed(list(enumerate(keys))):  # backward order: last layer first
            rng = np.random.RandomState(1_000_000 * rank + 1000 * step + key)
            grad = mx.nd.array(rng.normal(0, 1, SHAPES[i]).astype(dtype), dtype=dtype)
            kv.pushpull(key, grad, out=weights[key], priority=-i)
        # As in training, where the next forward pass reads every weight: no key starts step s+1 before all
        # finished step s. (Without it the first key could run steps ahead, and MXNet's num_update, the max over
        # keys that lr schedulers read, would depend on timing on any parameter server, dist_sync's included.)
        mx.nd.waitall()
        if save_load and step + 1 == SAVE_AT:
            mx.nd.waitall()
            path = os.path.join(out_dir, f"states-{name}-rank{rank}")
            kv.save_optimizer_states(path, dump_optimizer=True)
            kv.set_optimizer(mx.optimizer.Test())  # another state layout: the servers drop every state and count
            kv.load_optimizer_states(path)
    return {f"{name}/{key}": weights[key].asnumpy() for key in keys}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kvstore")
    p.add_argument("out")
    p.add_argument("--save-load", action="store_true")
    p.add_argument("--only", nargs="*")
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    results = {}
    for index, (name, dtype, make) in enumerate(configs()):
        if args.only and name not in args.only:
            continue
        results.update(run_case(kv, index, name, dtype, make, args.save_load, args.out))
    mx.nd.waitall()
    np.savez(os.path.join(args.out, f"{args.kvstore}-rank{kv.rank}.npz"), **results)
    print(f"rank {kv.rank}: {len(results)} arrays", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
