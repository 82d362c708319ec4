"""What a data socket holds, measured on this machine's kernel (benchmarks/emulation/socket_probe.py, through a link
shaped as the emulation's): engine.Sender lets a process write into a destination's socket only as far as it has
room, TCP frees a byte once the receiver has it, and the congestion window caps what is in flight.

From the probe's CSV (medians over the rates measured): payload bytes per byte of SO_SNDBUF at p3kv's default
buffer (the kernel doubles the value set, for its bookkeeping), the bytes a socket left to autotune held (ZMQ's,
under MXNet), and the bytes one connection had in flight where its buffer did not limit it (the congestion window:
BBR on these machines, the emulation's congestion control).
"""

from __future__ import annotations

import csv
import statistics

from benchmarks.analysis.points import DEFAULTS
from benchmarks.emulation.link_shaping import LEGACY_CONGESTION_CONTROL
from benchmarks.paths import RESULTS

PROBE = RESULTS / "socket_payload.csv"
# The congestion control the probe ran under (the machine's, BBR): the model's window is its, so the simulator
# validates on rows of it only (validate.py).
CONGESTION_CONTROL = LEGACY_CONGESTION_CONTROL


def probed() -> tuple[float, float, float]:
    """(payload per byte set at P3_SOCKET_BUFFER's default, bytes an autotuned socket holds, bytes in flight)."""
    if not PROBE.exists():
        raise FileNotFoundError(f"{PROBE} is missing: measure it with "
                                "`sudo .venv/bin/python -m benchmarks.emulation.socket_probe`")
    with open(PROBE, newline="") as f:
        rows = list(csv.DictReader(f))
    default = DEFAULTS["p3"]["P3_SOCKET_BUFFER"]
    per_byte = [float(r["payload_per_byte_set"]) for r in rows if r["so_sndbuf"] == default]
    autotuned = [float(r["send_queue_bytes"]) for r in rows if r["so_sndbuf"] == "0"]
    window = [float(r["unacked_bytes"]) for r in rows if r["so_sndbuf"] == "0" or int(r["so_sndbuf"]) >= int(default)]
    if not per_byte or not autotuned:
        raise ValueError(f"{PROBE} lacks rows at SO_SNDBUF {default} or autotuned (0): probe them again")
    return statistics.median(per_byte), statistics.median(autotuned), statistics.median(window)
