"""Misuses kvstore 'p3' on purpose and reports, as one JSON line per case, which exception each misuse raised.

usage: kv_misuse.py   (in a p3 job of 2 workers)

Cases: pushpull of a key never initialised; pushpull whose gradient, or whose `out`, has another shape than the
key; init of the same key twice. Then, not caught: one key initialised with different sizes on the two workers,
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
    print(f"rank {kv.rank} finished the local cases", flush=True)
    # The same key with 6 elements on worker 0 and 4 on worker 1.
    kv.init(1, mx.nd.ones((2, 3) if kv.rank == 0 else (4,)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
