"""Runs an MXNet optimizer on the slices a server owns (the paper's server-side update, per slice).

Worker 0 ships the optimizer (as MXNet's dist_sync does); each slice then gets its own optimizer state,
while learning-rate multipliers, weight decay multipliers, update counts and schedulers work per key: the
key id is the optimizer's parameter index, and every slice of a key sees the key's update count. So any
element-wise optimizer (SGD, NAG, Adam, RMSProp, ...) gives the same weights as updating whole arrays.
A key's update count continues from the optimizer's `_index_update_count` when it arrives (an optimizer saved
with its states, then loaded: Adam's bias correction and lr schedules go on where they were), and GET_STATES
reports the counts so the saved optimizer carries them.
Optimizers that need the whole array (LARS, LAMB: per-layer norms) are refused.

mxnet is imported only when an optimizer arrives: a server that only aggregates does not need it.
"""

from __future__ import annotations

import logging
import pickle

import numpy as np

from p3kv import requests

log = logging.getLogger("p3kv.server")

# Optimizers whose update of one element depends on other elements of the array.
NOT_ELEMENTWISE = ("lars", "lamb", "lans")


def _to_numpy(state):
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_to_numpy(s) for s in state)
    return state.asnumpy()


def _to_ndarray(state):
    import mxnet as mx

    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_to_ndarray(s) for s in state)
    return mx.nd.array(state, dtype=state.dtype)


class OptimizerHost:
    """The request handler and update function of a P3Server that runs MXNet optimizers."""

    def __init__(self):
        self.on_optimizer = lambda: None  # called once an optimizer is set (enables the per-slice update)
        self.optimizer = None
        self.states: dict = {}  # (key, slice) -> optimizer state of that slice
        self.base_counts: dict = {}  # key -> updates done before this optimizer arrived (its _index_update_count)
        self.updates: dict = {}  # (key, slice) -> updates this optimizer made to the slice

    def on_request(self, kind: int, body: bytes) -> bytes:
        if kind == requests.SET_OPTIMIZER:
            import mxnet  # noqa: F401  (unpickling needs the optimizer classes)

            try:
                optimizer = pickle.loads(body)
            except (AttributeError, ImportError) as e:
                # A custom optimizer class defined in the training script pickles as __main__.Name.
                raise ValueError(f"cannot unpickle the optimizer on this server ({e}): its class must be "
                                 "importable here; define it in a module on the servers' PYTHONPATH, not in the "
                                 "training script") from e
            name = type(optimizer).__name__.lower()
            if name in NOT_ELEMENTWISE:
                raise ValueError(f"optimizer {type(optimizer).__name__} needs whole arrays (layer-wise norms) and "
                                 "cannot run per slice: use update_on_kvstore=False with it")
            self.optimizer = optimizer
            self.base_counts = dict(optimizer._index_update_count)
            self.updates = {}
            self.on_optimizer()
            log.info("server optimizer: %s", type(optimizer).__name__)
            return b""
        if kind == requests.GET_STATES:
            return pickle.dumps({"states": {k: _to_numpy(s) for k, s in self.states.items()},
                                 "counts": {**self.base_counts,
                                            **{key: self._count(key, slc) for key, slc in self.updates}}},
                                protocol=4)
        if kind == requests.SET_STATES:
            self.states = {k: _to_ndarray(s) for k, s in pickle.loads(body).items()}
            return b""
        raise ValueError(f"unknown request type {kind}")

    def update(self, key: int, slc: int, offset: int, iteration: int, aggregated: np.ndarray,
               value: np.ndarray) -> None:
        if self.optimizer is None:  # update_on_kvstore=False: broadcast the summed gradient
            value[...] = aggregated
            return
        import mxnet as mx

        opt = self.optimizer
        # Zero-copy views of the server's buffers: the update writes the new weights straight into `value`.
        weight = mx.nd.from_numpy(value, zero_copy=True)
        grad = mx.nd.from_numpy(aggregated, zero_copy=True)
        state = self.states.get((key, slc))
        if state is None and (key, slc) not in self.states:
            state = self.states[(key, slc)] = opt.create_state_multi_precision(key, weight)
        # Every slice of a key is the same update of the same parameter: give each the key's count, so that
        # bias corrections (Adam) and learning-rate schedules advance once per iteration, not per slice.
        opt._index_update_count[key] = self._count(key, slc)
        opt.update_multi_precision(key, weight, grad, state)
        self.updates[(key, slc)] = self.updates.get((key, slc), 0) + 1
        weight.wait_to_read()  # the engine has written `value` before the server broadcasts it

    def _count(self, key: int, slc: int) -> int:
        """Updates of `key` done so far, as the slice `slc` has seen them."""
        return self.base_counts.get(key, self.optimizer.begin_num_update) + self.updates.get((key, slc), 0)
