"""The simulator (benchmarks/sim) against closed-form answers. Fast: no measurements are read."""

import dataclasses

import pytest

from benchmarks.sim import model, ring
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.ps import DIST_SYNC, P3KV, SLICING_ONLY, simulate

pytestmark = pytest.mark.unit

GBIT = 1e9


def link(hosts, layout="separate", rate=GBIT):
    return Cluster(hosts, rate, layout=layout, wire_overhead=1.0)


def test_compute_only_is_the_sum_of_layer_times():
    m = model.synthetic([(0.1, 0.2, 10), (0.3, 0.6, 10)])
    assert simulate(m, Cluster(2, None), P3KV).iteration_s == pytest.approx(1.2)


def test_one_layer_on_one_link_is_push_then_broadcast():
    # 1 worker, 1 server on two hosts, one array in one slice: L/R out, L/R back; compute 0.
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    r = simulate(m, link(2), dataclasses.replace(P3KV, slice_size=1 << 30))
    assert r.iteration_s == pytest.approx(2 * 4e6 * 8 / GBIT)


def test_communication_only_pipelines_slices():
    # k slices of s bytes: pushes back to back, each broadcast while the next is pushed: (k + 1) s / R.
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    r = simulate(m, link(2), P3KV)  # 20 slices of 50,000 elements
    assert r.iteration_s == pytest.approx(21 * 200_000 * 8 / GBIT)


def test_wire_overhead_and_compute_add_where_they_do_not_overlap():
    m = model.synthetic([(0.5, 1.0, 1_000_000)])
    c = Cluster(2, GBIT, layout="separate")  # default framing overhead 1514/1448
    r = simulate(m, c, dataclasses.replace(P3KV, slice_size=1 << 30))
    assert r.iteration_s == pytest.approx(1.5 + 2 * 4e6 * 8 / GBIT * 1514 / 1448)


def test_priority_lets_the_first_layer_overtake():
    # Layer 1 (big) is pushed first; layer 0's gradient is ready right after. With priority, layer 0's slices
    # overtake layer 1's queued ones, so the next forward of layer 0 starts earlier.
    m = model.synthetic([(0.01, 0.001, 500_000), (0.01, 0.001, 5_000_000)])
    c = link(2)
    with_priority = simulate(m, c, P3KV, iters=4).forward_done[0]
    fifo = simulate(m, c, SLICING_ONLY, iters=4).forward_done[0]
    # FIFO: layer 0 comes back after all 110 slices (+1 slice for the last broadcast); interval = backward of
    # layer 1 (pushes start) + 111 slices + forward (0.02) - the first forward (0.02).
    slice_s = 200_000 * 8 / GBIT
    assert fifo[1] - fifo[0] == pytest.approx(0.001 + 0.02 + 111 * slice_s, rel=1e-6)
    assert with_priority[1] < fifo[1]


def test_w_workers_into_s_servers_need_the_model_each_way():
    # W workers and W servers on separate hosts: each link carries the model L once per direction; full duplex
    # and slicing overlap the two directions (L/R + about a slice), while dist_sync without slicing cannot
    # overlap push and pull of one array (>= 2 L/R: L/W to each server, then L/W back, W arrays in parallel).
    W = 4
    m = model.synthetic([(0.0, 0.0, 10_000_000)])
    c = link(2 * W)
    L = 40e6
    p3 = simulate(m, c, P3KV).iteration_s
    assert p3 == pytest.approx(L * 8 / GBIT, rel=0.03)
    ds = simulate(m, c, DIST_SYNC).iteration_s
    assert ds >= 2 * L * 8 / GBIT


def test_cpu_cost_serialises_on_the_server_thread():
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    costs = CpuCosts(per_message=0.0, per_byte=1e-9)
    r = simulate(m, Cluster(2, None, layout="separate"), dataclasses.replace(P3KV, slice_size=1 << 30, costs=costs))
    assert r.iteration_s == pytest.approx(2 * 4e6 * 1e-9)  # push on the server, broadcast on the worker


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_allreduce_time(n):
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    c = Cluster(n, 10 * GBIT, wire_overhead=1.0)
    expected = 2 * (n - 1) / n * 4e6 * 8 / (10 * GBIT)
    assert ring.allreduce_seconds(4e6, c) == pytest.approx(expected)
    assert ring.iteration_seconds(m, c, cycle_s=0.0) == pytest.approx(expected)


def test_ring_fuses_up_to_the_threshold():
    m = model.synthetic([(0.0, 0.0, 1_000_000)] * 3)
    c = Cluster(4, 10 * GBIT, latency_s=1e-3, wire_overhead=1.0)
    one_buffer = ring.iteration_seconds(m, c, cycle_s=0.0)
    three = ring.iteration_seconds(m, c, fusion_bytes=4_000_000, cycle_s=0.0)
    assert three - one_buffer == pytest.approx(2 * 6 * 1e-3)  # two more allreduces' latency steps


@pytest.mark.parametrize("window", [2, 10])
def test_send_window_delays_the_urgent_layer_by_the_committed_slices(window):
    # MXNet's P3 van: DMLC_PS_WATER_MARK messages already sit in the socket, in order, ahead of the priority
    # queue. Layer 1 (40 slices) is pushed first; layer 0 (10 slices) is ready 1 ms later and, with window w,
    # waits for w slices of layer 1 instead of the one in service: w - 1 slice times later, every iteration
    # (layer 0's long forward hides layer 1's transfer).
    m = model.synthetic([(0.1, 0.001, 500_000), (0.0, 0.001, 2_000_000)])
    c = link(2)
    ideal = simulate(m, c, P3KV).iteration_s
    windowed = simulate(m, c, dataclasses.replace(P3KV, window=window)).iteration_s
    assert windowed - ideal == pytest.approx((window - 1) * 200_000 * 8 / GBIT)


def test_pushpull_answers_without_a_pull_round_trip():
    # MXNet's kv.pushpull (ZPushPull): the server answers each push with the aggregate, so responses of earlier
    # arrays overlap pushes of later ones: (k + 1) arrays' time for k arrays, as P3's broadcast.
    m = model.synthetic([(0.0, 0.0, 100_000)] * 10)
    r = simulate(m, link(2), DIST_SYNC)
    assert r.iteration_s == pytest.approx(11 * 400_000 * 8 / GBIT)
