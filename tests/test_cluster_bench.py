"""The emulated-cluster benchmark's parts: the cluster helper (namespaces, capped links, teardown), the emulated
compute layer (profiled times, backward order) and a smoke run of the runner for every system on 2 hosts.
Ratios between systems are results (benchmarks/results/), never asserted here."""

import csv
import json
import os
import re
import subprocess
import sys
import time

import pytest
from harness import ROOT

from benchmarks.analysis import bench_rows
from benchmarks.emulation import emulated_cluster, emulated_compute
from benchmarks.suites import cluster_bench

RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); n = 0; start = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if start is None: start = time.monotonic()
    n += len(b)
print(n * 8 / (time.monotonic() - start))
"""
SENDER = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); buf = b"x" * (1 << 20); end = time.monotonic() + 2
while time.monotonic() < end: s.sendall(buf)
s.close()
"""


def _require_cluster():
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)


def _our_namespaces(cluster):
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(cluster.name)]


def _measure(cluster, src, dst):
    receiver = cluster.popen(dst, [sys.executable, "-c", RECEIVER, cluster.address(dst)], stdout=subprocess.PIPE,
                             text=True)
    assert receiver.stdout.readline().strip() == "listening"
    cluster.run(src, [sys.executable, "-c", SENDER, cluster.address(dst)], check=True)
    out, _ = receiver.communicate(timeout=30)
    return float(out.strip())


@pytest.mark.unit
def test_parse_rate():
    assert emulated_cluster.parse_rate("1gbit") == 1e9
    assert emulated_cluster.parse_rate("300mbit") == 300e6
    assert emulated_cluster.parse_rate("10Gbit") == 10e9
    assert emulated_cluster.parse_rate("1mbps") == 8e6  # tc: bps is bytes per second
    with pytest.raises(ValueError, match="not a rate"):
        emulated_cluster.parse_rate("fast")


@pytest.mark.system
def test_cluster_caps_links_and_tears_down():
    _require_cluster()
    with emulated_cluster.EmulatedCluster(3, "200mbit") as cluster:
        assert len(_our_namespaces(cluster)) == 4  # 3 hosts + the bridge
        # Addresses exist only inside the namespaces.
        assert cluster.address(1) not in subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        before = cluster.counters()
        rate = _measure(cluster, 0, 2)
        assert 0.9 * 200e6 <= rate <= 1.1 * 200e6, rate
        sent = cluster.counters()[0][0] - before[0][0]
        assert sent >= 0.9 * rate / 8 * 2 * 0.9  # the counters saw (about) what was sent
        cluster.set_bandwidth("50mbit")
        rate = _measure(cluster, 1, 0)
        assert 0.9 * 50e6 <= rate <= 1.1 * 50e6, rate
        sleeper = cluster.popen(1, ["sleep", "600"])
    assert sleeper.wait(timeout=10) != 0  # killed with its namespace
    assert _our_namespaces(cluster) == []


@pytest.mark.system
def test_cut_link_blocks_traffic():
    _require_cluster()
    with emulated_cluster.EmulatedCluster(2) as cluster:
        ping = ["ping", "-c", "1", "-W", "1", cluster.address(1)]
        if subprocess.run(["which", "ping"], capture_output=True).returncode != 0:
            ping = [sys.executable, "-c", f"import socket; socket.create_connection(('{cluster.address(1)}', 9), 1)"]
        cluster.set_link(1, up=False)
        assert cluster.run(0, ping, capture_output=True).returncode != 0


@pytest.mark.system
def test_the_dilated_bucket_and_tcp_minimum_rto_reach_the_kernel():
    _require_cluster()
    with emulated_cluster.EmulatedCluster(2, "200mbit", burst_ms=20.0) as cluster:
        shown = cluster.run(0, ["tc", "-j", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        tbf = next(q for q in json.loads(shown) if q["kind"] == "tbf")
        assert tbf["options"]["burst"] == 500_000, tbf  # 20 ms of 200 Mbit/s: 1 ms of GPU time at gpu_scale 0.05
        cluster.set_transport(4000.0)  # the kernel's 200 ms at gpu_scale 0.05
        for i in range(2):
            route = cluster.run(i, ["ip", "route", "show", f"{emulated_cluster.SUBNET}.0/24"], capture_output=True,
                                text=True).stdout
            assert re.search(r"rto_min (lock )?(4s|4000ms)", route), route
        cluster.set_transport(None)
        route = cluster.run(0, ["ip", "route", "show", f"{emulated_cluster.SUBNET}.0/24"], capture_output=True,
                            text=True).stdout
        assert "rto_min" not in route and "eth0" in route, route
        # The route still carries traffic: a connection to a closed port is refused by host 1, not unreachable.
        probe = (f"import socket\ntry:\n    socket.create_connection(('{cluster.address(1)}', 9), 2)\n"
                 "except ConnectionRefusedError:\n    print('refused')")
        assert cluster.run(0, [sys.executable, "-c", probe], capture_output=True, text=True).stdout == "refused\n"


@pytest.mark.system
def test_stale_namespaces_of_dead_processes_are_removed():
    _require_cluster()
    # A cluster created by a process that was SIGKILLed leaves namespaces behind; the next cluster removes them.
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import benchmarks.emulation.emulated_cluster as e; "
            "c = e.EmulatedCluster(2).start(); print(c.name, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, ROOT], stdout=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip()
    assert name.startswith(emulated_cluster.PREFIX)
    child.kill()
    child.wait()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name in listed
    removed = emulated_cluster.cleanup_stale()
    assert {f"{name}h0", f"{name}h1", f"{name}br"} <= set(removed)
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _toy(layers=5, fwd_flops=0.02):
    """A model whose layer k has one 10-element parameter and takes `fwd_flops` x batch "seconds"."""
    return {"model": "toy", "params": [{"name": f"p{k}", "shape": [10], "dtype": "float32"} for k in range(layers)],
            "layers": [{"name": f"l{k}", "params": [k], "fwd_flops": fwd_flops} for k in range(layers)]}


@pytest.mark.mxnet
def test_emulated_layers_take_their_profiled_time_and_run_backward_last_to_first():
    import mxnet as mx

    profile = emulated_compute.Profile("p100", 1 / (emulated_compute.GPU_PEAK_FLOPS["p100"] *
                                                    emulated_compute.EFFICIENCY))  # 1 FLOP = 1 s
    model = emulated_compute.EmulatedModel(_toy(), 1, profile)
    assert model.layers[0].forward_s == pytest.approx(0.02)
    assert model.layers[0].backward_s == pytest.approx(0.04)
    assert model.compute_seconds == pytest.approx(0.3)
    assert [model.priority(i) for i in range(5)] == [0, -1, -2, -3, -4]
    mx.nd.waitall()
    start = time.perf_counter()
    loss = model.forward()
    model.backward()
    loss.wait_to_read()
    forward_done = time.perf_counter() - start
    ready = []
    for k in reversed(range(5)):  # last layer's gradient first
        model.grads[k].wait_to_read()
        ready.append(time.perf_counter() - start)
    assert forward_done >= 0.1  # 5 layers x 20 ms, one after the other
    # Layer k's gradient is ready after the forward pass and the backward of layers 4..k (40 ms each).
    for i, t in enumerate(ready):
        assert t >= 0.1 + 0.04 * (i + 1) - 0.002, ready
    assert ready == sorted(ready)
    assert ready[-1] < 0.3 * 1.5, ready  # emulated compute costs time on the virtual device only
    # A parameter the kvstore writes holds back the next forward of its layer (the dependency P3 relies on).
    blocker = mx.nd.zeros((10,))
    engine_bridge = model._bridge
    engine_bridge.emulate_compute([], [model.weights[2].handle.value, blocker.handle.value], 0.2)
    start = time.perf_counter()
    model.forward().wait_to_read()
    assert time.perf_counter() - start >= 0.2
    mx.nd.waitall()


@pytest.mark.unit
def test_shape_files_have_a_profile_for_every_model():
    for model in cluster_bench.MODELS:
        description = emulated_compute.load_description(model)
        layers = emulated_compute.layers_of(description, 32, emulated_compute.Profile())
        covered = sorted(i for layer in layers for i in layer.params)
        assert covered == list(range(len(description["params"])))
        assert all(layer.forward_s > 0 for layer in layers[1:]) or model == "sockeye"


@pytest.mark.system
def test_link_overhead_probe_reads_what_the_token_bucket_charged(tmp_path):
    _require_cluster()
    from benchmarks.suites import link_overhead
    out = tmp_path / "results"
    assert link_overhead.main(["--mib", "16", "--repeats", "2", "--bandwidth", "1gbit", "--results-dir", str(out),
                               "--allow-dirty"]) == 0
    rows = list(csv.DictReader(open(out / "link_overhead.csv")))
    assert len(rows) == 2
    for row in rows:
        assert int(row["payload_bytes"]) == 16 << 20
        # tc meters every segment's TCP/IP/Ethernet headers (a GSO packet as its segments): the bound's first term.
        assert float(row["forward_per_payload"]) == pytest.approx(link_overhead.model_forward(), abs=0.005)
        assert 0 < float(row["acks_per_segment"]) <= 0.55  # ACKs only: at most one per two segments
    assert "pure ACKs per 1448-byte segment" in (out / "link_overhead.md").read_text()


@pytest.mark.unit
def test_the_bound_uses_the_measured_ack_rate():
    from benchmarks.emulation import wire_bound
    from benchmarks.suites import link_overhead
    rows = list(csv.DictReader(open(os.path.join(ROOT, "benchmarks", "results", "link_overhead.csv"))))
    assert rows, "run sudo .venv/bin/python -m benchmarks.suites.link_overhead"
    measured = sorted(link_overhead.acks_per_segment(int(r["payload_bytes"]), int(r["reverse_metered_bytes"]))
                      for r in rows)[len(rows) // 2]
    assert wire_bound.ACKS_PER_SEGMENT == pytest.approx(measured, rel=0.1)


@pytest.mark.unit
def test_comm_bound():
    # 4 hosts, 100 MB model, 1 Gbit: each link carries 2 x 3/4 x 100 MB each way = 1.2 s.
    assert cluster_bench.comm_bound_seconds(100_000_000, 4, 1e9) == pytest.approx(1.2)
    assert cluster_bench.comm_bound_seconds(100_000_000, 4, None) == 0.0


@pytest.mark.system
def test_runner_smoke_every_system_with_the_optimizer_on_two_hosts(tmp_path):
    """All four systems (and the fair priority-only ablation) train with SGD on 2 CPU-limited hosts: every run
    writes its row with the optimizer where the system runs it, its shuffled position, load and CPU, each host's
    CPU quota, CPU and throttled time, the links' drops, a fidelity verdict, and every rank's timed iterations.
    Horovod is optional: without it the runner says how to install it and runs the others."""
    _require_cluster()
    out = tmp_path / "cluster.csv"
    plot = tmp_path / "compare.png"
    systems = ["p3", "dist_sync", "mxnet-p3", "horovod", "p3-priority-split"]
    cmd = [sys.executable, "-m", "benchmarks.suites.cluster_bench", "--model", "resnet50",
           "--hosts", "2", "--bandwidth", "400mbit", "--gpu-scale", "0.2", "--kvstore", *systems, "--warmup", "1",
           "--iters", "2",
           "--repeats", "1", "--seed", "3", "--log-interval", "1", "--batch-size", "4", "--csv", str(out),
           "--plot", str(plot), "--timeout", "240", "--smoke", "--force", "--allow-dirty", "--untuned",
           "--link-queue-ms", "20"]
    runner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    output, _ = runner.communicate(timeout=600)
    assert runner.returncode == 0, output[-5000:]
    assert re.search(r"^\[host0\] .* iter 3: [\d.]+ images/s", output, re.MULTILINE)  # host 0's progress is live
    horovod_missing = cluster_bench.horovod_problem()
    if horovod_missing:
        assert "skipping horovod" in output and "make bench-setup" in output
        systems.remove("horovod")
    with out.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == cluster_bench.COLUMNS
        rows = list(reader)
    expected = [p.kvstore for p in cluster_bench.interleave(
        [cluster_bench.Point(model="resnet50_v1", kvstore=kv) for kv in cluster_bench.SYSTEMS + ("p3-priority-split",)],
        1, 3) if p.kvstore in systems]
    assert [r["kvstore"] for r in rows] == expected  # the seeded shuffled order, recorded
    assert len({r["run_id"] for r in rows}) == len(rows)
    with bench_rows.iterations_path(out).open() as f:
        iterations = list(csv.DictReader(f))
    for r in rows:
        # p3kv's and Horovod's jobs must end cleanly; MXNet's servers may hang at shutdown after the measurement.
        assert r["status"] == "ok" and (r["exit_code"] == "0" or r["kvstore"] in ("dist_sync", "mxnet-p3")), r
        assert r["hosts"] == "2" and r["bandwidth"] == "400mbit" and r["mxnet"] == "1.9.1"
        assert r["baseline_setting"] == "default (untuned)"
        assert r["optimizer"] == "sgd(lr=0.01,momentum=0.9,wd=0.0001,rescale_grad=1/2)", r
        assert r["update_on"] == ("workers" if r["kvstore"] in ("mxnet-p3", "horovod") else "servers")
        # The workers' update runs on their virtual GPUs, the servers' on their CPUs.
        assert r["update_placement"] == (f"workers (virtual GPU, 732 GB/s x {float(r['gpu_scale']):g})"
                                         if r["update_on"] == "workers" else "servers (CPU)"), r
        assert r["servers"] == ("0" if r["kvstore"] == "horovod" else "2")
        assert (r["smoke"], r["allow_dirty"], r["repeats"], r["seed"]) == ("True", "True", "1", "3")
        assert r["forced"] in ("True", "False") and float(r["load_1m_before"]) >= 0 and r["load_1m_after"]
        assert len(r["cpu_host_pct"].split(";")) == 2 and float(r["cpu_total_pct"]) > 0
        assert len(json.loads(r["iter_s"])) == 2
        # CPU-limited hosts (the default 4 CPUs x gpu_scale 0.2 each), accounted per host, with the run's verdict.
        assert (r["host_cpus"], r["cpu_quota_cores"]) == ("4.0", "0.8") and r["cpu_limit"].startswith("cgroup-v")
        assert len(r["host_cpu_s"].split(";")) == 2 and all(float(c) > 0 for c in r["host_cpu_s"].split(";"))
        assert len(r["host_throttled_pct"].split(";")) == 2 and float(r["timed_window_s"]) > 0
        assert len(r["qdisc_drops"].split(";")) == 2 and int(r["tcp_out_segs_total"]) > 0
        assert r["faithful"] in ("True", "False") and (r["faithful"] == "True" or r["fidelity_notes"]), r
        # The link monitor watched both directions of both links, and the links had the queue asked for.
        assert r["link_queue_ms"] == "20.0" and float(r["link_monitor_cpu_s"]) > 0
        assert len(r["link_starved_pct"].split(";")) == 2 and len(r["link_backlogged_pct"].split(";")) == 2
        assert "link: not measured" not in r["fidelity_notes"], r["fidelity_notes"]
        assert [len(times) for times in json.loads(r["rank_iter_s"])] == [2, 2]
        mine = [i for i in iterations if i["run_id"] == r["run_id"]]
        assert sorted((i["rank"], i["iteration"]) for i in mine) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
        assert float(r["throughput"]) > 0 and float(r["bound_throughput"]) > 0
        # Nothing beats the physical bound, which now counts frame and TCP/IP headers.
        assert float(r["throughput"]) <= 1.05 * float(r["bound_throughput"])
        assert int(r["wire_bytes"]) > int(r["model_bytes"])
        assert float(r["compute_s"]) == pytest.approx(float(rows[0]["compute_s"]))
    assert plot.stat().st_size > 10_000
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{emulated_cluster.PREFIX}{runner.pid}x" not in listed  # the runner removed its cluster
