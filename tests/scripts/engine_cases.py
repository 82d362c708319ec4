"""pushpull through MXNet's engine in the cases the engine bridge must not get wrong; one JSON line per case.

usage: engine_cases.py alias|skip   (in a job of 2 workers; any kvstore: p3, or MXNet's dist_sync to compare)

alias: worker r pushes (r + 1) * ones into key 0 (2 x 3, float32) with `out` another handle of the gradient's
memory: a reshape of it, a slice of all of it, a detached handle, rows of the same array apart from it (out =
arr[2:4], grad = arr[0:2]); then with `out` overlapping part of it (arr[1:3] over arr[0:2]), and a plain
pushpull after that. Each case reports what `out` (and the gradient) hold after the wait, or the error raised.

skip: 6 steps of pushpull(0, (r + 1) * (step + 1) * ones, out=out); at step 2 worker 1's gradient depends on an
operation that fails inside MXNet's engine (random.normal with a negative scale), so the engine skips what reads
it and raises at the next wait. The script catches that error and trains on; each step reports `out`.
"""

import json
import sys

import mxnet as mx

import p3kv  # noqa: F401  (makes kvstore='p3' available)

KEY, SHAPE = 0, (2, 3)
SKIP_STEPS, FAIL_STEP, FAILING_RANK = 6, 2, 1


def report(case, **fields):
    print("RESULT " + json.dumps({"case": case, **fields}), flush=True)


def attempt(kv, case, grad, out, show):
    """pushpull(KEY, grad, out=out), waits, reports `show()` (a dict of arrays) or the error."""
    try:
        kv.pushpull(KEY, grad, out=out)
        out.wait_to_read()
        report(case, rank=kv.rank, **{k: v.asnumpy().tolist() for k, v in show().items()})
    except mx.base.MXNetError as e:
        report(case, rank=kv.rank, error=str(e))


def alias(kv):
    rank = kv.rank
    g = mx.nd.ones(SHAPE) * (rank + 1)
    attempt(kv, "reshape", g, g.reshape(SHAPE), lambda: {"grad": g})
    g = mx.nd.ones(SHAPE) * (rank + 1)
    attempt(kv, "slice of all", g, g[0:2], lambda: {"grad": g})
    g = mx.nd.ones(SHAPE) * (rank + 1)
    attempt(kv, "detached handle", g, g.detach(), lambda: {"grad": g})
    arr = mx.nd.ones((4, 3)) * (rank + 1)
    attempt(kv, "rows apart", arr[0:2], arr[2:4], lambda: {"grad": arr[0:2], "out": arr[2:4]})
    arr = mx.nd.ones((3, 3)) * (rank + 1)
    attempt(kv, "rows overlapping", arr[0:2], arr[1:3], lambda: {"arr": arr})
    g = mx.nd.ones(SHAPE) * (rank + 1)
    out = mx.nd.zeros(SHAPE)
    attempt(kv, "after", g, out, lambda: {"out": out})


def skip(kv):
    rank = kv.rank
    out = mx.nd.zeros(SHAPE)
    for step in range(SKIP_STEPS):
        grad = mx.nd.ones(SHAPE) * (rank + 1) * (step + 1)
        if step == FAIL_STEP and rank == FAILING_RANK:
            broken = mx.nd.random.normal(0, -1, shape=SHAPE)  # fails when the engine runs it
            grad = grad + broken * 0
        error = None
        try:
            kv.pushpull(KEY, grad, out=out)
            out.wait_to_read()
        except mx.base.MXNetError as e:
            error = str(e)
        report("step", rank=rank, step=step, out=out.asnumpy().tolist(), error=error)


def main():
    mode, kvstore = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "p3"
    kv = mx.kv.create(kvstore)
    kv.init(KEY, mx.nd.zeros(SHAPE))
    {"alias": alias, "skip": skip}[mode](kv)
    mx.nd.waitall()
    print(f"rank {kv.rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
