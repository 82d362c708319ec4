"""One worker of the GPU benchmark (benchmarks/suites/gpu_bench.py): a real torch network (torch_models.py) trained
on the host's GPU with SGD, synchronised by one of

* ``local``: nothing (each process trains alone: what the GPU does for its share when nothing is exchanged);
* ``p3kv``: p3kv.torch.distribute(net, SGD, placement=worker|server) under `python -m p3kv.launch --servers core`
  (CUDA tensors go through p3kv.torch.cuda_staging: pinned host buffers, a side stream, one staging thread);
* ``ddp``: DistributedDataParallel over gloo under torchrun (NCCL refuses two ranks on one GPU, and gloo is the
  backend both systems share on one host).

    python -m benchmarks.workloads.gpu_worker --system p3kv --placement worker --model resnet50_v1 --out PREFIX

Every system starts from the same weights (seed 0), reads the same synthetic batch per rank (seed 1000 + rank),
and steps torch.optim.SGD (lr 0.01, momentum 0.9, weight decay 1e-4, foreach=False). The loop is an ordinary one:
forward, the loss read on the host (the iteration's clock: consecutive forward completions, as in the emulated
cluster's workers), backward, step(), zero_grad(). Each rank writes PREFIX.rank<r>.json with its iteration times,
the process's CPU seconds and the staging thread's ("p3kv staging", read from /proc) over the timed iterations,
and a checksum and a SHA-256 digest of its final parameters and buffers.

--device cpu (with --staging double for p3kv: the staging path's CPU double) is the dry run anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import logging
import os
import statistics
import sys
import threading
import time

from benchmarks.workloads import torch_models, worker_output
from benchmarks.workloads.cluster_worker import LEARNING_RATE, MOMENTUM, WEIGHT_DECAY

LOG = logging.getLogger("gpu_worker")
STAGING_THREAD = "p3kv staging"  # p3kv/torch/cuda_staging.py's thread name


def thread_cpu_s(name: str) -> float | None:
    """CPU seconds (user + system) this process's thread `name` has used, from /proc; None without one."""
    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=("local", "p3kv", "ddp"), required=True)
    p.add_argument("--placement", choices=("worker", "server"), default="worker", help="p3kv.torch's")
    p.add_argument("--model", choices=torch_models.MODELS, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--staging", choices=("double",), help="CPU models through the staging path's CPU double")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    worker_output.add_iteration_arguments(p, warmup=5, iters=30)
    worker_output.add_out_argument(p, per_rank=True, required=True)
    args = p.parse_args(argv)
    worker_output.check_iterations(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    worker_output.start_logging(rank_lines=True)
    import torch
    import torch.nn.functional as F

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False here (--device cpu is the dry run)")
    if args.system == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        rank, world = dist.get_rank(), dist.get_world_size()
    elif args.system == "p3kv":
        import p3kv.torch

        rank, world = p3kv.torch.worker().rank, p3kv.torch.worker().num_workers
        if args.staging:
            from p3kv.torch import cuda_staging

            cuda_staging.use_host_double()
    else:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = (torch.device("cuda", local_rank % torch.cuda.device_count()) if args.device == "cuda"
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = torch_models.build(args.model, device)
    data = torch.Generator(device=device).manual_seed(1000 + rank)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=data, device=device)
    y = torch.randint(0, torch_models.CLASSES, (args.batch_size,), generator=data, device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                                foreach=False)
    if args.system == "p3kv":
        model, optimizer = p3kv.torch.distribute(net, optimizer, placement=args.placement)
    elif args.system == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)
    else:
        model = net
    mode = f"p3kv-{args.placement}" if args.system == "p3kv" else args.system
    worker_output.mark_ready()
    times: list[float] = []
    last = None
    cpu: list[float] = []
    staging: list[float | None] = []
    for it in range(args.warmup + args.iters + 1):
        loss = F.cross_entropy(model(x), y)
        value = loss.item()  # the host waits for the forward pass, as reading a metric does
        now = time.perf_counter()
        if it > args.warmup:
            times.append(now - last)
        if it in (args.warmup, args.warmup + args.iters):  # the timed iterations' ends: forward completions
            cpu.append(time.process_time())
            staging.append(thread_cpu_s(STAGING_THREAD))
        last = now
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if it == 0:
            LOG.info("rank %d/%d %s %s on %s, batch %d: first loss %.4f", rank, world, mode, args.model, device,
                     args.batch_size, value)
    state = net.state_dict()  # p3kv's finishes pending updates first
    checksum = sum(float(t.double().sum()) for t in state.values())
    digest = hashlib.sha256()  # bit-for-bit identity of the final state (a sum can hide a difference)
    for name, t in state.items():
        digest.update(name.encode())
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result = {"rank": rank, "num_workers": world, "mode": mode, "model": args.model, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "batch_size": args.batch_size, "image_size": args.image_size, "iter_s": times,
              "median_s": statistics.median(times), "process_cpu_s_per_iter": (cpu[1] - cpu[0]) / args.iters,
              "staging_cpu_s_per_iter": None if None in staging else (staging[1] - staging[0]) / args.iters,
              "checksum": checksum, "state_sha256": digest.hexdigest(),
              "versions": worker_output.versions("torch", "numpy")}
    worker_output.write_rank(args.out, rank, result)
    LOG.info("rank %d: median %.4f s/iter, %.1f images/s; checksum %.10f", rank, result["median_s"],
             args.batch_size / result["median_s"], checksum)
    if args.system == "ddp":
        torch.distributed.barrier()  # every rank has written its result before any leaves
        worker_output.leave_without_gloo_teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
