"""Worker for tests/test_failures.py: misuses P3Worker in ways it must refuse with ConfigError, then does a valid
push that must still sum correctly and closes cleanly.

Prints ``REJECTED <case> <exception class>: <message>`` for each misuse (``ACCEPTED <case>`` if one was not
refused), ``sum ok rank=R`` once the valid push gave the right sum, and exits 0 after close().
"""

import sys

import numpy as np

from p3kv import P3Worker

SIZE = 2500


def main() -> int:
    worker = P3Worker()
    value = np.zeros(SIZE, np.float32)
    worker.init("w", value)
    worker.wait()
    grad = np.full(SIZE, worker.rank + 1, np.float32)
    misuses = {
        "push-shape": lambda: worker.push("w", np.ones(SIZE + 1, np.float32)),
        "push-dtype": lambda: worker.push("w", np.ones(SIZE, np.float64)),
        "push-2d": lambda: worker.push("w", np.ones((SIZE, 1), np.float32)),
        "push-out-shape": lambda: worker.push("w", grad, out=np.zeros(SIZE - 1, np.float32)),
        "push-unknown": lambda: worker.push("nope", grad),
        "wait-unknown": lambda: worker.wait("nope"),
        "init-twice": lambda: worker.init("w", value),
    }
    for case, call in misuses.items():
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the class is part of what the test checks
            print(f"REJECTED {case} {type(e).__name__}: {e}", flush=True)
        else:
            print(f"ACCEPTED {case}", flush=True)
    out = np.zeros(SIZE, np.float32)
    worker.push("w", grad, out=out)
    worker.wait("w")
    expected = worker.num_workers * (worker.num_workers + 1) / 2
    if not (out == expected).all():
        print(f"WRONG sum: {out[:5]} != {expected}", flush=True)
        return 4
    print(f"sum ok rank={worker.rank}", flush=True)
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
