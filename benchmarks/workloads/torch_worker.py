"""One worker of the emulated-cluster benchmark's PyTorch systems (started by benchmarks/suites/cluster_job.py).

Systems (--system, --placement):
* ``p3kv`` (cluster_job's torch-p3kv / torch-p3kv-server): p3kv.torch.distribute(model, optimizer, placement=...)
  under `python -m p3kv.launch --servers core` (framework-free servers). Worker placement: the servers sum, and
  each worker's SGD update of a parameter runs when its average has landed, in the forward pre-hook of its layer.
  Server placement (the paper's): the servers run torch's SGD per slice (real CPU work, the `torch_sgd` kernel);
  the copy of their new values into a parameter before its layer's forward runs on the virtual GPU, as a GPU
  host's device-to-device copy (torch_compute.copy_weights_on_the_virtual_gpu; the rows' weight_copy).
* ``ddp``: torch.nn.parallel.DistributedDataParallel over gloo under torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT), with --bucket-cap-mb (default: DDP_BUCKET_CAP_MB from the environment, which the tuning grid sets,
  else DDP's own 25): DDP all-reduces buckets during backward and the update runs after backward.

The model is the shape file's (benchmarks/workloads/shapes/<model>.json, the arrays the MXNet workers push) as an
emulated torch module on the virtual GPU (benchmarks/emulation/torch_compute.py: the same layer times, calibration
and dilation as the MXNet workers' emulated compute). Optimizer: SGD with momentum 0.9 and weight decay 1e-4 (lr
0.01) in every system, torch's single-tensor formulas (foreach=False); each gradient is multiplied by 1/W before
the sum (DDP's reducer and p3kv.torch alike). A worker-side update (p3kv worker placement, DDP) takes its memory
traffic at the GPU's bandwidth on the virtual GPU, as the MXNet workers' do, and so do the systems' own passes over
the gradients during backward (DDP's bucket copies, p3kv.torch's scaling into its send buffers: gradient_work.py;
the rows' gradient_work); nothing is computed on the host (--real computes the gradients from the weights and runs
torch's SGD and those passes too: the tests compare final weights).

The loop is an ordinary torch training loop: forward, wait for its result (the loss), backward, step(),
zero_grad(). The iteration time is the interval between consecutive forward completions, as in cluster_worker.py;
each rank writes <out>.rank<r>.json with the same fields.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import pathlib
import statistics
import sys
import time

from benchmarks.suites.torch_systems import GRADIENT_WORK, WEIGHT_COPY
from benchmarks.workloads import worker_output
from benchmarks.workloads.cluster_worker import LEARNING_RATE, MOMENTUM, WEIGHT_DECAY, device_fields

LOG = logging.getLogger("torch_worker")
DDP_BUCKET_VARIABLE = "DDP_BUCKET_CAP_MB"  # the tuning grid's setting (suites/baseline_settings.py)
DDP_DEFAULT_BUCKET_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default


def gradient_work_fields(stats) -> dict:
    """Per iteration (backward pass since the warm-up), what gradient_work.py moved onto the virtual GPU."""
    per = stats.per_entry()
    return {"gradient_work_ops": per["ops"], "gradient_work_bytes": per["bytes"], "gradient_work_s": per["seconds"]}


def optimizer_label(num_workers: int) -> str:
    return f"sgd(lr={LEARNING_RATE},momentum={MOMENTUM},wd={WEIGHT_DECAY},grad/{num_workers} before the sum)"


def bucket_cap_mb(given: float | None) -> float | None:
    """DDP's bucket_cap_mb: --bucket-cap-mb, else DDP_BUCKET_CAP_MB. None (DDP's default) for 25 or neither: DDP
    then also caps its first bucket at 1 MiB (torch 2.13's nn/parallel/distributed.py, _DEFAULT_FIRST_BUCKET_BYTES),
    which an explicit 25 would not."""
    text = str(given) if given is not None else os.environ.get(DDP_BUCKET_VARIABLE, "")
    try:
        value = float(text) if text else None
    except ValueError:
        raise SystemExit(f"{DDP_BUCKET_VARIABLE}={text!r} is not a number of MiB (DDP's bucket_cap_mb)") from None
    if value is not None and not value > 0:
        raise SystemExit(f"DDP's bucket_cap_mb must be positive (got {text})")
    return None if value in (None, DDP_DEFAULT_BUCKET_MB) else value


class Training:
    """The emulated model, its optimizer and the system that synchronizes them."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from benchmarks.emulation import emulated_compute, gradient_work, torch_compute

        self.torch = torch
        description = (json.loads(pathlib.Path(args.description).read_text()) if args.description
                       else emulated_compute.load_description(args.model))
        scale = math.inf if args.compute == "none" else args.gpu_scale  # compute none: zero-time layers
        self.profile = emulated_compute.Profile(args.gpu, scale, emulated_compute.efficiency_of(
            description, args.efficiency_factor))
        self.system, self.placement = args.system, args.placement
        if args.system == "ddp":
            import torch.distributed as dist

            # Gloo's threads sum and send here what NCCL does on a GPU host: the per-thread caps leave them at the
            # host's quota (known by the names torch gives them, thread_cap.GLOO_THREADS).
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
            self.rank, self.num_workers = dist.get_rank(), dist.get_world_size()
        else:
            import p3kv.torch

            self.rank, self.num_workers = p3kv.torch.worker().rank, p3kv.torch.worker().num_workers
        self.net = torch_compute.EmulatedNet(description, args.batch_size, self.profile, self.rank, real=args.real)
        settings = dict(lr=LEARNING_RATE, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, foreach=False)
        server = args.system == "p3kv" and args.placement == "server"
        # Server placement runs torch.optim.SGD's formulas on the servers (its kernel needs that exact class); the
        # others update on the workers, on the virtual GPU.
        optimizer = (torch.optim.SGD(self.net.parameters(), **settings) if server
                     else torch_compute.VirtualGpuSGD(self.net.parameters(), self.net, args.real, **settings))
        if args.system == "ddp":
            cap = bucket_cap_mb(args.bucket_cap_mb)
            self.model = torch.nn.parallel.DistributedDataParallel(self.net, bucket_cap_mb=cap)
            self.optimizer = optimizer
            self.buckets = f"{cap:g} MiB" if cap else f"{DDP_DEFAULT_BUCKET_MB:g} MiB, the first 1 MiB (default)"
        else:
            import p3kv.torch

            self.buckets = None
            self.model, self.optimizer = p3kv.torch.distribute(self.net, optimizer, placement=args.placement)
        self.update_on = "servers" if server else "workers"
        self.update_placement = "servers (CPU)" if server else self.profile.describe_bandwidth()
        self.update_s = 0.0 if server else self.net.update_seconds_total
        # Server placement's copy of the new weights into the parameters: on the virtual GPU, as on a GPU host.
        self.weight_copy = WEIGHT_COPY["torch-p3kv-server"] if server else ""
        self.weight_copy_s = (torch_compute.copy_weights_on_the_virtual_gpu(self.optimizer, self.net, args.real)
                              if server else 0.0)
        # The frameworks' own passes over the gradients during backward (DDP's bucket copies, p3kv.torch's 1/W
        # scaling into its send buffers): kernels on a GPU host, so on the virtual GPU here (gradient_work.py).
        self.gradient_work = gradient_work.GradientWorkOnTheVirtualGpu(self.net.gpu, self.profile.memory_seconds,
                                                                       args.real)
        self.samples = args.batch_size * int(description.get("tokens_per_sample", 1))
        self.unit = description.get("sample_unit", "images")
        self.token = torch.zeros(1)

    @property
    def mode(self) -> str:
        return "ddp" if self.system == "ddp" else f"p3kv-{self.placement}"

    def forward(self):
        """Queues the forward pass and waits for its result (the loss), as reading a metric would."""
        loss = self.model(self.token).sum()
        self.net.gpu.wait()
        return loss

    def backward_and_step(self, loss) -> None:
        with self.gradient_work:
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def final_state(self) -> dict:
        """The parameters after every pending update (p3kv: state_dict() finishes them first), not copied: the
        job reads them once and leaves."""
        return {k: v.detach() for k, v in self.net.state_dict().items()}

    def close(self) -> None:
        if self.system == "ddp":
            self.torch.distributed.barrier()  # every rank has written its result before any leaves


def checksum_of(state: dict) -> float:
    """The sum of every value in `state`, accumulated in float64 through numpy's small cast buffer. Not
    t.double().sum() over a copy of the state, which allocates a float64 copy of each tensor: for VGG-19's weights
    0.8 s of this machine's CPU against 0.08 s uncapped, and under the per-thread cap (thread_cap.py, 0.05 cores) a
    DDP job's time after its last iteration fell from 82 s to 2 s with this (2026-12-07, torch sweep at 5
    Gbps-equivalent)."""
    import numpy as np
    import torch

    total = 0.0
    for t in state.values():
        t = t.detach().cpu()
        values = (t.float() if t.dtype == torch.bfloat16 else t).numpy()  # numpy has no bfloat16
        total += float(np.add.reduce(values.reshape(-1), dtype=np.float64))
    return total


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--description", help="a shape file to use instead of the model's (the tests' tiny one)")
    parser.add_argument("--compute", choices=("emulated", "none", "real"), default="emulated")
    parser.add_argument("--batch-size", type=int, default=32)
    worker_output.add_iteration_arguments(parser, warmup=3, iters=20)
    parser.add_argument("--gpu", default="p100")
    parser.add_argument("--gpu-scale", type=float, default=1.0)
    parser.add_argument("--efficiency-factor", type=float, default=1.0)
    parser.add_argument("--optimizer", choices=("sgd", "none"), default="sgd")
    parser.add_argument("--system", choices=("p3kv", "ddp"), default="p3kv")
    parser.add_argument("--placement", choices=("worker", "server"), default="worker", help="p3kv.torch's")
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help=f"DDP's bucket_cap_mb (default: "
                        f"{DDP_BUCKET_VARIABLE} from the environment, else {DDP_DEFAULT_BUCKET_MB:g})")
    parser.add_argument("--real", action="store_true", help="compute gradients from the weights and run torch's "
                        "SGD on the workers too (the tests; not a benchmark setting)")
    parser.add_argument("--save", help="worker/rank 0 saves the final parameters here (torch.save)")
    parser.add_argument("--timeout", type=float, default=600.0, help="DDP's collective timeout, seconds")
    parser.add_argument("--log-interval", type=int, default=5)
    worker_output.add_out_argument(parser, per_rank=True)
    args = parser.parse_args(argv)
    worker_output.check_iterations(parser, args)
    if args.compute == "real":
        parser.error("--compute real: the torch systems run emulated compute only (the MXNet workers' real "
                     "networks are Gluon models); use --compute emulated or none")
    if args.optimizer == "none":
        parser.error("--optimizer none: the torch systems train with SGD (p3kv.torch needs an optimizer); use "
                     "--optimizer sgd")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    worker_output.start_logging(rank_lines=True)
    import torch

    torch.set_num_threads(1)  # hosts share 2 cores: one compute thread per process, as the MXNet workers
    start = time.perf_counter()
    training = Training(args)
    rank = training.rank
    worker_output.mark_ready()  # start-up done: per-thread caps may begin (thread_cap.py)
    times: list[float] = []
    last = None
    for it in range(args.warmup + args.iters):
        loss = training.forward()
        now = time.perf_counter()
        if it == 0:
            LOG.info("rank %d/%d %s %s batch %d: first forward after %.1f s; compute %.3f s/iter; update: %s, "
                     "%.4f s/iter%s%s", rank, training.num_workers, training.mode, args.model, args.batch_size,
                     now - start, training.net.compute_seconds, training.update_placement, training.update_s,
                     f"; weight copies: {training.weight_copy}, {training.weight_copy_s:.4f} s/iter"
                     if training.weight_copy else "", f"; DDP buckets {training.buckets}" if training.buckets else "")
        if last is not None and it >= args.warmup:
            times.append(now - last)
        last = now
        worker_output.mark_progress()  # the runner stops a job whose iterations stall (job_watch.py)
        if it == max(args.warmup - 1, 0):
            training.net.gpu.reset_stats()  # the virtual GPU's accounting covers the timed iterations
            training.gradient_work.reset_stats()
        training.backward_and_step(loss)
        if times and len(times) % args.log_interval == 0:
            recent = times[-args.log_interval:]
            LOG.info("rank %d iter %d: %.1f %s/s (%.3f s/iter over the last %d)", rank, it + 1,
                     training.samples / statistics.median(recent), training.unit, statistics.median(recent),
                     len(recent))
    device = training.net.gpu.stats.as_dict()
    ended = time.perf_counter()
    state = training.final_state()
    pending = time.perf_counter() - ended  # p3kv: the last updates arriving
    if args.save and rank == 0:
        torch.save(state, args.save)
    checksum = checksum_of(state)
    summed = time.perf_counter() - ended - pending
    result = {"rank": rank, "num_workers": training.num_workers, "mode": training.mode, "model": args.model,
              "optimizer": optimizer_label(training.num_workers), "update_on": training.update_on,
              "update_placement": training.update_placement, "update_s": training.update_s,
              "weight_copy": training.weight_copy, "weight_copy_s": training.weight_copy_s,
              "gradient_work": GRADIENT_WORK, **gradient_work_fields(training.gradient_work.stats),
              "vgpu_timer": "none: a computed timeline (benchmarks/emulation/torch_compute.py)",
              **device_fields(device, len(times)), "ddp_buckets": training.buckets,
              "compute": args.compute, "batch_size": args.batch_size, "samples_per_batch": training.samples,
              "unit": training.unit, "compute_s": training.net.compute_seconds, "iter_s": times,
              "median_s": statistics.median(times) if times else None, "checksum": checksum,
              "versions": worker_output.versions("torch", "p3kv", "numpy")}
    worker_output.write_rank(args.out, rank, result)
    LOG.info("rank %d: median %.4f s/iter, %.1f %s/s; checksum %.10f (final state %.1f s, checksum %.1f s)", rank,
             result["median_s"] or 0, training.samples / result["median_s"] if result["median_s"] else 0,
             training.unit, checksum, pending, summed)
    training.close()
    if training.system == "ddp":  # every rank passed the barrier after writing its result
        worker_output.leave_without_gloo_teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
