"""PyTorch DDP (torch 2.13) over Gloo: gradient buckets allreduced during backward, the optimizer after them all.

What the Reducer does (torch/nn/parallel/distributed.py and its C++ reducer): after the first iteration the
buckets are rebuilt in the order the gradients became ready in backward (the reverse of forward for these models),
each closed once it holds at least its limit (1 MiB for the first, `bucket_cap_mb` for the others: 25 MiB by
default; DDP_BUCKET_CAP_MB in the benchmark's worker); each gradient is copied into its bucket times 1/W on the
device right after its layer's backward (`bucket_accesses` passes), and a bucket's allreduce starts once all its
gradients are there and every earlier bucket has started; when every bucket is reduced, the buckets are copied back
into the gradients on the device (`copy_back_accesses`) before the step (emulation/gradient_work.py; both 0 for rows
from before it, whose hosts made those copies). Gloo reduces them one after another over a ring (ring.allreduce_seconds,
its copies and sums CPU per byte, the cost fitted for Horovod's Gloo ring: the same library). Backward returns only
when every bucket is reduced, then optimizer.step() updates every parameter on the virtual GPU at its memory
traffic (torch_compute.VirtualGpuSGD) and only then does the next forward start: communication overlaps backward,
never the next forward, which is what P3 adds.

Gloo's threads are GPU-side work in the emulation (NCCL's on a GPU host: thread_cap.GLOO_THREADS keeps them off the
per-thread caps), so, like Horovod's background thread in ring.py, they run on the host's quota uncapped.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.model import ModelProfile
from benchmarks.sim.ps import COPY_ACCESSES, Result
from benchmarks.sim.ring import Horovod, RingRun
from benchmarks.suites import baseline_settings

MIB = baseline_settings.MIB
FIRST_BUCKET_BYTES = 1 * MIB  # torch's _DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = int(float(baseline_settings.DEFAULTS["ddp"]["DDP_BUCKET_CAP_MB"]) * MIB)  # bucket_cap_mb's default


@dataclasses.dataclass(frozen=True)
class Ddp:
    cpu: CpuCosts = CpuCosts()  # Gloo's allreduce CPU per byte (per_message: none, DDP negotiates nothing)
    gpu_accesses: int = 0  # the optimizer's passes over each parameter on the virtual GPU (SGD: 5; 0: no step)
    bucket_bytes: int = BUCKET_BYTES
    first_bucket_bytes: int = FIRST_BUCKET_BYTES
    link_costs: CpuCosts = CpuCosts()  # extra CPU of the emulated links per byte sent (fitted)
    bucket_accesses: int = COPY_ACCESSES  # the copy of a gradient into its bucket, on the virtual GPU
    copy_back_accesses: int = COPY_ACCESSES  # the reduced buckets' copy back into the gradients


def buckets_of(sizes: list[int], first: int, rest: int) -> list[list[int]]:
    """The Reducer's bucket assignment of tensors (indices into `sizes`, bytes, in the order given): each bucket
    takes tensors until it holds at least its limit (`first` for the first bucket, `rest` after)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for t, nbytes in enumerate(sizes):
        current.append(t)
        size += nbytes
        if size >= (first if not buckets else rest):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class DdpRun(RingRun):
    """A DDP worker (the ranks are symmetric): RingRun's device loop and ring allreduce, with DDP's static
    buckets in place of Horovod's cycles and one optimizer step after every bucket is reduced."""

    def __init__(self, model: ModelProfile, cluster: Cluster, ddp: Ddp, iters: int = 4) -> None:
        super().__init__(model, cluster, Horovod(CpuCosts(0.0, ddp.cpu.per_byte), update_on="workers-gpu",
                                                 cycle_s=0.0, link_costs=ddp.link_costs), iters)
        self.ddp = ddp
        order = [t for k in reversed(range(len(model.layers))) for t in reversed(self.layer_tensors[k])]
        sizes = [self.tensors[t][1] * self.tensors[t][2] for t in order]
        self.buckets = [[order[i] for i in b] for b in buckets_of(sizes, ddp.first_bucket_bytes, ddp.bucket_bytes)]
        self.bucket_of = {t: b for b, tensors in enumerate(self.buckets) for t in tensors}
        self.missing = [len(b) for b in self.buckets]  # gradients each bucket still waits for this iteration
        self.next_bucket = 0  # the next bucket to launch (they start in order)
        self.launched: deque[list[int]] = deque()
        self.reduced = 0

    def _gradients_ready(self, k: int) -> None:  # the bucket copies first, on the device before the next layer
        if not self.ddp.bucket_accesses:
            super()._gradients_ready(k)
            return
        seconds = sum(self.model.memory_seconds(self.tensors[t][1], self.tensors[t][2], self.ddp.bucket_accesses)
                      for t in self.layer_tensors[k])
        self.device.submit(seconds, False, super()._gradients_ready, k)

    def _wake_background(self) -> None:
        while self.enqueued:
            self.missing[self.bucket_of[self.enqueued.popleft()]] -= 1
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            self.missing[self.next_bucket] = len(self.buckets[self.next_bucket])
            self.launched.append(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets):
            self.next_bucket = 0
        if not self.cycling and self.launched:
            self.cycling = True
            self._perform(deque([self.launched.popleft()]))

    def _update(self, t: int) -> None:  # t is reduced; the step waits for every tensor
        self.reduced += 1
        if self.reduced < len(self.tensors):
            return
        self.reduced = 0
        step = sum(self.model.memory_seconds(n, size, self.ddp.gpu_accesses + self.ddp.copy_back_accesses)
                   for _, n, size in self.tensors)
        if step:
            self.device.submit(step, True, self._stepped)
        else:
            self._stepped()

    def _stepped(self) -> None:
        for k in range(len(self.model.layers)):
            self.version[k] += 1
        self._advance()


def simulate(model: ModelProfile, cluster: Cluster, ddp: Ddp = Ddp(), iters: int = 4) -> Result:
    return DdpRun(model, cluster, ddp, iters).run()
