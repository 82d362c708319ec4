"""Horovod 0.28.1 on MXNet: ring allreduce with tensor fusion, no parameter servers.

Horovod's background thread starts a cycle at most every `cycle_s` (HOROVOD_CYCLE_TIME; while it is idle the
cycles keep that rhythm): it takes every tensor the ranks have enqueued (a gradient is enqueued when its layer's
backward ends: allreduce_ is an asynchronous MXNet engine operation on it), fuses them in that order into
buffers of at most `fusion_bytes` (HOROVOD_FUSION_THRESHOLD; a larger tensor goes alone) and allreduces the
buffers one after another; tensors enqueued meanwhile wait for the next cycle. The defaults are 0.28.1's
(benchmarks/suites/baseline_settings.py: 128 MiB and 1 ms, read in its source).

A ring allreduce of b bytes over N workers sends and receives 2 (N-1)/N b per worker in 2 (N-1) steps, each
paying the link latency; every NIC direction carries one flow, so its share is the whole link. `Horovod.cpu`:
per tensor, the negotiation of every tensor (fused or not) through the coordinator before the buffer's
allreduce, taken as a wait (see _perform); per byte, the copies through the fusion buffer and Gloo's sums, CPU of
the background thread on its host's pool, so a buffer takes the longer of its wire time and that CPU.
When a buffer is done each of its tensors is updated - on the virtual GPU
at its memory traffic (`gpu_accesses` passes: SGD's 5, or the copy of the sum into the weight, 2), or on the
worker's CPU engine thread (`update_on` "workers-cpu", the runs before GPU-side updates) - and layer k's next
forward waits for its own tensors only, as MXNet's engine orders it.

The ranks are symmetric, so one worker is simulated: its CPU pool is its host's quota, or its share of the
machine's cores when every host shares them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.engine import CpuThread, Device, EventLoop, SharedCpu
from benchmarks.sim.model import ModelProfile
from benchmarks.sim.ps import Result, summarise
from benchmarks.suites.baseline_settings import DEFAULTS

FUSION_BYTES = int(DEFAULTS["horovod"]["HOROVOD_FUSION_THRESHOLD"])  # 128 MiB in 0.28.1
CYCLE_S = float(DEFAULTS["horovod"]["HOROVOD_CYCLE_TIME"]) / 1000  # 1 ms in 0.28.1


@dataclasses.dataclass(frozen=True)
class Horovod:
    cpu: CpuCosts = CpuCosts()  # allreducing one tensor (per_message) and its bytes, per worker
    update: CpuCosts = CpuCosts()  # update_on "workers-cpu": the optimizer on one tensor, per worker
    update_on: str = "workers-gpu"  # or "workers-cpu"
    gpu_accesses: int = 0  # workers-gpu: passes over each tensor on the virtual GPU (0: nothing runs there)
    fusion_bytes: int = FUSION_BYTES
    cycle_s: float = CYCLE_S
    link_costs: CpuCosts = CpuCosts()  # extra CPU of the emulated links per byte sent (fitted)


def allreduce_seconds(nbytes: float, cluster: Cluster) -> float:
    n = cluster.workers
    if n < 2:
        return 0.0
    return 2 * (n - 1) / n * cluster.seconds_on_wire(nbytes) + 2 * (n - 1) * cluster.latency_s


def worker_cores(cluster: Cluster) -> float | None:
    """The CPU pool of one worker's host: its quota, or its share of the machine the hosts share."""
    if cluster.shared_cores:
        return cluster.shared_cores / cluster.workers
    return cluster.cores


class RingRun:
    def __init__(self, model: ModelProfile, cluster: Cluster, horovod: Horovod, iters: int = 4) -> None:
        self.model, self.cluster, self.h, self.iters = model, cluster, horovod, iters
        self.loop = loop = EventLoop()
        self.cpu = SharedCpu(loop, worker_cores(cluster))
        self.device = Device(loop, cluster.gpu_slack_s)
        self.update_thread = CpuThread(self.cpu, self._update_cost, self._tensor_ready, False)
        self.tensors = [(k, n, layer.itemsize) for k, layer in enumerate(model.layers) for n in layer.arrays]
        self.layer_tensors: list[list[int]] = [[] for _ in model.layers]
        for t, (k, _, _) in enumerate(self.tensors):
            self.layer_tensors[k].append(t)
        n = len(model.layers)
        self.ready = [0] * n
        self.version = [0] * n
        self.enqueued: deque[int] = deque()
        self.cycling = False  # a cycle is scheduled or its buffers are being allreduced
        self.last_cycle = 0.0  # the loop has been cycling since before the first iteration
        self.free_at = 0.0
        self.op = self.iteration = 0
        self.running = False
        self.forward_done: list[float] = []

    # --- the worker's device ---
    def _advance(self) -> None:
        n = len(self.model.layers)
        if self.running or self.iteration >= self.iters:
            return
        j = self.op
        if j < n:
            if self.version[j] < self.iteration:
                return
            seconds, waited = self.model.layers[j].forward_s, True
        else:
            seconds, waited = self.model.layers[2 * n - 1 - j].backward_s, False
        self.running = True
        self.device.submit(seconds, waited, self._op_done)

    def _op_done(self) -> None:
        n = len(self.model.layers)
        j = self.op
        self.running = False
        if j == n - 1:
            self.forward_done.append(self.loop.now)
        if j >= n:
            self._gradients_ready(2 * n - 1 - j)
        self.op = j + 1
        if self.op == 2 * n:
            self.op = 0
            self.iteration += 1
        self._advance()

    def _gradients_ready(self, k: int) -> None:
        self.enqueued.extend(reversed(self.layer_tensors[k]))  # the worker loop's key order
        self._wake_background()

    # --- Horovod's background thread ---
    def _wake_background(self) -> None:
        if self.cycling or not self.enqueued:
            return
        self.cycling = True
        cycle, now = self.h.cycle_s, self.loop.now
        start = max(self.last_cycle + cycle, self.free_at)
        if cycle and start < now:
            start += math.ceil((now - start) / cycle - 1e-9) * cycle
        self.loop.at(max(start, now), self._cycle)

    def _cycle(self) -> None:
        self.last_cycle = self.loop.now
        buffers, current, size = [], [], 0
        while self.enqueued:
            t = self.enqueued.popleft()
            nbytes = self.tensors[t][1] * self.tensors[t][2]
            if current and size + nbytes > self.h.fusion_bytes:
                buffers.append(current)
                current, size = [], 0
            current.append(t)
            size += nbytes
        if current:
            buffers.append(current)
        self._perform(deque(buffers))

    def _perform(self, buffers: deque) -> None:
        if not buffers:
            self.free_at = self.loop.now
            self.cycling = False
            self._wake_background()
            return
        buffer = buffers.popleft()
        # Negotiation first: Horovod agrees on every tensor through its coordinator before the allreduce, a wait
        # per tensor (Horovod.cpu.per_message) that the fit on loopback cannot tell from CPU; it is taken as a wait,
        # because the emulated runs' measured CPU stays well below what charging it as CPU gives (sim_validation.csv:
        # measured_cpu_pct against simulated_cpu_pct).
        negotiation = self.h.cpu.per_message * len(buffer)
        self.loop.at(self.loop.now + negotiation, self._allreduce, buffer, buffers)

    def _allreduce(self, buffer: list[int], buffers: deque) -> None:
        sizes = [self.tensors[t][1] * self.tensors[t][2] for t in buffer]
        cpu = sum(self.h.cpu.per_byte * b + self.h.link_costs.of(b) for b in sizes)
        waiting = [2]

        def half_done() -> None:
            waiting[0] -= 1
            if waiting[0] == 0:
                for t in buffer:
                    self._update(t)
                self._perform(buffers)

        self.loop.at(self.loop.now + allreduce_seconds(sum(sizes), self.cluster), half_done)
        self.cpu.run(cpu, half_done)  # at once when it costs nothing

    # --- the update, then the layer's next forward ---
    def _update(self, t: int) -> None:
        _, elements, itemsize = self.tensors[t]
        if self.h.update_on == "workers-gpu" and self.h.gpu_accesses:
            self.device.submit(self.model.memory_seconds(elements, itemsize, self.h.gpu_accesses), True,
                               self._tensor_ready, t)
        elif self.h.update_on == "workers-cpu":
            self.update_thread.put(0, t)
        else:
            self._tensor_ready(t)

    def _update_cost(self, t: int) -> float:
        _, elements, itemsize = self.tensors[t]
        return self.h.update.of(elements * itemsize)

    def _tensor_ready(self, t: int) -> None:
        k = self.tensors[t][0]
        self.ready[k] += 1
        if self.ready[k] == len(self.layer_tensors[k]):
            self.ready[k] = 0
            self.version[k] += 1
            if self.op == k:
                self._advance()

    def run(self) -> Result:
        self.loop.at(0.0, self._advance)
        self.loop.run()
        end = self.loop.now
        cpu_pct = 100 * self.cpu.busy_core_s * self.cluster.workers / end if end else 0.0
        return summarise([self.forward_done], self.model, self.cluster.workers, None, cpu_pct)


def simulate(model: ModelProfile, cluster: Cluster, horovod: Horovod = Horovod(), iters: int = 4) -> Result:
    return RingRun(model, cluster, horovod, iters).run()


def iteration_seconds(model: ModelProfile, cluster: Cluster, horovod: Horovod = Horovod(), iters: int = 4) -> float:
    return simulate(model, cluster, horovod, iters).iteration_s
