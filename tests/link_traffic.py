"""Traffic for the monitors' tests on real links (test_link_monitor_system.py, test_socket_monitor_system.py): a
bulk TCP sender run inside an emulated host, and the skip when namespaces cannot be built here."""

import pytest

from benchmarks.emulation import emulated_cluster

# argv: the receiver's address, seconds to send; port 5001.
SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5001), timeout=30)
end = time.monotonic() + float(sys.argv[2])
chunk = bytes(1 << 20)
while time.monotonic() < end:
    c.sendall(chunk)
c.close()
"""


def require_namespaces() -> None:
    """Skips the test, with the reason, where the emulated cluster cannot be built (not root, no `ip`/`tc`)."""
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
