"""Pushes a large, non-urgent key and right after it a small, urgent one; dumps the worker's trace.

Sizes come from P3_SLICE_SIZE and P3_TEST_BULK_SLICES. Output: $P3_TEST_OUT/worker<rank>.json.
"""

import json
import os
import sys

import numpy as np

from p3kv.core.worker import P3Worker

BULK, URGENT = 1, 0  # key ids


def main():
    w = P3Worker()  # P3_TRACE must be set: the test reads the trace
    bulk = np.ones(w.slice_size * int(os.environ["P3_TEST_BULK_SLICES"]), np.float32)
    urgent = np.ones(w.slice_size, np.float32)
    w.init(BULK, bulk)
    w.init(URGENT, urgent)
    w.wait()
    w.push(BULK, bulk, priority=-10)  # e.g. the last layer's gradient, ready first in backward
    w.push(URGENT, urgent, priority=0)  # the first layer's gradient: needed first by the next forward
    w.wait()
    assert np.all(bulk == w.num_workers) and np.all(urgent == w.num_workers)
    with open(os.path.join(os.environ["P3_TEST_OUT"], f"worker{w.rank}.json"), "w") as f:
        json.dump({"trace": w.trace_events()}, f)
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
