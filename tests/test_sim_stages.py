"""ps-lite's receive path in the simulator (benchmarks/sim/stages.py, threads.py): a message through a process's
serial threads in turn and an OpenMP team, against hand-worked answers; the shares read from the rows' measured
thread_cpu, on the fit split only. Fast: no measurements are read."""

import json

import pytest

from benchmarks.sim import ps, threads, validate
from benchmarks.sim.engine import EventLoop, SharedCpu
from benchmarks.sim.stages import Stages, TeamCpu

pytestmark = pytest.mark.unit


def ends_of(shares, team, costs, cores=None, arrivals=None):
    """Each job's end through Stages(shares, team) on one host of `cores` (None: a core per thread)."""
    loop = EventLoop()
    ends = [None] * len(costs)
    stages = Stages(SharedCpu(loop, cores), shares, team, costs.__getitem__,
                    lambda job: ends.__setitem__(job, loop.now))
    for job, at in enumerate(arrivals or [0.0] * len(costs)):
        loop.at(at, stages.put, job)
    loop.run()
    return ends


def test_without_shares_one_thread_pays_every_message_in_turn():
    assert ends_of((), 4, [1.0, 1.0]) == pytest.approx([1.0, 2.0])


def test_a_chain_of_threads_pipelines_messages_at_its_busiest_stage():
    # Stage 1: 0.5 s per message; stage 2: 0.3 s alone, then the 0.2 s OpenMP loop over 2 threads (0.1 s):
    # 0.9 s for one message, the next one 0.5 s behind it (stage 1 is the busiest), not 1 s.
    assert ends_of((0.5, 0.3), 2, [1.0, 1.0]) == pytest.approx([0.9, 1.4])


def test_the_openmp_loop_shares_the_hosts_cores():
    # On one core the loop's two chunks share it: no faster than one thread would be.
    loop = EventLoop()
    done = []
    TeamCpu(SharedCpu(loop, 1.0), 2, 0.5).run(1.0, lambda: done.append(loop.now))
    loop.run()
    assert done == pytest.approx([1.0])
    loop = EventLoop()
    TeamCpu(SharedCpu(loop, None), 4, 0.5).run(1.0, lambda: done.append(loop.now))
    loop.run()
    assert done[1] == pytest.approx(0.5 + 0.5 / 4)  # a core per thread: the loop in a quarter of its time


def test_shares_must_be_positive_and_add_up_to_at_most_one():
    with pytest.raises(ValueError, match="each positive"):
        Stages(SharedCpu(EventLoop(), None), (0.7, 0.4), 2, lambda j: 1.0, lambda j: None)
    with pytest.raises(ValueError, match="receivers 'process'"):
        ps.PSSystem("p3", receivers="connection", server_stages=(0.5,))


def test_shares_are_read_from_the_busiest_threads_without_gpu_side_ones():
    listed = [["p3-gpu-side", 300.0, 0.0], ["python", 48.0, 24.0], ["python", 42.0, 38.0], ["python", 4.0, 0.5],
              ["python", 3.0, 0.4], ["python", 3.0, 0.4]]
    assert threads.shares(listed) == (0.48, 0.42)  # 100 points of CPU-side threads; the three small ones: OpenMP
    assert threads.shares([["python", 0.0, 0.0]]) == ()
    assert threads.median_stages([(0.5, 0.3), (0.6, 0.2), (0.7,), ()]) == (0.55, 0.25)  # most rows: two stages
    assert threads.median_stages([(0.5, 0.3), (0.7,)]) == (0.7,)  # a tie: fewer stages


def test_only_fit_points_of_ps_lites_systems_give_shares():
    text = json.dumps({"server": [["python", 60, 0], ["python", 30, 0], ["python", 10, 0]],
                       "worker": [["python", 80, 0], ["python", 20, 0]]})
    points = [{"split": "fit", "kvstore": "dist_sync", "thread_cpu": [text, text]},
              {"split": "held-out", "kvstore": "mxnet-p3", "thread_cpu": [text]},  # held out: never fitted on
              {"split": "fit", "kvstore": "p3", "thread_cpu": [text]}]  # p3kv: a thread per connection already
    found = threads.measured(points)
    assert found == {"dist_sync": {"server": (0.6, 0.3, 0.1), "worker": (0.8, 0.2)}}
    assert validate.own_threads("dist_sync", found) and not validate.own_threads("mxnet-p3", found)
