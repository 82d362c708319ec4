"""The launcher's scheduler port: free, and outside the kernel's ephemeral range, so that no connection's source
port can take it before the scheduler listens and no node that connects early can be connected to itself."""

import socket

import pytest

from p3kv.launch.launcher import LOWEST_PORT, ephemeral_ports, free_port


@pytest.mark.unit
def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults_to_linuxs(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("15000\t50000\n")
    assert ephemeral_ports(str(ranges)) == range(15000, 50001)
    assert ephemeral_ports(str(tmp_path / "missing")) == range(32768, 61000)
    ranges.write_text("garbage\n")
    assert ephemeral_ports(str(ranges)) == range(32768, 61000)
    live = ephemeral_ports()  # this machine's
    assert 0 < live.start < live.stop <= 65536


@pytest.mark.unit
def test_a_free_port_lies_outside_the_ephemeral_range_and_can_be_listened_on():
    ephemeral = range(20000, 60001)
    ports = {free_port("127.0.0.1", ephemeral) for _ in range(40)}
    assert all(LOWEST_PORT <= p < 20000 or 60001 <= p < 65536 for p in ports), sorted(ports)
    assert len(ports) > 1  # chosen at random, not one fixed port every job would race for
    port = free_port("127.0.0.1")  # this machine's range
    assert port not in ephemeral_ports()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()


@pytest.mark.unit
def test_a_port_taken_is_passed_over_and_with_no_room_outside_the_kernel_picks():
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", 65535))
            held.listen()
        except OSError:
            pass  # another process has it: taken all the same
        # Only 65535 lies outside this range and it is taken: every attempt fails, the kernel's choice comes back.
        port = free_port("127.0.0.1", range(LOWEST_PORT, 65535))
        assert port != 65535 and port in ephemeral_ports()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert free_port("127.0.0.1", range(1, 65536)) in ephemeral_ports()  # no port outside: bind(0)
