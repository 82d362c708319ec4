"""The servers' optimizer host (p3kv.mxnet.optimizer_host) and its step function (server_kernels.step_params)
in process, without a job: what a new optimizer keeps, a refused change that leaves the optimizer as it was, the
per-slice MXNet fallback against the server's buffer reuse, and failing steps that count nothing."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

from p3kv import _p3  # noqa: E402
from p3kv.core import requests  # noqa: E402
from p3kv.mxnet import server_kernels  # noqa: E402
from p3kv.mxnet.optimizer_host import OptimizerHost  # noqa: E402

pytestmark = pytest.mark.unit


def adam_host():
    host = OptimizerHost(_p3.SliceOptimizer())
    host.on_request(requests.SET_OPTIMIZER, pickle.dumps(mx.optimizer.Adam(learning_rate=0.01)))
    mean, var = np.full(4, 0.5, np.float32), np.full(4, 0.25, np.float32)
    host.native.set_states(3, 0, "float32", "float32", [mean, var])
    host.optimizer._index_update_count[3] = 2
    return host, mean, var


def test_a_new_optimizer_drops_slice_states_and_takes_its_own_counts_as_dist_sync():
    # MXNet 1.9.1's dist_sync server runs kvstore.set_optimizer on every SET_OPTIMIZER: a new Updater, no states;
    # the counts are the pickled optimizer's. Keeping Adam's m and v with a restarted count matches nothing.
    host, _, _ = adam_host()
    host.on_request(requests.SET_OPTIMIZER, pickle.dumps(mx.optimizer.Adam(learning_rate=0.01)))
    assert host.native.states(3, 0) is None
    assert 3 not in host.optimizer._index_update_count


def test_keep_states_continues_states_and_counts():
    host, mean, var = adam_host()
    again = mx.optimizer.Adam(learning_rate=0.005)
    host.on_request(requests.SET_OPTIMIZER, pickle.dumps({"optimizer": again, "keep_states": True}))
    weight_dtype, kept = host.native.states(3, 0)
    assert weight_dtype == "float32" and np.array_equal(kept[0], mean) and np.array_equal(kept[1], var)
    assert host.optimizer._index_update_count[3] == 2 and host.optimizer.lr == 0.005
    # The optimizer's own count wins where it is larger (a resumed run stating its updates).
    ahead = mx.optimizer.Adam(learning_rate=0.005)
    ahead.begin_num_update = 5
    host.on_request(requests.SET_OPTIMIZER, pickle.dumps({"optimizer": ahead, "keep_states": True}))
    assert host.optimizer._index_update_count[3] == 5 and host.native.states(3, 0) is not None
    # Another state layout cannot be kept: refused, and the servers' optimizer is unchanged.
    with pytest.raises(ValueError, match="keeps other states per weight"):
        host.on_request(requests.SET_OPTIMIZER, pickle.dumps({"optimizer": mx.optimizer.SGD(), "keep_states": True}))
    assert host.optimizer is not None and host.kernel["kind"] == "adam" and host.native.states(3, 0) is not None


def test_a_refused_hyperparameter_change_leaves_the_optimizer_as_it_was():
    host = OptimizerHost(_p3.SliceOptimizer())
    host.on_request(requests.SET_OPTIMIZER, pickle.dumps(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)))
    with pytest.raises(ValueError, match="state it keeps per weight"):
        host.on_request(requests.SET_HYPERPARAMETERS, pickle.dumps({"lr": 0.5, "momentum": 0.0, "lr_mult": {1: 3.0}}))
    assert (host.optimizer.lr, host.optimizer.momentum, host.optimizer.lr_mult) == (0.1, 0.9, {})
    assert host.kernel["momentum"] == 0.9


class SlowGradientReader(mx.optimizer.SGD):
    """Writes the weight first, then a state from the gradient, behind a slow engine operation: the weight's
    last write completes long before the last read of the gradient."""

    def create_state(self, index, weight):
        return mx.nd.zeros(weight.shape, dtype=weight.dtype)

    def update(self, index, weight, grad, state):
        weight[:] = weight - grad
        big = mx.nd.ones((800, 800))
        for _ in range(4):
            big = mx.nd.dot(big, big) * (1.0 / 800)
        state[:] = state + mx.nd.broadcast_add(grad, big.sum().reshape((1,)) * 0)

    update_multi_precision = update


def test_the_fallback_returns_only_when_nothing_reads_the_servers_buffers():
    # The server reuses the aggregation buffer as soon as the update returns (the next push overwrites it).
    host = OptimizerHost(_p3.SliceOptimizer())
    host._set_optimizer(SlowGradientReader())
    value = np.ones(6, np.float32)
    aggregated = np.full(6, 2.0, np.float32)
    host.update(1, 0, 0, 1, aggregated, value)
    aggregated.setflags(write=True)  # mx.nd.from_numpy marks what it shares read-only; the server writes anyway
    aggregated[:] = 1000.0  # the next iteration's sum
    mx.nd.waitall()
    assert np.array_equal(value, np.full(6, -1.0, np.float32))
    assert np.array_equal(host.states[(1, 0)].asnumpy(), np.full(6, 2.0, np.float32))


def test_a_failing_step_counts_nothing():
    class Failing(mx.lr_scheduler.LRScheduler):
        def __call__(self, num_update):
            if num_update >= 3:
                raise ValueError("schedule ended")
            return self.base_lr

    opt = mx.optimizer.Adam(learning_rate=0.01, lr_scheduler=Failing(base_lr=0.01))
    for _ in range(2):
        server_kernels.step_params(opt, 4)
    for _ in range(2):  # asked again (another slice, another server): still the third update, never the fourth
        with pytest.raises(ValueError, match="schedule ended"):
            server_kernels.step_params(opt, 4)
        assert opt._index_update_count[4] == 2 and opt.num_update == 2
    resumed = mx.optimizer.Adam(learning_rate=0.01, lr_scheduler=Failing(base_lr=0.01), begin_num_update=2)
    with pytest.raises(ValueError, match="schedule ended"):
        server_kernels.step_params(resumed, 9)  # the key's first update here
    assert 9 not in resumed._index_update_count and resumed.num_update == 2


def test_signum_without_momentum_refuses_wd_lh_as_mxnet_raises():
    opt = mx.optimizer.Signum(learning_rate=0.1, momentum=0.0, wd_lh=0.01)
    w = mx.nd.ones((3,))
    with pytest.raises(mx.base.MXNetError, match="wd_lh"):  # MXNet's own update
        opt.update(0, w, mx.nd.ones((3,)), opt.create_state(0, w))
        w.wait_to_read()
    with pytest.raises(ValueError, match="wd_lh"):
        server_kernels.kernel_spec(opt)
    assert server_kernels.kernel_spec(mx.optimizer.Signum(momentum=0.0))["kind"] == "signum"
