"""Worker for tests/test_stalled_server.py: one float32 key of --size elements, pushed for --iterations iterations.

Worker r pushes ``r + 1`` everywhere in iteration i (times i), so every broadcast of iteration i must equal
``i * W * (W + 1) / 2``. The last worker is a straggler when --lag is set: it sleeps --lag seconds before each of
its pushes and waits for each broadcast. The others push every iteration at once, without waiting (each into its
own output array): their pushes run ahead of the straggler's, the server holds them, and once they are over their
share of P3_SERVER_QUEUE_BYTES it stops reading them until the straggler catches up.

Prints ``ready rank=R pid=P``, ``pushed iteration N`` after each push() returned, ``iteration N ok`` for each
correct broadcast, then ``done iterations=N pause=P resume=R`` (the PAUSE and RESUME frames it received) after
close(); exit 0. Exit 3 with ``FAILED <exception class> after <seconds> s: <message>`` when an operation raises
P3Error (the seconds since the last push() returned); exit 4 with ``WRONG ...`` when a broadcast is not the sum.
"""

import argparse
import os
import sys
import time

import numpy as np

from p3kv import P3Error, P3Worker


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--lag", type=float, default=0.0, help="seconds the last worker sleeps before each push")
    args = parser.parse_args()
    worker = P3Worker()
    rank, size = worker.rank, worker.num_workers
    print(f"ready rank={rank} pid={os.getpid()}", flush=True)
    straggler = args.lag > 0 and rank == size - 1
    started = time.monotonic()
    try:
        weight = np.zeros(args.size, np.float32)
        worker.init("weight", weight)
        worker.wait()
        outs = [np.empty(args.size, np.float32) for _ in range(args.iterations)]
        for i in range(1, args.iterations + 1):
            if straggler:
                time.sleep(args.lag)
            worker.push("weight", np.full(args.size, (rank + 1) * i, np.float32), out=outs[i - 1])
            started = time.monotonic()
            print(f"pushed iteration {i}", flush=True)
            if straggler:
                worker.wait("weight")
        worker.wait()
        for i, out in enumerate(outs, 1):
            expected = np.float32(i * size * (size + 1) // 2)
            if not np.all(out == expected):
                print(f"WRONG iteration {i}: {out[:4]} != {expected}", flush=True)
                return 4
            print(f"iteration {i} ok", flush=True)
        received = worker.counters()["received"]
        worker.close()
    except P3Error as e:
        print(f"FAILED {type(e).__name__} after {time.monotonic() - started:.2f} s: {e}", flush=True)
        return 3
    print(f"done iterations={args.iterations} pause={received.get('PAUSE', 0)} "
          f"resume={received.get('RESUME', 0)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
