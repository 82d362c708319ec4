"""The frameworks' gradient work on the virtual GPU (benchmarks/emulation/gradient_work.py): which writes it takes
over and at how many passes, that the host computes nothing in timing mode and waits for the device, that `real`
still computes, and that DDP's reducer's bucket copies are what it sees."""

from __future__ import annotations

import datetime
import socket

import pytest
from torch_bench_jobs import TINY

from benchmarks.emulation import emulated_compute

pytestmark = pytest.mark.unit
torch = pytest.importorskip("torch", reason="the PyTorch benchmark needs torch (pip install '.[torch]')")

from benchmarks.emulation import gradient_work, torch_compute  # noqa: E402

BANDWIDTH = 1e9  # bytes/s of the fake GPU below


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _mode(real: bool):
    clock = FakeClock()
    gpu = torch_compute.VirtualGpu(clock, clock.sleep)
    return clock, gpu, gradient_work.GradientWorkOnTheVirtualGpu(
        gpu, lambda n, size, accesses: accesses * n * size / BANDWIDTH, real)


@pytest.mark.parametrize("real", [False, True])
def test_each_write_takes_its_passes_on_the_virtual_gpu_and_the_host_waits_for_it(real):
    clock, gpu, mode = _mode(real)
    grad, out = torch.full((1000,), 2.0), torch.zeros(1000)
    ops = [  # (the op, its passes over the output's 4000 bytes)
        (lambda: torch.mul(grad, 0.5, out=out), 2),  # DDP's copy into its bucket, p3kv.torch's into its send buffer
        (lambda: grad.copy_(out), 2),  # DDP's copy back into the gradient
        (lambda: out.add_(grad), 3),
        (lambda: out.div_(4), 2),
        (lambda: out.zero_(), 1),
    ]
    for op, passes in ops:
        before = (grad.clone(), out.clone())
        start = clock.now
        with mode:
            op()
        assert clock.now - start == pytest.approx(passes * 4000 / BANDWIDTH)  # waited until the device finished
        assert gpu.end == pytest.approx(clock.now)
        if not real:  # timing mode: the host wrote nothing
            assert torch.equal(grad, before[0]) and torch.equal(out, before[1])
    assert mode.stats.ops == len(ops) and mode.stats.bytes == sum(p for _, p in ops) * 4000
    if real:  # the writes happened, in order: 2*0.5 -> copied back -> +1 -> /4 -> 0
        assert float(grad[0]) == 1.0 and float(out[0]) == 0.0


def test_scaling_a_gradient_chains_behind_the_device_and_copying_a_result_in_waits_for_the_host():
    clock, gpu, mode = _mode(False)
    grad, out = torch.full((1000,), 2.0), torch.zeros(1000)
    gpu.queue(1.0)  # a backward layer the host waited for
    gpu.wait()
    clock.now += 0.5  # the host is late issuing what follows (its hooks' Python, a capped thread)
    with mode:
        torch.mul(grad, 0.5, out=out)  # reads the gradient the device produced: behind it, the lateness absorbed
    assert gpu.end == pytest.approx(101.0 + 8000 / BANDWIDTH) and clock.now == pytest.approx(101.5)
    assert gpu.stats.dispatch_absorbed_us == pytest.approx(0.5e6)
    with mode:
        grad.copy_(out)  # DDP's reduced bucket back into the gradient: its input came off the wire, now
    assert gpu.end == pytest.approx(101.5 + 8000 / BANDWIDTH) and clock.now == pytest.approx(gpu.end)


def test_reads_out_of_place_ops_and_bookkeeping_are_left_to_the_host():
    clock, gpu, mode = _mode(False)
    a, used = torch.ones(1000), torch.zeros(10, dtype=torch.int32)
    with mode:
        b = a * 3 + 1  # the emulated layers' real-mode gradients are out of place
        used.fill_(1)  # an integer map (DDP's unused-parameter bookkeeping)
        total = float(a.sum())
    assert float(b[0]) == 4.0 and int(used[0]) == 1 and total == 1000.0
    assert mode.stats.ops == 0 and gpu.stats.started == 0 and clock.now == 100.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddps_bucket_copies_run_on_the_virtual_gpu_and_not_on_the_host():
    """A one-rank DDP over gloo (its reducer runs as with more ranks): per backward, the copy of every gradient into
    its bucket (scaled by 1/W) and back, 2 passes each, and nothing else; in timing mode the gradients keep their
    fixed values (nothing was copied back)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        clock, gpu, mode = _mode(False)
        net = torch_compute.EmulatedNet(TINY, 4, emulated_compute.Profile("p100", 1.0, 0.5), 0, gpu=gpu)
        model = torch.nn.parallel.DistributedDataParallel(net)
        token = torch.zeros(1)
        nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
        for iteration in range(3):
            mode.reset_stats()
            with mode:
                model(token).sum().backward()
            assert mode.stats.bytes == 4 * nbytes, iteration  # in: read the gradient, write the bucket; out: back
            assert mode.stats.seconds == pytest.approx(4 * nbytes / BANDWIDTH)
            fixed = [g for layer in net.layers for g in layer._grads]
            assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), fixed))
            net.zero_grad()
    finally:
        dist.destroy_process_group()
