"""The simulator (benchmarks/sim) against closed-form answers. Fast: no measurements are read."""

import dataclasses
import math

import pytest

from benchmarks.sim import ddp, model, ring, settings
from benchmarks.sim.cluster import Cluster, CpuCosts
from benchmarks.sim.ps import DIST_SYNC, MXNET_P3, P3KV, PRIORITY_SPLIT, SLICING_ONLY, parts_of, simulate

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
    # W workers and W servers on separate hosts: each link carries the model L once per direction, so no system
    # beats L/R; dist_sync without slicing cannot overlap push and pull of one array (>= 2 L/R). Workers in
    # lockstep push slice i to the same server at once and share its link (max-min), so p3kv's slices convoy:
    # between L/R and W L/R (plus a slice).
    W = 4
    m = model.synthetic([(0.0, 0.0, 10_000_000)])
    c = link(2 * W)
    L = 40e6
    p3 = simulate(m, c, P3KV).iteration_s
    assert L * 8 / GBIT <= p3 <= (W * L + 200_000) * 8 / GBIT * 1.001
    ds = simulate(m, c, DIST_SYNC).iteration_s
    assert ds >= 2 * L * 8 / GBIT


def test_cpu_cost_serialises_on_the_server_thread():
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    costs = CpuCosts(per_message=0.0, per_byte=1e-9)
    r = simulate(m, Cluster(2, None, layout="separate"), dataclasses.replace(P3KV, slice_size=1 << 30, costs=costs))
    assert r.iteration_s == pytest.approx(2 * 4e6 * 1e-9)  # push on the server, broadcast on the worker


NO_CYCLE = ring.Horovod(cycle_s=0.0)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_allreduce_time(n):
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    c = Cluster(n, 10 * GBIT, wire_overhead=1.0)
    expected = 2 * (n - 1) / n * 4e6 * 8 / (10 * GBIT)
    assert ring.allreduce_seconds(4e6, c) == pytest.approx(expected)
    assert ring.iteration_seconds(m, c, NO_CYCLE) == pytest.approx(expected)


def test_ring_fuses_up_to_the_threshold():
    # Three 4 MB gradients ready within one cycle: one fused buffer at the default threshold, three at 4 MB.
    m = model.synthetic([(0.0, 1e-5, 1_000_000)] * 3)
    c = Cluster(4, 10 * GBIT, latency_s=1e-3, wire_overhead=1.0)
    one_buffer = ring.iteration_seconds(m, c, ring.Horovod(cycle_s=1e-3))
    three = ring.iteration_seconds(m, c, ring.Horovod(cycle_s=1e-3, fusion_bytes=4_000_000))
    assert three - one_buffer == pytest.approx(2 * 6 * 1e-3)  # two more allreduces' latency steps


def test_horovod_defaults_are_0_28_1s():
    # horovod/common/operations.cc of v0.28.1: 128 MiB fusion threshold, 1 ms cycle (DESIGN.md; older: 64 MiB, 5 ms).
    assert ring.FUSION_BYTES == 128 * 1024 * 1024 and ring.CYCLE_S == pytest.approx(0.001)
    assert ring.Horovod().fusion_bytes == ring.FUSION_BYTES and ring.Horovod().cycle_s == ring.CYCLE_S


def test_horovod_waits_for_the_next_cycle():
    # One gradient ready at t = 0.25 ms of each iteration's backward end; cycles every 1 ms from t = 0: the
    # allreduce starts at the next cycle, so with no wire time an iteration lasts a whole number of cycles.
    m = model.synthetic([(0.0, 0.00025, 1000)])
    t = ring.iteration_seconds(m, Cluster(2, None), ring.Horovod(cycle_s=1e-3))
    assert t == pytest.approx(1e-3)


def test_ddp_buckets_close_once_they_hold_their_limit_the_first_at_1_mib():
    mib = 1 << 20
    sizes = [mib // 2, mib // 2 + 1, 10 * mib, 20 * mib, mib]
    assert ddp.buckets_of(sizes, mib, 25 * mib) == [[0, 1], [2, 3], [4]]
    assert ddp.buckets_of(sizes, 100 * mib, 100 * mib) == [[0, 1, 2, 3, 4]]
    assert ddp.FIRST_BUCKET_BYTES == mib and ddp.BUCKET_BYTES == 25 * mib  # torch 2.13's defaults


def test_ddp_reduces_its_buckets_in_turn_then_steps_everything_before_the_next_forward():
    # Two 4 MB gradients, compute free, 2 hosts at 10 Gbit/s with 1 ms latency: the last layer's gradient fills the
    # 1 MiB first bucket, the first layer's the next. Each allreduce moves 2 (N-1)/N x 4 MB (3.2 ms) in 2 (N-1)
    # latency steps (2 ms); then one step over both parameters, SGD's 5 passes at 1 GB/s (40 ms), before the
    # forward: nothing of the step overlaps the allreduces.
    m = model.synthetic([(0.0, 0.0, 1_000_000)] * 2, memory_bytes_per_s=1e9)
    c = Cluster(2, 10 * GBIT, latency_s=1e-3, wire_overhead=1.0)
    sgd = ddp.Ddp(gpu_accesses=5, bucket_accesses=0, copy_back_accesses=0)  # the bucket copies: the next test
    assert ddp.simulate(m, c, sgd).iteration_s == pytest.approx(2 * (3.2e-3 + 2e-3) + 40e-3)
    one_bucket = settings.apply_ddp(sgd, {"DDP_BUCKET_CAP_MB": "100"})  # both gradients in one bucket
    assert ddp.simulate(m, c, one_bucket).iteration_s == pytest.approx(6.4e-3 + 2e-3 + 40e-3)
    # Horovod on the same ring updates the first-reduced tensor while the second is reduced: 5.2 ms less.
    h = ring.Horovod(cycle_s=0.0, fusion_bytes=4_000_000, update_on="workers-gpu", gpu_accesses=5)
    assert ring.iteration_seconds(m, c, h) == pytest.approx(3.2e-3 + 2e-3 + 40e-3)


def test_ddps_bucket_copies_take_their_passes_on_the_virtual_gpu_around_its_allreduces():
    # As above, with the reducer's copies on the device (emulation/gradient_work.py): each gradient into its bucket
    # after its layer's backward, 2 x 4 MB at 1 GB/s (8 ms); the second bucket's allreduce (5.2 ms) starts when its
    # copy ends (16 ms), the first's ran meanwhile; then the copies back and the step, (2 + 5) x 8 MB (56 ms).
    m = model.synthetic([(0.0, 0.0, 1_000_000)] * 2, memory_bytes_per_s=1e9)
    c = Cluster(2, 10 * GBIT, latency_s=1e-3, wire_overhead=1.0)
    d = ddp.Ddp(gpu_accesses=5)
    assert (d.bucket_accesses, d.copy_back_accesses) == (2, 2)
    assert ddp.simulate(m, c, d).iteration_s == pytest.approx(16e-3 + 5.2e-3 + 56e-3)


def test_at_paper_scale_p3kv_torch_gains_on_ddp_where_the_link_limits_and_not_where_it_does_not():
    from benchmarks.sim import paper
    assert {"torch-p3kv", "ddp"} <= {p.system for p in paper.points("bandwidth")}

    def throughput(system, gbps):
        return paper.run_point(paper.Point("bandwidth", "resnet50_v1", system, gbps=gbps))["throughput"]

    # ResNet-50 on 4 machines: at 4 Gbps the next forward overlaps the tail of the broadcast (DDP waits for every
    # bucket and its step first); at 1 Gbps both are link-bound and move the same bytes.
    assert throughput("torch-p3kv", 4) > 1.1 * throughput("ddp", 4)
    assert throughput("torch-p3kv", 1) == pytest.approx(throughput("ddp", 1), rel=0.05)


def test_horovods_update_runs_on_the_virtual_gpu_at_the_memory_bandwidth():
    # 1M float32 elements, SGD's 5 passes at 1 GB/s: 20 ms on the device after the allreduce, before the forward.
    m = model.synthetic([(0.0, 0.0, 1_000_000)], memory_bytes_per_s=1e9)
    c = Cluster(2, None)
    h = ring.Horovod(cycle_s=0.0, update_on="workers-gpu", gpu_accesses=5)
    assert ring.iteration_seconds(m, c, h) == pytest.approx(0.02)


@pytest.mark.parametrize("window", [2, 10])
def test_send_window_delays_the_urgent_layer_by_the_committed_slices(window):
    # A sender with a window of w messages in its sockets (engine.Sender's `window`; the socket model aside): they
    # sit there, in order, ahead of the priority queue. Layer 1 (40 slices) is pushed first; layer 0 (10 slices)
    # is ready 1 ms later and, with window w, waits for w slices of layer 1 instead of the one in service: w - 1
    # slice times later, every iteration (layer 0's long forward hides layer 1's transfer).
    m = model.synthetic([(0.1, 0.001, 500_000), (0.0, 0.001, 2_000_000)])
    c = link(2)
    one_at_a_time = dataclasses.replace(P3KV, window=1, socket_bytes=None, flight_bytes=None)
    ideal = simulate(m, c, one_at_a_time).iteration_s
    windowed = simulate(m, c, dataclasses.replace(one_at_a_time, window=window)).iteration_s
    assert windowed - ideal == pytest.approx((window - 1) * 200_000 * 8 / GBIT)


def test_pushpull_answers_without_a_pull_round_trip():
    # MXNet's kv.pushpull (ZPushPull): the server answers each push with the aggregate, so responses of earlier
    # arrays overlap pushes of later ones: (k + 1) arrays' time for k arrays, as P3's broadcast.
    m = model.synthetic([(0.0, 0.0, 100_000)] * 10)
    r = simulate(m, link(2), DIST_SYNC)
    assert r.iteration_s == pytest.approx(11 * 400_000 * 8 / GBIT)


def test_a_server_update_runs_once_per_part_with_its_last_push():
    # 2 workers, 1 server on 3 hosts, one unsliced array, no links: the server's one thread processes 2 pushes
    # (1 ns/byte each) and updates once (0.5 ns/byte), then broadcasts; the worker receives (1 ns/byte).
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    costs, update = CpuCosts(per_byte=1e-9), CpuCosts(per_byte=0.5e-9)
    cluster = Cluster(4, None, layout="separate")
    system = dataclasses.replace(P3KV, slice_size=1 << 30, costs=costs, update=update, receivers="process")
    assert simulate(m, cluster, system).iteration_s == pytest.approx((2 + 0.5 + 1) * 4e6 * 1e-9)
    assert simulate(m, cluster, dataclasses.replace(system, update=CpuCosts())).iteration_s == \
        pytest.approx(3 * 4e6 * 1e-9)


def test_p3kv_reads_each_connection_on_its_own_thread_and_its_consumer_only_sums_and_updates():
    # The same job as above with p3kv's threads: each worker's push is read by its connection's thread at once
    # (1 ns/byte less the 0.25 ns/byte sum), the consumer sums both (0.25 each) and updates with the second.
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    costs, update, aggregate = CpuCosts(per_byte=1e-9), CpuCosts(per_byte=0.5e-9), CpuCosts(per_byte=0.25e-9)
    system = dataclasses.replace(P3KV, slice_size=1 << 30, costs=costs, update=update, aggregate=aggregate)
    assert P3KV.receivers == "connection" and DIST_SYNC.receivers == MXNET_P3.receivers == "process"
    cluster = Cluster(4, None, layout="separate")
    assert simulate(m, cluster, system).iteration_s == pytest.approx((0.75 + 2 * 0.25 + 0.5 + 1) * 4e6 * 1e-9)
    # Under per-thread caps (a tenth of a core each, the host's quota 2 cores) one server uses several threads'
    # worth: 2 readers in parallel; the ps-lite model's single thread pays all of it at the cap.
    capped = Cluster(4, None, layout="separate", cores=2.0, thread_cores=0.1)
    assert simulate(m, capped, system).iteration_s == pytest.approx((0.75 + 2 * 0.25 + 0.5 + 1) * 4e6 * 1e-8)
    single = dataclasses.replace(system, receivers="process")
    assert simulate(m, capped, single).iteration_s == pytest.approx((2 + 0.5 + 1) * 4e6 * 1e-8)
    # Replies from S servers are read by S threads of the worker: 2 servers' halves of an array in parallel.
    two = model.synthetic([(0.0, 0.0, 2_000_000)])
    halves = dataclasses.replace(system, slice_size=1_000_000, update=CpuCosts(), aggregate=CpuCosts())
    assert simulate(two, capped, halves).iteration_s == pytest.approx((1 + 1) * 4e6 * 1e-8)
    assert simulate(two, capped, dataclasses.replace(halves, receivers="process")).iteration_s == \
        pytest.approx((2 + 2) * 4e6 * 1e-8)
    with pytest.raises(ValueError, match="receivers 'thread'"):
        dataclasses.replace(P3KV, receivers="thread")


def test_a_worker_update_runs_on_every_worker_when_its_part_comes_back():
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    costs, update = CpuCosts(per_byte=1e-9), CpuCosts(per_message=1e-3)
    cluster = Cluster(4, None, layout="separate")
    system = dataclasses.replace(MXNET_P3, slice_size=1 << 30, window=1, costs=costs, update=update,
                                 update_on="workers-cpu")
    # 2 pushes served, then the worker receives and updates (1 ms): the worker's part of the path, not the server's.
    assert simulate(m, cluster, system).iteration_s == pytest.approx(3 * 4e6 * 1e-9 + 1e-3)


def test_a_worker_update_on_the_virtual_gpu_costs_its_memory_traffic_not_cpu():
    m = model.synthetic([(0.0, 0.0, 1_000_000)], memory_bytes_per_s=1e9)
    cluster = Cluster(4, None, layout="separate")
    system = dataclasses.replace(MXNET_P3, slice_size=1 << 30, window=1, costs=CpuCosts(per_byte=1e-9),
                                 update=CpuCosts(per_message=1.0), update_on="workers-gpu", gpu_accesses=5)
    # 2 pushes (4 ms each) on the server thread, the receive (4 ms), then 5 x 4 MB at 1 GB/s on the device.
    assert simulate(m, cluster, system).iteration_s == pytest.approx(3 * 4e-3 + 0.02)


def test_torch_server_placements_new_values_are_copied_into_the_parameter_on_the_virtual_gpu():
    from benchmarks.sim.ps import TORCH_P3KV_SERVER

    m = model.synthetic([(0.0, 0.0, 1_000_000)], memory_bytes_per_s=1e9)
    cluster = Cluster(4, None, layout="separate")
    system = dataclasses.replace(TORCH_P3KV_SERVER, slice_size=1 << 30, window=1, receivers="process",
                                 costs=CpuCosts(per_byte=1e-9), push_accesses=0)
    assert (system.update_on, system.gpu_accesses) == ("servers", 2)
    # 2 pushes (4 ms each) on the server thread, the receive (4 ms), then the copy: 2 x 4 MB at 1 GB/s on the device.
    assert simulate(m, cluster, system).iteration_s == pytest.approx(3 * 4e-3 + 0.008)
    no_copy = dataclasses.replace(system, gpu_accesses=0)
    assert simulate(m, cluster, no_copy).iteration_s == pytest.approx(3 * 4e-3)
    # With the 1/W scaling into the send buffer on the device before the push (gradient_work.py), 2 x 4 MB more.
    assert TORCH_P3KV_SERVER.push_accesses == 2
    scaled = dataclasses.replace(system, push_accesses=2)
    assert simulate(m, cluster, scaled).iteration_s == pytest.approx(0.008 + 3 * 4e-3 + 0.008)


def test_priority_split_cuts_only_big_arrays_one_part_per_server_round_robin():
    m = model.synthetic([(0.0, 0.0, 3_000_001), (0.0, 0.0, 10)])
    parts = parts_of(m, PRIORITY_SPLIT, 2)
    assert [(p.layer, p.nbytes, p.server) for p in parts] == [(0, 1_500_001 * 4, 0), (0, 1_500_000 * 4, 1),
                                                               (1, 40, 0)]


def test_ring_cpu_bounds_an_allreduce_and_updates_follow_their_buffer():
    m = model.synthetic([(0.0, 0.0, 1_000_000)])
    c = Cluster(2, 10 * GBIT, wire_overhead=1.0)
    wire = ring.allreduce_seconds(4e6, c)
    # 4 ms of CPU for 4 MB, above the 3.2 ms on the wire
    slow_cpu = ring.Horovod(cpu=CpuCosts(per_byte=1e-9), cycle_s=0.0)
    assert ring.iteration_seconds(m, c, slow_cpu) == pytest.approx(4e6 * 1e-9)
    with_update = ring.Horovod(update=CpuCosts(per_message=1e-3), update_on="workers-cpu", cycle_s=0.0)
    assert ring.iteration_seconds(m, c, with_update) == pytest.approx(wire + 1e-3)
    # 4 workers time-sharing 2 cores: every worker's CPU at once takes twice as long.
    shared = Cluster(4, None, shared_cores=2)
    assert ring.iteration_seconds(m, shared, slow_cpu) == pytest.approx(2 * 4e6 * 1e-9)
    # A quota of 0.5 core per host (the emulation's host_cpus x gpu_scale): the same, each host on its own.
    assert ring.iteration_seconds(m, Cluster(4, None, cores=0.5), slow_cpu) == pytest.approx(2 * 4e6 * 1e-9)


def test_the_cost_fit_recovers_known_costs_exactly_from_two_cases_and_by_least_squares_from_more():
    from benchmarks.sim import costs as costs_lib
    truth = CpuCosts(per_message=30e-6, per_byte=0.4e-9)
    # case -> (messages, bytes): two models at one slice size, then the same at a smaller slice size.
    cases = {("a", 50): (500, 100e6), ("b", 50): (2900, 570e6), ("a", 10): (2500, 100e6), ("b", 10): (14300, 570e6)}

    def seconds(costs, case):
        messages, nbytes = cases[case]
        return 0.01 + messages * costs.per_message + nbytes * costs.per_byte

    for subset in ([("a", 50), ("a", 10)], list(cases)):
        found = costs_lib.fit_pair(seconds, {c: seconds(truth, c) for c in subset})
        assert found.per_message == pytest.approx(truth.per_message, rel=1e-3), subset
        assert found.per_byte == pytest.approx(truth.per_byte, rel=1e-3), subset
    # Why a second slice size: at one size both models carry about as many messages per byte, and costs far from
    # the truth reproduce them within the fit's tolerance.
    one_size = {c: seconds(truth, c) for c in [("a", 50), ("b", 50)]}
    found = costs_lib.fit_pair(seconds, one_size)
    assert all(abs(seconds(found, c) / t - 1) < 0.005 for c, t in one_size.items())
    assert found.per_message < truth.per_message / 2
    # Inconsistent measurements (4 equations, 2 unknowns): the fit's squared log error is no worse than the truth's.
    noisy = {c: seconds(truth, c) * f for c, f in zip(cases, (1.04, 0.97, 1.0, 1.05))}
    found = costs_lib.fit_pair(seconds, noisy)

    def error(costs):
        return sum(math.log(seconds(costs, c) / t) ** 2 for c, t in noisy.items())

    assert error(found) <= error(truth) * 1.001


def test_p3kvs_update_cost_is_the_line_through_the_measured_kernel_times(tmp_path):
    from benchmarks.sim import costs as costs_lib
    path = tmp_path / "server_slice.csv"
    lines = ["workers,count,optimizer,kernel_cpu_ns_median"]
    for workers in (2, 4):
        for count in (10_000, 50_000, 200_000):
            # 2 us + 0.125 ns per byte with 2 workers; other rows must be ignored.
            lines.append(f"{workers},{count},sgd,{2000 + 0.125 * 4 * count if workers == 2 else 1e9}")
        lines.append(f"{workers},50000,adam,1e9")
        lines.append(f"{workers},50000,none,0")
    path.write_text("\n".join(lines) + "\n")
    found = costs_lib.server_update(path)
    assert found.per_message == pytest.approx(2e-6) and found.per_byte == pytest.approx(0.125e-9)
    path.write_text(lines[0] + "\n2,50000,sgd,100\n")
    with pytest.raises(ValueError, match="rerun benchmarks/suites/server_bench.py"):
        costs_lib.server_update(path)


def test_p3kvs_sum_per_push_is_the_line_through_the_measured_work_without_an_optimizer(tmp_path):
    from benchmarks.sim import costs as costs_lib
    path = tmp_path / "server_slice.csv"
    lines = ["workers,count,optimizer,work_cpu_ns_median"]
    for count in (10_000, 50_000, 200_000):
        # 2 pushes of 1 us + 0.1 ns per byte each; the SGD rows and the 4-worker rows must be ignored.
        lines += [f"2,{count},none,{2 * (1000 + 0.1 * 4 * count)}", f"2,{count},sgd,1e9", f"4,{count},none,1e9"]
    path.write_text("\n".join(lines) + "\n")
    found = costs_lib.server_aggregate(path)
    assert found.per_message == pytest.approx(1e-6) and found.per_byte == pytest.approx(0.1e-9)
    assert costs_lib.with_aggregate(P3KV).aggregate == costs_lib.server_aggregate()  # the committed file's
    assert costs_lib.with_aggregate(DIST_SYNC) == DIST_SYNC  # ps-lite's one receive thread: no split
    short = tmp_path / "short.csv"
    short.write_text(lines[0] + "\n2,50000,none,100\n")
    with pytest.raises(ValueError, match="rerun benchmarks/suites/server_bench.py"):
        costs_lib.server_aggregate(short)
