"""Optimizer states to and from the servers, for save_optimizer_states/load_optimizer_states of kvstore 'p3'.

The servers keep one state per slice (the paper's server-side update); a checkpoint holds one state per key, in
the format of mx.optimizer.Updater, so that Trainer.load_states and MXNet's own kvstores read it. States travel
in pages that fit in one frame (p3kv.core.requests).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable

import mxnet as mx
import numpy as np

from p3kv.core import requests
from p3kv.core.errors import ConfigError
from p3kv.core.worker import P3Worker


def collect(worker: P3Worker, keys: Iterable) -> tuple[dict, dict]:
    """Every key's state, joined from its slices' states on all servers ({index: state as NDArrays}), and the
    servers' update count per index. `keys` have `index`, `name` and `shape` (the kvstore's keys)."""
    pieces: dict = {}
    counts: dict = {}
    page_bytes = worker.config.max_message_bytes // 2  # a page and its pickle fit in one frame
    for s in range(worker.num_servers):
        start = 0
        while start is not None:
            body = pickle.dumps({"start": start, "max_bytes": page_bytes}, protocol=4)
            reply = pickle.loads(worker.request(s, requests.GET_STATES, body))
            pieces.update(reply["states"])
            for index, count in reply["counts"].items():
                counts[index] = max(count, counts.get(index, 0))
            start = reply["next"]
    states = {}
    for info in keys:
        parts = [pieces.get((info.index, sl[0])) for sl in worker.slices(info.index)]
        if parts and all(p is not None for p in parts):
            states[info.index] = _join(parts, info.shape)
        elif parts and any(p is not None for p in parts):
            raise ConfigError(f"servers hold states for only some slices of key {info.name!r}")
    return states, counts


def distribute(worker: P3Worker, keys: Iterable, states: dict) -> None:
    """Cuts each key's state ({index: state}) into its slices' and sends each to the server owning the slice."""
    per_server: list[dict] = [{} for _ in range(worker.num_servers)]
    for info in keys:
        if info.index not in states:
            continue
        for index, offset, count, server in worker.slices(info.index):
            per_server[server][(info.index, index)] = _cut(states[info.index], offset, count)
    page_bytes = worker.config.max_message_bytes // 2  # a page and its pickle fit in one frame
    for s, states_here in enumerate(per_server):
        for i, page in enumerate(requests.pages(states_here, page_bytes)):
            body = pickle.dumps({"states": page, "first": i == 0}, protocol=4)
            worker.request(s, requests.SET_STATES, body)


def _join(parts, shape):
    """Per-slice states (numpy, possibly nested tuples) to one state of the whole parameter (NDArrays)."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        return type(first)(_join([p[i] for p in parts], shape) for i in range(len(first)))
    return mx.nd.array(np.concatenate(parts).reshape(shape), dtype=first.dtype)


def _cut(state, offset: int, count: int):
    """The part of a whole-parameter state that belongs to one slice, as numpy."""
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_cut(s, offset, count) for s in state)
    return state.asnumpy().reshape(-1)[offset:offset + count].copy()
