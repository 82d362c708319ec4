"""The cluster: hosts with full-duplex NICs, the CPU each host's processes get, and what the CPU costs.

CPU (engine.SharedCpu): `cores` per host is the emulation's CPU quota (host_cpus x gpu_scale cores, each host in a
cgroup of its own, benchmarks/emulation/cpu_limit.py) or a real host's cores; `shared_cores` is a machine whose
cores every host's processes share (the emulation without CPU limits, and the loopback benchmarks). Neither:
CPU is free. `thread_cores` caps each thread of a host (the emulation's per-thread caps, thread_cap.py: one
dilated CPU, gpu_scale cores; threads standing for GPU-side work, Horovod's background thread and DDP's Gloo
threads, keep the host's quota: ring.py and ddp.py do not cap them). The network (engine.FairNetwork) and the
virtual GPU's rules (engine.Device) are in engine.py.
"""

from __future__ import annotations

import dataclasses

# tc's token bucket counts whole Ethernet frames: 1448 payload bytes (MSS 1460 less 12 bytes of TCP timestamps)
# travel in 1514 (+20 IP, +32 TCP, +14 Ethernet). Protocol arithmetic, not a fit.
WIRE_OVERHEAD = 1514 / 1448


@dataclasses.dataclass(frozen=True)
class CpuCosts:
    """Core-seconds a message costs end to end (sender copy, kernel, receiver copy, summing on the server)."""

    per_message: float = 0.0
    per_byte: float = 0.0

    def of(self, nbytes: int) -> float:
        return self.per_message + self.per_byte * nbytes


@dataclasses.dataclass(frozen=True)
class Cluster:
    hosts: int
    rate_bps: float | None  # per host, each direction; None: unlimited
    latency_s: float = 0.0  # one way; the emulated cluster has no netem, so 0 there
    layout: str = "colocated"  # one worker + one server per host, or "separate": workers, then servers
    cores: float | None = None  # CPU bandwidth of each host, in cores (the emulation's quota); None: unlimited
    shared_cores: float | None = None  # every host's processes share one machine's cores (no CPU limits)
    thread_cores: float | None = None  # each thread's cap (the emulation's per-thread caps: one dilated CPU)
    wire_overhead: float = WIRE_OVERHEAD
    gpu_slack_s: float = 0.0  # a gap the virtual GPU forgave before an op that waited (1 ms before chaining)
    # The share of a link's rate its TCP flows deliver while messages wait for it: 1 on a real cluster's links here;
    # on the emulation's tbf links under BBR, less (the flows' windows and pacing leave a loaded link idle at times:
    # results/tcp_trace/summary.md), fitted on the fit split (link_fit.fit_link_efficiency).
    link_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.hosts < 1 or (self.layout == "separate" and self.hosts % 2):
            raise ValueError(f"bad cluster: {self.hosts} hosts, layout {self.layout}")
        if not 0 < self.link_efficiency <= 1:
            raise ValueError(f"link_efficiency {self.link_efficiency}: a share of the rate, in (0, 1]")

    @property
    def workers(self) -> int:
        return self.hosts if self.layout == "colocated" else self.hosts // 2

    @property
    def servers(self) -> int:
        return self.workers

    def worker_host(self, w: int) -> int:
        return w

    def server_host(self, s: int) -> int:
        return s if self.layout == "colocated" else self.workers + s

    def seconds_on_wire(self, nbytes: float) -> float:
        if self.rate_bps is None:
            return 0.0
        return nbytes * self.wire_overhead * 8 / (self.rate_bps * self.link_efficiency)
