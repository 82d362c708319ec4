"""The GPU path's staging (p3kv.torch.cuda_staging) without a GPU: which path a model takes and what is refused,
the ordering of copies, pushes and waits through the CPU double of the side stream (p3kv.torch.stream_double), and
whole jobs through the double that end with DDP's weights bit for bit (the double changes the order of events,
never the arithmetic). Nothing here needs CUDA; tests/gpu/ runs the real thing on a lent GPU."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from torch_jobs import ddp_job, p3kv_job

from p3kv.core.errors import ConfigError, P3Error, P3TimeoutError

torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")
from p3kv.torch import cuda_staging  # noqa: E402
from p3kv.torch.stream_double import HostDouble  # noqa: E402

WAIT_S = 20.0  # bound of every wait below (never reached when the code works)


class FakeWorker:
    """The part of P3Worker the staging uses. A push completes when `complete_after` pushes have been made (all
    of them at once, inside the push that reaches the count: the staging thread then sees them together); the
    result written into `out` is the gradient times 10."""

    def __init__(self, complete_after: int = 1, fail: str = ""):
        self.complete_after, self.fail = complete_after, fail
        self.pushes: list[tuple[str, np.ndarray, int]] = []
        self._outs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def init(self, key, value, out, wire_dtype):
        out[...] = value

    def push(self, key, grad, out, priority):
        with self._lock:
            self.pushes.append((key, grad.copy(), priority))
            self._outs[key] = (grad.copy(), out)
            if len(self.pushes) % self.complete_after == 0:
                for k, (g, o) in self._outs.items():
                    o[...] = g * 10
                    self._done.add(k)
                self._outs.clear()

    def completed(self, key):
        with self._lock:
            return key in self._done

    def wait(self, key=None, timeout=None):
        with self._lock:
            self._done.discard(key)
        if self.fail == key:
            raise P3Error(f"server 1 rejected {key}")


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


@pytest.mark.unit
def test_a_cpu_model_takes_the_direct_path_and_the_double_only_when_asked():
    model = torch.nn.Linear(3, 2)
    assert cuda_staging.model_device(model) == torch.device("cpu")
    assert cuda_staging.select(torch.device("cpu"), FakeWorker(), 1.0) is None  # today's CPU path, unchanged
    cuda_staging.use_host_double()
    try:
        staging = cuda_staging.select(torch.device("cpu"), FakeWorker(), 1.0)
        assert isinstance(staging.streams, HostDouble)
    finally:
        cuda_staging.use_host_double(False)


@pytest.mark.unit
def test_a_model_on_several_devices_or_on_another_kind_of_device_is_refused_naming_them():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model[1].to("meta")
    with pytest.raises(ConfigError, match=r"several devices \(cpu: 0.weight, 0.bias; meta: 1.weight, 1.bias, "
                                          r"1.running_mean \.\.\.\).*one device"):
        cuda_staging.model_device(model)
    with pytest.raises(ConfigError, match=r"on meta; p3kv.torch runs on CPU tensors or on one CUDA device"):
        cuda_staging.model_device(torch.nn.Linear(3, 2, device="meta"))
    frozen = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2, device="meta"))
    frozen[1].requires_grad_(False)
    assert cuda_staging.model_device(frozen) == torch.device("cpu")  # frozen parameters are never sent


@pytest.mark.unit
def test_a_push_returns_before_any_copy_and_sends_the_gradient_as_it_was_when_pushed():
    gate = threading.Event()
    worker, streams = FakeWorker(), HostDouble(gate)
    staging = cuda_staging.Staging(worker, streams, WAIT_S)
    grad = torch.arange(6, dtype=torch.float32)
    sk = staging.register("param:w", grad)
    staging.push(sk, grad, 0.5, priority=-3)
    # The side stream has not run (gate closed): nothing was pushed, and the hook returned all the same.
    assert worker.pushes == [] and not sk.ready.is_set()
    grad.add_(100)  # the next backward accumulating into .grad: the push already took its snapshot
    gate.set()
    _until(sk.ready.is_set, "the result did not land")
    staging.wait(sk)
    [(key, sent, priority)] = worker.pushes
    assert key == "param:w" and priority == -3
    np.testing.assert_array_equal(sent, np.arange(6, dtype=np.float32) * 0.5)
    assert torch.equal(sk.recv_dev, torch.arange(6, dtype=torch.float32) * 5)  # result = sent * 10
    # Copy to the host, push, copy to the device, and only then the current stream's wait.
    assert streams.log == ["to host param:w", "to device param:w", "current waited"]


@pytest.mark.unit
def test_results_are_copied_to_the_device_most_urgent_first():
    gate = threading.Event()
    worker, streams = FakeWorker(complete_after=3), HostDouble(gate)
    staging = cuda_staging.Staging(worker, streams, WAIT_S)
    keys = {p: staging.register(f"param:l{-p}", torch.ones(4)) for p in (-2, -1, 0)}
    for priority in (-2, -1, 0):  # backward order: the last layer's gradient is final first
        staging.push(keys[priority], torch.full((4,), float(priority)), None, priority)
    gate.set()
    for sk in keys.values():
        _until(sk.ready.is_set, f"{sk.key} did not land")
        staging.wait(sk)
    assert [k for k, _, _ in worker.pushes] == ["param:l2", "param:l1", "param:l0"]  # sent as they were final
    landed = [line for line in streams.log if line.startswith("to device")]
    assert landed == ["to device param:l0", "to device param:l1", "to device param:l2"]
    for priority, sk in keys.items():
        assert torch.equal(sk.recv_dev, torch.full((4,), priority * 10.0))


@pytest.mark.unit
def test_zeros_and_plain_copies_and_init():
    worker, streams = FakeWorker(), HostDouble()
    staging = cuda_staging.Staging(worker, streams, WAIT_S)
    value = torch.tensor([1.5, -2.0])
    sk = staging.register("buffer:b", value)
    staging.init(sk, value, "float32")
    staging.finish_init()
    assert torch.equal(value, torch.tensor([1.5, -2.0]))
    staging.push(sk, None, None, 0)  # a worker other than 0 broadcasting a buffer pushes zeros
    staging.wait(sk)
    np.testing.assert_array_equal(worker.pushes[-1][1], [0.0, 0.0])
    staging.push(sk, value, None, 0)
    staging.wait(sk)
    np.testing.assert_array_equal(worker.pushes[-1][1], [1.5, -2.0])


@pytest.mark.unit
def test_a_failed_push_raises_its_error_in_the_waiting_thread_and_a_missing_one_times_out():
    worker = FakeWorker(fail="param:bad")
    staging = cuda_staging.Staging(worker, HostDouble(), WAIT_S)
    sk = staging.register("param:bad", torch.ones(2))
    staging.push(sk, torch.ones(2), 1.0, 0)
    with pytest.raises(P3Error, match="server 1 rejected param:bad"):
        staging.wait(sk)
    never = FakeWorker(complete_after=2)  # one push only: it never completes
    staging = cuda_staging.Staging(never, HostDouble(), 0.2)
    sk = staging.register("param:slow", torch.ones(2))
    staging.push(sk, torch.ones(2), 1.0, 0)
    with pytest.raises(P3TimeoutError, match=r"param:slow did not arrive within 0.2 s \(P3_TIMEOUT\)"):
        staging.wait(sk)


CASES = {
    "sgd": [],
    "sgd-server": ["--placement", "server"],
    "batchnorm": ["--model", "bn"],  # buffers through the staging too
    "adam-clip": ["--optimizer", "adam", "--clip", "0.05"],  # optimizer.synchronize() reads the staged averages
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(CASES))
def test_a_job_through_the_staging_double_ends_with_ddps_weights_bit_for_bit(tmp_path, case):
    args = CASES[case]
    result = p3kv_job(tmp_path / "p3kv.pt", *args, "--staging", "double")
    assert result.returncode == 0, result.stdout
    ddp_job(tmp_path / "ddp.pt", *args)
    mine, ddp = torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt")
    assert mine.keys() == ddp.keys()
    assert [k for k in mine if not torch.equal(mine[k], ddp[k])] == []
