"""Worker script for the launcher's Horovod test: an allreduce must sum every rank's values.

Run through ``python -m p3kv.launch -s 0 --kvstore horovod``. Rank r allreduces (r + 1) * ones, so with W ranks
every element of the result is W * (W + 1) / 2. Prints ``OK rank=R size=W local=L/S`` and exits 0, or exits 1
naming what was wrong (a wrong sum, or a parameter-server variable that reached the rank). With ``--die-rank R``
rank R exits with code 3 after joining, while the others wait in the allreduce for it.
"""

import argparse
import logging
import os
import sys

import horovod.mxnet as hvd
import mxnet as mx

LOG = logging.getLogger("horovod_sum")
SIZE = 10


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--die-rank", type=int, default=-1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    leaked = sorted(k for k in os.environ if k.startswith(("DMLC_", "P3_ROLE", "P3_SECRET")))
    if leaked:
        LOG.error("parameter-server variables reached a Horovod rank: %s", ", ".join(leaked))
        return 1
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if rank == args.die_rank:
        print(f"rank {rank} dies", flush=True)
        os._exit(3)
    value = mx.nd.ones(SIZE) * (rank + 1)
    hvd.allreduce_(value, average=False, name="sum")
    expected = size * (size + 1) / 2
    got = value.asnumpy()
    if not (got == expected).all():
        LOG.error("rank %d: allreduce gave %s, expected %s everywhere", rank, got.tolist(), expected)
        return 1
    print(f"OK rank={rank} size={size} local={hvd.local_rank()}/{hvd.local_size()}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
