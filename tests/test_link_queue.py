"""The links' queue depth as a setting (issue 26 item 5): tbf's parameters, the runner's flag, the shallow-queue
sweep at the headline points, and rows of different queues kept apart (resume, tables). The queue on real links
is tests/test_link_monitor_system.py's."""

import dataclasses

import pytest

from benchmarks.analysis import points as point_stats
from benchmarks.emulation import emulated_cluster
from benchmarks.suites import cluster_bench, sweeps

pytestmark = pytest.mark.unit


def test_tbf_holds_the_queue_asked_for_beyond_its_burst():
    assert emulated_cluster.tbf_args(8e8) == ["tbf", "rate", "800000000bit", "burst", "1000000", "latency", "50ms"]
    assert emulated_cluster.tbf_args(8e8, 1.0)[-2:] == ["latency", "1ms"]
    assert emulated_cluster.tbf_args(1e8, 2.5)[-4:] == ["burst", str(128 * 1024), "latency", "2.5ms"]
    with pytest.raises(ValueError, match="link queue 0 ms: must be positive"):
        emulated_cluster.tbf_args(8e8, 0)
    with pytest.raises(ValueError, match="must be positive"):
        emulated_cluster.EmulatedCluster(2, "1gbit", queue_ms=-1)  # refused before anything is built


def test_the_runner_takes_the_queue_and_refuses_a_bad_one(capsys):
    args = cluster_bench.parse_args(["--link-queue-ms", "5", "--kvstore", "p3", "dist_sync"])
    assert {p.link_queue_ms for p in cluster_bench.points_from_args(args)} == {5.0}
    assert cluster_bench.parse_args([]).link_queue_ms == emulated_cluster.DEFAULT_QUEUE_MS
    # The queue is dilated like every duration: at gpu_scale 0.1 tc holds 10x the real time, the same bytes as the
    # P100-equivalent link's queue; real compute is not dilated.
    point = cluster_bench.Point(model="resnet50_v1", kvstore="p3", hosts=2, bandwidth="400mbit", compute="emulated",
                                gpu_scale=0.1, link_queue_ms=50.0)
    assert point.link_queue_real_ms == pytest.approx(500.0)
    assert dataclasses.replace(point, compute="real").link_queue_real_ms == 50.0
    with pytest.raises(SystemExit):
        cluster_bench.parse_args(["--link-queue-ms", "0"])
    assert "--link-queue-ms must be positive" in capsys.readouterr().err


def test_the_shallow_sweep_runs_the_headline_points_with_a_shallow_queue():
    args = sweeps.parse_args(["shallow"])
    points = sweeps.SWEEPS["shallow"](args)
    equivalents = {(p.model, round(emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale / 1e9, 3)) for p in points}
    assert equivalents == {("resnet50_v1", 4.0), ("vgg19", 15.0)}
    assert {p.kvstore for p in points} == set(sweeps.SYSTEMS)
    assert {p.link_queue_ms for p in points} == {sweeps.SHALLOW[1]} and sweeps.SHALLOW[1] < 50
    assert {p.tag for p in points} == {"shallow"}
    # The same points of the bandwidth sweep, the deep queue's: everything else equal.
    deep = {(p.model, p.kvstore, p.bandwidth, p.gpu_scale, p.host_cpus) for p in sweeps.sweep_bandwidth(args)}
    assert {(p.model, p.kvstore, p.bandwidth, p.gpu_scale, p.host_cpus) for p in points} <= deep
    assert {p.link_queue_ms for p in sweeps.sweep_bandwidth(args)} == {emulated_cluster.DEFAULT_QUEUE_MS}
    assert "shallow" in sweeps.ALL


def test_rows_of_another_queue_are_another_point_and_older_rows_had_the_default():
    args = sweeps.parse_args(["shallow"])
    point = next(p for p in sweeps.SWEEPS["shallow"](args) if p.model == "vgg19" and p.kvstore == "p3")
    row = {k: ("" if v is None else str(v)) for k, v in dataclasses.asdict(point).items()}
    assert sweeps._signature(row) == sweeps._signature(dataclasses.asdict(point))
    deep = {**row, "link_queue_ms": ""}  # a row from before the column ran the 50 ms queue
    assert sweeps._signature(deep) == sweeps._signature({**dataclasses.asdict(point), "link_queue_ms": 50.0})
    assert sweeps._signature(deep) != sweeps._signature(row)
    assert point_stats.key_value(deep, "link_queue_ms") == "50" == point_stats.key_value({}, "link_queue_ms")
    assert point_stats.key_value(row, "link_queue_ms") == "1"


def test_the_links_bucket_is_dilated_so_it_holds_the_same_bytes_at_every_dilation():
    # tbf lets a link send a whole bucket at once after an idle spell. At a fixed 10 ms of real time the bucket
    # held half the P100-equivalent link's bytes at 0.05 that it held at 0.1; in the GPU's time it stays 1 ms.
    assert emulated_cluster.tbf_args(4e8, 50.0, 20.0)[3:5] == ["burst", "1000000"]
    with pytest.raises(ValueError, match="link burst 0 ms: must be positive"):
        emulated_cluster.tbf_args(8e8, 50.0, 0)
    at = {scale: cluster_bench.Point(model="resnet50_v1", kvstore="p3", hosts=4, bandwidth=sweeps.link(4, scale),
                                     compute="emulated", gpu_scale=scale, host_cpus=4) for scale in (0.1, 0.05, 0.025)}
    assert {p.link_burst_bytes for p in at.values()} == {500_000}  # 1 ms of 4 Gbps
    assert at[0.05].link_burst_real_ms == pytest.approx(20.0)
    assert emulated_cluster.burst_bytes(1e8, 1.0) == emulated_cluster.MIN_BURST_BYTES  # a GSO packet fits
    # Rows: the column, or for rows from before it the 10 ms of rate every link had; keeps buckets apart.
    row = {"bandwidth_bps": "200000000.0", "link_burst_bytes": ""}
    assert point_stats.key_value(row, "link_burst_bytes") == "250000"
    assert point_stats.key_value({**row, "link_burst_bytes": "500000"}, "link_burst_bytes") == "500000"
    assert point_stats.key_value({"bandwidth_bps": ""}, "link_burst_bytes") == ""
    point = at[0.05]
    fields = {k: ("" if v is None else str(v)) for k, v in dataclasses.asdict(point).items()}
    new_row = {**fields, "bandwidth_bps": "200000000.0", "link_burst_bytes": "500000", "cfs_period_us": "20000",
               "priority_hold_ms": "1000.0"}
    old_row = {**new_row, "link_burst_bytes": ""}  # 250,000 bytes: another run for --resume
    assert sweeps._signature(new_row) == sweeps._signature(sweeps._settings(point))
    assert sweeps._signature(old_row) != sweeps._signature(sweeps._settings(point))


def test_tcps_minimum_rto_is_the_kernels_200_ms_dilated():
    from benchmarks.emulation import link_shaping

    point = cluster_bench.Point(model="resnet50_v1", kvstore="p3", hosts=4, bandwidth="200mbit", compute="emulated",
                                gpu_scale=0.05, host_cpus=4, tcp_rto_min_gpu_ms=200.0)
    assert point.tcp_rto_min_real_ms == pytest.approx(4000.0) == link_shaping.dilated_rto_min_ms(0.05)
    assert dataclasses.replace(point, tcp_rto_min_gpu_ms=None).tcp_rto_min_real_ms is None  # the kernel's own
    assert dataclasses.replace(point, compute="real").tcp_rto_min_real_ms is None
    args = cluster_bench.parse_args(["--gpu-scale", "0.1", "--kvstore", "p3"])
    assert cluster_bench.points_from_args(args)[0].tcp_rto_min_real_ms is None  # the default: the kernel's 200 ms
    args = cluster_bench.parse_args(["--gpu-scale", "0.1", "--kvstore", "p3", "--tcp-rto-min-gpu-ms", "200"])
    assert cluster_bench.points_from_args(args)[0].tcp_rto_min_real_ms == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="must be positive"):
        link_shaping.dilated_rto_min_ms(0)
    # Rows: the real value, or for rows from before the column the kernel's 200 ms; --resume keeps them apart.
    assert point_stats.key_value({"tcp_rto_min_ms": ""}, "tcp_rto_min_ms") == "200"
    assert point_stats.key_value({"tcp_rto_min_ms": "4000"}, "tcp_rto_min_ms") == "4000"
    fields = {k: ("" if v is None else str(v)) for k, v in dataclasses.asdict(point).items()}
    row = {**fields, "link_burst_bytes": "500000", "cfs_period_us": "20000", "tcp_rto_min_ms": "4000",
           "priority_hold_ms": "1000.0"}
    assert sweeps._signature(row) == sweeps._signature(sweeps._settings(point))
    assert sweeps._signature({**row, "tcp_rto_min_ms": ""}) != sweeps._signature(sweeps._settings(point))
