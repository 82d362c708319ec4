"""Worker placement's engine (p3kv.torch.synchronizer) in one process, on a stand-in for the core: how many optimizer
calls the per-parameter updates cost, and that grouping parameters into one call changes no bit. The jobs against
DDP (tests/test_torch_ddp.py) show the same equality over real servers."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")
import p3kv.torch  # noqa: E402
from p3kv.torch import distributed  # noqa: E402

pytestmark = pytest.mark.unit
STEPS = 3


class SummingWorker:
    """The part of P3Worker that p3kv.torch uses, for `num_workers` workers that all push the same gradient: the
    servers' sum lands in `out` at once (num_workers times the pushed value: exact for two)."""

    rank, num_servers = 0, 1

    def __init__(self, num_workers: int = 2):
        self.num_workers = num_workers
        self.config = types.SimpleNamespace(timeout=10.0)
        self.pushes = 0

    def init(self, key, value, out, wire_dtype):
        out[...] = value

    def push(self, key, grad, out, priority):
        self.pushes += 1
        np.multiply(grad, self.num_workers, out=out)

    def wait(self, key=None):
        pass


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum; the biases in a group of their own (no weight decay, half the lr), so that each module's
    two parameters are in different groups."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return torch.optim.SGD([{"params": weights}, {"params": biases, "lr": 0.025, "weight_decay": 0.0}], lr=0.05,
                           momentum=0.9, weight_decay=1e-3, foreach=False)


def _train(model, optimizer) -> None:
    torch.manual_seed(1)
    for _ in range(STEPS):
        model(torch.randn(16, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_each_module_costs_one_optimizer_call_and_the_parameters_equal_torchs_own_steps(monkeypatch):
    torch.manual_seed(0)
    model = TwoLayers()
    reference = copy.deepcopy(model)
    worker = SummingWorker()
    monkeypatch.setattr(distributed, "_worker", worker)
    model, optimizer = p3kv.torch.distribute(model, _optimizer(model))
    calls = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append(
        sorted(len(g["params"]) for g in opt.param_groups)))
    _train(model, optimizer)
    state = model.state_dict()  # finishes every pending update
    plain = _optimizer(reference)
    _train(reference, plain)
    for name, value in reference.state_dict().items():
        assert torch.equal(state[name], value), name
    assert worker.pushes == 4 * STEPS
    # Steps 1 and 2 are applied as modules a and b start the next forward (one call each: weight and bias, one
    # in each param group); step 3 at state_dict(), all four parameters in one call.
    assert calls == [[1, 1], [1, 1]] * (STEPS - 1) + [[2, 2]]
