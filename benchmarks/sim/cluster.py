"""The cluster: hosts with full-duplex NICs, the processes on them, and what the CPU costs.

Network model (why this one): message-level cut-through. A message holds its sender's egress for
wire_bytes / rate and its receiver's ingress for the same time; the ingress may start no earlier than the egress
started and ends no earlier than the egress ended (+ latency), and an ingress serves messages whole in the order
they started. This is exact for one flow, conserves every NIC's capacity in both directions, and costs one event
per message and hop, where a fluid max-min model would recompute every rate on every flow start and end
(the paper-scale sweep has ~10^5 messages per iteration) and still need a rule for P3's non-preemptive sender
priority. What it gets wrong: flows converging on one ingress are served one after another instead of sharing
it, and a sender blocked by a busy receiver is not slowed down. With P3's 200 KB slices the first is invisible;
for whole arrays (dist_sync) the server needs every worker's copy before it can answer, so the last byte -
the one that matters - arrives at the same time either way.
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
    cores: int | None = None  # CPU cores per host for message handling; None: unlimited
    shared_cores: int | None = None  # the emulated cluster: all hosts share one machine's cores
    wire_overhead: float = WIRE_OVERHEAD

    def __post_init__(self) -> None:
        if self.hosts < 1 or (self.layout == "separate" and self.hosts % 2):
            raise ValueError(f"bad cluster: {self.hosts} hosts, layout {self.layout}")

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
        return 0.0 if self.rate_bps is None else nbytes * self.wire_overhead * 8 / self.rate_bps
