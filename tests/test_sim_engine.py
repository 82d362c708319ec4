"""The simulator's resource models against hand-worked answers: processor sharing of a host's CPU quota (and
of its per-thread caps), fair sharing of each link direction, the virtual GPU's chaining rule. Fast: no measurements
are read."""

import pytest

from benchmarks.sim import model
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.engine import CpuThread, Device, EventLoop, FairNetwork, SharedCpu
from benchmarks.sim.ps import P3KV, simulate

pytestmark = pytest.mark.unit


def finish_times(cores, jobs, per_job=1.0):
    """jobs: [(arrival, cost)] on one SharedCpu -> each job's end."""
    loop = EventLoop()
    cpu = SharedCpu(loop, cores, per_job)
    ends = [None] * len(jobs)

    def done(i):
        ends[i] = loop.now

    for i, (arrival, cost) in enumerate(jobs):
        loop.at(arrival, cpu.run, cost, done, i)
    loop.run()
    return ends


def test_two_equal_jobs_on_one_core_share_it_and_end_together():
    assert finish_times(1.0, [(0.0, 1.0), (0.0, 1.0)]) == pytest.approx([2.0, 2.0])  # not 1 and 2 (FCFS)


def test_processor_sharing_with_a_late_arrival():
    # A alone for 0.5 s (0.5 done), then both at half a core: A's last 0.5 takes 1 s (ends 1.5), B has 0.5 done
    # by then and runs alone for its last 0.5 (ends 2.0).
    assert finish_times(1.0, [(0.0, 1.0), (0.5, 1.0)]) == pytest.approx([1.5, 2.0])


def test_short_and_long_jobs_leave_in_order_of_size():
    # 1 s and 2 s at once on one core: both at 0.5 until the short one ends (t = 2), then the long one alone.
    assert finish_times(1.0, [(0.0, 2.0), (0.0, 1.0)]) == pytest.approx([3.0, 2.0])


def test_a_quota_above_one_core_serves_each_thread_at_most_one_core():
    assert finish_times(2.0, [(0.0, 1.0)]) == pytest.approx([1.0])  # one thread: one core, not two
    assert finish_times(2.0, [(0.0, 1.0)] * 3) == pytest.approx([1.5] * 3)  # three threads: 2/3 core each
    assert finish_times(0.4, [(0.0, 1.0)]) == pytest.approx([2.5])  # a 0.4-core quota: 1 core-second in 2.5 s


def test_per_thread_caps_hold_each_thread_to_one_dilated_cpu_within_the_hosts_quota():
    # A host of 4 CPUs at a dilation of 0.1: a quota of 0.4 cores, each thread capped at 0.1 (thread_cap.py).
    assert finish_times(0.4, [(0.0, 0.1)], per_job=0.1) == pytest.approx([1.0])  # alone: 0.1 core, not 0.4
    assert finish_times(0.4, [(0.0, 0.1)] * 4, per_job=0.1) == pytest.approx([1.0] * 4)  # 4 threads fill the quota
    assert finish_times(0.4, [(0.0, 0.1)] * 8, per_job=0.1) == pytest.approx([2.0] * 8)  # 8 share it: 0.05 each
    assert finish_times(None, [(0.0, 0.1)] * 3, per_job=0.1) == pytest.approx([1.0] * 3)  # no quota, still capped
    with pytest.raises(ValueError, match="share of a core"):
        SharedCpu(EventLoop(), 1.0, 0.0)


def test_a_capped_cluster_slows_a_cpu_bound_server_thread_by_its_cap():
    # One server thread with 0.5 core-seconds per push: a 4-core quota serves it at one core, a 0.25-core cap at a
    # quarter of that (the hosts' other threads idle meanwhile).
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    system = P3KV.with_costs(CpuCosts(per_message=0.5))
    layout = dict(layout="colocated", wire_overhead=1.0)
    free = simulate(m, Cluster(2, None, cores=4.0, **layout), system).iteration_s
    capped = simulate(m, Cluster(2, None, cores=4.0, thread_cores=0.25, **layout), system).iteration_s
    assert capped == pytest.approx(4 * free)


def test_a_thread_serves_its_jobs_one_at_a_time_and_shares_the_host_with_other_threads():
    loop = EventLoop()
    cpu = SharedCpu(loop, 1.0)
    ends = {}
    one = CpuThread(cpu, lambda job: job[1], lambda job: ends.__setitem__(job[0], loop.now), False)
    other = CpuThread(cpu, lambda job: job[1], lambda job: ends.__setitem__(job[0], loop.now), False)
    loop.at(0.0, one.put, 0, ("a", 1.0))
    loop.at(0.0, one.put, 0, ("b", 1.0))
    loop.at(0.0, other.put, 0, ("c", 1.0))
    loop.run()
    # a and c share the core (end at 2); then b runs alone (ends at 3).
    assert ends == pytest.approx({"a": 2.0, "c": 2.0, "b": 3.0})


def test_quotas_are_per_host_and_a_shared_machine_is_not():
    # One server thread per host with 1 core-second of work each: a quota of 1 core per host serves both in 1 s;
    # 1 core shared by both hosts takes 2 s.
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    system = P3KV.with_costs(CpuCosts(per_message=0.5))  # push 0.5 s on the server, reply 0.5 s on the worker
    layout = dict(layout="colocated", wire_overhead=1.0)
    per_host = simulate(m, Cluster(2, None, cores=1.0, **layout), system).iteration_s
    shared = simulate(m, Cluster(2, None, shared_cores=1.0, **layout), system).iteration_s
    assert shared > per_host * 1.3


def arrivals(messages, rate_bps=8e9, hosts=3, window=1, prioritised=False):
    """messages: [(sender host, dst, bytes, send time)], each from its own process -> arrival times."""
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(hosts, rate_bps, wire_overhead=1.0))
    got = [None] * len(messages)

    def arrived(t, i):
        got[i] = t

    for i, (src, dst, nbytes, at) in enumerate(messages):
        sender = net.sender(src, prioritised, window)
        loop.at(at, sender.put, 0, dst, nbytes, arrived, i)
    loop.run()
    return got


def test_two_flows_into_one_receiver_share_its_link():
    # 1 GB/s links: two 1 MB messages into host 2 at once each get half: both arrive at 2 ms (not 1 and 2 ms).
    assert arrivals([(0, 2, 1e6, 0.0), (1, 2, 1e6, 0.0)]) == pytest.approx([2e-3, 2e-3])
    # 1 MB and 2 MB: half each until the first ends (2 ms), then the second alone (1 MB more: 3 ms).
    assert arrivals([(0, 2, 1e6, 0.0), (1, 2, 2e6, 0.0)]) == pytest.approx([2e-3, 3e-3])


def test_a_sender_is_not_held_back_by_a_receiver_others_keep_busy():
    # Host 0 sends 1 MB to host 2, then 1 MB to host 3 (one message at a time); host 1 also sends 1 MB to host 2.
    # Host 2's link is shared (both its messages arrive at 2 ms), but host 0's first message left at its own
    # link's rate (the tbf queue in front of host 2 holds it), so its second one starts at 1 ms and is at host 3
    # at 2 ms (end-to-end max-min would give 3 ms).
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(4, 8e9, wire_overhead=1.0))
    got = {}
    record = lambda t, name: got.__setitem__(name, t)  # noqa: E731
    p3 = net.sender(0, prioritised=True, window=1)
    other = net.sender(1, prioritised=True, window=1)
    loop.at(0.0, p3.put, 0, 2, 1e6, record, "0->2")
    loop.at(0.0, p3.put, 1, 3, 1e6, record, "0->3")
    loop.at(0.0, other.put, 0, 2, 1e6, record, "1->2")
    loop.run()
    assert got == pytest.approx({"0->2": 2e-3, "1->2": 2e-3, "0->3": 2e-3})


def test_one_sender_with_sockets_to_two_receivers_shares_its_egress():
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(3, 8e9, wire_overhead=1.0))
    got = {}
    zmq = net.sender(0, prioritised=False, window=None)  # a socket per destination, all sending at once
    for dst in (1, 2):
        loop.at(0.0, zmq.put, 0, dst, 1e6, lambda t, d: got.__setitem__(d, t), dst)
    loop.run()
    assert got == pytest.approx({1: 2e-3, 2: 2e-3})


def test_a_priority_sender_puts_one_message_at_a_time_in_priority_order():
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(3, 8e9, wire_overhead=1.0))
    got = {}
    p3 = net.sender(0, prioritised=True, window=1)
    record = lambda t, name: got.__setitem__(name, t)  # noqa: E731
    loop.at(0.0, p3.put, 5, 1, 1e6, record, "first")  # on the wire at once
    loop.at(0.0, p3.put, 9, 2, 1e6, record, "late")
    loop.at(0.0, p3.put, 1, 2, 1e6, record, "urgent")  # overtakes "late", not the one on the wire
    loop.run()
    assert got == pytest.approx({"first": 1e-3, "urgent": 2e-3, "late": 3e-3})


def test_p3kvs_sender_streams_a_frame_through_its_socket_buffer_without_gaps():
    # 1 GB/s links, a 1 MB socket buffer: a 3 MB frame goes in 0.5 MB chunks, each written as soon as the one two
    # ahead of it is delivered; nothing else on the links, so the link never waits: there at 3 ms.
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(2, 8e9, wire_overhead=1.0))
    got = {}
    p3 = net.sender(0, prioritised=True, window=None, socket_bytes=1e6)
    loop.at(0.0, p3.put, 0, 1, 3e6, lambda t, name: got.__setitem__(name, t), "frame")
    loop.run()
    assert got == pytest.approx({"frame": 3e-3})


def test_p3kvs_sender_holds_every_destination_while_its_urgent_frames_socket_is_full():
    # Host 2 keeps host 1's link busy (a 10 MB message), so what host 0 sends to host 1 is delivered at a share of
    # it. Host 0's urgent 1.5 MB frame to host 1 fills its 1 MB socket at once (chunks a1, a2); a1's last byte
    # leaves host 0 at 0.5 ms and reaches host 1 at 1.25 ms (half of host 1's link until 0.5 ms, a third after,
    # beside a2). Only then does a3 fit, the urgent frame is all written, and the less urgent frame to host 2,
    # whose socket was empty all along, starts: at 1.25 ms, not at 0 (TCP frees a socket's bytes on delivery,
    # and the one send thread waits on the most urgent frame), nor at 1.5 ms (when host 0's link alone would have
    # sent the urgent frame).
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(3, 8e9, wire_overhead=1.0))
    started, got = {}, {}
    p3 = net.sender(0, prioritised=True, window=None, socket_bytes=1e6)
    other = net.sender(2, prioritised=False, window=None)
    record = lambda t, name: got.__setitem__(name, t)  # noqa: E731
    loop.at(0.0, other.put, 0, 1, 10e6, record, "busy")
    loop.at(0.0, p3.put, 0, 1, 1.5e6, record, "urgent")
    on_start = lambda name: started.__setitem__(name, loop.now)  # noqa: E731
    loop.at(0.0, lambda: p3.put(1, 2, 1e6, record, "later", on_start=on_start))
    loop.run()
    assert started == pytest.approx({"later": 1.25e-3})
    assert got["urgent"] < got["busy"]


def test_a_connections_congestion_window_caps_what_it_has_in_flight():
    # Host 2 keeps host 1's link busy (10 MB), so host 0's bytes reach host 1 at half its rate. Host 0 writes a 2 MB
    # frame into a 2 MB socket (two 1 MB chunks) but may have 1 MB in flight: the first chunk leaves host 0 by 1 ms
    # and reaches host 1 at 2 ms; only then does the second start, there at 4 ms (at 3.5 ms without the cap, the
    # second chunk leaving while the first still queued in front of host 1).
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(3, 8e9, wire_overhead=1.0))
    got = {}
    record = lambda t, name: got.__setitem__(name, t)  # noqa: E731
    other = net.sender(2, prioritised=False, window=None)
    p3 = net.sender(0, prioritised=True, window=None, socket_bytes=2e6, flight_bytes=1e6)
    loop.at(0.0, other.put, 0, 1, 10e6, record, "busy")
    loop.at(0.0, p3.put, 0, 1, 2e6, record, "frame")
    loop.run()
    assert got["frame"] == pytest.approx(4e-3)


def test_a_zmq_style_sender_without_a_send_limit_still_has_one_window_per_connection():
    # dist_sync's ZMQ puts every message on its socket at once, but its TCP connection has BBR's window too. Host 2
    # keeps host 1's ingress busy, so host 0's first 1 MB reaches host 1 at half the rate, at 2 ms; with a 1 MB
    # window the second may start only then and lands at 4 ms; without one it leaves host 0 from 1 ms on and lands
    # sooner (its bytes sharing host 1 with the first's, which then lands later).
    def second_arrives(flight_bytes):
        loop = EventLoop()
        net = FairNetwork(loop, Cluster(3, 8e9, wire_overhead=1.0))
        got = {}
        record = lambda t, name: got.__setitem__(name, t)  # noqa: E731
        other = net.sender(2, prioritised=False, window=None)
        zmq = net.sender(0, prioritised=False, window=None, flight_bytes=flight_bytes)
        loop.at(0.0, other.put, 0, 1, 10e6, record, "busy")
        loop.at(0.0, zmq.put, 0, 1, 1e6, record, "first")
        loop.at(0.0, zmq.put, 0, 1, 1e6, record, "second")
        loop.run()
        return got["first"], got["second"]

    assert second_arrives(1e6) == pytest.approx((2e-3, 4e-3))
    first, second = second_arrives(None)
    assert first > 2e-3 * 1.01 and second < 4e-3 * 0.99  # the two shared host 1 with host 2's bytes


def test_every_parameter_server_system_runs_over_connections_with_the_probed_window():
    # Every system of ps.SYSTEMS talks TCP under the emulation's BBR: none may send past the window the probe measured.
    # The window is PSSystem's default, so a system added later has it without being told.
    from benchmarks.sim.ps import FLIGHT_BYTES, SYSTEMS, PSSystem

    assert FLIGHT_BYTES > 0
    assert {name: system.flight_bytes for name, system in SYSTEMS.items()} == {name: FLIGHT_BYTES for name in SYSTEMS}
    assert PSSystem("a-new-system").flight_bytes == FLIGHT_BYTES


def test_the_virtual_gpu_chains_operations_and_forgives_only_within_its_slack():
    def run(slack, ready_at):
        loop = EventLoop()
        device = Device(loop, slack)
        ends = []
        loop.at(0.0, device.submit, 1.0, False, lambda: ends.append(loop.now))
        loop.at(ready_at, device.submit, 1.0, True, lambda: ends.append(loop.now))
        loop.run()
        return ends

    assert run(0.0, 0.5) == pytest.approx([1.0, 2.0])  # ready while busy: starts where the first ended
    assert run(0.0, 1.0005) == pytest.approx([1.0, 2.0005])  # ready after: its wait is device time lost
    assert run(1e-3, 1.0005) == pytest.approx([1.0, 2.0])  # the old 1 ms slack forgave that gap
    assert run(1e-3, 1.5) == pytest.approx([1.0, 2.5])  # not a longer one
