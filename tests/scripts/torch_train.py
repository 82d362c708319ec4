"""A small torch training job run two ways with the same seed, data shards and optimizer: as a p3kv.torch worker
(under python -m p3kv.launch) or as a DDP rank (gloo; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the test).
Worker/rank 0 saves the final parameters and buffers to OUT (torch.save of the state_dict).

    torch_train.py p3kv|ddp OUT [--optimizer NAME] [--model reversed|bn|unused|wide|tied] [--steps N]
                   [--accumulate K] [--unused error|zeros] [--dtype float32|float16|bfloat16] [--clip NORM]
                   [--marks PREFIX] [--placement worker|server] [--groups] [--save-at K] [--resume CKPT [--load-first]]
                   [--misuse clip-raw|scaler|late-lr] [--scheduler step|onecycle] [--servers S]
                   [--device cpu|cuda] [--staging double] [--timing]

--groups gives layer a its own param group (half the learning rate, no weight decay). --save-at K saves
{"model", "optimizer", "scheduler"} state dicts after K steps to OUT.ckpt (worker/rank 0) and goes on; --resume
CKPT loads such a checkpoint (the model's before distribute, the optimizer's and scheduler's after it) and runs the
remaining steps. --misuse does something server placement refuses between backward() and step().
--servers S passes servers=S to distribute (under torchrun: p3kv's scheduler and servers start from the workers).
--device cuda trains on cuda:LOCAL_RANK modulo the GPUs there are (p3kv: the staging path; DDP: gloo on CUDA
tensors); --staging double runs a CPU model through the staging path's CPU double (p3kv.torch.stream_double).
--timing prints each worker's iterations per second after the first two steps.

The "reversed" model registers its layers in the reverse of the order its forward pass calls them (a, b, c run
in that order; c, b, a registered), so registration order is not forward order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


class Reversed(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.c = nn.Linear(width, 4)  # used last
        self.b = nn.Linear(width, width)
        self.a = nn.Linear(8, width)  # used first

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.bn = nn.BatchNorm1d(32)
        self.c = nn.Linear(32, 4)

    def forward(self, x):
        return self.c(torch.relu(self.bn(self.a(x))))


class Unused(Reversed):
    """Layer `spare` is used by worker/rank 0 only."""

    def __init__(self):
        super().__init__()
        self.spare = nn.Linear(4, 4)
        self.rank = 0

    def forward(self, x):
        y = super().forward(x)
        return self.spare(y) if self.rank == 0 else y


class Wide(Reversed):
    """A last layer of 10 M parameters (about 200 slices of the default size) behind small first layers: its
    average arrives well after theirs."""

    def __init__(self):
        super().__init__(width=16)
        self.c = nn.Linear(16, 640_000)


class Tied(nn.Module):
    """Weights shared as language models share their embeddings: b and d are two modules holding one weight
    (d.weight is b.weight), and the output reads a's weight again, transposed (F.linear outside a's forward)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)  # used first, and its weight again before c
        self.b = nn.Linear(16, 16)
        self.d = nn.Linear(16, 16)
        self.d.weight = self.b.weight  # one parameter, two modules
        self.c = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.d(torch.relu(self.b(torch.relu(self.a(x))))))
        return self.c(torch.relu(F.linear(h, self.a.weight.t())))


MODELS = {"reversed": Reversed, "bn": WithBatchNorm, "unused": Unused, "wide": Wide, "tied": Tied}


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3, foreach=False),
    "sgd-nesterov": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                                   foreach=False),
    "sgd-dampening": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.8, dampening=0.3, foreach=False),
    "sgd-plain": lambda params: torch.optim.SGD(params, lr=0.05, foreach=False),
    "sgd-maximize": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.5, maximize=True, foreach=False),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3, foreach=False),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, foreach=False),
    "adamw-amsgrad": lambda params: torch.optim.AdamW(params, lr=1e-2, amsgrad=True, weight_decay=0.05,
                                                      foreach=False),
    # eps 1e-8 is 0 in float16 (torch's own float16 Adam then ends in NaN): an eps float16 holds.
    "adam-half": lambda params: torch.optim.Adam(params, lr=1e-3, eps=1e-4, foreach=False),
    "adam-maximize": lambda params: torch.optim.Adam(params, lr=1e-3, maximize=True, betas=(0.8, 0.95),
                                                     eps=1e-6, foreach=False),
}


def make_optimizer(name: str, model: nn.Module, groups: bool):
    if not groups:
        return OPTIMIZERS[name](model.parameters())
    first = list(model.a.parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    optimizer = OPTIMIZERS[name](rest)
    optimizer.add_param_group({"params": first, "lr": optimizer.defaults["lr"] / 2, "weight_decay": 0.0})
    return optimizer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["p3kv", "ddp"])
    p.add_argument("out")
    p.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZERS))
    p.add_argument("--placement", default="worker", choices=["worker", "server"])
    p.add_argument("--groups", action="store_true")
    p.add_argument("--scheduler", default="step", choices=["step", "onecycle"])
    p.add_argument("--save-at", type=int)
    p.add_argument("--resume")
    p.add_argument("--load-first", action="store_true", help="with --resume: load the optimizer's state before "
                   "distribute (p3kv sends it to the servers at distribute)")
    p.add_argument("--misuse", choices=["clip-raw", "scaler", "late-lr"])
    p.add_argument("--model", default="reversed", choices=sorted(MODELS))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--accumulate", type=int, default=1, help="backward passes per step (the first K-1 in no_sync)")
    p.add_argument("--passes-per-step", action="store_true", help="p3kv: accumulate with distribute's "
                   "backward_passes_per_step=K instead of no_sync (DDP still uses no_sync)")
    p.add_argument("--unused", default="error")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--clip", type=float, help="clip the gradients' global norm to this before each step (p3kv: "
                   "after optimizer.synchronize(), as with Horovod)")
    p.add_argument("--marks", help="write JSON: time.time_ns() when each step's forward has passed layer a")
    p.add_argument("--servers", type=int, help="p3kv: distribute(servers=S)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--staging", choices=["double"], help="p3kv, CPU: through the staging path's CPU double")
    p.add_argument("--timing", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    model = MODELS[args.model]().to(getattr(torch, args.dtype)).to(device)
    checkpoint = torch.load(args.resume) if args.resume else None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])  # before distribute: the servers take worker 0's weights
    optimizer = make_optimizer(args.optimizer, model, args.groups)
    if args.scheduler == "onecycle":  # changes lr and momentum (SGD) or betas[0] (Adam) at every step
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=args.steps)
    else:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    if checkpoint is not None and args.load_first:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if args.mode == "p3kv":
        import p3kv.torch

        if args.staging == "double":
            from p3kv.torch import cuda_staging

            cuda_staging.use_host_double()
        passes = args.accumulate if args.passes_per_step else 1
        model, optimizer = p3kv.torch.distribute(model, optimizer, unused_parameters=args.unused,
                                                 backward_passes_per_step=passes, placement=args.placement,
                                                 servers=args.servers)
        rank, world = p3kv.torch.worker().rank, p3kv.torch.worker().num_workers
        if os.environ.get("RANK") is not None:  # the launcher's torchrun variables name the same worker
            assert (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) == (rank, world), (
                os.environ["RANK"], rank)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = nn.parallel.DistributedDataParallel(model)
    first = 0
    if checkpoint is not None:
        if not args.load_first:
            optimizer.load_state_dict(checkpoint["optimizer"])  # p3kv server placement: sent to the servers
        scheduler.load_state_dict(checkpoint["scheduler"])
        first = checkpoint["steps"]
    scaler = torch.amp.GradScaler("cpu") if args.misuse == "scaler" else None
    print(f"ready rank={rank} pid={os.getpid()}", flush=True)
    if device.type != "cpu":
        print(f"rank {rank} device {device} ({torch.cuda.get_device_name(device)})", flush=True)
    inner = model.module if args.mode == "ddp" else model
    marks: list[int] = []
    inner.a.register_forward_hook(lambda *_: marks.append(time.time_ns()))
    if isinstance(inner, Unused):
        inner.rank = rank
    # Every process draws the whole data set, then takes its shard: the same shards in both modes.
    gen = torch.Generator().manual_seed(1)
    n = args.steps * args.accumulate * args.batch * world
    x = torch.randn(n, 8, generator=gen).to(getattr(torch, args.dtype)).to(device)
    y = torch.randint(0, 4, (n,), generator=gen).to(device)
    timed_from = None
    for step in range(first, args.steps):
        if step == first + min(2, args.steps - first - 1):
            timed_from = (step, time.perf_counter())
        for micro in range(args.accumulate):
            start = ((step * args.accumulate + micro) * world + rank) * args.batch
            xb, yb = x[start:start + args.batch], y[start:start + args.batch]
            last = micro == args.accumulate - 1
            local_only = not last and not (args.mode == "p3kv" and args.passes_per_step)
            with (model.no_sync() if local_only else _nothing()):
                loss = F.cross_entropy(model(xb).float(), yb)
                (loss if scaler is None else scaler.scale(loss)).backward()
        if args.clip is not None:
            if args.mode == "p3kv":
                optimizer.synchronize()  # the averaged gradients into .grad; the next step() is a whole one
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        if args.misuse == "clip-raw":
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if args.misuse == "late-lr":
            for group in optimizer.param_groups:
                group["lr"] *= 0.9
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.save_at == step + 1 and rank == 0:
            torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "steps": step + 1}, f"{args.out}.ckpt")
    if args.timing and timed_from is not None and args.steps - timed_from[0] > 0:
        rate = (args.steps - timed_from[0]) / (time.perf_counter() - timed_from[1])
        print(f"rank {rank} iterations_per_s {rate:.3f}", flush=True)
    if args.marks:
        with open(f"{args.marks}.rank{rank}.json", "w") as f:
            json.dump(marks, f)
    state = inner.state_dict()  # p3kv: finishes the pending updates first
    if rank == 0:
        torch.save(state, args.out)
    checksum = sum(float(t.double().sum()) for t in state.values() if t.is_floating_point())
    print(f"rank {rank} checksum {checksum:.10f}", flush=True)
    if args.mode == "ddp":
        torch.distributed.barrier()  # every rank at the end before any tears down
        torch.distributed.destroy_process_group()
    return 0


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
