"""Misuses kvstore 'p3' on purpose and reports, as one JSON line per case, which exception each misuse raised.

usage: kv_misuse.py   (in a p3 job of 2 workers)

Cases: pushpull of a key never initialised; pushpull whose gradient, or whose `out`, has another shape than the
key; init of the same key twice; sparse arrays (row_sparse, csr) through init, pushpull, push and
row_sparse_pull, and a Gluon Trainer whose Embedding has sparse gradients; the kvstore's type, and how a
Gluon Trainer sees it.
Then, not caught: one key initialised with different sizes on the two workers,
which only the servers can see; the worker whose init arrives second gets P3Error naming the key and exits
non-zero, which ends the job.
"""

import json
import sys
import time

import mxnet as mx

import p3kv  # noqa: F401


def attempt(name, fn):
    started = time.time()
    try:
        fn()
        mx.nd.waitall()
        outcome = {"case": name, "raised": None}
    except Exception as e:  # noqa: BLE001  (reporting which exception is the point)
        outcome = {"case": name, "raised": type(e).__name__, "message": str(e)}
    outcome["seconds"] = round(time.time() - started, 2)
    print("RESULT " + json.dumps(outcome), flush=True)


def main():
    kv = mx.kv.create("p3")
    good = mx.nd.ones((2, 3))
    kv.init(0, good)
    attempt("uninitialised key", lambda: kv.pushpull(7, mx.nd.ones((2, 3))))
    attempt("gradient shape", lambda: kv.pushpull(0, mx.nd.ones((3, 2))))
    attempt("out shape", lambda: kv.pushpull(0, mx.nd.ones((2, 3)), out=mx.nd.zeros((2, 2))))
    attempt("init twice", lambda: kv.init(0, good))
    attempt("sparse init", lambda: kv.init(5, mx.nd.ones((4, 3)).tostype("row_sparse")))
    attempt("sparse pushpull", lambda: kv.pushpull(0, mx.nd.ones((2, 3)).tostype("csr")))
    attempt("sparse push", lambda: kv.push(0, mx.nd.ones((2, 3)).tostype("row_sparse")))
    attempt("row_sparse_pull", lambda: kv.row_sparse_pull(0, out=mx.nd.ones((2, 3)).tostype("row_sparse"),
                                                          row_ids=mx.nd.array([0])))

    def gluon_sparse():
        embed = mx.gluon.nn.Embedding(10, 4, sparse_grad=True, prefix="embed_")
        embed.initialize()
        mx.gluon.Trainer(embed.collect_params(), "sgd", kvstore=kv)._init_kvstore()

    attempt("gluon sparse gradient", gluon_sparse)
    # Gluon treats kvstore 'p3' as dist_sync although its type is 'p3': distributed, optimizer on the servers,
    # and a distributed kvstore cannot be reset.
    dense = mx.gluon.nn.Dense(2, in_units=2, prefix="dense_")
    dense.initialize()
    trainer = mx.gluon.Trainer(dense.collect_params(), "sgd", kvstore=kv)
    trainer._init_kvstore()
    attempt("reset distributed", trainer._reset_kvstore)
    seen = {"type": kv.type, "distributed": trainer._distributed, "update_on_kvstore": trainer._update_on_kvstore}
    print(f"RESULT {json.dumps({'case': 'type', 'raised': None, 'seconds': 0, **seen})}", flush=True)
    print(f"rank {kv.rank} finished the local cases", flush=True)
    # The same key with 6 elements on worker 0 and 4 on worker 1.
    kv.init(1, mx.nd.ones((2, 3) if kv.rank == 0 else (4,)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
