"""The framework-free optimizer host (p3kv.core.native_optimizer) on its own: the requests it answers, the step
parameters it gives per key (counted once per call, nothing counted on a failing step), state pages that round-trip,
and what it refuses. Jobs through it: tests/test_torch_server_mode.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from p3kv import _p3
from p3kv.core import requests
from p3kv.core.errors import UnsupportedRequest
from p3kv.core.native_optimizer import NativeOptimizerHost

pytestmark = pytest.mark.unit

ADAM = {"kind": "torch_adam", "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "amsgrad": False, "maximize": False,
        "decoupled_weight_decay": True}


def _host(spec=ADAM, keys=None):
    host = NativeOptimizerHost(_p3.SliceOptimizer())
    keys = keys if keys is not None else {"7": {"lr": 0.1, "wd": 0.01}, "9": {"lr": 0.2, "wd": 0.0}}
    host.on_request(requests.NATIVE_SET_OPTIMIZER, json.dumps({"spec": spec, "keys": keys}).encode())
    return host


def test_pack_and_unpack_round_trip_a_header_and_arrays():
    arrays = [np.arange(5, dtype=np.float32), np.zeros(0, dtype=np.float64), np.ones((2, 3), dtype=np.float64)]
    header, back = requests.unpack(requests.pack({"slices": [["7", 0]], "first": True}, arrays))
    assert header == {"slices": [["7", 0]], "first": True}
    assert [a.dtype for a in back] == [np.float32, np.float64, np.float64]
    assert all(np.array_equal(a.reshape(-1), b) for a, b in zip(arrays, back))
    with pytest.raises(ValueError, match="after its arrays"):
        requests.unpack(requests.pack({}, arrays) + b"x")


def test_each_keys_step_carries_its_lr_and_wd_and_counts_once_per_call():
    host = _host()
    assert host._step(7) == (0.1, 0.01, 1.0, -1.0, 1.0)
    assert host._step(7) == (0.1, 0.01, 1.0, -1.0, 2.0)
    assert host._step(9) == (0.2, 0.0, 1.0, -1.0, 1.0)
    # An unknown key fails and counts nothing.
    with pytest.raises(ValueError, match="key 8 has no learning rate"):
        host._step(8)
    assert host.counts == {7: 2, 9: 1}


def test_hyperparameters_change_per_key_and_keep_the_counts():
    host = _host()
    host._step(7)
    host.on_request(requests.NATIVE_SET_HYPERPARAMETERS, json.dumps({"keys": {"7": {"lr": 0.05, "wd": 0.01}}}).encode())
    assert host._step(7) == (0.05, 0.01, 1.0, -1.0, 2.0)
    assert host._step(9)[0] == 0.2  # untouched
    # New kernel settings with the same states per parameter are taken (states kept) ...
    host.on_request(requests.NATIVE_SET_HYPERPARAMETERS, json.dumps({"keys": {}, "spec": {**ADAM, "beta1": 0.8}})
                    .encode())
    assert host.spec["beta1"] == 0.8
    # ... settings that change the states kept (amsgrad adds one) are refused, and nothing changes.
    with pytest.raises(ValueError, match="changes the states it keeps per parameter"):
        host.on_request(requests.NATIVE_SET_HYPERPARAMETERS,
                        json.dumps({"keys": {"7": {"lr": 9.0, "wd": 0}}, "spec": {**ADAM, "amsgrad": True}}).encode())
    assert host.spec["amsgrad"] is False and host._step(7)[0] == 0.05


def test_states_set_in_pages_come_back_with_the_counts():
    host = _host()
    m, v = np.arange(4, dtype=np.float32), np.full(4, 0.5, dtype=np.float32)
    page = requests.pack({"slices": [["7", 1, "float32", 2]], "counts": {"7": 5}, "first": True}, [m, v])
    host.on_request(requests.NATIVE_SET_STATES, page)
    header, arrays = requests.unpack(host.on_request(requests.NATIVE_GET_STATES, json.dumps({"start": 0}).encode()))
    assert header["slices"] == [["7", 1, "float32", 2]] and header["counts"] == {"7": 5} and header["next"] is None
    assert np.array_equal(arrays[0], m) and np.array_equal(arrays[1], v)
    assert host._step(7)[4] == 6.0  # continues from the loaded count
    # A first page replaces everything: the slice and count left out start afresh.
    host.on_request(requests.NATIVE_SET_STATES, requests.pack({"slices": [], "counts": {}, "first": True}, []))
    header, arrays = requests.unpack(host.on_request(requests.NATIVE_GET_STATES, b""))
    assert header["slices"] == [] and header["counts"] == {} and arrays == []


def test_what_it_does_not_take_is_refused_by_name():
    host = NativeOptimizerHost(_p3.SliceOptimizer())
    # An MXNet optimizer (pickled) to a framework-free server: UnsupportedRequest, which the MXNet adapter names.
    with pytest.raises(UnsupportedRequest, match="this server takes no requests of kind 1"):
        host.on_request(requests.SET_OPTIMIZER, b"pickle")
    with pytest.raises(ValueError, match="before any kernel spec"):
        host.on_request(requests.NATIVE_SET_HYPERPARAMETERS, b"{}")
    with pytest.raises(ValueError, match="unknown optimizer kind 'torch_rmsprop'"):
        host.on_request(requests.NATIVE_SET_OPTIMIZER, json.dumps({"spec": {"kind": "torch_rmsprop"}}).encode())
    assert host.spec is None
