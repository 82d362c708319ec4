"""ps-lite's receive path in the simulator (benchmarks/sim/stages.py, threads.py): a message through a process's
serial threads in turn and an OpenMP team, its first thread reading as the bytes come, against hand-worked answers;
each thread's CPU per message and per byte fitted from the rows' measured thread_cpu, on the fit split only. Fast:
no measurements are read."""

import json

import pytest

from benchmarks.sim import link_fit, ps, threads
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.engine import EventLoop, FairNetwork, SharedCpu
from benchmarks.sim.stages import Stages, TeamCpu, ThreadCosts

pytestmark = pytest.mark.unit


def per_byte(*seconds):
    """ThreadCosts whose stages cost `seconds` per byte; a 1-byte job then costs exactly that."""
    return tuple(CpuCosts(0.0, s) for s in seconds)


def ends_of(costs, team, sizes, cores=None, arrivals=None, blocking=False):
    """Each job's end through Stages(costs, team) on one host of `cores` (None: a core per thread)."""
    loop = EventLoop()
    ends = [None] * len(sizes)
    stages = Stages(SharedCpu(loop, cores), costs, team, sizes.__getitem__, lambda job: ends.__setitem__(job, loop.now),
                    blocking=blocking)
    for job, at in enumerate(arrivals or [0.0] * len(sizes)):
        loop.at(at, stages.put, job)
    loop.run()
    return ends


def test_one_thread_pays_every_message_in_turn():
    assert ends_of(ThreadCosts(per_byte(1.0)), 4, [1, 1]) == pytest.approx([1.0, 2.0])


def test_a_chain_of_threads_pipelines_messages_at_its_busiest_stage():
    # Stage 1: 0.5 s per message; stage 2: 0.3 s alone, then the 0.2 s OpenMP loop over 2 threads (0.1 s):
    # 0.9 s for one message, the next one 0.5 s behind it (stage 1 is the busiest), not 1 s.
    costs = ThreadCosts(per_byte(0.5, 0.3), CpuCosts(0.0, 0.2))
    assert ends_of(costs, 2, [1, 1]) == pytest.approx([0.9, 1.4])
    # Per message and per byte: 0.1 s + 0.2 s/byte on the first thread, so 2 bytes take 0.5 s there.
    costs = ThreadCosts((CpuCosts(0.1, 0.2), CpuCosts(0.0, 0.0)))
    assert ends_of(costs, 1, [2]) == pytest.approx([0.5])


def test_a_blocking_handler_takes_the_next_message_only_when_the_last_thread_is_done():
    # Reader 0.1 s, then two threads of 0.5 s each. Pipelined, the second message ends 0.5 s after the first; with
    # MXNet's server handler waiting for the engine (blocking), 1 s after it: the threads after the reader take
    # one message at a time between them.
    costs = ThreadCosts(per_byte(0.1, 0.5, 0.5))
    assert ends_of(costs, 1, [1, 1]) == pytest.approx([1.1, 1.6])
    assert ends_of(costs, 1, [1, 1], blocking=True) == pytest.approx([1.1, 2.1])


def test_the_openmp_loop_shares_the_hosts_cores():
    # On one core the loop's two chunks share it: no faster than one thread would be.
    loop = EventLoop()
    done = []
    TeamCpu(SharedCpu(loop, 1.0), 2).run(0.5, 0.5, lambda: done.append(loop.now))
    loop.run()
    assert done == pytest.approx([1.0])
    loop = EventLoop()
    TeamCpu(SharedCpu(loop, None), 4).run(0.5, 0.5, lambda: done.append(loop.now))
    loop.run()
    assert done[1] == pytest.approx(0.5 + 0.5 / 4)  # a core per thread: the loop in a quarter of its time


def test_the_first_thread_reads_a_message_while_its_bytes_come():
    def onward(read_s, last_byte_at):
        loop = EventLoop()
        ends = []
        stages = Stages(SharedCpu(loop, None), ThreadCosts(per_byte(read_s, 0.5)), 1, lambda job: 1,
                        lambda job: ends.append(loop.now))
        token = stages.begin(0)  # the first byte leaves at 0
        loop.at(last_byte_at, stages.arrived, token)
        loop.run()
        return ends

    assert onward(1.0, 2.0) == pytest.approx([2.5])  # read by 1 s, all here at 2 s: on at 2, done at 2.5
    assert onward(3.0, 2.0) == pytest.approx([3.5])  # the reader is slower than the wire: on once it is done


def test_the_network_says_when_a_messages_first_byte_leaves():
    loop = EventLoop()
    net = FairNetwork(loop, Cluster(2, 8.0, wire_overhead=1.0))  # 1 byte per second
    sender = net.sender(0, False, None)
    seen = []
    for name in ("a", "b"):  # one connection: b starts once a is sent
        sender.put(0, 1, 2.0, lambda t, n: seen.append((n, "in", t)), name,
                   on_start=lambda n: seen.append((n, "out", loop.now)))
    loop.run()
    assert sorted(seen, key=lambda e: (e[2], e[0])) == [("a", "out", 0.0), ("a", "in", 2.0), ("b", "out", 2.0),
                                                        ("b", "in", 4.0)]


def test_thread_costs_need_a_stage_and_no_negative_cost():
    with pytest.raises(ValueError, match="at least one stage"):
        ThreadCosts(())
    with pytest.raises(ValueError, match="negative"):
        ThreadCosts(per_byte(-1.0))
    with pytest.raises(ValueError, match="receivers 'process'"):
        ps.PSSystem("p3", receivers="connection", server_threads=ThreadCosts(per_byte(1.0)))


def test_a_line_through_messages_and_bytes_is_found_and_never_negative():
    # 100 messages + 1e6 bytes -> 0.3 s; 10 messages + 1e8 bytes -> 2.01 s: 1 ms per message, 20 ns per byte.
    found = threads.fit_line([(100, 1e6, 0.1 + 0.02), (10, 1e8, 0.01 + 2.0)])
    assert found.per_message == pytest.approx(1e-3) and found.per_byte == pytest.approx(2e-8)
    # More CPU where there are fewer messages and the same bytes: no negative per-message cost, bytes alone.
    found = threads.fit_line([(100, 1e6, 1.0), (10, 1e6, 2.0)])
    assert found.per_message == 0.0 and found.per_byte > 0


def test_each_threads_cost_comes_from_its_cpu_in_the_runs():
    # Two fit rows of one role, cap 0.1 core per thread, 2 s per iteration, teams of 3 OpenMP threads: a thread
    # listed at 50% used 0.5 x 0.1 x 2 = 0.1 core-seconds per iteration.
    small = json.dumps({"worker": [["python", 50, 0], ["python", 20, 0], ["p3-gpu-side", 90, 0],
                                   ["python", 5, 0], ["python", 5, 0]]})
    big = json.dumps({"worker": [["python", 90, 0], ["python", 10, 0], ["python", 10, 0]] + [["python", 1, 0]] * 5})
    point = {"split": "fit", "kvstore": "dist_sync", "thread_cap_cores": "0.1", "cpu_quota_cores": "0.3",
             "median_s": 2.0}
    rows = (threads.samples({**point, "thread_cpu": [small]}, {"worker": (100.0, 1e6)})["worker"]
            + threads.samples({**point, "thread_cpu": [big]}, {"worker": (10.0, 1e8)})["worker"])
    assert rows[0].threads == pytest.approx((0.1, 0.04, 0.01, 0.01))  # the GPU-side thread left out
    costs = threads.thread_costs(rows)
    assert len(costs.stages) == 2  # at most two threads carry >= 10% of a row's CPU
    # The first thread: 0.1 core-s at (100, 1e6), 0.18 at (10, 1e8).
    assert costs.stages[0].of(1e6) + 99 * costs.stages[0].per_message == pytest.approx(0.1)
    assert costs.stages[0].of(1e8) + 9 * costs.stages[0].per_message == pytest.approx(0.18)
    # The team's other two threads: 0.02 core-s (small row), 0.022 (big row: the listed 0.02 of the first two
    # past the stages); the loop over all three is 3/2 of that, and the last stage keeps its own 0.04 - 0.01.
    assert costs.team.of(1e6) + 99 * costs.team.per_message == pytest.approx(0.03)
    assert costs.stages[1].of(1e6) + 99 * costs.stages[1].per_message == pytest.approx(0.03)


def test_a_row_listing_only_the_busiest_threads_counts_the_team_threads_it_leaves_out():
    full = [["python", 50, 0], ["python", 30, 0]] + [["python", 2, 0]] * 6  # TOP threads: the list is cut
    point = {"thread_cap_cores": "0.1", "cpu_quota_cores": "1.0", "median_s": 1.0, "thread_cpu": [json.dumps(
        {"server": full})]}
    (row,) = threads.samples(point, {"server": (1.0, 1.0)})["server"]
    assert row.team == 10 and not row.listed_all
    assert threads._rest(row, 2) == pytest.approx(9 * 0.002)  # 6 listed, 3 more at the least listed one's CPU


def test_only_fit_points_of_ps_lites_systems_are_fitted():
    text = json.dumps({"server": [["python", 60, 0], ["python", 30, 0], ["python", 10, 0]],
                       "worker": [["python", 80, 0], ["python", 20, 0]]})
    base = {"thread_cap_cores": "0.1", "cpu_quota_cores": "0.1", "median_s": 1.0}
    points = [{**base, "split": "fit", "kvstore": "dist_sync", "thread_cpu": [text, text]},
              {**base, "split": "held-out", "kvstore": "mxnet-p3", "thread_cpu": [text]},  # held out: never fitted
              {**base, "split": "fit", "kvstore": "p3", "thread_cpu": [text]}]  # p3kv: a thread per connection
    found = threads.fitted(points, lambda p: {"server": (10.0, 1e6), "worker": (5.0, 1e6)})
    assert set(found) == {"dist_sync"} and set(found["dist_sync"]) == {"server", "worker"}
    assert len(found["dist_sync"]["server"].stages) == 3
    assert link_fit.own_threads("p3") and not link_fit.own_threads("dist_sync")


def test_the_busiest_server_gets_every_workers_push_of_its_parts():
    parts = [ps.Part(0, 100, 0), ps.Part(0, 300, 1), ps.Part(1, 50, 1)]
    assert threads.traffic_of(parts, workers=4, servers=2) == {"server": (8.0, 1400.0), "worker": (3.0, 450.0)}
