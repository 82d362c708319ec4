"""The virtual GPU of the emulated cluster: the cost of a worker's update (its memory traffic at the GPU's
bandwidth, dilated like compute), where each system's update runs (the rows' update_placement), the update as an
operation on the virtual GPU that the next forward waits for, with no update on the host's CPU, and the device's
own accounting of the gaps its dispatch slack forgave (the C++ side: cpp/tests/device_clock_tests.cc)."""

import argparse
import time

import pytest

from benchmarks.emulation import emulated_compute
from benchmarks.workloads import cluster_worker

P100_BYTES = 732e9  # NVIDIA Tesla P100 datasheet: HBM2 at 732 GB/s


@pytest.mark.unit
def test_update_cost_is_its_memory_traffic_at_the_gpu_bandwidth_dilated_by_scale():
    # SGD with momentum and wd on float32: read weight, grad, momentum; write weight, momentum = 20 bytes each.
    assert emulated_compute.SGD_MOMENTUM_ACCESSES * 4 == 20
    assert emulated_compute.GPU_MEMORY_BANDWIDTH["p100"] == P100_BYTES
    full = emulated_compute.Profile("p100", 1.0)
    assert full.memory_seconds(1_000_000, 4) == pytest.approx(20e6 / P100_BYTES)
    # Dilation slows memory as it slows FLOPs: a fifth of the speed, five times the time.
    assert emulated_compute.Profile("p100", 0.2).memory_seconds(1_000_000, 4) == pytest.approx(5 * 20e6 / P100_BYTES)
    assert full.memory_seconds(1_000_000, 2) == pytest.approx(10e6 / P100_BYTES)  # float16: half the bytes
    assert full.memory_seconds(1_000_000, 4, emulated_compute.COPY_ACCESSES) == pytest.approx(8e6 / P100_BYTES)
    assert emulated_compute.Profile("p100", float("inf")).memory_seconds(10**9, 4) == 0  # --compute none
    assert set(emulated_compute.GPU_MEMORY_BANDWIDTH) == set(emulated_compute.GPU_PEAK_FLOPS)
    # ResNet-50's 25.6M parameters: about 0.7 ms per iteration on a P100, a few ms as the issue expects.
    description = emulated_compute.load_description("resnet50_v1")
    elements = sum(_elements(p["shape"]) for p in description["params"])
    assert 25e6 < elements < 26e6
    assert 0.6e-3 < full.memory_seconds(elements, 4) < 0.8e-3


def _elements(shape):
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.mark.unit
def test_rows_say_where_each_system_updates():
    profile = emulated_compute.Profile("p100", 0.2)
    placement = cluster_worker.update_placement
    assert placement("sgd", "p3kv", "emulated", profile) == "servers (CPU)"
    assert placement("sgd", "dist_sync", "real") == "servers (CPU)"
    assert placement("sgd", "mxnet-p3", "emulated", profile) == "workers (virtual GPU, 732 GB/s x 0.2)"
    assert placement("sgd", "horovod", "emulated", profile) == "workers (virtual GPU, 732 GB/s x 0.2)"
    assert placement("sgd", "horovod", "real") == "workers (CPU)"
    assert placement("sgd", "mxnet-p3", "real", device="GPU") == "workers (GPU)"  # device_worker.py on a GPU
    assert placement("none", "mxnet-p3", "emulated", profile) == "none"


@pytest.mark.unit
def test_device_fields_are_per_timed_iteration():
    stats = {"slack_us": 50.0, "forgiven_us": 900.0, "forgiven_gaps": 30, "idle_us": 3000.0, "idle_gaps": 3,
             "started": 99, "completed": 99, "late_max_us": 12.34, "dispatch_absorbed_us": 600.0,
             "dispatch_max_us": 80.0, "wake_late_max_us": 5.0, "wake_late_total_us": 12.0,
             "callback_max_us": 9.0}
    fields = cluster_worker.device_fields(stats, 3)
    assert fields == {"vgpu_slack_us": 50.0, "vgpu_forgiven_us_per_iter": 300.0, "vgpu_forgiven_gaps_per_iter": 10.0,
                      "vgpu_idle_us_per_iter": 1000.0, "vgpu_dispatch_absorbed_us_per_iter": 200.0,
                      "vgpu_dispatch_max_us": 80.0, "vgpu_late_max_us": 5.0, "vgpu_late_us_per_iter": 4.0,
                      "vgpu_completion_late_max_us": 12.3,
                      "vgpu_callback_max_us": 9.0}
    assert set(cluster_worker.device_fields(None, 3).values()) == {None}  # real compute: no virtual GPU


LAYERS = 3
ELEMENTS = 1_000_000  # float32 per layer: a 0.1 s update at SCALE
SCALE = emulated_compute.SGD_MOMENTUM_ACCESSES * 4 * ELEMENTS / (P100_BYTES * 0.1)
FORWARD_S = 0.01


def _toy():
    flops = FORWARD_S * emulated_compute.GPU_PEAK_FLOPS["p100"] * emulated_compute.EFFICIENCY * SCALE
    return {"model": "toy", "params": [{"name": f"w{k}", "shape": [ELEMENTS], "dtype": "float32"}
                                       for k in range(LAYERS)],
            "layers": [{"name": f"l{k}", "params": [k], "fwd_flops": flops} for k in range(LAYERS)]}


def _training(mode, optimizer="sgd", slack_us=None):
    import mxnet as mx

    args = argparse.Namespace(model="toy", split_big_arrays=0, compute="emulated", gpu="p100", gpu_scale=SCALE,
                              efficiency_factor=1.0, batch_size=1, optimizer=optimizer, vgpu_slack_us=slack_us)
    return cluster_worker.EmulatedTraining(args, mode, description=_toy(), kvstore=mx.kv.create("local"))


@pytest.mark.mxnet
def test_a_worker_side_update_runs_on_the_virtual_gpu_and_the_next_forward_waits_for_it():
    import mxnet as mx

    training = _training("mxnet-p3")
    model = training.model
    assert training.update_placement.startswith("workers (virtual GPU, 732 GB/s x ")
    assert training.update_s == pytest.approx(LAYERS * 0.1)
    assert model.compute_seconds == pytest.approx(LAYERS * 3 * FORWARD_S)
    for weight in model.weights:
        weight[:] = 1.0
    training.step()
    mx.nd.waitall()
    model.device_stats(reset=True)
    training.step().wait_to_read()
    start = time.perf_counter()
    training.step().wait_to_read()
    iteration = time.perf_counter() - start
    mx.nd.waitall()
    # One serial device: between two forward completions it runs the backward, every update, then the forward
    # (0.39 s; without the updates 0.09 s; the margin is this process's own wake-up latency at the start).
    assert iteration >= model.compute_seconds + training.update_s - 0.02, iteration
    stats = model.device_stats()
    assert stats["started"] == stats["completed"] == 2 * (2 * LAYERS + LAYERS)  # forward, backward, one update each
    # No update ran on the host: MXNet's SGD (lr 0.01, wd 1e-4) would have moved every weight off 1.0.
    assert all((w.asnumpy() == 1.0).all() for w in model.weights)


@pytest.mark.mxnet
def test_servers_updates_and_no_optimizer_put_nothing_on_the_virtual_gpu():
    import mxnet as mx

    training = _training("mxnet-p3", optimizer="none", slack_us=20)
    assert training.update_placement == "none" and training.update_s == 0
    training.step()
    mx.nd.waitall()
    training.model.device_stats(reset=True)
    training.step().wait_to_read()
    mx.nd.waitall()
    stats = training.model.device_stats()
    assert stats["started"] == 2 * LAYERS and stats["slack_us"] == pytest.approx(20)
    # The layers follow one another through the engine: each one's gap is either forgiven or idle, and counted.
    assert stats["forgiven_gaps"] + stats["idle_gaps"] <= stats["started"]
    assert stats["forgiven_us"] <= 20 * stats["forgiven_gaps"] and stats["late_max_us"] >= 0
    from p3kv.core.errors import ConfigError

    with pytest.raises(ConfigError, match="set its slack before the first emulate_compute"):
        training.model._bridge.set_emulation_slack(30)


@pytest.mark.mxnet
def test_an_input_from_off_the_device_costs_only_its_lateness():
    """A forward layer waits for weights the kvstore writes: if they arrive while the virtual GPU is busy, it starts
    right after that work (no idle time, whatever the engine's dispatch latency); if they arrive late, the device
    idles exactly until they do. A second virtual device stands for the network that writes them."""
    import mxnet as mx

    from p3kv import _p3

    model = emulated_compute.EmulatedModel(_toy(), 1, emulated_compute.Profile("p100", SCALE))
    network = _p3.EngineBridge.load(mx.libinfo.find_lib_path()[0])
    model.forward().wait_to_read()  # the device has run: its next arrival after an idle spell is a counted gap

    def forward_after(network_s, busy_s):
        blocker = mx.nd.zeros((1,))
        mx.nd.waitall()
        model.device_stats(reset=True)
        network.emulate_compute([], [model.weights[0].handle.value], network_s)  # the pull into layer 0
        model._bridge.emulate_compute([], [blocker.handle.value], busy_s)  # the device busy meanwhile
        model.forward().wait_to_read()
        return model.device_stats()

    early = forward_after(0.05, 0.2)
    # One idle gap at most: the busy work's own arrival on the idle device; the forward waited for nothing.
    assert early["idle_gaps"] <= 1 and early["started"] == 1 + LAYERS, early
    late = forward_after(0.3, 0.1)
    assert late["idle_gaps"] >= 1 and late["idle_us"] >= (0.3 - 0.1) * 1e6 - 2000, late
    assert early["forgiven_gaps"] == late["forgiven_gaps"] == 0  # chained: nothing is forgiven by a slack


@pytest.mark.mxnet
def test_a_mxnet_p3_job_updates_on_the_virtual_gpu_and_its_result_says_so(tmp_path):
    """A real MXNet-P3 job (1 worker, 1 server, loopback): the worker's result places the update on the virtual
    GPU, its iterations include the update's device time, and it carries the virtual GPU's monitors."""
    import json
    import secrets

    from harness import launcher_env, run_job

    out = tmp_path / "job"
    env = {**launcher_env(), "P3_SECRET": secrets.token_hex(32), "OMP_NUM_THREADS": "1",
           "MXNET_CPU_WORKER_NTHREADS": "1"}
    # Scale 0.02: 0.26 s of compute and 35 ms of update per iteration at batch 1.
    job = run_job(1, 1, ["-m", "benchmarks.workloads.cluster_worker", "--model", "resnet50_v1", "--batch-size", "1",
                         "--warmup", "1", "--iters", "2", "--gpu-scale", "0.02", "--out", str(out)],
                  env=env, launcher_args=["--kvstore", "mxnet-p3"], timeout=240)
    results = list(tmp_path.glob("job.rank*.json"))
    assert len(results) == 1, job.stdout[-3000:]
    result = json.loads(results[0].read_text())
    assert result["mode"] == "mxnet-p3" and result["update_on"] == "workers"
    assert result["update_placement"] == "workers (virtual GPU, 732 GB/s x 0.02)"
    elements = sum(_elements(p["shape"]) for p in emulated_compute.load_description("resnet50_v1")["params"])
    assert result["update_s"] == pytest.approx(elements * 20 / (P100_BYTES * 0.02))
    # One serial device: each iteration holds the backward, every update and the forward.
    assert min(result["iter_s"]) >= result["compute_s"] + result["update_s"] - 0.02, result["iter_s"]
    assert result["vgpu_forgiven_us_per_iter"] == 0 and result["vgpu_slack_us"] == 50
    assert result["vgpu_late_max_us"] >= 0 and result["vgpu_dispatch_absorbed_us_per_iter"] >= 0


@pytest.mark.mxnet
def test_the_timer_thread_runs_as_a_gpu_real_time_where_allowed():
    import os

    model = emulated_compute.EmulatedModel(_toy(), 1, emulated_compute.Profile("p100", SCALE))
    tid = model.timer_tid
    assert tid > 0 and os.path.isdir(f"/proc/self/task/{tid}")  # a thread of this process
    said = emulated_compute.run_timer_as_gpu(tid)
    # It says what it did: real-time exactly when the kernel agreed (root here; EPERM named otherwise).
    assert said.startswith("real-time") == (os.sched_getscheduler(tid) == os.SCHED_FIFO), said
    assert said.startswith("real-time") or "not real-time (" in said
