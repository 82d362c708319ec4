"""Every optimizer MXNet 1.9.1 ships, on kvstore 'p3''s servers, against what MXNet's dist_sync server computes.

A dist_sync server runs `updater(key, sum of the workers' gradients, weight)` — `update_multi_precision` on the
whole array, once per key and iteration. tests/scripts/optimizer_sweep.py trains three arrays per optimizer
configuration through kvstore 'p3' (2 workers x 2 servers, slices of 50 elements, so arrays span both servers),
saving and reloading the servers' states midway; this test computes the same updates in-process with MXNet's
own optimizer on whole arrays and requires the same bits. (Comparing with a live dist_sync job instead is
unreliable for this raw kvstore loop: its two workers end with different weights; the Gluon and Module jobs of
test_mxnet_kvstore.py compare with live dist_sync.) Optimizers that cannot run per slice are refused on every
worker with a message naming update_on_kvstore=False.
"""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pytest
from harness import SCRIPTS, run_job

mx = pytest.importorskip("mxnet")
sys.path.insert(0, SCRIPTS)
import optimizer_sweep  # noqa: E402

pytestmark = pytest.mark.mxnet

# With a native kernel: the rest (DCASGD, a user subclass) take MXNet's own per-slice update.
KERNEL_CASES = {"sgd", "sgd_momentum_clip", "sgd_scheduler", "sgd_mults", "sgd_fp16_multi_precision", "nag", "adam",
                "adam_fp16_multi_precision", "rmsprop", "rmsprop_centered", "adagrad", "adadelta", "adamax",
                "signum", "ftrl", "ftml"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("optimizer_sweep")
    result = run_job(2, 2, [os.path.join(SCRIPTS, "optimizer_sweep.py"), "p3", str(out), "--save-load"],
                     timeout=240, launcher_args=["--timeout", "200", "--env", f"PYTHONPATH={SCRIPTS}",
                                                 "--env", "P3_SLICE_SIZE=50", "--env", "P3_LOG_LEVEL=INFO"])
    assert result.returncode == 0, result.stdout[-6000:]
    return out, result.stdout


def reference(case_index: int, name: str, dtype: str, make, steps: int = optimizer_sweep.STEPS,
              float32_weights: bool = False) -> dict:
    """What a dist_sync server computes: MXNet's optimizer on whole arrays, once per key and step, on the sum
    (`float32_weights`: its float32 copy of float16 weights under multi_precision, not the weights)."""
    keys = [100 * (case_index + 1) + i for i in range(len(optimizer_sweep.SHAPES))]
    opt = make()
    if getattr(opt, "_p3_test_mults", False):
        opt.set_lr_mult({keys[0]: 0.5, keys[2]: 0.0})
        opt.set_wd_mult({keys[1]: 0.0})
    weights = {k: mx.nd.array(np.random.RandomState(k).uniform(-1, 1, shape).astype(dtype), dtype=dtype)
               for k, shape in zip(keys, optimizer_sweep.SHAPES)}
    # multi_precision with float16: dist_sync's servers keep a float32 copy of the weights and update it with
    # the float32 sum of the workers' gradients (MXNet's kSetMultiPrecision); the workers get it cast to float16.
    master = dtype == "float16" and opt.multi_precision
    if master:
        weights = {k: w.astype("float32") for k, w in weights.items()}
    states = {k: opt.create_state_multi_precision(k, weights[k]) for k in keys}
    for step in range(steps):
        for i, k in reversed(list(enumerate(keys))):
            grads = [np.random.RandomState(1_000_000 * rank + 1000 * step + k).normal(0, 1, optimizer_sweep.SHAPES[i])
                     .astype(dtype) for rank in range(2)]
            total = grads[0].astype(np.float32) + grads[1] if master else (grads[0] + grads[1]).astype(dtype)
            opt.update_multi_precision(k, weights[k], mx.nd.array(total, dtype=total.dtype), states[k])
    if float32_weights:
        return {k: weights[k].asnumpy() for k in keys}
    return {f"{name}/{k}": weights[k].asnumpy().astype(dtype) for k in keys}


CASES = [(i, *case) for i, case in enumerate(optimizer_sweep.configs())]


@pytest.mark.parametrize("case_index,name,dtype,make", CASES, ids=[c[1] for c in CASES])
def test_server_optimizer_is_bitwise_mxnets_update(sweep, case_index, name, dtype, make):
    out, _ = sweep
    expected = reference(case_index, name, dtype, make)
    got = [dict(np.load(out / f"p3-rank{r}.npz")) for r in (0, 1)]
    for key, ref in expected.items():
        start = np.random.RandomState(int(key.split("/")[1])).uniform(-1, 1, ref.shape).astype(dtype)
        assert not np.array_equal(ref, start) or name == "sgd_mults", f"{key}: training did not move the weights"
        for rank in (0, 1):
            assert got[rank][key].dtype == ref.dtype
            assert np.array_equal(got[rank][key], ref), (
                f"{key} on worker {rank}: max abs difference {np.max(np.abs(got[rank][key] - ref.astype(np.float64)))}")


@pytest.mark.parametrize("name", ["sgd_fp16_multi_precision", "user_subclass_fp16_multi_precision"])
def test_float16_weights_are_updated_in_float32_from_the_float32_sum(sweep, name):
    """multi_precision: dist_sync's server updates its float32 copy of the weights from the float32 sum of the
    workers' float16 gradients; the float16 weights hide a sum rounded to float16, the float32 copy saved with
    the states shows it. The kernel and MXNet's own update per slice (a user subclass) must both match."""
    out, _ = sweep
    index = [c[1] for c in CASES].index(name)
    expected = reference(*CASES[index], steps=optimizer_sweep.SAVE_AT, float32_weights=True)
    with open(out / f"states-{name}-rank0", "rb") as f:
        states, _ = pickle.load(f)
    for key, ref in expected.items():
        master = states[key][1].asnumpy()  # MXNet's SGD (and its subclass) nests (momentum, float32 weights)
        assert master.dtype == np.float32 and np.array_equal(master, ref.reshape(master.shape)), (
            f"{name} key {key}: max abs difference {np.max(np.abs(master - ref.reshape(master.shape)))}")


def test_saved_states_carry_one_update_per_key_and_step(sweep):
    """Python runs once per key and iteration on a server, not per slice: after 2 steps every key (also those
    cut into 3 and 4 slices over two servers) has an update count of 2 in the saved optimizer."""
    out, _ = sweep
    for name in ("adam", "ftml", "user_subclass"):
        index = [c[1] for c in CASES].index(name)
        with open(out / f"states-{name}-rank0", "rb") as f:
            states, optimizer = pickle.load(f)
        keys = [100 * (index + 1) + i for i in range(3)]
        assert {k: optimizer._index_update_count[k] for k in keys} == {k: optimizer_sweep.SAVE_AT for k in keys}
        assert set(states) == set(keys)


def test_optimizers_without_kernel_warn_once_naming_the_cost(sweep):
    _, output = sweep
    lines = [line for line in output.splitlines() if "has no native kernel" in line and " Test has" not in line]
    # One line per server each time such an optimizer arrives: DCASGD and ScaledSGD (float32, float16) are each
    # set twice (set_optimizer, and loaded after the Test optimizer), on two servers. Never one per slice.
    assert len(lines) == 12, lines
    assert {(line[:10], name) for line in lines for name in ("DCASGD", "ScaledSGD") if f" {name} has" in line} == {
        (server, name) for server in ("[server 0]", "[server 1]") for name in ("DCASGD", "ScaledSGD")}
    assert all("update_on_kvstore=False" in line for line in lines)


def test_kernel_optimizers_are_logged_as_native(sweep):
    _, output = sweep
    native = {line.split("(native kernel, ")[1].split(")")[0] for line in output.splitlines()
              if "(native kernel, " in line}
    assert native == {"sgd", "nag", "adam", "rmsprop", "adagrad", "adadelta", "adamax", "signum", "ftrl", "ftml"}


def test_optimizers_that_cannot_run_per_slice_are_refused_on_every_worker():
    result = run_job(2, 2, [os.path.join(SCRIPTS, "refused_optimizers.py")], timeout=120,
                     launcher_args=["--timeout", "90"])
    assert result.returncode == 0, result.stdout[-4000:]
    for rank in (0, 1):
        lines = [line for line in result.stdout.splitlines() if line.startswith(f"[worker {rank}]")]
        refused = {line.split("REFUSED ")[1].split(":")[0] for line in lines if "REFUSED " in line}
        assert refused == {"Nadam", "LARS", "LAMB", "LBSGD"}, lines
        assert all("update_on_kvstore=False" in line for line in lines if "REFUSED " in line)
        assert not any("ACCEPTED" in line for line in lines)
        assert any("AFTER [0.0, 0.0, 0.0, 0.0]" in line for line in lines)  # SGD still runs after the refusals


@pytest.mark.parametrize("change", ["set", "again", "load", "keep"])
def test_optimizer_changes_apply_between_iterations(tmp_path, change):
    """set_optimizer / load_optimizer_states right after a step's pushpulls, whose gradients an engine operation
    is still computing: the servers must finish that step with the old optimizer and states, on every slice,
    before the change (the request would otherwise overtake the queued slices). Adam shipped again restarts as
    on dist_sync (states and counts afresh); keep_states=True continues it exactly. Each worker's weights must be
    MXNet's whole-array update with the change between steps."""
    result = run_job(2, 2, [os.path.join(SCRIPTS, "optimizer_swap.py"), str(tmp_path), "--change", change],
                     timeout=120, launcher_args=["--timeout", "100", "--env", "P3_SLICE_SIZE=4000"])
    assert result.returncode == 0, result.stdout[-6000:]
    for rank in (0, 1):
        got = dict(np.load(tmp_path / f"swap-rank{rank}.npz"))
        for key in ("w0", "w1"):
            wrong = np.flatnonzero(got[key] != got["expected"])
            assert wrong.size == 0, (f"worker {rank} {key}: {wrong.size} of {got[key].size} elements differ from "
                                     f"MXNet's update (first at {wrong[:1]}: {got[key][wrong[:1]]} != "
                                     f"{got['expected'][wrong[:1]]})")
