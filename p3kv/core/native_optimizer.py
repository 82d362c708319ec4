"""The framework-free optimizer host of a P3Server: it runs native kernels chosen by name, answering the
NATIVE_* control requests of p3kv.core.requests, and imports no framework and unpickles nothing.

p3kv.torch's server placement speaks to it: worker 0 sends the kernel spec its torch optimizer maps to ("torch_sgd",
"torch_adam": cpp/src/optimizer.cc follows torch.optim's formulas there) and every parameter's (key's) learning
rate and weight decay from its param group. The paper's split: what the framework computes once per parameter
and step (here torch's step count `t`, and the param group's lr and weight_decay) is computed here, once per key
and iteration (the SliceOptimizer asks once per key and iteration, however many slices of the key this server
holds); the per-element work runs in C++ on each slice without the GIL.

The update count of a key (the `t` its kernel gets: Adam's bias corrections, SGD's first momentum buffer) advances
exactly once per key and iteration, and not at all when a step fails (an unknown key). Every request that changes
the kernel or its states arrives between two iterations: the worker that sends it has every result of the
previous iteration first, and no slice of the next is updated before that worker's own pushes, which leave after
the reply (p3kv.torch.server_placement). The SliceOptimizer refuses a new kernel while a key is partly updated.

Thread-safety: every method runs on the server's consumer thread (the request handler and the step callback).
"""

from __future__ import annotations

import json
import logging

from p3kv import _p3
from p3kv.core import requests
from p3kv.core.errors import UnsupportedRequest

log = logging.getLogger("p3kv.server")

# A page's size is estimated as its arrays' bytes plus this per slice (the JSON header's share).
SLICE_OVERHEAD_BYTES = 64


class NativeOptimizerHost:
    """The request handler of a P3Server whose update function is `native` (a p3kv._p3.SliceOptimizer). Until a
    spec arrives the server broadcasts the summed gradients (aggregate only)."""

    def __init__(self, native):
        self.native = native
        self.spec: dict | None = None  # the kernel's spec while one runs
        self.hyper: dict[int, tuple[float, float]] = {}  # key -> (lr, wd) for its next update
        self.counts: dict[int, int] = {}  # key -> updates done (torch's 'step')

    # -- control requests -------------------------------------------------------------------------------------
    def on_request(self, kind: int, body: bytes) -> bytes:
        if kind == requests.NATIVE_SET_OPTIMIZER:
            self._set_optimizer(json.loads(body))
            return b""
        if kind == requests.NATIVE_SET_HYPERPARAMETERS:
            self._set_hyperparameters(json.loads(body))
            return b""
        if kind == requests.NATIVE_GET_STATES:
            return self._get_states(json.loads(body) if body else {})
        if kind == requests.NATIVE_SET_STATES:
            self._set_states(*requests.unpack(body))
            return b""
        # Worded so that the MXNet adapter's message (kvstore.py) reads right: an MXNet optimizer sent to a
        # framework-free server.
        raise UnsupportedRequest(f"this server takes no requests of kind {kind} (it runs framework-free kernels "
                                 "only: p3kv.core.server takes no pickled optimizer)")

    def _set_optimizer(self, msg: dict) -> None:
        spec = dict(msg["spec"])
        hyper = _hyperparameters(msg.get("keys", {}))
        counts = {int(k): int(v) for k, v in msg.get("counts", {}).items()}
        _check_spec(spec)
        # The native side first: it refuses while a key is partly updated, and then nothing here has changed.
        self._use_kernel(spec, keep_states=False, keys=hyper)
        self.spec, self.hyper, self.counts = spec, hyper, counts
        log.info("server optimizer: native kernel %s for %d keys", spec, len(hyper))

    def _set_hyperparameters(self, msg: dict) -> None:
        """A change made on the workers during training (an LR scheduler, param_groups edited): every slice keeps
        its state and every key its count. Checked whole before anything changes."""
        if self.spec is None:
            raise ValueError("optimizer hyperparameters arrived before any kernel spec")
        hyper = _hyperparameters(msg.get("keys", {}))
        spec = msg.get("spec")
        if spec is not None and spec != self.spec:
            spec = dict(spec)
            _check_spec(spec)
            if spec.get("kind") != self.spec.get("kind") or any(
                    _num_states(spec, d) != _num_states(self.spec, d) for d in ("float32", "float64")):
                raise ValueError(f"the optimizer's change ({self.spec} -> {spec}) changes the states it keeps per "
                                 "parameter; the servers cannot convert them. Set it before training starts, or "
                                 "use placement='worker'")
            self._use_kernel(spec, keep_states=True, keys={**self.hyper, **hyper})
            self.spec = spec
            log.info("server optimizer: kernel settings changed to %s (slices' states kept)", spec)
        if set(hyper) - set(self.hyper):
            self.native.set_kernel_keys(sorted({*self.hyper, *hyper}))
        self.hyper.update(hyper)

    def _use_kernel(self, spec: dict, keep_states: bool, keys) -> None:
        """The kernel from now on, for `keys` only: other keys (p3kv.torch's broadcast of BatchNorm's buffers)
        are summed, never updated."""
        self.native.use_kernel(spec, self._step, keep_states=keep_states)
        self.native.set_kernel_keys(sorted(keys))

    def _step(self, key: int) -> tuple:
        """Once per key and iteration: (lr, wd, rescale_grad, clip_gradient, t). The workers push their gradients
        already divided by the number of workers (as DDP does before its sum), so the sum is the average."""
        hyper = self.hyper.get(key)
        if hyper is None:
            raise ValueError(f"key {key} has no learning rate on this server: the spec worker 0 sent does not name "
                             "it (a parameter added to the optimizer after p3kv.torch.distribute?)")
        t = self.counts.get(key, 0) + 1
        self.counts[key] = t  # the last thing that can fail is above: a failed step counts nothing
        return (hyper[0], hyper[1], 1.0, -1.0, float(t))

    def _get_states(self, page: dict) -> bytes:
        """The states of the slices from index `start` (in (key, slice) order) on, as many as fit in `max_bytes`
        (estimated; at least one), packed with every key's count and the index to ask for next."""
        start, max_bytes = int(page.get("start", 0)), page.get("max_bytes")
        indices = sorted(self.native.slices())
        slices, arrays, size, position = [], [], 0, start
        while position < len(indices):
            key, slc = indices[position]
            weight_dtype, states = self.native.states(key, slc)
            n = SLICE_OVERHEAD_BYTES + sum(int(a.nbytes) for a in states)
            if slices and max_bytes is not None and size + n > max_bytes:
                break
            slices.append([str(key), int(slc), weight_dtype, len(states)])
            arrays.extend(states)
            size += n
            position += 1
        header = {"slices": slices, "counts": {str(k): v for k, v in self.counts.items()},
                  "next": position if position < len(indices) else None}
        return requests.pack(header, arrays)

    def _set_states(self, header: dict, arrays: list) -> None:
        """Loads a page of states (a checkpoint's, cut into this server's slices by the worker)."""
        if self.spec is None:
            raise ValueError("optimizer states arrived before any kernel spec")
        entries, at = [], 0
        for key, slc, weight_dtype, n in header["slices"]:
            entries.append((int(key), int(slc), str(weight_dtype), arrays[at:at + int(n)]))
            at += int(n)
        if at != len(arrays):
            raise ValueError(f"the states page names {at} arrays and carries {len(arrays)}")
        counts = {int(k): int(v) for k, v in header.get("counts", {}).items()}
        if header.get("first", True):
            self._use_kernel(self.spec, keep_states=False, keys=self.hyper)  # drops every slice's states
            self.counts = {}
        for key, slc, weight_dtype, states in entries:
            if states:
                self.native.set_states(key, slc, weight_dtype, str(states[0].dtype), states)
        self.counts.update(counts)


def _hyperparameters(keys: dict) -> dict[int, tuple[float, float]]:
    return {int(k): (float(v["lr"]), float(v["wd"])) for k, v in keys.items()}


def _check_spec(spec: dict) -> None:
    """ValueError unless the extension knows the kernel and every field (its own message names the problem)."""
    _p3.num_states(spec, "float32")


def _num_states(spec: dict, dtype: str) -> int:
    try:
        return _p3.num_states(spec, dtype)
    except ValueError:
        return -1
