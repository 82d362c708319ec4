"""P3 as a drop-in for PyTorch's DistributedDataParallel: the marked lines are all that differs.

    python -m p3kv.launch -n 2 -s 2 --servers core --env OMP_NUM_THREADS=1 -- python examples/torch_drop_in.py
    python -m torch.distributed.run --nproc-per-node 2 --master-port 29500 examples/torch_drop_in.py --ddp

Both print each worker's weight checksum; with two workers they are equal bit for bit (docs/torch.md; torchrun
runs its workers with OMP_NUM_THREADS=1, hence the --env). `--placement server` runs the optimizer on p3kv's
servers instead of the workers (the paper's placement); the checksum is the same.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ddp", action="store_true", help="run as DistributedDataParallel (gloo) to compare")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--placement", choices=["worker", "server"], default="worker",
                   help="p3kv: where the optimizer runs (workers, or the servers as in the paper)")
    args = p.parse_args()

    torch.manual_seed(0)  # same initial weights everywhere (both also broadcast rank 0's)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    else:
        import p3kv.torch  # <- 1

        model, optimizer = p3kv.torch.distribute(model, optimizer, placement=args.placement)  # <- 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # both launchers export them

    # Synthetic data: 10 classes of 3x32x32 images, each class a noisy copy of a fixed pattern.
    patterns = torch.rand(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(100 + rank)  # each worker draws its own batches
    start = time.time()
    for step in range(args.steps):
        labels = torch.randint(0, 10, (args.batch_size,), generator=gen)
        x = patterns[labels] + 0.5 * torch.randn(args.batch_size, 3, 32, 32, generator=gen)
        loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            start = time.time()  # after the first step: it includes set-up and parameter broadcast
    elapsed = time.time() - start

    state = model.state_dict()  # p3kv.torch: finishes the pending updates first
    checksum = sum(float(t.double().abs().sum()) for t in state.values())
    throughput = (args.steps - 1) * args.batch_size / elapsed if args.steps > 1 else float("nan")
    kind = "ddp" if args.ddp else f"p3kv placement={args.placement}"
    print(f"worker {rank}/{world} {kind}: {throughput:.1f} samples/s, final loss {loss.item():.4f}, "
          f"weight checksum {checksum:.10f}", flush=True)
    if args.ddp:
        torch.distributed.barrier()  # both ranks done before either tears gloo down (else exits abort or hang)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
