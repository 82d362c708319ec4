"""Test worker: several keys of several dtypes and sizes, several iterations; checks every broadcast
against numpy and dumps final buffers, slices and counters to $P3_TEST_OUT/worker<rank>.npz/.json.

P3_TEST_LR: if set, the servers run SGD with that learning rate (test_server.py sgd:<lr>); otherwise they
broadcast the aggregated sum.
"""

import json
import os
import sys

import numpy as np

from p3kv.core.worker import P3Worker

ITERATIONS = 3
# name -> (size, dtype): sizes around the slice size (1000 in these tests) and tiny keys that still spread.
KEYS = {
    "one": (1, "float32"),
    "exact": (1000, "float32"),
    "plus_one": (1001, "float64"),
    "many": (7345, "float32"),
    "half": (2500, "float16"),
    3: (17, "float64"),
    4: (5, "float16"),
}


def gradient(rank, it, size, dtype):
    # Small integers and halves: exactly representable, so sums are exact in every dtype and order.
    base = np.arange(size, dtype=np.float64) % 7 - 3
    return ((base + rank + it) * 0.5).astype(dtype)


def main():
    out_dir = os.environ["P3_TEST_OUT"]
    lr = os.environ.get("P3_TEST_LR")
    w = P3Worker()
    n = w.num_workers
    params = {}
    for key, (size, dtype) in KEYS.items():
        init = (np.arange(size) % 5).astype(dtype) if w.rank == 0 else np.full(size, 99, dtype)
        params[key] = init
        w.init(key, init)
    w.wait()
    for key, (size, dtype) in KEYS.items():
        expect = (np.arange(size) % 5).astype(dtype)
        assert np.array_equal(params[key], expect), f"init of {key!r} not equal to worker 0's value"
    ref = {key: (np.arange(size) % 5).astype(dtype) for key, (size, dtype) in KEYS.items()}
    for it in range(1, ITERATIONS + 1):
        outs = {}
        for prio, key in enumerate(reversed(list(KEYS))):
            size, dtype = KEYS[key]
            # SGD: the servers update the weights, which come back into the weights; else the sum comes back.
            outs[key] = params[key] if lr else np.empty(size, dtype)
            w.push(key, gradient(w.rank, it, size, dtype), out=outs[key], priority=-prio)
        w.wait()
        for key, (size, dtype) in KEYS.items():
            total = sum(gradient(r, it, size, "float64") for r in range(n))
            ref[key] = (ref[key] - float(lr) * total).astype(dtype) if lr else total.astype(dtype)
            assert np.array_equal(outs[key], ref[key]), f"key {key!r} iteration {it}: {outs[key][:4]} != {ref[key][:4]}"
    np.savez(os.path.join(out_dir, f"worker{w.rank}.npz"), **{str(k): v for k, v in params.items()})
    slices = {str(k): w.slices(k) for k in KEYS}
    # Counters after close: the sender counts a frame once its write returned, and the server's broadcast of the
    # last PUSH can complete the wait before that (a fresh-clone run read 50 PUSHes of 51).
    w.close()
    with open(os.path.join(out_dir, f"worker{w.rank}.json"), "w") as f:
        json.dump({"rank": w.rank, "counters": w.counters(), "slices": slices}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
