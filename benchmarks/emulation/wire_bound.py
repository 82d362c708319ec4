"""The network's share of the physical bound: the bytes one iteration puts on the busiest link, headers included.

Payload alone understates the time a link needs: every message carries its system's frame header, and every
TCP segment carries TCP/IP and Ethernet headers (tc's token bucket counts them: it meters whole frames, and a
GSO packet as its segments). The link is full duplex and both directions carry the same traffic, so each
direction also carries the pure ACKs of the other direction's segments: ACKS_PER_SEGMENT of them, measured on
the emulated links by benchmarks/suites/link_overhead.py (results/link_overhead.md; its test keeps the two equal).

Messages per iteration, per system (what a worker sends; it receives as many):
* p3kv: one PUSH per slice (P3_SLICE_SIZE elements, 50,000 by default) and one broadcast back; a 64-byte header
  (cpp/include/p3/message.h, kHeaderBytes).
* MXNet dist_sync: one push and one pull per array, arrays above MXNET_KVSTORE_BIGARRAY_BOUND (10^6 elements)
  split into one part per server; each request is answered (push ack, pull response). ps-lite's message meta
  (a protobuf of the head, keys, lengths and addressing, sent as ZeroMQ frames) is not fixed in size: about 80
  bytes (an estimate: meta ~50, the key and length arrays 12, ZeroMQ frame prefixes ~18).
* MXNet's P3: as dist_sync, but every array in slices of MXNET_KVSTORE_SLICE_THRESHOLD (40,000) elements.
* Horovod: ring allreduce over fusion buffers (HOROVOD_FUSION_THRESHOLD, 64 MiB): per buffer each rank sends
  2 (N-1) chunks; Gloo's TCP pair prefixes each send with a 48-byte preamble (six 64-bit fields).
* PyTorch DDP (gloo): as Horovod, over DDP's buckets (bucket_cap_mb, 25 MiB) instead of fusion buffers.
  p3kv.torch (both placements) sends what p3kv sends: one key per parameter, in slices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

P3KV_HEADER = 64
PSLITE_META = 80  # estimate, see above
GLOO_PREAMBLE = 48
MSS = 1448  # MTU 1500 - 20 (IPv4) - 32 (TCP with timestamps)
SEGMENT_OVERHEAD = 20 + 32 + 14  # IPv4 + TCP (timestamps) + Ethernet, per segment and per pure ACK
# A sender's 64 KiB GSO packet reaches the receiver whole (veth, bridge) and is ACKed about once: 0.022 pure ACKs
# per 1448-byte segment measured, not the 0.5 of delayed ACKs on a wire of MTU-sized packets.
ACKS_PER_SEGMENT = 0.022
P3KV_SLICE = 50_000
MXNET_BIGARRAY_BOUND = 1_000_000
MXNET_P3_SLICE = 40_000
HOROVOD_FUSION_BYTES = 64 << 20
DDP_BUCKET_BYTES = 25 << 20
ALLREDUCE_BUFFER_BYTES = {"horovod": HOROVOD_FUSION_BYTES, "ddp": DDP_BUCKET_BYTES}
SAME_WIRE = {"torch-p3kv": "p3", "torch-p3kv-server": "p3"}  # systems whose messages are another's


@dataclasses.dataclass(frozen=True)
class LinkLoad:
    """What the busiest link carries per iteration, each direction."""

    payload: float
    messages: float
    wire: float  # payload + frame headers + TCP/IP/Ethernet headers + the reverse direction's ACKs

    def seconds(self, rate_bps: float | None) -> float:
        return self.wire * 8 / rate_bps if rate_bps else 0.0


def wire_bytes(payload: float, messages: float, header: int) -> float:
    framed = payload + messages * header
    segments = framed / MSS
    return framed + segments * SEGMENT_OVERHEAD + segments * ACKS_PER_SEGMENT * SEGMENT_OVERHEAD


def messages_per_worker(system: str, sizes: Sequence[int], servers: int, slice_size: int | None = None) -> int:
    """Data messages a worker sends per iteration (pushes, or allreduce chunks for Horovod are counted in
    `link_load`). `sizes`: elements of every array."""
    if system in ("p3", "p3-slicing-only"):
        size = slice_size or P3KV_SLICE
        return sum(math.ceil(n / size) for n in sizes)
    if system == "p3-priority-only":  # one slice per array
        return len(sizes)
    if system == "p3-priority-split":  # big arrays spread over the servers, as dist_sync does
        return sum(servers if n > MXNET_BIGARRAY_BOUND else 1 for n in sizes)
    if system == "dist_sync":  # push + pull request per part
        return 2 * sum(servers if n > MXNET_BIGARRAY_BOUND else 1 for n in sizes)
    if system == "mxnet-p3":
        size = slice_size or MXNET_P3_SLICE
        return 2 * sum(math.ceil(n / size) for n in sizes)
    raise ValueError(f"unknown system {system!r}")


def header_of(system: str) -> int:
    if system in ALLREDUCE_BUFFER_BYTES:
        return GLOO_PREAMBLE
    return PSLITE_META if system in ("dist_sync", "mxnet-p3") else P3KV_HEADER


def link_load(system: str, sizes: Sequence[int], model_bytes: int, hosts: int, layout: str = "colocated",
              slice_size: int | None = None) -> LinkLoad:
    """Per direction on the busiest link. Parameter servers, colocated (one server + one worker per host): the
    worker sends the (N-1)/N of its gradient owned by other hosts' servers and the host's server sends its 1/N
    to the N-1 other workers, so 2 (N-1)/N of the model (and of the messages) each way. Separate layout (W
    workers, W servers): the whole model each way. Horovod's ring allreduce: 2 (N-1)/N of the model each way
    too, in 2 (N-1) chunks per fusion buffer."""
    model = model_bytes
    system = SAME_WIRE.get(system, system)
    if hosts < 2:
        return LinkLoad(0.0, 0.0, 0.0)
    if system in ALLREDUCE_BUFFER_BYTES:
        share = 2 * (hosts - 1) / hosts
        buffers = max(1, math.ceil(model / ALLREDUCE_BUFFER_BYTES[system]))
        messages = 2 * (hosts - 1) * buffers
    else:
        share = 2 * (hosts - 1) / hosts if layout == "colocated" else 1.0
        servers = hosts if layout == "colocated" else hosts // 2
        messages = share * messages_per_worker(system, sizes, servers, slice_size)
    payload = share * model
    return LinkLoad(payload, messages, wire_bytes(payload, messages, header_of(system)))
