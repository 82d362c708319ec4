"""The GPU benchmark (benchmarks/suites/gpu_bench.py) without a GPU: its torch networks have the shape files'
arrays in forward order, its worker reads a thread's CPU time, and its dry run (CPU tensors, p3kv through the
staging path's CPU double) runs every system to the end, p3kv's worker placement ending with DDP's weights."""

from __future__ import annotations

import csv
import json
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="p3kv.torch's benchmark needs torch (pip install '.[torch]')")

from benchmarks.emulation import emulated_compute  # noqa: E402
from benchmarks.suites import gpu_bench  # noqa: E402
from benchmarks.workloads import gpu_worker, torch_models  # noqa: E402


@pytest.mark.unit
@pytest.mark.parametrize("model", torch_models.MODELS)
def test_torch_networks_have_the_shape_files_arrays_in_forward_order(model):
    net = torch_models.build(model, "meta")
    expected = [tuple(p["shape"]) for p in emulated_compute.load_description(model)["params"]]
    assert [tuple(p.shape) for p in net.parameters()] == expected


@pytest.mark.unit
def test_forward_order_is_registration_order_on_a_small_image():
    """A forward pass reads the parameters in the order they are registered (the shape files' forward order)."""
    net = torch_models.build("resnet50_v1")
    seen: list[int] = []
    ids = {id(p): i for i, p in enumerate(net.parameters())}
    for module in net.modules():
        if not list(module.children()):
            module.register_forward_pre_hook(
                lambda m, _: seen.extend(ids[id(p)] for p in m.parameters(recurse=False)))
    net(torch.randn(2, 3, 32, 32))
    assert seen == sorted(seen) == list(range(len(ids)))


@pytest.mark.unit
def test_thread_cpu_seconds_of_a_named_thread():
    stop = threading.Event()

    def spin():
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        stop.wait()

    t = threading.Thread(target=spin, name="gpu-bench spinner")
    t.start()
    time.sleep(0.5)
    try:
        used = gpu_worker.thread_cpu_s("gpu-bench spinner")
        assert used is not None and 0.15 <= used <= 0.6
        assert gpu_worker.thread_cpu_s("no such thread") is None
    finally:
        stop.set()
        t.join()


@pytest.mark.integration
def test_dry_run_every_system_ends_and_p3kv_equals_ddp(tmp_path):
    rc = gpu_bench.main(["--device", "cpu", "--image-size", "32", "--batch-size", "2", "--warmup", "1", "--iters",
                         "2", "--repeats", "1", "--job-timeout", "150", "--out", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "gpu_bench.csv")))
    assert rc == 0, [r["detail"] for r in rows]
    assert sorted(r["system"] for r in rows) == sorted(gpu_bench.SYSTEMS)
    by = {r["system"]: r for r in rows}
    assert all(r["status"] == "ok" and float(r["images_per_s"]) > 0 for r in rows)
    assert all(len(json.loads(r["iter_s_by_rank"])) == gpu_bench.WORKERS for r in rows)
    # Same seed, shards and SGD: worker placement sums two terms (order-free) and steps torch's own SGD, as DDP.
    assert by["p3kv-worker"]["state_sha256"] == by["ddp"]["state_sha256"]
    assert by["local"]["state_sha256"] != by["ddp"]["state_sha256"]  # alone, each steps on its own gradient
    # The staging thread exists in p3kv's jobs only (the CPU double stands in for CUDA's side stream).
    assert by["p3kv-worker"]["staging_cpu_s_per_iter"] and not by["ddp"]["staging_cpu_s_per_iter"]
    summary = (tmp_path / "gpu_bench.md").read_text()
    assert "| p3kv-worker | 1 |" in summary and "ended with DDP's state bit for bit in every job" in summary
