"""Worker for tests/test_failures.py: pushes and checks sums in a loop until told to stop or until p3kv fails.

Prints ``ready rank=R pid=P`` once it joined, then ``iteration N ok`` after each iteration whose broadcast equals
the sum numpy computes. Worker r pushes ``(r + 1) * N + arange(SIZE)`` for iteration N, so the sum over W workers
is ``N * W * (W + 1) / 2 + W * arange(SIZE)``, exact in float32 while it stays below 2^24 (millions of
iterations); past that it exits 6 with ``STOPPED ...`` rather than report a rounding as a wrong sum.

Stops after --iterations iterations, or (with --stop-file) at the first iteration, no earlier than
--min-iterations, at which worker 0 sees that file exist: worker 0 tells the others by pushing 1 on a control key,
so every worker stops after the same iteration. Then it closes and prints ``done iterations=N``; exit 0.

Exit 3 with ``FAILED <exception class> after <seconds> s: <message>`` when an operation raises P3Error (the
seconds are how long the failing call blocked); exit 4 with ``WRONG ...`` when a broadcast is not the sum.

With --hold-close PREFIX it prints ``holding close after iteration N`` after its last iteration and calls close()
only once the file PREFIX<rank> exists; with --hold-exit PREFIX it waits for PREFIX<rank> after ``done`` before it
exits (so a test can kill a node while the job is closing). It gives up after 120 s (exit 5).

With --straggle S the last worker is a straggler: before each iteration's push of "weight" (odd iterations) or of
"stop" (even iterations) it sleeps a random 0-S seconds (seeded by --seed, printed as ``straggle seed=N``).
"""

import argparse
import os
import random
import sys
import time

import numpy as np

from p3kv import P3Error, P3Worker

SIZE = 3000  # several slices with a small P3_SLICE_SIZE, so every server holds part of the key
EXACT = 2**24  # float32 holds every integer below this exactly


def gradient(rank: int, iteration: int) -> np.ndarray:
    """What worker `rank` pushes in `iteration`: float32 at every iteration. (np.float32 first: numpy 1.x casts a
    Python int of 2^16 or more with a float32 array to float64, which the float32 key rightly refuses; a job
    that ran past iteration 32768 used to fail there.)"""
    return np.arange(SIZE, dtype=np.float32) + np.float32((rank + 1) * iteration)


def expected_sum(size: int, iteration: int) -> np.ndarray:
    """The sum of `size` workers' gradients in `iteration`."""
    return np.arange(SIZE, dtype=np.float32) * np.float32(size) + np.float32(iteration * size * (size + 1) // 2)


def exact(size: int, iteration: int) -> bool:
    """Whether every element of the sum (and so of each gradient) is an integer float32 holds exactly."""
    return iteration * size * (size + 1) // 2 + size * (SIZE - 1) < EXACT
HOLD_LIMIT = 120.0  # seconds a worker waits for a --hold-close/--hold-exit file


def hold(prefix: str, rank: int) -> bool:
    """Wait until the file <prefix><rank> exists; False after HOLD_LIMIT. A short poll: this is a test's go-ahead,
    not a guess at how long something takes."""
    deadline = time.monotonic() + HOLD_LIMIT
    while not os.path.exists(f"{prefix}{rank}"):
        if time.monotonic() > deadline:
            print(f"gave up waiting for {prefix}{rank}", flush=True)
            return False
        time.sleep(0.02)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=0, help="stop after this many (0: no limit)")
    parser.add_argument("--stop-file")
    parser.add_argument("--min-iterations", type=int, default=1)
    parser.add_argument("--straggle", type=float, default=0.0, help="max seconds the last worker sleeps")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--hold-close", metavar="PREFIX", help="before close(), wait for the file PREFIX<rank>")
    parser.add_argument("--hold-exit", metavar="PREFIX", help="before exiting, wait for the file PREFIX<rank>")
    args = parser.parse_args()
    worker = P3Worker()
    rank, size = worker.rank, worker.num_workers
    print(f"ready rank={rank} pid={os.getpid()}", flush=True)
    straggle = args.straggle if rank == size - 1 else 0.0
    seed = random.randrange(2**32) if args.seed is None else args.seed
    if straggle:
        print(f"straggle seed={seed}", flush=True)
    rng = random.Random(seed)
    iteration = 0
    started = time.monotonic()
    try:
        weight = np.zeros(SIZE, np.float32)
        stop = np.zeros(1, np.float32)
        worker.init("weight", weight)
        worker.init("stop", stop)
        worker.wait()
        while not args.iterations or iteration < args.iterations:
            iteration += 1
            if not exact(size, iteration):
                print(f"STOPPED iteration {iteration}: the expected sums are no longer exact in float32; run fewer "
                      "iterations (--iterations or a stop file)", flush=True)
                return 6
            grad = gradient(rank, iteration)
            asked = rank == 0 and args.stop_file and iteration >= args.min_iterations and \
                os.path.exists(args.stop_file)
            stop[:] = 1.0 if asked else 0.0
            if straggle and iteration % 2:
                time.sleep(rng.uniform(0, straggle))
            worker.push("weight", grad, out=weight, priority=0)
            if straggle and not iteration % 2:
                time.sleep(rng.uniform(0, straggle))
            worker.push("stop", stop, priority=-1)
            started = time.monotonic()
            worker.wait("weight")
            worker.wait("stop")
            expected = expected_sum(size, iteration)
            if not np.array_equal(weight, expected):
                bad = np.flatnonzero(weight != expected)
                print(f"WRONG iteration {iteration}: {len(bad)} elements differ, first at {bad[0]}: "
                      f"{weight[bad[0]]} != {expected[bad[0]]}", flush=True)
                return 4
            print(f"iteration {iteration} ok", flush=True)
            if stop[0] != 0:
                break
        if args.hold_close:
            print(f"holding close after iteration {iteration}", flush=True)
            if not hold(args.hold_close, rank):
                return 5
        started = time.monotonic()
        worker.close()
    except P3Error as e:
        print(f"FAILED {type(e).__name__} after {time.monotonic() - started:.2f} s: {e}", flush=True)
        return 3
    print(f"done iterations={iteration}", flush=True)
    if args.hold_exit and not hold(args.hold_exit, rank):
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main())
