"""Worker script for the launcher's baseline tests: a dist_sync pushpull must sum every worker's values.

Run through ``python -m p3kv.launch --kvstore dist_sync`` (or ``mxnet-p3``). Worker r pushes (r + 1) * ones, so
with W workers every element of the result is W * (W + 1) / 2. Prints ``OK rank=R`` and exits 0, or exits 1
with a message naming the wrong values.
"""

import logging
import os
import sys

import mxnet as mx

LOG = logging.getLogger("dist_sync_sum")
KEY = 3
SIZE = 10


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    kv = mx.kv.create("dist_sync")
    rank, num_workers = kv.rank, kv.num_workers
    kv.init(KEY, mx.nd.zeros(SIZE))
    out = mx.nd.zeros(SIZE)
    kv.pushpull(KEY, mx.nd.ones(SIZE) * (rank + 1), out=out)
    expected = num_workers * (num_workers + 1) / 2
    got = out.asnumpy()
    if not (got == expected).all():
        LOG.error("rank %d: pushpull gave %s, expected %s everywhere", rank, got.tolist(), expected)
        return 1
    sys.stdout.write(f"OK rank={rank} baseline={os.environ.get('P3_BASELINE', '')}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
