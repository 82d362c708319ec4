"""The fidelity verdict's rules and the network counters it reads, from captured text: `tc -s qdisc show` of a
host and of the bridge, /proc/net/snmp, and the workers' virtual-GPU fields."""

import pytest

from benchmarks.emulation import fidelity, net_counters
from benchmarks.emulation.cpu_limit import CpuUsage
from benchmarks.emulation.link_monitor import DirectionStats, HostLink
from benchmarks.emulation.net_counters import HostNet

pytestmark = pytest.mark.unit

HOST_TC = """qdisc tbf 8001: root refcnt 2 rate 200Mbit burst 262144b lat 50ms
 Sent 48213340 bytes 8021 pkt (dropped 17, overlimits 3120 requeues 0)
 backlog 0b 0p requeues 0
"""
BRIDGE_TC = """qdisc noqueue 0: dev lo root refcnt 2
 Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
qdisc noqueue 0: dev br0 root refcnt 2
 Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
qdisc tbf 8002: dev h0 root refcnt 2 rate 200Mbit burst 262144b lat 50ms
 Sent 1000 bytes 10 pkt (dropped 4, overlimits 9 requeues 0)
 backlog 0b 0p requeues 0
qdisc tbf 8004: dev h1 root refcnt 2 rate 200Mbit burst 262144b lat 50ms
 Sent 2000 bytes 20 pkt (dropped 0, overlimits 1 requeues 0)
 backlog 0b 0p requeues 0
"""
SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 12345
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs \
OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 6 6 0 0 4 9000 10000 250 0 2 0
Udp: InDatagrams NoPorts
Udp: 0 0
"""


def test_qdisc_drops_per_device_with_and_without_dev_in_the_line():
    assert net_counters.parse_qdisc_drops(HOST_TC) == {"": 17}
    assert net_counters.parse_qdisc_drops(BRIDGE_TC) == {"lo": 0, "br0": 0, "h0": 4, "h1": 0}


def test_snmp_tcp_counters():
    tcp = net_counters.parse_snmp_tcp(SNMP)
    assert (tcp["RetransSegs"], tcp["OutSegs"], tcp["RtoMin"]) == (250, 10000, 200)
    assert net_counters.parse_snmp_tcp("Ip: a\nIp: 1\n") == {}


def test_a_host_reads_both_ends_of_its_link_and_its_tcp():
    text = HOST_TC + "@@snmp@@\n" + SNMP
    bridge = net_counters.parse_qdisc_drops(BRIDGE_TC)
    assert net_counters.host_counters(text, bridge, 0) == HostNet(17, 4, 250, 10000)
    assert net_counters.host_counters(text, bridge, 1).drops == 17


def test_a_run_counts_the_difference_and_a_reset_qdisc_from_zero():
    before, after = HostNet(10, 5, 100, 1000), HostNet(12, 2, 130, 3000)  # the ingress qdisc was replaced
    assert after.since(before) == HostNet(2, 2, 30, 2000)
    assert net_counters.difference([after], [before]) == [HostNet(2, 2, 30, 2000)]


def _judge(**overrides):
    settings = dict(cpu_window=[CpuUsage(5.0, 0.1, 100, 2), CpuUsage(5.0, 0.2, 100, 4)], window_s=10.0, limited=True,
                    ranks=[{"vgpu_late_max_us": 120.0, "vgpu_forgiven_us_per_iter": 900.0}], median_iter_s=0.5,
                    net=[HostNet(0, 0, 5, 10000)], sampling_cpu_s=0.5, wall_s=20.0, headroom_cores=0.2,
                    links=[HostLink(DirectionStats(500, 300, 2, 10**9, 10.0),
                                    DirectionStats(500, 200, 0, 10**9, 10.0))])
    settings.update(overrides)
    return fidelity.judge(**settings)


def test_a_run_within_every_threshold_is_faithful_with_no_notes():
    verdict = _judge()
    assert verdict.faithful and verdict.notes == ()


def test_a_host_throttled_beyond_the_share_fails_the_run_with_its_numbers():
    verdict = _judge(cpu_window=[CpuUsage(5.0, 0.1, 100, 2), CpuUsage(5.0, 0.8, 100, 40)])
    assert not verdict.faithful
    assert verdict.text() == "cpu: host 1 throttled 8.0% of the timed window (0.80 of 10.00 s, limit 5%)"
    assert _judge(cpu_window=[CpuUsage(5.0, 0.5, 100, 40)]).faithful  # 5.0% exactly: within


def test_a_capped_host_out_of_its_cpus_is_flagged_cpu_bound_not_failed():
    # With each thread capped at one dilated CPU, a throttled host had more runnable threads than CPUs: a real
    # host of that size contends the same way, so the run stands, flagged.
    cpu_bound = _judge(cpu_window=[CpuUsage(5.0, 0.1, 100, 2), CpuUsage(5.0, 0.8, 100, 40)], thread_caps=True,
                       caps_lead_s=2.0)
    assert cpu_bound.faithful
    assert cpu_bound.text().startswith("cpu: flagged CPU-bound, host 1 throttled 8.0% of the timed window (0.80 of "
                                       "10.00 s, limit 5%): ")
    assert ";" not in cpu_bound.text()  # one note (points.fidelity_sentence splits on ";")
    # The caps' own rule still fails a run whose window began uncapped, throttled or not.
    assert not _judge(cpu_window=[CpuUsage(5.0, 0.8, 100, 40)], thread_caps=True, caps_lead_s=-1.0).faithful


def test_rows_failed_only_for_a_capped_hosts_throttling_are_judged_again_and_nothing_else_is(tmp_path):
    from benchmarks.analysis import rejudge
    throttled = "cpu: host 1 throttled 10.9% of the timed window (57.96 of 533.17 s, limit 5%)"
    flag = "network: 12 packets dropped by the link queues"
    late = "vgpu: late wake-ups added up to 9000 us per iteration, 2.00% of the median iteration (limit 1%)"
    rows = [("capped, throttled", "0.035", "False", f"{throttled}; {flag}"),
            ("uncapped, throttled", "", "False", throttled),
            ("capped, throttled and late", "0.035", "False", f"{throttled}; {late}"),
            ("capped, faithful", "0.035", "True", "vgpu: flagged, one completion 80076 us late"),
            ("capped, caps late", "0.035", "False", "cpu: the per-thread caps began 0.25 s after the timed window")]
    path = tmp_path / "runs.csv"
    text = "run_id,thread_cap_cores,faithful,fidelity_notes\n" + "".join(
        f'"{a}",{b},{c},"{d}"' + ("\r\n" if i % 2 else "\n") for i, (a, b, c, d) in enumerate(rows))
    path.write_bytes(text.encode())
    assert rejudge.rewrite(path) == 1
    lines = path.read_bytes().decode().splitlines(keepends=True)
    assert lines[2:] == text.splitlines(keepends=True)[2:]  # the other rows, byte for byte
    first = lines[1]
    assert first.endswith(",True,\"" + fidelity.cpu_bound_flag(throttled[len("cpu: "):]) + f"; {flag}\"\n")
    assert rejudge.rewrite(path) == 0  # judged once
    assert fidelity.failures(f"{throttled}; {flag}; {late}") == [throttled, late]


def test_runs_without_cpu_limits_or_a_window_are_not_faithful():
    off = _judge(limited=False)
    assert not off.faithful and "not limited (--no-cpu-limit" in off.text()
    assert not _judge(cpu_window=None).faithful


def test_per_thread_caps_that_began_after_the_timed_window_or_never_fail_the_run():
    assert _judge(thread_caps=True, caps_lead_s=3.5).faithful  # began 3.5 s before the window
    late = _judge(thread_caps=True, caps_lead_s=-0.25)
    assert not late.faithful and late.text() == "cpu: the per-thread caps began 0.25 s after the timed window started"
    never = _judge(thread_caps=True, caps_lead_s=None)
    assert not never.faithful and "never began" in never.text()
    assert _judge(thread_caps=False, caps_lead_s=None).faithful  # uncapped runs: no such rule


def test_the_virtual_gpu_late_or_forgiving_too_much_fails_and_absent_is_not_measured():
    late = _judge(ranks=[{"vgpu_late_max_us": 100.0}, {"vgpu_late_max_us": 2500.0}])
    assert not late.faithful and "2500 us late (limit 1000 us)" in late.text()
    forgiving = _judge(ranks=[{"vgpu_forgiven_us_per_iter": 6000.0}])  # 6 ms of a 0.5 s iteration: 1.2%
    assert not forgiving.faithful and "1.20% of the median iteration (limit 1%)" in forgiving.text()
    absent = _judge(ranks=[{"rank": 0}])
    assert absent.faithful and absent.notes == ("vgpu: not measured",)


def test_the_late_limit_is_in_the_gpus_own_time_so_it_grows_with_dilation():
    # At gpu_scale 0.1 every emulated duration takes 10x as long in real time: 9 ms of real lateness is 0.9 ms
    # of GPU time, the same share of an iteration as 0.9 ms undilated.
    assert _judge(ranks=[{"vgpu_late_max_us": 9000.0}], gpu_scale=0.1).faithful
    late = _judge(ranks=[{"vgpu_late_max_us": 11000.0}], gpu_scale=0.1)
    assert not late.faithful
    assert "11000 us late (limit 10000 us: 1000 us of GPU time at gpu_scale 0.1)" in late.text()
    assert not _judge(ranks=[{"vgpu_late_max_us": 1100.0}]).faithful  # undilated: 1 ms


def test_late_wake_ups_are_judged_by_their_sum_per_iteration_and_a_single_late_one_is_flagged():
    # 17 ms late once (the dilation pilot's worst, dist_sync at 0.075), 3 ms per iteration in all: 0.6% of a
    # 0.5 s iteration passes; the single one is over 1 ms of GPU time and is named.
    once = _judge(ranks=[{"vgpu_late_max_us": 17000.0, "vgpu_late_us_per_iter": 3000.0},
                         {"vgpu_late_max_us": 100.0, "vgpu_late_us_per_iter": 200.0}], gpu_scale=0.075)
    assert once.faithful
    assert once.notes == ("vgpu: flagged, one completion 17000 us late (over 13333 us: 1000 us of GPU time at "
                          "gpu_scale 0.075); all late wake-ups 0.60% of the median iteration",)
    often = _judge(ranks=[{"vgpu_late_max_us": 900.0, "vgpu_late_us_per_iter": 6000.0}])  # 1.2% of 0.5 s
    assert not often.faithful
    assert often.notes == ("vgpu: late wake-ups added up to 6000 us per iteration, 1.20% of the median iteration "
                           "(limit 1%)",)


def test_the_hypervisors_steal_is_flagged_never_failed():
    stolen = _judge(steal=0.034)
    assert stolen.faithful and "machine: the hypervisor took 3.4% of the CPUs' time during the run (steal)" in \
        stolen.notes
    assert not [n for n in _judge(steal=0.005).notes if n.startswith("machine:")]


def test_drops_and_retransmissions_are_flagged_never_failed():
    verdict = _judge(net=[HostNet(3, 4, 20, 1000), HostNet(0, 0, 0, 1000)])
    assert verdict.faithful
    assert verdict.notes == ("network: 7 packets dropped by the link queues",
                             "network: host 0 retransmitted 2.00% of its segments (20 of 1000)")
    assert _judge(net=None).notes == ("network: not measured",)


def test_monitors_beyond_the_headroom_flag_the_run_as_perturbed():
    verdict = _judge(sampling_cpu_s=6.0)  # 0.3 cores against 0.2 left beside the quotas
    assert verdict.faithful
    assert verdict.notes == ("sampling: perturbed, the monitors used 0.300 cores (headroom 0.200)",)
    assert "perturbed" in _judge(limited=False, headroom_cores=None, sampling_cpu_s=2.0).text()  # 0.1 > 0.05
