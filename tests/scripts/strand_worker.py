"""Pushes iteration 2 (whose update raises on raising_server.py) and iteration 3 back to back: the error of 2
must be reported and 3 must still complete (a failed update may not strand the pushes held behind it)."""

import sys

import numpy as np

from p3kv import P3Error, P3Worker

w = P3Worker()
w.init("k", np.zeros(10, np.float32))
w.wait()
w.push("k", np.ones(10, np.float32))
w.wait("k")
g2, g3 = np.ones(10, np.float32), np.full(10, 2, np.float32)
w.push("k", g2)  # iteration 2: the servers' update function raises
w.push("k", g3)  # iteration 3, queued before 2 failed
try:
    w.wait("k", timeout=20)
except P3Error as e:
    print(f"rank {w.rank} iteration 2 failed: {e}", flush=True)
else:
    sys.exit("the failed update was not reported")
assert np.all(g3 == 2 * w.num_workers), g3
print(f"rank {w.rank} iteration 3 ok", flush=True)
w.close()
