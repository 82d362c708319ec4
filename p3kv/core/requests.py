"""Control requests a worker sends to servers (kRequest frames), and how their bodies are encoded.

Two families. The MXNet optimizer's (1-4, p3kv.mxnet.optimizer_host): bodies are pickles, since the optimizer
itself travels (servers trust the workers of their own job, see the README's threat model). The framework-free
kernels' (5-8, p3kv.core.native_optimizer, used by p3kv.torch's server placement): bodies are JSON, or JSON and raw
arrays (`pack`/`unpack`), never pickles, so that such a server imports no framework and unpickles nothing.
"""

from __future__ import annotations

import json
import struct

import numpy as np

SET_OPTIMIZER = 1  # body: pickled mx.optimizer.Optimizer; the server then updates slices with it
# Optimizer states can be far larger than one frame (P3_MAX_MESSAGE_BYTES; Adam on VGG-19 with one server holds
# ~1.15 GB), so they travel in pages of at most `max_bytes` (the requester picks half its frame limit):
GET_STATES = 2  # body: pickled {"start": index of the first slice, "max_bytes": page size} (empty: everything);
#                 reply: pickled {"states": {(key, slice): state as numpy (nested tuples kept)},
#                                 "counts": {key: updates done}, "next": start of the next page, or None at the end}
SET_STATES = 3  # body: pickled {"states": {(key, slice): state as numpy}, "first": True on the first page (the
#                 server's states are replaced, not merged)}; a bare {(key, slice): state} is one whole page
#
# A page's size is estimated as its arrays' bytes plus STATE_OVERHEAD_BYTES per slice (the pickle's framing).
STATE_OVERHEAD_BYTES = 1024
SET_HYPERPARAMETERS = 4  # body: pickled {attribute: value} of the optimizer (lr, wd, rescale_grad, momentum, ...,
#                          "lr_mult"/"wd_mult": {index: multiplier}); the server sets them on its optimizer and
#                          keeps every slice's state and update count. Worker 0 sends it between two iterations.


def state_bytes(state) -> int:
    """The estimated pickled size of one slice's state (numpy arrays, possibly nested in tuples/lists)."""
    if state is None:
        return STATE_OVERHEAD_BYTES
    if isinstance(state, (tuple, list)):
        return STATE_OVERHEAD_BYTES + sum(state_bytes(s) for s in state)
    return STATE_OVERHEAD_BYTES + int(state.nbytes)


def pages(states: dict, max_bytes: int) -> list[dict]:
    """`states` ({(key, slice): state}) cut into pages of at most `max_bytes` (estimated), at least one slice
    each (a slice's state is a few times the slice, which fits in a frame)."""
    out: list[dict] = [{}]
    size = 0
    for index, state in states.items():
        n = state_bytes(state)
        if out[-1] and size + n > max_bytes:
            out.append({})
            size = 0
        out[-1][index] = state
        size += n
    return out


# -- framework-free kernels (p3kv.core.native_optimizer) ------------------------------------------------------
# Key ids travel as decimal strings (JSON object keys are strings). A kernel spec is the dict of
# p3::OptimizerSpec fields by name ({"kind": "torch_adam", "beta1": 0.9, ...}); per key the servers hold its
# learning rate and weight decay ("lr", "wd") and count its updates (the step t the kernels get).
NATIVE_SET_OPTIMIZER = 5  # JSON {"spec": spec, "keys": {key: {"lr": float, "wd": float}}, "counts": {key: updates
#                           done}}; the slices' states start afresh (a set of states follows if there are any)
NATIVE_SET_HYPERPARAMETERS = 6  # JSON {"keys": {key: {"lr", "wd"}} (changed keys only), "spec": spec (optional: the
#                                 kernel's settings changed, states kept)}; sent between two iterations
NATIVE_GET_STATES = 7  # JSON {"start": index of the first slice, "max_bytes": page size}; reply packed: header
#                        {"slices": [[key, slice, weight dtype, arrays]], "counts": {key: updates}, "next": start of
#                        the next page or None}, then each slice's state arrays in order
NATIVE_SET_STATES = 8  # packed: header {"slices": [[key, slice, weight dtype, arrays]], "counts": {key: updates},
#                        "first": True on the first page (every slice's states and every key's count are replaced,
#                        not merged: a slice or key the pages leave out starts afresh)}, then the arrays
NATIVE_KINDS = (NATIVE_SET_OPTIMIZER, NATIVE_SET_HYPERPARAMETERS, NATIVE_GET_STATES, NATIVE_SET_STATES)

_LENGTH = struct.Struct("<Q")


def pack(header: dict, arrays: list) -> bytes:
    """`header` as JSON and `arrays` (numpy, any shape; C order) as raw bytes after it. The header gains "arrays":
    [[dtype name, element count]] so that unpack can cut the tail."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    head = json.dumps({**header, "arrays": [[a.dtype.name, int(a.size)] for a in arrays]}).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *(a.tobytes() for a in arrays)])


def unpack(body: bytes) -> tuple[dict, list[np.ndarray]]:
    """The inverse of pack: (header, flat read-only arrays viewing `body`). Raises ValueError on a malformed
    body."""
    if len(body) < _LENGTH.size:
        raise ValueError("packed request body too short")
    (n,) = _LENGTH.unpack_from(body)
    header = json.loads(body[_LENGTH.size:_LENGTH.size + n])
    arrays, at = [], _LENGTH.size + n
    for dtype, count in header.pop("arrays"):
        a = np.frombuffer(body, dtype=np.dtype(dtype), count=int(count), offset=at)
        arrays.append(a)
        at += a.nbytes
    if at != len(body):
        raise ValueError(f"packed request body has {len(body) - at} bytes after its arrays")
    return header, arrays
