"""One process of the loopback pushpull benchmark (benchmarks/suites/torch_loopback_bench.py): every iteration sums
one model's gradients over all processes, with nothing else (no compute, no optimizer).

* ``p3kv``: p3kv's core (the numpy P3Worker, under `python -m p3kv.launch --servers core`): one push per array, last
  layer first, priority -layer, the servers' sum landing in a receive array; the iteration ends when every key
  has landed.
* ``gloo``: torch.distributed.all_reduce over gloo (under torchrun), the way DDP's reducer does it: the arrays,
  last layer first, are packed into buckets of --bucket-cap-mb (DDP's 25 MiB, the first bucket 1 MiB), each
  bucket is all-reduced asynchronously as soon as it is packed, the sums are copied back after all have finished.

Both sum the same arrays (the shape file's, float32, filled from the rank), so the results must agree: each rank
reports a checksum of its last sums. Each rank writes <out>.rank<r>.json with its timed iterations.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import sys
import time

import numpy as np

from benchmarks.workloads import model_shapes, worker_output

LOG = logging.getLogger("allreduce_worker")
FIRST_BUCKET_MB = 1.0  # DDP's first bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES)
MIB = 1 << 20


def arrays(description: dict) -> list[np.ndarray]:
    """The model's arrays in forward order, flat float32 (zeros until `fill`)."""
    return [np.zeros(int(np.prod(p["shape"])), dtype=np.float32) for p in description["params"]]


def fill(grads: list[np.ndarray], rank: int) -> None:
    """Each rank's own values, in place (gloo's tensors share the arrays' memory)."""
    for i, g in enumerate(grads):
        g.fill((rank + 1) * 1e-3 + i * 1e-6)


def buckets(sizes: list[int], cap_mb: float, itemsize: int = 4) -> list[list[int]]:
    """Indices of the arrays in each bucket, last array first (backward order), by DDP's rule (torch's reducer,
    compute_bucket_assignment_by_size): an array joins the open bucket, which closes once it holds at least its
    limit; the first bucket's limit is FIRST_BUCKET_MB, the others' cap_mb."""
    out: list[list[int]] = []
    open_bucket: list[int] = []
    size, limit = 0, FIRST_BUCKET_MB * MIB
    for i in reversed(range(len(sizes))):
        open_bucket.append(i)
        size += sizes[i] * itemsize
        if size >= limit:
            out.append(open_bucket)
            open_bucket, size, limit = [], 0, cap_mb * MIB
    if open_bucket:
        out.append(open_bucket)
    return out


class P3kvSum:
    def __init__(self, grads: list[np.ndarray]):
        from p3kv.core.worker import P3Worker

        self.worker = P3Worker()
        self.rank, self.num_workers = self.worker.rank, self.worker.num_workers
        self.grads = grads
        self.sums = [np.empty_like(g) for g in grads]
        for key, g in enumerate(grads):
            self.worker.init(key, np.zeros_like(g))
        self.worker.wait()

    def iteration(self) -> None:
        for key in reversed(range(len(self.grads))):
            self.worker.push(key, self.grads[key], out=self.sums[key], priority=-key)
        self.worker.wait()

    def close(self) -> None:
        self.worker.close()


class GlooSum:
    def __init__(self, grads: list[np.ndarray], cap_mb: float, timeout: float):
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
        self.dist, self.torch = dist, torch
        self.rank, self.num_workers = dist.get_rank(), dist.get_world_size()
        self.grads = [torch.from_numpy(g) for g in grads]
        self.sums = [torch.empty_like(g) for g in self.grads]
        self.buckets = buckets([g.numel() for g in self.grads], cap_mb)
        self.flat = [torch.empty(sum(self.grads[i].numel() for i in b)) for b in self.buckets]

    def iteration(self) -> None:
        works = []
        for bucket, flat in zip(self.buckets, self.flat):
            at = 0
            for i in bucket:  # DDP copies each gradient into its bucket as it becomes ready
                n = self.grads[i].numel()
                flat[at:at + n].copy_(self.grads[i])
                at += n
            works.append(self.dist.all_reduce(flat, async_op=True))
        for work, bucket, flat in zip(works, self.buckets, self.flat):
            work.wait()
            at = 0
            for i in bucket:
                n = self.grads[i].numel()
                self.sums[i].copy_(flat[at:at + n])
                at += n

    @property
    def sums_np(self) -> list[np.ndarray]:
        return [s.numpy() for s in self.sums]

    def close(self) -> None:
        self.dist.barrier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=("p3kv", "gloo"), required=True)
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--description", help="a shape file to use instead of the model's (the tests' tiny one)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="gloo: DDP's bucket size")
    parser.add_argument("--timeout", type=float, default=300.0)
    worker_output.add_iteration_arguments(parser, warmup=2, iters=10)
    worker_output.add_out_argument(parser, per_rank=True)
    args = parser.parse_args(argv)
    worker_output.check_iterations(parser, args)
    worker_output.start_logging(rank_lines=True)
    description = (json.loads(pathlib.Path(args.description).read_text()) if args.description
                   else model_shapes.load(args.model))
    grads = arrays(description)
    summer = P3kvSum(grads) if args.system == "p3kv" else GlooSum(grads, args.bucket_cap_mb, args.timeout)
    fill(grads, summer.rank)
    times = []
    for it in range(args.warmup + args.iters):
        start = time.perf_counter()
        summer.iteration()
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    sums = summer.sums if args.system == "p3kv" else summer.sums_np
    checksum = float(sum(float(s.astype(np.float64).sum()) for s in sums))
    nbytes = sum(g.nbytes for g in grads)
    result = {"rank": summer.rank, "num_workers": summer.num_workers, "system": args.system, "model": args.model,
              "arrays": len(grads), "bytes": nbytes, "iter_s": times, "median_s": statistics.median(times),
              "checksum": checksum, "buckets": len(summer.buckets) if args.system == "gloo" else None,
              "versions": worker_output.versions("torch", "p3kv", "numpy")}
    worker_output.write_rank(args.out, summer.rank, result)
    LOG.info("rank %d %s: %d arrays, %.1f MB, median %.4f s/iter; checksum %.6f", summer.rank, args.system,
             len(grads), nbytes / 1e6, result["median_s"], checksum)
    summer.close()
    if args.system == "gloo":  # every rank passed the barrier after writing its result
        worker_output.leave_without_gloo_teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
