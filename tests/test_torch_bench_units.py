"""The PyTorch benchmark's parts in one process: the virtual GPU's timeline, the emulated torch model (layer times,
backward order, gradients released when their layer ends, no copies), the worker-side update on the virtual GPU,
DDP's buckets in the loopback bench, the systems' place in the runner (roles, environment, torchrun, bound), the
sweep definition and its CI table."""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest
from torch_bench_jobs import TINY

from benchmarks.emulation import emulated_compute, wire_bound
from benchmarks.suites import baseline_settings, cluster_job, sweeps, torch_systems, tune

pytestmark = pytest.mark.unit
torch = pytest.importorskip("torch", reason="the PyTorch benchmark needs torch (pip install '.[torch]')")

from benchmarks.analysis import torch_comparison  # noqa: E402
from benchmarks.emulation import torch_compute  # noqa: E402
from benchmarks.workloads import allreduce_worker, torch_worker  # noqa: E402


class FakeClock:
    """time.monotonic and time.sleep of a host whose sleeps overshoot by `late` seconds."""

    def __init__(self, late: float = 0.0):
        self.now, self.late = 100.0, late

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late


def test_queued_work_runs_back_to_back_and_the_host_does_not_wait():
    clock = FakeClock()
    gpu = torch_compute.VirtualGpu(clock, clock.sleep)
    assert gpu.queue(1.0) == 101.0
    clock.now += 0.25  # the host issues the next while the device is busy
    assert gpu.queue(2.0) == 103.0 and clock.now == 100.25
    clock.now = 105.0  # the device idled 2 s (e.g. waiting for weights from the network)
    assert gpu.queue(1.0) == 106.0
    assert gpu.stats.idle_gaps == 1 and gpu.stats.idle_us == pytest.approx(2e6)


def test_chained_work_absorbs_the_hosts_lateness_and_waits_count_a_late_wake_up():
    clock = FakeClock(late=0.001)
    gpu = torch_compute.VirtualGpu(clock, clock.sleep)
    gpu.queue(1.0)
    gpu.wait()  # the host reads the forward's result
    assert clock.now == pytest.approx(101.001) and gpu.stats.host_late_max_us == pytest.approx(1000)
    assert gpu.stats.as_dict()["late_max_us"] == pytest.approx(1000)  # the host's lateness, not the device's
    assert gpu.stats.as_dict()["wake_late_max_us"] == 0.0  # a computed timeline has no timer to be late
    clock.now += 0.004  # the host was 5 ms late issuing the chained op: the device does not idle for it
    assert gpu.chain(0.5) == pytest.approx(101.5)
    assert gpu.stats.dispatch_absorbed_us == pytest.approx(5000) and gpu.stats.idle_gaps == 0
    gpu.reset_stats()
    assert gpu.stats.started == 0 and gpu.chain(0.5) == pytest.approx(102.0)  # still chained after a reset


def _profile(scale: float = 1.0) -> emulated_compute.Profile:
    return emulated_compute.Profile("p100", scale, emulated_compute.efficiency_of(TINY))


def test_the_emulated_net_takes_each_layers_time_and_releases_gradients_last_layer_first_when_they_end():
    clock = FakeClock()
    gpu = torch_compute.VirtualGpu(clock, clock.sleep)
    net = torch_compute.EmulatedNet(TINY, 4, _profile(1e-3), rank=0, gpu=gpu)
    layers = emulated_compute.layers_of(TINY, 4, _profile(1e-3))
    assert [p.shape for p in net.parameters()] == [torch.Size(p["shape"]) for p in TINY["params"]]
    assert net.compute_seconds == pytest.approx(sum(x.forward_s + x.backward_s for x in layers))
    released = []
    for name, p in net.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: released.append((name, clock.now)))
    start = clock.now
    loss = net(torch.zeros(1)).sum()
    assert clock.now == start  # forward is queued, as CUDA kernels are
    gpu.wait()
    forward_end = start + sum(x.forward_s for x in layers)
    assert clock.now == pytest.approx(forward_end)
    loss.backward()
    ends = {}
    t = forward_end
    for layer in reversed(layers):
        t += layer.backward_s
        ends[layer.name] = t
    assert sorted(name for name, _ in released) == sorted(name for name, _ in net.named_parameters())
    layer_order = [int(name.split(".")[1]) for name, _ in released]
    assert layer_order == sorted(layer_order, reverse=True)  # last layer first
    for name, when in released:
        assert when == pytest.approx(ends[name.split(".")[2].split("_")[0]])  # at its layer's end, not before
    # Timing mode: .grad is the fixed buffer itself (autograd took it without a copy), the weights untouched.
    for layer in net.layers:
        for w, g in zip(layer.weights(), layer._grads):
            assert w.grad.data_ptr() == g.data_ptr() and not w.detach().any()


def test_the_worker_side_update_takes_its_memory_traffic_on_the_virtual_gpu_and_computes_only_when_real():
    clock = FakeClock()
    gpu = torch_compute.VirtualGpu(clock, clock.sleep)
    net = torch_compute.EmulatedNet(TINY, 4, _profile(0.1), rank=1, gpu=gpu)
    settings = dict(lr=0.01, momentum=0.9, weight_decay=1e-4, foreach=False)
    optimizer = torch_compute.VirtualGpuSGD(net.parameters(), net, False, **settings)
    net(torch.zeros(1)).sum().backward()
    before = gpu.end
    optimizer.step()
    elements = sum(int(np.prod(p["shape"])) for p in TINY["params"])
    assert gpu.end - before == pytest.approx(5 * 4 * elements / (732e9 * 0.1))  # SGD momentum: 5 accesses
    assert not any(p.detach().any() for p in net.parameters())  # nothing computed
    real = torch_compute.EmulatedNet(TINY, 4, _profile(), rank=1, real=True)
    reference = [p.detach().clone().requires_grad_() for p in real.parameters()]
    real(torch.zeros(1)).sum().backward()
    for r, p in zip(reference, real.parameters()):
        r.grad = p.grad.clone()
    torch_compute.VirtualGpuSGD(real.parameters(), real, True, **settings).step()
    torch.optim.SGD(reference, **settings).step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(real.parameters(), reference))


class _ServerSync:
    """What copy_weights_on_the_virtual_gpu wraps of p3kv.torch's ServerSynchronizer: its spec and _apply, which
    copies each slot's received values (avg) into its parameter."""

    def __init__(self, slots):
        self.spec, self.slots, self.host_copies = {"kernel": "torch_sgd"}, slots, 0

    def _apply(self, slots):
        for slot in slots:
            slot.param.detach().copy_(slot.avg)
            slot.arrived = False
            self.host_copies += 1


def test_server_placements_weight_copy_takes_two_passes_on_the_virtual_gpu_and_copies_only_when_real():
    import types

    for real in (False, True):
        clock = FakeClock()
        gpu = torch_compute.VirtualGpu(clock, clock.sleep)
        net = torch_compute.EmulatedNet(TINY, 4, _profile(0.1), rank=0, gpu=gpu, real=real)
        slots = [types.SimpleNamespace(param=p, avg=torch.full_like(p, 0.5), arrived=True) for p in net.parameters()]
        sync = _ServerSync(slots)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        optimizer._p3kv_sync = sync
        per_iteration = torch_compute.copy_weights_on_the_virtual_gpu(optimizer, net, real)
        elements = sum(int(np.prod(p["shape"])) for p in TINY["params"])
        assert per_iteration == pytest.approx(2 * 4 * elements / (732e9 * 0.1))  # a read and a write of each
        before = [p.detach().clone() for p in net.parameters()]
        start = clock.now  # the device is idle: the first copy starts now
        sync._apply(slots[:1])  # the forward pre-hook of the first layer: its parameters' copy, queued
        sync._apply(slots[1:])
        assert gpu.end - start == pytest.approx(per_iteration) and gpu.stats.started == len(slots)
        assert clock.now == 100.0  # queued: the host does not wait for it
        assert not any(slot.arrived for slot in slots)
        if real:  # the copy made as before: the tests' final weights
            assert sync.host_copies == len(slots) and all(bool((p == 0.5).all()) for p in net.parameters())
        else:  # nothing copied on the host
            assert sync.host_copies == 0 and all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    worker_placement = torch.optim.SGD(net.parameters(), lr=0.01)
    worker_placement._p3kv_sync = types.SimpleNamespace(_apply=lambda slots: None)  # no spec: not server placement
    with pytest.raises(TypeError, match="placement='server'"):
        torch_compute.copy_weights_on_the_virtual_gpu(worker_placement, net, False)


def _rows_from_before(csv_path, **before) -> list:
    """The torch sweep's first round at ResNet-50 2 Gbps-equivalent written as ok rows, with the columns `before`
    (a change's column as older rows have it); returns the points."""
    from benchmarks.analysis import bench_rows

    args = sweeps.parse_args(["torch", "--models", "resnet50_v1", "--equivalents", "2"])
    points = [p for p in sweeps.sweep_points("torch", args) if p.repeat == 0]
    for p in points:
        settings = sweeps._settings(p)
        assert settings["gradient_work"] == "virtual GPU"  # every torch system's
        row = {k: v for k, v in settings.items() if k in bench_rows.RUN_COLUMNS}
        row.update(status="ok", smoke=False, baseline_setting=p.baseline_setting or "",
                   optimizer=sweeps.optimizer_label(p.optimizer), **before)
        bench_rows.write_run(csv_path, row)
    return points


def test_a_server_placement_row_whose_host_copied_the_weights_is_run_again_and_outdated(tmp_path):
    from benchmarks.analysis import bench_rows, superseded

    csv_path = tmp_path / "torch.csv"
    points = _rows_from_before(csv_path, weight_copy="")
    left = sweeps.not_yet_run(points, csv_path)
    assert [p.kvstore for p in left] == ["torch-p3kv-server"]  # its old row: the host copied; the others stand
    assert sweeps._settings(left[0])["weight_copy"] == "virtual GPU"
    old = next(r for r in bench_rows.read_runs(csv_path) if r["kvstore"] == "torch-p3kv-server")
    assert superseded.outdated_by({**old, "compute": "emulated"}) == "the weight copy on the virtual GPU"
    assert not superseded.outdated({**old, "compute": "emulated", "weight_copy": "virtual GPU"})
    bench_rows.write_run(csv_path, {**{k: v for k, v in old.items() if k in bench_rows.RUN_COLUMNS},
                                    "weight_copy": "virtual GPU"})
    assert sweeps.not_yet_run(points, csv_path) == []


def test_a_torch_row_whose_host_made_the_gradient_passes_is_run_again_and_outdated(tmp_path):
    from benchmarks.analysis import bench_rows, superseded

    csv_path = tmp_path / "torch.csv"
    points = _rows_from_before(csv_path, gradient_work="")
    assert sorted(p.kvstore for p in sweeps.not_yet_run(points, csv_path)) == sorted(torch_systems.SYSTEMS)
    for old in bench_rows.read_runs(csv_path):
        assert superseded.outdated_by({**old, "compute": "emulated"}) == "the gradient passes on the virtual GPU"
        assert not superseded.outdated({**old, "compute": "emulated", "gradient_work": "virtual GPU"})
    mxnet = sweeps._settings(sweeps.sweep_points("demo", sweeps.parse_args(["demo"]))[0])
    assert mxnet["gradient_work"] == ""  # the MXNet systems' rows have no such column to miss
    assert not superseded.outdated_by({"compute": "emulated", "kvstore": "p3", "priority_hold_ms": "1"})


def test_ddp_like_buckets_fill_last_layer_first_with_a_small_first_bucket():
    mib = 1 << 18  # float32 elements per MiB
    sizes = [mib // 2, 20 * mib, 10 * mib, mib // 4, mib // 2, 2 * mib]  # forward order
    # DDP's rule: an array joins the open bucket, which closes once it holds its limit (1 MiB first, then the cap).
    assert allreduce_worker.buckets(sizes, 25.0) == [[5], [4, 3, 2, 1], [0]]
    assert allreduce_worker.buckets(sizes, 100.0) == [[5], [4, 3, 2, 1, 0]]


def test_ddp_bucket_setting(monkeypatch):
    monkeypatch.delenv("DDP_BUCKET_CAP_MB", raising=False)
    assert torch_worker.bucket_cap_mb(None) is None and torch_worker.bucket_cap_mb(25.0) is None  # DDP's default
    assert torch_worker.bucket_cap_mb(5.0) == 5.0
    monkeypatch.setenv("DDP_BUCKET_CAP_MB", "100")
    assert torch_worker.bucket_cap_mb(None) == 100.0
    monkeypatch.setenv("DDP_BUCKET_CAP_MB", "many")
    with pytest.raises(SystemExit, match="DDP_BUCKET_CAP_MB"):
        torch_worker.bucket_cap_mb(None)
    cells = tune.grid("ddp")
    assert [dict(c.env)["DDP_BUCKET_CAP_MB"] for c in cells] == ["5", "25", "100"]
    assert [c.default for c in cells] == [False, True, False]
    assert tune.parse_cell("DDP_BUCKET_CAP_MB=50").system == "ddp"
    assert baseline_settings.DEFAULTS["ddp"] == {"DDP_BUCKET_CAP_MB": "25"}


def test_the_runner_runs_ddp_under_torchrun_without_servers_and_p3kv_torch_on_framework_free_servers():
    ddp = cluster_job.Point(model="resnet50_v1", kvstore="ddp", hosts=3)
    assert (ddp.workers, ddp.servers, ddp.roles(2)) == (3, 0, (1, 0))
    env = cluster_job._environment(ddp, cluster_job.KVSTORES["ddp"][1])
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and "P3_SECRET" not in env
    p3 = cluster_job.Point(model="resnet50_v1", kvstore="torch-p3kv-server", hosts=2)
    assert (p3.workers, p3.servers, p3.roles(0)) == (2, 2, (1, 1))
    assert torch_systems.LAUNCHER_FLAGS["torch-p3kv-server"] == ["--servers", "core"]
    worker = cluster_job._worker_argv(p3, "/tmp/x")
    assert worker[1:3] == ["-m", torch_systems.WORKER_MODULE] and worker[-4:] == ["--system", "p3kv", "--placement",
                                                                                 "server"]
    argv = torch_systems.torchrun_argv("python", 3, 1, "10.77.0.1", 9400, cluster_job._worker_argv(ddp, "/tmp/x"),
                                       "10.77.0.2")
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--master-addr") + 1] == "10.77.0.1"
    assert argv[argv.index("--local-addr") + 1] == "10.77.0.2"
    assert argv[argv.index("-m", 3) + 1] == torch_systems.WORKER_MODULE and argv[-2:] == ["--system", "ddp"]


def test_the_bound_counts_ddps_ring_over_its_buckets_and_p3kv_torchs_slices():
    sizes, nbytes = cluster_job.model_arrays("resnet50_v1")
    ddp = wire_bound.link_load("ddp", sizes, nbytes, 4)
    horovod = wire_bound.link_load("horovod", sizes, nbytes, 4)
    assert ddp.payload == horovod.payload == pytest.approx(1.5 * nbytes)
    assert ddp.messages == 2 * 3 * -(-nbytes // (25 << 20))
    for system in ("torch-p3kv", "torch-p3kv-server"):
        assert wire_bound.link_load(system, sizes, nbytes, 4) == wire_bound.link_load("p3", sizes, nbytes, 4)


def test_the_torch_sweep_has_both_models_at_three_rates_five_repeats_and_an_estimate():
    args = sweeps.parse_args(["torch"])
    points = sweeps.sweep_points("torch", args)
    assert {p.kvstore for p in points} == set(torch_systems.SYSTEMS)
    for model in ("resnet50_v1", "vgg19"):
        mine = [p for p in points if p.model == model]
        assert len({(p.bandwidth, p.gpu_scale) for p in mine}) >= 3
        assert {p.repeat for p in mine} == set(range(5)) and all(p.repeats == 5 for p in mine)
        assert all(p.tag == "torch" and p.optimizer == "sgd" for p in mine)
        assert {p.host_cpus for p in mine} == {8.0 if model == "vgg19" else 4.0}  # cluster_args.MODEL_HOST_CPUS
    # Interleaved: every repeat runs each comparison's three systems together, in a shuffled order.
    first = points[:3]
    assert {p.kvstore for p in first} == set(torch_systems.SYSTEMS) and len({p.group() for p in first}) == 1
    assert "torch" in sweeps.ALL
    seconds = sweeps.estimate_seconds(points, 1, (30.0, 1.15, "fixed"))
    assert seconds > len(points) * 30


def test_the_torch_sweep_runs_only_the_rates_and_systems_asked_for():
    args = sweeps.parse_args(["torch", "--models", "resnet50_v1", "--equivalents", "2",
                              "--kvstores", "torch-p3kv", "torch-p3kv-server"])
    points = sweeps.SWEEPS["torch"](args)
    assert {(p.model, p.kvstore) for p in points} == {("resnet50_v1", kv) for kv in ("torch-p3kv", "torch-p3kv-server")}
    assert {p.bandwidth for p in points} == {sweeps.link(2, points[0].gpu_scale)}


def _row(kvstore: str, seconds: float, repeat: int, rng) -> dict:
    times = rng.normal(seconds, 0.01 * seconds, size=(2, 20)).tolist()
    return {"kvstore": kvstore, "status": "ok", "faithful": "True", "smoke": "False", "model": "resnet50_v1",
            "hosts": "2", "bandwidth": "400mbit", "bandwidth_bps": "4e8", "gpu_scale": "0.2", "batch_size": "32",
            "efficiency_factor": "1.0", "host_cpus": "2.0", "tag": "torch", "workers": "2",
            "samples_per_batch": "32", "unit": "images", "rank_iter_s": json.dumps(times),
            "iter_s": json.dumps(times[0]), "repeat": str(repeat), "update_placement": "servers (CPU)",
            "legacy": "False", "optimizer": "sgd(lr=0.01)", "bound_throughput": "500", "cpu_total_pct": "50",
            "cpu_host_pct": "25;25", "load_1m_before": "0.1", "load_1m_after": "0.1", "layout": "colocated",
            "compute": "emulated", "slice_size": "", "gradient_work": "virtual GPU", "priority_hold_ms": "0.5",
            "thread_cap_cores": "0.2", "omp_threads": "2"}  # current: nothing outdated (superseded.outdated_by)


def test_the_table_gives_each_systems_rate_and_its_ratio_to_ddp_with_cis():
    rng = np.random.default_rng(0)
    rows = [_row(kv, s, r, rng) for r in range(5) for kv, s in (("ddp", 1.0), ("torch-p3kv", 0.5))]
    rows.append({**_row("torch-p3kv-server", 0.1, 0, rng), "faithful": "False"})  # left out
    text = torch_comparison.table(rows, resamples=500)
    lines = [line for line in text.splitlines() if line.startswith("| resnet50_v1")]
    assert len(lines) == 2 and "server placement" not in text
    ddp, p3kv = lines
    assert "| 2 | DDP (gloo) | 5 | " in ddp
    assert float(ddp.split("|")[6].split()[0]) == pytest.approx(320, rel=0.01)  # 64 images / 1 s / 0.2
    ratio = p3kv.split("|")[7].strip()
    value, ci = ratio.split(" ", 1)
    low, high = (float(x) for x in ci.strip("()").split("-"))
    assert float(value) == pytest.approx(2.0, rel=0.02) and low <= 2.0 <= high
    assert torch_comparison.table([{**rows[0], "kvstore": "p3"}]) == ""


def test_the_readme_lines_give_ddps_rate_each_placements_ratio_and_count_what_the_monitors_left_out():
    rng = np.random.default_rng(2)
    rows = [_row(kv, s, r, rng) for r in range(5) for kv, s in (("ddp", 1.0), ("torch-p3kv", 0.5))]
    rows += [{**_row("torch-p3kv-server", 0.4, r, rng), "faithful": "False", "throttled_max_pct": "14.2"}
             for r in range(2)]
    text = torch_comparison.headline(rows, resamples=500)
    line = next(x for x in text.splitlines() if x.startswith("| resnet50_v1"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert float(cells[2].split()[0]) == pytest.approx(320, rel=0.01)  # DDP: 64 images / 1 s / 0.2
    value, ci = cells[3].split(" ", 1)
    low, high = (float(x) for x in ci.strip("()").split("–"))
    assert float(value.rstrip("×")) == pytest.approx(2.0, rel=0.02) and low <= 2.0 <= high
    assert cells[4] == "no faithful run (2 left out: a host's CPU throttled up to 14% of the timed window)"
    assert cells[6] == "10 of 12"
    assert torch_comparison.headline([{**rows[0], "kvstore": "p3"}]) == ""
    # Runs from before a change to the emulation (here: their hosts made the gradient passes) are counted as such.
    older = [{**r, "gradient_work": ""} if r["kvstore"] == "ddp" else r for r in rows]
    line = next(x for x in torch_comparison.headline(older, resamples=200).splitlines() if x.startswith("| resnet"))
    assert line.split("|")[-2].strip() == "10 of 12; 5 from before the gradient passes on the virtual GPU"


def test_ddps_setting_cell_names_runs_from_before_its_grid_only_where_the_grid_kept_their_setting():
    tuned = "default (tuned: DDP_BUCKET_CAP_MB=25)"
    before, after = {"baseline_setting": "default (untuned)"}, {"baseline_setting": tuned}
    assert torch_comparison.setting_cell([before, before, before, after, after]) == \
        f"{tuned}; 3 of 5 runs ran it before the grid"
    assert torch_comparison.setting_cell([after, after]) == tuned
    assert torch_comparison.setting_cell([before, {}]) == "default, default (untuned)"  # no grid ran yet
    moved = {"baseline_setting": "DDP_BUCKET_CAP_MB=5 (tuned)"}  # the grid chose another setting: both stay named
    assert torch_comparison.setting_cell([before, moved]) == "DDP_BUCKET_CAP_MB=5 (tuned), default (untuned)"
    assert torch_comparison.setting_cell([]) == "-"


def test_ddps_setting_cell_takes_the_grids_choice_where_every_run_predates_the_grid(tmp_path):
    before = {"baseline_setting": "default (untuned)"}
    kept, moved = "default (tuned: DDP_BUCKET_CAP_MB=25)", "DDP_BUCKET_CAP_MB=5 (tuned)"
    # The grid kept the setting all runs ran before it: its label, and that every run predates it.
    assert torch_comparison.setting_cell([before] * 5, kept) == f"{kept}; 5 of 5 runs ran it before the grid"
    # It chose another: the runs' own label stays, and the cell names what the sweep has not run yet.
    assert torch_comparison.setting_cell([before] * 2, moved) == \
        f"default (untuned); the grid has since chosen {moved}"
    assert torch_comparison.setting_cell([{"baseline_setting": moved}], moved) == moved
    # The grid's point is read from its CSV's newest DDP row and matched to the sweep's rows less the tag.
    point = {"model": "vgg19", "hosts": "4", "bandwidth": "250mbit", "gpu_scale": "0.05", "batch_size": "32",
             "efficiency_factor": "1.0", "host_cpus": "8.0"}
    ran = {"kvstore": "ddp", "tag": "tune", "status": "ok", "optimizer": "sgd"}
    grid = [{**point, **ran, "timestamp": "2026-12-07T22:00:00+0000"},  # an older grid run at older conditions:
            {**point, **ran, "host_cpus": "", "timestamp": "2026-11-01T00:00:00+0000"}]  # not the grid's point
    with open(tmp_path / "grid.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*point, *ran, "timestamp"])
        writer.writeheader()
        writer.writerows(grid)
    best = {"vgg19.250mbit.4h.x0.05.emulated": {"ddp": {"csv": "grid.csv", "label": kept}},
            "smoke": {"ddp": {"csv": "grid.csv", "label": moved, "smoke": True}},
            "gone": {"ddp": {"csv": "missing.csv", "label": moved}}, "p3kv": {"p3": {"csv": "grid.csv"}}}
    chosen = torch_comparison.grid_choices(best, tmp_path)
    assert chosen == {torch_comparison._grid_key({**point, "tag": "torch"}): kept}


def test_ddps_tuning_grid_becomes_a_sentence_with_each_cell_against_the_chosen_one():
    entry = {"throughput": 40.0, "repeats": 3, "csv": "grid.csv", "label": "default (tuned: DDP_BUCKET_CAP_MB=25)",
             "reason": "the default is the fastest cell", "comparison": "resnet50_v1.4000mbit-p100.4h.emulated",
             "cells": {"DDP_BUCKET_CAP_MB=5": {"throughput": 38.0}, "DDP_BUCKET_CAP_MB=25 (default)":
                       {"throughput": 40.0}}}
    (sentence,) = torch_comparison.tuning_sentences({"k": {"ddp": entry, "p3": {}}, "s": {"ddp": {"smoke": True}}})
    assert "DDP_BUCKET_CAP_MB=5 5.0% slower" in sentence and "3 repeats per cell" in sentence
    assert sentence.startswith("DDP's tuning grid at resnet50_v1.4000mbit-p100.4h.emulated")


def test_the_torch_sweeps_figure_draws_each_model_against_the_rate(tmp_path):
    rng = np.random.default_rng(1)
    rows = [{**_row(kv, s * rate_s, r, rng), "model": model, "bandwidth": f"{rate}mbit",
             "bandwidth_bps": str(rate * 1e6)}
            for model in ("resnet50_v1", "vgg19") for rate, rate_s in ((400, 1.0), (800, 0.6), (2000, 0.4))
            for r in range(2) for kv, s in (("ddp", 1.0), ("torch-p3kv", 0.8), ("torch-p3kv-server", 0.9))]
    path = tmp_path / "fig_torch.png"
    sweeps.plot("torch", rows, path, include_smoke=True)
    assert path.stat().st_size > 10_000


def test_worker_arguments_refuse_what_the_torch_systems_do_not_run():
    for bad in (["--compute", "real"], ["--optimizer", "none"]):
        with pytest.raises(SystemExit):
            torch_worker.parse_args(["--model", "resnet50_v1", "--out", "/tmp/x", *bad])
    args = torch_worker.parse_args(["--model", "resnet50_v1", "--out", "/tmp/x"])
    assert isinstance(args, argparse.Namespace) and args.system == "p3kv" and args.placement == "worker"


def test_the_weights_checksum_is_the_float64_sum_without_a_float64_copy(monkeypatch):
    # VGG-19's weights as float64 copies were 1.1 GB page-faulted in under the per-thread cap: over a minute of
    # every job after its last iteration. The checksum accumulates in float64 all the same, for every dtype.
    state = {"w": torch.linspace(-1.0, 3.0, 100_002, dtype=torch.float32).reshape(6, -1)[:, ::2],  # non-contiguous
             "b": torch.tensor([1e8, 1.0, -1e8, 0.5], dtype=torch.float32),  # float32 accumulation loses the 1.5
             "h": torch.tensor([0.25, 1.5], dtype=torch.bfloat16), "n": torch.tensor(7, dtype=torch.int64)}
    expected = sum(float(t.double().sum()) for t in state.values())
    doubles = []
    monkeypatch.setattr(torch.Tensor, "double", lambda t: doubles.append(t.shape) or t.to(torch.float64))
    assert torch_worker.checksum_of(state) == pytest.approx(expected, rel=1e-12)
    assert torch_worker.checksum_of({"b": state["b"]}) == 1.5
    assert doubles == []  # no float64 copy of any tensor
