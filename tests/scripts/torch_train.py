"""A small torch training job run two ways with the same seed, data shards and optimizer: as a p3kv.torch worker
(under python -m p3kv.launch) or as a DDP rank (gloo; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the test).
Worker/rank 0 saves the final parameters and buffers to OUT (torch.save of the state_dict).

    torch_train.py p3kv|ddp OUT [--optimizer sgd|adam|adamw] [--model reversed|bn|unused|wide] [--steps N]
                   [--accumulate K] [--unused error|zeros] [--dtype float32|float16|bfloat16] [--clip NORM]
                   [--marks PREFIX]

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


MODELS = {"reversed": Reversed, "bn": WithBatchNorm, "unused": Unused, "wide": Wide}


def make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3, foreach=False)
    return torch.optim.AdamW(params, lr=1e-2, foreach=False)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["p3kv", "ddp"])
    p.add_argument("out")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
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
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MODELS[args.model]().to(getattr(torch, args.dtype))
    optimizer = make_optimizer(args.optimizer, model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    if args.mode == "p3kv":
        import p3kv.torch

        passes = args.accumulate if args.passes_per_step else 1
        model, optimizer = p3kv.torch.distribute(model, optimizer, unused_parameters=args.unused,
                                                 backward_passes_per_step=passes)
        rank, world = p3kv.torch.worker().rank, p3kv.torch.worker().num_workers
        if os.environ.get("RANK") is not None:  # the launcher's torchrun variables name the same worker
            assert (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) == (rank, world), (
                os.environ["RANK"], rank)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = nn.parallel.DistributedDataParallel(model)
    print(f"ready rank={rank} pid={os.getpid()}", flush=True)
    inner = model.module if args.mode == "ddp" else model
    marks: list[int] = []
    inner.a.register_forward_hook(lambda *_: marks.append(time.time_ns()))
    if isinstance(inner, Unused):
        inner.rank = rank
    # Every process draws the whole data set, then takes its shard: the same shards in both modes.
    gen = torch.Generator().manual_seed(1)
    n = args.steps * args.accumulate * args.batch * world
    x = torch.randn(n, 8, generator=gen).to(getattr(torch, args.dtype))
    y = torch.randint(0, 4, (n,), generator=gen)
    for step in range(args.steps):
        for micro in range(args.accumulate):
            start = ((step * args.accumulate + micro) * world + rank) * args.batch
            xb, yb = x[start:start + args.batch], y[start:start + args.batch]
            last = micro == args.accumulate - 1
            local_only = not last and not (args.mode == "p3kv" and args.passes_per_step)
            with (model.no_sync() if local_only else _nothing()):
                loss = F.cross_entropy(model(xb).float(), yb)
                loss.backward()
        if args.clip is not None:
            if args.mode == "p3kv":
                optimizer.synchronize()  # the averaged gradients into .grad; the next step() is a whole one
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
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
