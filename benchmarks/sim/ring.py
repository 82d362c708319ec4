"""Ring allreduce with tensor fusion, as Horovod does it (no parameter servers).

Every CYCLE_S Horovod's background loop takes the gradients that became ready, fuses them in backward order
into buffers of at most FUSION_BYTES (a larger tensor goes alone) and allreduces them one buffer after another.
A ring allreduce of b bytes over N workers sends and receives 2 (N-1)/N b per worker and takes 2 (N-1) steps,
each paying the link latency. The optimizer step waits for every allreduce, so the next forward starts after
the last one ends: the ring overlaps backward only.

CPU (`Horovod.cpu`: per tensor (Horovod negotiates every tensor, fused or not) and per byte, on every worker;
`update`: the optimizer per tensor on every worker, after its buffer): an allreduce lasts as long as the longer
of its wire time and its CPU, and updates run one after another as their buffers complete. Where all workers
share a machine's cores (the emulated cluster), W workers' CPU takes W / cores times as long once there are more
workers than cores.
"""

from __future__ import annotations

import dataclasses

from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.model import ModelProfile
from benchmarks.sim.ps import Result

FUSION_BYTES = 64 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD's default
CYCLE_S = 0.005  # HOROVOD_CYCLE_TIME's default (5 ms)


@dataclasses.dataclass(frozen=True)
class Horovod:
    cpu: CpuCosts = CpuCosts()  # allreducing one tensor (per_message) and its bytes, per worker
    update: CpuCosts = CpuCosts()  # the optimizer on one tensor, per worker (zero: none)


def cpu_seconds(core_seconds: float, cluster: Cluster) -> float:
    """Wall time of `core_seconds` of CPU that every worker spends at once."""
    if cluster.shared_cores and cluster.workers > cluster.shared_cores:
        return core_seconds * cluster.workers / cluster.shared_cores
    return core_seconds


def allreduce_seconds(nbytes: float, cluster: Cluster) -> float:
    n = cluster.workers
    if n < 2:
        return 0.0
    return 2 * (n - 1) / n * cluster.seconds_on_wire(nbytes) + 2 * (n - 1) * cluster.latency_s


def iteration_seconds(model: ModelProfile, cluster: Cluster, fusion_bytes: int = FUSION_BYTES,
                      cycle_s: float = CYCLE_S, horovod: Horovod = Horovod()) -> float:
    forward = sum(layer.forward_s for layer in model.layers)
    ready, t = [], forward
    for layer in reversed(model.layers):  # backward: gradients become ready last layer first
        t += layer.backward_s
        ready.extend((t, n * layer.itemsize) for n in layer.arrays)
    backward_end = t
    free, updated, i = 0.0, 0.0, 0
    while i < len(ready):
        # The next cycle at or after both the engine being free and the next tensor being ready.
        start = max(free, ready[i][0])
        start = cycle_s * -(-start // cycle_s) if cycle_s else start
        fused, cpu, update = 0, 0.0, 0.0
        while i < len(ready) and ready[i][0] <= start and (fused == 0 or fused + ready[i][1] <= fusion_bytes):
            fused += ready[i][1]
            cpu += horovod.cpu.of(ready[i][1])
            update += horovod.update.of(ready[i][1])
            i += 1
        free = start + max(allreduce_seconds(fused, cluster), cpu_seconds(cpu, cluster))
        updated = max(updated, free) + cpu_seconds(update, cluster)
    return max(free, updated, backward_end)


def simulate(model: ModelProfile, cluster: Cluster, horovod: Horovod = Horovod()) -> Result:
    t = iteration_seconds(model, cluster, horovod=horovod)
    return Result(t, cluster.workers * model.samples_per_batch / t, model.unit, [], None)
