"""The socket probe's reading of `ss -tmi` and the simulator's constants read from its CSV (what a socket holds,
benchmarks/emulation/socket_probe.py and benchmarks/sim/sockets.py). Fast: no namespaces are built."""

import csv

import pytest

from benchmarks.emulation import socket_probe
from benchmarks.sim import sockets

pytestmark = pytest.mark.unit

SS = """State Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess
ESTAB 0      195480     10.99.0.1:47692    10.99.0.2:5555
\t skmem:(r0,rb131072,t131984,tb262144,f2728,w197976,o0,bl0,d0) bbr wscale:2,10 rto:204 rtt:2.241/0.169 mss:1448 \
pmtu:1500 cwnd:194 unacked:90 rcv_space:14480 notsent:65160 minrtt:0.02 snd_wnd:194896
"""


def test_ss_gives_the_bytes_written_and_not_acknowledged_and_those_in_flight():
    assert socket_probe.parse_ss(SS) == {"send_q": 195480, "unacked": 90 * 1448, "notsent": 65160}
    assert socket_probe.parse_ss("State Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess\n") is None


def write_probe(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, socket_probe.FIELDS)
        writer.writeheader()
        for rate, buf, send_q, unacked in rows:
            writer.writerow({"rate": rate, "so_sndbuf": buf, "send_queue_bytes": send_q, "unacked_bytes": unacked,
                             "payload_per_byte_set": round(send_q / buf, 3) if buf else ""})


def test_the_simulators_socket_constants_are_the_probes_medians(tmp_path, monkeypatch):
    probe = tmp_path / "socket_payload.csv"
    monkeypatch.setattr(sockets, "PROBE", probe)
    write_probe(probe, [("440mbit", 131072, 228060, 130320), ("1100mbit", 131072, 260640, 130320),
                        ("440mbit", 32768, 69504, 46336), ("440mbit", 0, 1984484, 130320),
                        ("1100mbit", 0, 2499248, 130320)])
    per_byte, autotuned, window = sockets.probed()
    assert per_byte == pytest.approx((1.74 + 1.989) / 2, abs=1e-3)
    assert autotuned == pytest.approx((1984484 + 2499248) / 2)
    assert window == 130320  # the 32 KiB socket's own limit is not the congestion window


def test_a_missing_or_partial_probe_says_how_to_measure_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sockets, "PROBE", tmp_path / "absent.csv")
    with pytest.raises(FileNotFoundError, match="socket_probe"):
        sockets.probed()
    probe = tmp_path / "socket_payload.csv"
    write_probe(probe, [("440mbit", 32768, 69504, 46336)])
    monkeypatch.setattr(sockets, "PROBE", probe)
    with pytest.raises(ValueError, match="probe them again"):
        sockets.probed()


def test_a_runs_settings_size_the_simulated_sockets():
    from benchmarks.sim import ps, settings

    p3 = settings.apply_ps(ps.P3KV, {"P3_SOCKET_BUFFER": "524288"})
    assert p3.socket_bytes == pytest.approx(ps.SOCKET_PAYLOAD * 524288)
    # MXNet's P3: its ZMQ pipe holds DMLC_PS_WATER_MARK messages, so a larger slice makes room for more bytes.
    mxnet = settings.apply_ps(ps.MXNET_P3, {"MXNET_KVSTORE_SLICE_THRESHOLD": "100000"})
    assert mxnet.socket_bytes == pytest.approx(10 * 100_000 * 4 + ps.AUTOTUNED_SOCKET_BYTES)
    assert settings.apply_ps(ps.DIST_SYNC, {"P3_SOCKET_BUFFER": "524288"}).socket_bytes is None
