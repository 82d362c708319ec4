"""The socket monitor's pieces without namespaces (benchmarks/emulation/tcp_diag.py, socket_monitor.py): sock_diag
answers built byte by byte, a live loopback socket read through netlink against getsockopt(TCP_INFO), and the
analysis of intervals: a backlogged flow is unsaturated only when no link on its path ran at its rate."""

import socket
import struct
import threading
import time

import pytest

from benchmarks.emulation import netlink, socket_monitor, tcp_diag
from benchmarks.emulation.socket_monitor import Sweep, analyse, interval
from benchmarks.emulation.tcp_diag import TcpSocket

pytestmark = pytest.mark.unit

RATE = 100e6  # bits/s per link direction
ADDRESSES = ("10.77.0.1", "10.77.0.2", "10.77.0.3")
HOST_OF = {a: i for i, a in enumerate(ADDRESSES)}
LINE = RATE / 8 * socket_monitor.PAYLOAD_SHARE  # payload bytes a link carries per second


def _attr(kind: int, data: bytes) -> bytes:
    attr = struct.pack("=HH", 4 + len(data), kind) + data
    return attr + b"\0" * (-len(attr) % 4)


def _answer(seq: int, family: int, src: bytes, dst: bytes, sport: int, dport: int, info: bytes,
            bbr: bytes = b"") -> bytes:
    msg = struct.pack("=BBBB", family, tcp_diag.TCP_ESTABLISHED, 0, 0) + struct.pack("!HH", sport, dport) \
        + src.ljust(16, b"\0") + dst.ljust(16, b"\0") + struct.pack("=IQIIIII", 0, 0, 0, 0, 7000, 0, 0)
    body = msg + _attr(tcp_diag.INET_DIAG_INFO, info) + (_attr(tcp_diag.INET_DIAG_BBRINFO, bbr) if bbr else b"")
    return struct.pack("=IHHII", 16 + len(body), tcp_diag.SOCK_DIAG_BY_FAMILY, 2, seq, 0) + body


def _tcp_info(**values) -> bytes:
    info = bytearray(232)
    for name, offset, fmt in tcp_diag._FIELDS:
        struct.pack_into("=" + fmt, info, offset, values.get(name, 0))
    return bytes(info)


def test_a_sock_diag_answer_is_read_field_by_field_and_an_error_is_raised_with_its_reason():
    info = _tcp_info(snd_mss=1448, notsent_bytes=65160, bytes_sent=123456789012, busy_us=5000, rwnd_limited_us=1000)
    data = _answer(7, socket.AF_INET, socket.inet_aton("10.77.0.1"), socket.inet_aton("10.77.0.3"), 40000, 9000, info)
    mapped = b"\0" * 10 + b"\xff\xff" + socket.inet_aton("10.77.0.2")
    data += _answer(7, socket.AF_INET6, mapped, mapped, 1, 2, info)
    data += _answer(6, socket.AF_INET, b"\1\1\1\1", b"\2\2\2\2", 1, 2, info)  # an older request's answer: skipped
    data += _answer(7, socket.AF_INET, b"\1\1\1\1", b"\2\2\2\2", 1, 2, info[:100])  # too short a tcp_info
    found, done = tcp_diag.parse_messages(data, 7)
    assert not done and len(found) == 2
    first, second = found
    assert first.key == ("10.77.0.1", 40000, "10.77.0.3", 9000) and first.wqueue == 7000
    assert (first.snd_mss, first.notsent_bytes, first.bytes_sent, first.busy_us, first.rwnd_limited_us) == \
        (1448, 65160, 123456789012, 5000, 1000)
    assert second.src == "10.77.0.2" and second.dst == "10.77.0.2"  # v4-mapped, as its IPv4 address
    assert first.bbr_bw == 0 and first.bbr_pacing_gain == 0  # no BBR attribute: another congestion control
    # BBR's attribute: a 64-bit estimate in two halves, gains in 1/256ths (PROBE_BW's 1.25, cwnd gain 2).
    bbr = struct.pack("=IIIII", 5, 1, 800, 320, 512)
    [with_bbr], _ = tcp_diag.parse_messages(_answer(8, socket.AF_INET, b"\1\1\1\1", b"\2\2\2\2", 1, 2, info, bbr), 8)
    assert (with_bbr.bbr_bw, with_bbr.bbr_pacing_gain, with_bbr.bbr_cwnd_gain) == ((1 << 32) + 5, 1.25, 2.0)
    assert with_bbr.bbr_min_rtt_us == 800 and first.bbr_min_rtt_us == 0
    # Requests ask for tcp_info and for BBR's attribute (by the VEGASINFO bit: attribute 16 has no bit of its own).
    ext = tcp_diag.request(socket.AF_INET, 1)[16 + 2]
    assert ext == 1 << (tcp_diag.INET_DIAG_INFO - 1) | 1 << (tcp_diag.INET_DIAG_VEGASINFO - 1)
    done_msg = struct.pack("=IHHII", 20, netlink.NLMSG_DONE, 2, 7, 0) + b"\0" * 4
    assert tcp_diag.parse_messages(done_msg, 7) == ([], True)
    error = struct.pack("=IHHII", 20, netlink.NLMSG_ERROR, 0, 7, 0) + struct.pack("=i", -1)
    with pytest.raises(tcp_diag.TcpDiagError, match="Operation not permitted"):
        tcp_diag.parse_messages(error, 7)


TCP_CC_INFO = 26  # linux/tcp.h: getsockopt's view of the congestion control's state (struct tcp_bbr_info for BBR)


def _has_bbr() -> bool:
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        return "bbr" in f.read().split()


def test_a_live_socket_read_through_netlink_shows_what_getsockopt_tcp_info_shows():
    """The client runs BBR when the kernel has it (as the emulated links do), so its estimate and gains are checked
    against getsockopt(TCP_CC_INFO) as well."""
    server = socket.create_server(("127.0.0.1", 0))
    bbr = _has_bbr()
    if not bbr:
        print("\nthis kernel has no tcp_bbr (modprobe tcp_bbr): BBR's attribute is not checked")
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if bbr:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
    client.connect(server.getsockname())
    peer, _ = server.accept()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: peer.recv(1 << 20), b"")], daemon=True)
    drained.start()
    port = server.getsockname()[1]
    # One dump (discovery), then lookups by id only: the second read below must find the socket by its id.
    reader = tcp_diag.NamespaceSockets(None, keep=lambda s: port in (s.sport, s.dport), rediscover_s=3600)
    try:
        assert {s.key for s in reader.read()} == {(*client.getsockname(), *client.getpeername()),
                                                  (*peer.getsockname(), *peer.getpeername())}
        client.sendall(bytes(3_000_000))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until everything is acknowledged: the counters stop moving
            info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)
            if struct.unpack_from("=Q", info, 120)[0] >= 3_000_001:  # bytes_acked (the SYN counts one)
                break
            time.sleep(0.01)
        [mine] = [s for s in reader.read() if s.key == (*client.getsockname(), *client.getpeername())]
        info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)
        cc_info = client.getsockopt(socket.IPPROTO_TCP, TCP_CC_INFO, 20)  # idle: BBR's state no longer moves
        client.close()
        drained.join(timeout=10)
        peer.close()
        deadline = time.monotonic() + 10  # closed on both ends: the lookup leaves it out (TIME_WAIT has no tcp_info)
        while any(s.key == mine.key for s in reader.read()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(s.key != mine.key for s in reader.read())
    finally:
        reader.close()
        client.close()
        peer.close()
        server.close()
    # bytes_sent counts retransmissions too (a tail-loss probe resends the last segment now and then).
    assert mine.bytes_sent == struct.unpack_from("=Q", info, 200)[0]
    assert mine.bytes_retrans == struct.unpack_from("=Q", info, 208)[0]
    assert mine.bytes_sent - mine.bytes_retrans == 3_000_000
    assert mine.snd_mss == struct.unpack_from("=I", info, 16)[0] > 0
    assert mine.busy_us == struct.unpack_from("=Q", info, 168)[0]
    assert mine.notsent_bytes == 0 and mine.wqueue == 0
    if bbr:
        bw_lo, bw_hi, min_rtt, pacing_gain, cwnd_gain = struct.unpack("=IIIII", cc_info)
        assert mine.bbr_bw == bw_hi << 32 | bw_lo > 0
        assert mine.bbr_min_rtt_us == min_rtt > 0
        assert (mine.bbr_pacing_gain, mine.bbr_cwnd_gain) == (pacing_gain / 256, cwnd_gain / 256)
        assert mine.bbr_pacing_gain > 0 and mine.bbr_cwnd_gain > 0


def _sock(src: int, dst: int, sent: float, notsent: int = 0, port: int = 1000, **counters) -> TcpSocket:
    fields = dict(wqueue=0, snd_mss=1448, unacked=0, rtt_us=0, snd_cwnd=10, pacing_rate=0, delivery_rate=0,
                  busy_us=0, rwnd_limited_us=0, sndbuf_limited_us=0, bytes_retrans=0)
    fields.update(counters)
    return TcpSocket(ADDRESSES[src], port, ADDRESSES[dst], 9000, notsent_bytes=notsent, bytes_sent=int(sent),
                     **fields)


def _sweep(t: float, *sockets: TcpSocket) -> Sweep:
    hosts = tuple({s.key: s for s in sockets if s.src == a} for a in ADDRESSES)
    return Sweep(t, hosts)


def test_a_backlogged_flow_is_unsaturated_only_when_neither_its_egress_nor_its_destinations_ingress_ran_at_rate():
    backlog = 100_000
    # 0 -> 2 at the full rate: saturated egress.
    full = interval(_sweep(0.0, _sock(0, 2, 0, backlog)), _sweep(1.0, _sock(0, 2, LINE, backlog)), HOST_OF)
    assert analyse([full], 3, RATE, 0, 1).unsaturated_s == 0 and analyse([full], 3, RATE, 0, 1).backlogged_s == 1
    # Incast: 0 -> 2 and 1 -> 2 at half the rate each: neither egress at rate, host 2's ingress is.
    incast = interval(_sweep(1.0, _sock(0, 2, 0, backlog), _sock(1, 2, 0, backlog)),
                      _sweep(2.0, _sock(0, 2, LINE / 2, backlog), _sock(1, 2, LINE / 2, backlog)), HOST_OF)
    stats = analyse([incast], 3, RATE, 0, 2)
    assert stats.backlogged_s == 2 and stats.unsaturated_s == 0 and stats.flows == 2
    # Half the rate with data waiting and nothing else on either link: unsaturated, charged to its source.
    slow = interval(_sweep(2.0, _sock(1, 0, 0, backlog, busy_us=0, rwnd_limited_us=0)),
                    _sweep(3.0, _sock(1, 0, LINE / 2, backlog, busy_us=1_000_000, rwnd_limited_us=600_000)), HOST_OF)
    stats = analyse([full, incast, slow], 3, RATE, 0, 3)
    assert stats.backlogged_s == 4 and stats.unsaturated_s == 1 and stats.unsaturated_share == 0.25
    assert stats.host_shares() == [0.0, 0.5, 0.0]
    columns = stats.columns()
    assert columns["tcp_unsaturated_pct"] == 25.0 and columns["tcp_unsaturated_hosts"] == "0.0;50.0;0.0"
    assert columns["tcp_rwnd_limited_pct"] == 60.0 and columns["tcp_flows"] == 2
    # The window cuts whole intervals.
    assert analyse([full, incast, slow], 3, RATE, 1.0, 2.5).intervals == 1


def test_flows_that_stay_on_a_host_start_in_the_interval_or_hold_less_than_a_segment_are_not_backlogged():
    before = _sweep(0.0, _sock(0, 0, 0, 100_000), _sock(1, 2, 0, 1000), _sock(0, 1, 0, 100_000, port=7))
    after = _sweep(1.0, _sock(0, 0, LINE, 100_000), _sock(1, 2, 10, 1000), _sock(0, 1, 5, 100_000, port=7),
                   _sock(0, 2, LINE, 100_000, port=8))  # port 8: new in this interval
    iv = interval(before, after, HOST_OF)
    assert iv.waiting == ((0, 1, socket_monitor.LIMITS.index("other"), -1, 0.0),)
    assert iv.egress == (5, 10, 0) and iv.ingress == (0, 5, 10) and iv.flows == 2
    stats = analyse([iv], 3, RATE, 0, 1)
    assert stats.backlogged_s == 1 and stats.unsaturated_s == 1  # 0 -> 1 sent 5 bytes with 100 kB waiting
    assert stats.columns()["tcp_retrans_pct"] == 0.0


def test_unsaturated_time_is_split_by_what_held_each_flow_and_bbrs_estimates_are_set_against_the_link():
    backlog, t = 100_000, 0.0
    limits = socket_monitor.LIMITS

    def held(**counters) -> socket_monitor.Interval:
        """One second of 0 -> 1 at a tenth of the rate with data waiting: unsaturated, held by `counters`."""
        nonlocal t
        t += 1
        return interval(_sweep(t - 1, _sock(0, 1, 0, backlog)), _sweep(t, _sock(0, 1, LINE / 10, backlog, **counters)),
                        HOST_OF)

    # In precedence order: the receive window (over half the interval), a full congestion window, BBR's pacing in
    # PROBE_BW (gain 0.75-1.25) or in STARTUP/DRAIN, and a socket under another congestion control.
    cases = [held(rwnd_limited_us=600_000, unacked=10), held(unacked=10, bbr_pacing_gain=1.0),
             held(unacked=3, bbr_pacing_gain=1.0, bbr_bw=int(LINE / 4)), held(bbr_pacing_gain=0.75, bbr_bw=int(LINE)),
             held(bbr_pacing_gain=2.89), held()]
    assert [iv.waiting[0][2] for iv in cases] == [limits.index(x) for x in
                                                  ("rwnd", "cwnd", "pacing", "pacing", "startup", "other")]
    stats = analyse(cases, 3, RATE, 0, t)
    columns = stats.columns()
    assert columns["tcp_unsaturated_pct"] == 100.0
    assert columns["tcp_unsaturated_limits"] == "rwnd:16.7;cwnd:16.7;pacing:33.3;startup:16.7;other:16.7"
    # The pacing seconds: estimates of a quarter and of all of the link: on average 0.625 of it.
    assert columns["tcp_unsaturated_bw_share"] == 0.625
    # A saturated flow counts in none of it.
    full = interval(_sweep(t, _sock(0, 2, 0, backlog)), _sweep(t + 1, _sock(0, 2, LINE, backlog, bbr_pacing_gain=1)),
                    HOST_OF)
    assert analyse([full], 3, RATE, 0, t + 1).columns()["tcp_unsaturated_limits"] == ""


def test_a_full_bbr_window_is_put_down_to_the_rtt_a_short_window_or_neither_with_the_rtts_inflation():
    backlog, t = 100_000, 0.0
    causes = socket_monitor.WINDOW_CAUSES
    # BBR's target window: gain 2 x 12.5 MB/s x 1 ms = 25,000 bytes, about 17 segments of 1448.
    bbr = dict(bbr_pacing_gain=1.0, bbr_cwnd_gain=2.0, bbr_bw=12_500_000, bbr_min_rtt_us=1000)

    def held(**counters) -> socket_monitor.Interval:
        nonlocal t
        t += 1
        return interval(_sweep(t - 1, _sock(0, 1, 0, backlog)), _sweep(t, _sock(0, 1, LINE / 10, backlog, **counters)),
                        HOST_OF)

    cases = [held(unacked=17, snd_cwnd=17, rtt_us=3000, **bbr),  # RTT 3x its min: at least the gain's 2x
             held(unacked=4, snd_cwnd=4, rtt_us=1200, **bbr),  # 4 segments of a 17-segment target
             held(unacked=17, snd_cwnd=17, rtt_us=1500, **bbr),  # at its target, RTT 1.5x: neither
             held(unacked=17, snd_cwnd=17, rtt_us=3000),  # no BBR state: a full window of unknown cause
             held(unacked=3, rtt_us=9000, **bbr)]  # not window-held (pacing): no cause
    assert [iv.waiting[0][3] for iv in cases] == [causes.index(c) for c in ("rtt", "short", "other")] + [-1, -1]
    assert [iv.waiting[0][4] for iv in cases] == [3.0, 1.2, 1.5, 0.0, 0.0]
    columns = analyse(cases, 3, RATE, 0, t).columns()
    assert columns["tcp_unsaturated_limits"] == "rwnd:0.0;cwnd:80.0;pacing:20.0;startup:0.0;other:0.0"
    assert columns["tcp_cwnd_causes"] == "rtt:33.3;short:33.3;other:33.3"  # BBR's window seconds only
    assert columns["tcp_cwnd_rtt_inflation"] == 1.9  # (3 + 1.2 + 1.5) / 3
    untraced = analyse(cases[3:], 3, RATE, 0, t).columns()
    assert untraced["tcp_cwnd_causes"] == "" and untraced["tcp_cwnd_rtt_inflation"] == ""


def test_no_interval_in_the_window_gives_empty_shares_not_zeros():
    stats = analyse([], 2, RATE, 0, 1)
    columns = stats.columns()
    assert columns["tcp_unsaturated_pct"] == "" and columns["tcp_rwnd_limited_pct"] == ""
    assert set(columns) | {"tcp_monitor_cpu_s"} == set(socket_monitor.COLUMNS)


def test_the_trace_summary_sets_each_system_beside_its_untraced_runs_and_the_simulators_error(tmp_path):
    from benchmarks.analysis import tcp_trace

    point = {"tag": "bandwidth", "model": "resnet50_v1", "hosts": "4", "bandwidth": "440mbit", "gpu_scale": "0.11",
             "tcp_congestion_control": "bbr", "faithful": "True"}
    traced = [{**point, "kvstore": "p3", "throughput": t, "tcp_unsaturated_pct": u, "tcp_rwnd_limited_pct": "1.0",
               "tcp_sndbuf_limited_pct": "50", "tcp_retrans_pct": "0.01", "tcp_flows": "12",
               "tcp_backlogged_s": "500", "timed_window_s": "50", "tcp_unsaturated_limits": held,
               "tcp_unsaturated_bw_share": share, "tcp_cwnd_causes": causes, "tcp_cwnd_rtt_inflation": inflation}
              for t, u, held, share, causes, inflation in (
                  ("40", "10", "rwnd:0.0;cwnd:50.0;pacing:50.0;startup:0.0;other:0.0", "0.5",
                   "rtt:80.0;short:20.0;other:0.0", "2.5"),
                  ("42", "20", "rwnd:0.0;cwnd:0.0;pacing:100.0;startup:0.0;other:0.0", "0.7", "", ""))]
    traced.append({**point, "kvstore": "p3", "throughput": "1", "tcp_unsaturated_pct": "99", "faithful": "False"})
    traced.append({**point, "kvstore": "horovod", "throughput": "36", "tcp_unsaturated_pct": ""})  # not traced
    validation = tmp_path / "sim_validation.csv"
    validation.write_text("source,model,hosts,bandwidth,gpu_scale,kvstore,rel_error\n"
                          "sweeps/bandwidth.csv,resnet50_v1,4,440mbit,0.11,p3,-0.038\n"
                          "sweeps/shallow.csv,resnet50_v1,4,440mbit,0.11,p3,-0.5\n")
    errors = tcp_trace.sim_errors(validation)
    plain = {tcp_trace.key({**point, "kvstore": "p3"}): [40.0, 41.0, 42.0]}
    text = tcp_trace.summary(traced, plain, errors)
    [line] = [x for x in text.splitlines() if "p3kv" in x]
    # 500 flow-seconds waiting in a 50-s window, 10% and 20% of it unsaturated: 1 and 2 flows on average, so 50 and
    # 100 flow-seconds, pooled: 25 + 100 held by pacing, 25 by the congestion window.
    assert line == ("| bandwidth: resnet50_v1, 4 hosts, 440mbit (scale 0.11), bbr | p3kv | 2 | 15.0 | 1.50 | 1.0 "
                    "| 50.0 | 0.0 | 12 | 0.60 | 2.50 | pacing 83, cwnd 17 | rtt 80, short 20 "
                    "| 41.00 / 41.00 (1.000×, n = 2 and 3) | -3.8% |")
    assert "Horovod" not in text
