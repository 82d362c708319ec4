"""What a capped link is (Mininet's TCLink): a rate in tc's syntax, and the tbf qdisc that holds a host's link to
it with a queue and a token bucket. emulated_cluster.py puts one on both ends of every host's link."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text: str) -> float:
    """tc-style rate ("1gbit", "300mbit", "500kbit", "10gbit", "1e9") in bits per second."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(bit|bps)?\s*", text.lower())
    if not match:
        raise ValueError(f"bandwidth {text!r} is not a rate: use e.g. 1gbit, 300mbit, 10gbit")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if match.group(3) == "bps":  # tc's "bps" means bytes per second
        value *= 8
    if value <= 0:
        raise ValueError(f"bandwidth {text!r} must be positive")
    return value


DEFAULT_QUEUE_MS = 50.0  # how long a packet may wait in a link's queue beyond its burst (tbf's latency)
DEFAULT_BURST_MS = 10.0  # how much a link may send at once after an idle spell, in ms of its rate (real time)
MIN_BURST_BYTES = 128 * 1024  # veth hands tbf 64 KiB GSO packets; a packet larger than the burst would be dropped


def burst_bytes(rate_bps: float, burst_ms: float = DEFAULT_BURST_MS) -> int:
    """tbf's bucket: `burst_ms` of traffic at `rate_bps`, at least MIN_BURST_BYTES."""
    return max(MIN_BURST_BYTES, int(rate_bps / 8 * burst_ms / 1000))


def tbf_args(rate_bps: float, queue_ms: float = DEFAULT_QUEUE_MS, burst_ms: float = DEFAULT_BURST_MS) -> list[str]:
    """tbf parameters for `rate_bps`: a burst of `burst_ms` of traffic (burst_bytes) and `queue_ms` of queue (tc's
    byte limit is rate x latency + burst: a full queue under sustained load holds queue_ms plus the burst)."""
    if queue_ms <= 0:
        raise ValueError(f"link queue {queue_ms:g} ms: must be positive")
    if burst_ms <= 0:
        raise ValueError(f"link burst {burst_ms:g} ms: must be positive")
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst_bytes(rate_bps, burst_ms)), "latency",
            f"{queue_ms:g}ms"]


KERNEL_RTO_MIN_MS = 200.0  # Linux's TCP_RTO_MIN: the least retransmission timeout, and the idle time after which a
# connection restarts from its initial window (tcp_slow_start_after_idle, on by default)


def dilated_rto_min_ms(gpu_scale: float) -> float:
    """The minimum RTO in real ms that stands for the kernel's 200 ms on the emulated (undilated) cluster."""
    if gpu_scale <= 0:
        raise ValueError(f"gpu_scale {gpu_scale:g}: must be positive")
    return KERNEL_RTO_MIN_MS / gpu_scale


# TCP's congestion control on the links. The runner sets none unless asked (--tcp-congestion): a namespace starts with
# the machine's default, read here into every row. Rows from before the column ran under BBR, this machine kind's
# default (the runner never changed it; results/socket_payload.csv shows BBR's window in the namespaces).
LEGACY_CONGESTION_CONTROL = "bbr"
_TCP_PROC = "/proc/sys/net/ipv4"


def machine_congestion_control(proc: str = _TCP_PROC) -> str:
    """The congestion control a new namespace's connections get: the machine's default."""
    with open(f"{proc}/tcp_congestion_control") as f:
        return f.read().strip()


def check_congestion_control(name: str, proc: str = _TCP_PROC) -> None:
    """Raises ValueError naming what the kernel offers when `name` is not loaded."""
    with open(f"{proc}/tcp_available_congestion_control") as f:
        available = f.read().split()
    if name not in available:
        raise ValueError(f"TCP congestion control {name!r} is not loaded (available: {', '.join(available)}): "
                         f"modprobe tcp_{name}, or pick one of those")
