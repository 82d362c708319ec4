"""Test worker for tests/test_deploy.py: a few SGD steps through the p3kv core, then a checksum of the weights.

Each worker pulls its weights towards its own targets (loss 0.5 |w - t_rank|^2, gradient w - t_rank); the
servers sum the gradients and every worker applies the same step, so all workers end with the same weights,
equal to `reference()`. The weights span several slices, hence both servers. Writes the SHA-256 of the final
weights to OUT/weights<rank>.txt.
"""

import argparse
import hashlib
import os
import sys

import numpy as np

SIZE = 120_001  # three slices of the default 50,000 elements
STEPS = 5
LR = np.float32(0.25)


def initial() -> np.ndarray:
    return np.linspace(-1, 1, SIZE, dtype=np.float32)


def gradient(rank: int, weights: np.ndarray) -> np.ndarray:
    targets = np.random.default_rng(1000 + rank).standard_normal(SIZE).astype(np.float32)
    return weights - targets


def step(weights: np.ndarray, total: np.ndarray, num_workers: int) -> None:
    weights -= LR / np.float32(num_workers) * total


def checksum(weights: np.ndarray) -> str:
    return hashlib.sha256(weights.tobytes()).hexdigest()


def reference(num_workers: int) -> str:
    """The checksum every worker must report (exact for 2 workers: a float32 sum of two terms has one order)."""
    weights = initial()
    for _ in range(STEPS):
        total = np.zeros(SIZE, np.float32)
        for rank in range(num_workers):
            total += gradient(rank, weights)
        step(weights, total, num_workers)
    return checksum(weights)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for weights<rank>.txt")
    args = parser.parse_args()
    from p3kv.core.worker import P3Worker

    with P3Worker() as worker:
        weights = initial() if worker.rank == 0 else np.zeros(SIZE, np.float32)
        worker.init("weights", weights)
        worker.wait()
        for _ in range(STEPS):
            total = gradient(worker.rank, weights)
            worker.push("weights", total, priority=0)  # the sum over workers comes back into `total`
            worker.wait("weights")
            step(weights, total, worker.num_workers)
        with open(os.path.join(args.out, f"weights{worker.rank}.txt"), "w") as f:
            f.write(checksum(weights) + "\n")
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        print(f"rank {worker.rank}: {STEPS} steps, checksum {checksum(weights)[:16]}, gpus {gpus}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
