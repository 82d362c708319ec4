"""Runs an MXNet optimizer on the slices a server owns (the paper's server-side update, per slice).

Worker 0 ships the optimizer (as MXNet's dist_sync does). Optimizers with a native kernel (SGD, NAG, Adam,
RMSProp, AdaGrad, AdaDelta, Adamax, Signum, FTRL, FTML: p3kv.mxnet.server_kernels) update every slice in C++ without
the GIL; Python runs once per key and iteration, not per slice, to compute what MXNet computes per parameter
and update (learning rate after the scheduler and lr_mult, wd after wd_mult, the update count, bias
corrections) — so counts, schedules and multipliers work per key, as on a dist_sync server, and the weights
equal dist_sync's. Other optimizers (user-defined ones) run MXNet's own update on each slice, in Python: exact,
but slow (one warning says so). Optimizers whose update is not element-wise, or whose state is shared across
parameters (LARS, LAMB, LBSGD, Nadam), are refused with a message naming update_on_kvstore=False.

A key's update count continues from the optimizer's `_index_update_count` when it arrives (an optimizer saved
with its states, then loaded: Adam's bias correction and lr schedules go on where they were), and GET_STATES
reports the counts so the saved optimizer carries them. SET_HYPERPARAMETERS (a change made on the workers
during training) sets the changed attributes on the optimizer and keeps every slice's state and count.

mxnet is imported only when an optimizer arrives: a server that only aggregates does not need it (p3kv.mxnet.server
imports it in the background at start where it is installed).
"""

from __future__ import annotations

import logging
import pickle

import numpy as np

from p3kv.core import requests
from p3kv.mxnet import server_kernels

log = logging.getLogger("p3kv.server")


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
    """The request handler of a P3Server that runs MXNet optimizers through its SliceOptimizer (`native`)."""

    def __init__(self, native):
        self.native = native  # p3kv._p3.SliceOptimizer, the server's update function
        self.optimizer = None
        self.kernel: dict | None = None  # the kernel's spec while one runs
        # The per-slice MXNet path (optimizers without a kernel):
        self.states: dict = {}  # (key, slice) -> optimizer state of that slice
        self.base_counts: dict = {}  # key -> updates done before this optimizer arrived (its _index_update_count)
        self.updates: dict = {}  # (key, slice) -> updates this optimizer made to the slice

    # -- control requests (the server's consumer thread) -------------------------------------------------
    def on_request(self, kind: int, body: bytes) -> bytes:
        if kind == requests.SET_OPTIMIZER:
            self._set_optimizer(self._unpickle(body))
            return b""
        if kind == requests.GET_STATES:
            page = pickle.loads(body) if body else {}
            return pickle.dumps(self._get_states(page.get("start", 0), page.get("max_bytes")), protocol=4)
        if kind == requests.SET_STATES:
            page = pickle.loads(body)
            if "states" in page:
                self._set_states(page["states"], replace=page.get("first", True))
            else:  # the whole states in one request
                self._set_states(page, replace=True)
            return b""
        if kind == requests.SET_HYPERPARAMETERS:
            self._set_hyperparameters(pickle.loads(body))
            return b""
        raise ValueError(f"unknown request type {kind}")

    @staticmethod
    def _unpickle(body: bytes):
        import mxnet  # noqa: F401  (unpickling needs the optimizer classes)

        try:
            return pickle.loads(body)
        except (AttributeError, ImportError) as e:
            # A custom optimizer class defined in the training script pickles as __main__.Name.
            raise ValueError(f"cannot unpickle the optimizer on this server ({e}): its class must be importable "
                             "here; define it in a module on the servers' PYTHONPATH, not in the training "
                             "script") from e

    def _set_optimizer(self, optimizer) -> None:
        """A new optimizer. If it keeps the same state per weight as the current one (the same kernel and state
        layout, or the same class without a kernel), the slices keep their states: shipping an optimizer again
        changes its hyperparameters and update counts (Sockeye's entry point does so at checkpoints; states saved
        earlier come back with SET_STATES). Otherwise the states are dropped, as MXNet's dist_sync servers do."""
        spec = server_kernels.kernel_spec(optimizer)  # raises ValueError for optimizers refused on servers
        keep = self._same_state_layout(optimizer, spec)
        previous = self.optimizer
        self.optimizer = optimizer
        self.updates = {}
        self.base_counts = dict(optimizer._index_update_count)
        name = type(optimizer).__name__
        if spec is not None:
            self.states = {}
            if keep:
                self._use_kernel_keeping_states(spec)
            else:
                self.native.use_kernel(spec, self._step)
            self.kernel = spec
            log.info("server optimizer: %s (native kernel, %s)%s", name, spec["kind"],
                     ", slices' states kept" if keep else "")
            return
        self.kernel = None
        if not keep:
            self.states = {}
        self.native.use_function(self.update)
        if keep and previous is not None:
            return  # warned when this optimizer class arrived
        log.warning("server optimizer: %s has no native kernel, so this server runs MXNet's update in Python "
                    "for every slice (GIL, an engine call and a wait per slice; typically several times slower "
                    "per iteration than a kernel). Use one of %s, or update_on_kvstore=False to update on the "
                    "workers", name, ", ".join(server_kernels.KERNEL_OPTIMIZERS))

    def _same_state_layout(self, optimizer, spec: dict | None) -> bool:
        if self.optimizer is None:
            return False
        if spec is None or self.kernel is None:
            return spec is None and self.kernel is None and type(optimizer) is type(self.optimizer)
        return all(spec.get(k) == self.kernel.get(k) for k in ("kind", "multi_precision")) and all(
            _p3_num_states(spec, d) == _p3_num_states(self.kernel, d) for d in ("float32", "float16"))

    def _use_kernel_keeping_states(self, spec: dict) -> None:
        kept = {(key, slc): self.native.states(key, slc) for key, slc in self.native.slices()}
        self.native.use_kernel(spec, self._step)  # drops states and cached steps
        for (key, slc), held in kept.items():
            if held is not None and held[1]:
                weight_dtype, arrays = held
                self.native.set_states(key, slc, weight_dtype, str(arrays[0].dtype), arrays)

    def _set_hyperparameters(self, hyper: dict) -> None:
        """A change made on the workers during training (trainer.set_learning_rate, opt.wd = ...): applied to
        this optimizer, keeping every slice's state and every key's update count (the per-key values — lr, wd,
        rescale, clipping, multipliers — are read from the optimizer at each key's next update)."""
        if self.optimizer is None:
            raise ValueError("optimizer hyperparameters arrived before any optimizer")
        opt = self.optimizer
        for name, value in hyper.items():
            if name in ("lr_mult", "wd_mult"):
                getattr(opt, name).clear()
                getattr(opt, name).update(value)
            else:
                setattr(opt, name, value)
        if self.kernel is None:
            return  # MXNet's own update reads the optimizer's attributes at every call
        spec = server_kernels.kernel_spec(opt)
        if spec == self.kernel:
            return
        # Attributes the kernel holds (momentum, betas, epsilon, ...): a new kernel, with the slices' states.
        if spec is None or any(spec.get(k) != self.kernel.get(k) for k in ("kind", "multi_precision")) or \
                any(_p3_num_states(spec, d) != _p3_num_states(self.kernel, d) for d in ("float32", "float16")):
            raise ValueError(f"the optimizer's change ({', '.join(sorted(hyper))}) changes the state it keeps per "
                             f"weight ({self.kernel} -> {spec}); the servers cannot convert slices' states. Set it "
                             "before training starts, or use update_on_kvstore=False")
        self._use_kernel_keeping_states(spec)
        self.kernel = spec
        log.info("server optimizer: kernel settings changed to %s (slices' states kept)", spec)

    def _step(self, key: int) -> tuple:
        """Once per key and iteration: what MXNet computes per parameter and update."""
        return server_kernels.step_params(self.optimizer, key)

    def _get_states(self, start: int = 0, max_bytes: int | None = None) -> dict:
        """The states of the slices from index `start` (in (key, slice) order) on, as many as fit in `max_bytes`
        (estimated; at least one; None: all), with "next" the index to ask for next (None at the end)."""
        if self.kernel is None:
            indices = sorted(self.states)
            state_of = lambda index: _to_numpy(self.states[index])  # noqa: E731
            counts = {**self.base_counts, **{key: self._count(key, slc) for key, slc in self.updates}}
        else:
            indices = sorted(self.native.slices())
            templates: dict = {}

            def state_of(index):
                weight_dtype, arrays = self.native.states(*index)
                if (index[0], weight_dtype) not in templates:
                    templates[(index[0], weight_dtype)] = server_kernels.state_template(self.optimizer, weight_dtype,
                                                                                         index[0])
                return _to_numpy(server_kernels.unflatten_state(templates[(index[0], weight_dtype)], arrays))
            counts = dict(self.optimizer._index_update_count)
        states: dict = {}
        size = 0
        position = start
        while position < len(indices):
            state = state_of(indices[position])
            n = requests.state_bytes(state)
            if states and max_bytes is not None and size + n > max_bytes:
                break
            states[indices[position]] = state
            size += n
            position += 1
        return {"states": states, "counts": counts, "next": position if position < len(indices) else None}

    def _set_states(self, states: dict, replace: bool = True) -> None:
        """Loads a page of states; `replace` (the first page) drops the states this server had (the per-slice
        MXNet path; a kernel's states are overwritten slice by slice)."""
        if self.kernel is None:
            if replace:
                self.states = {}
            self.states.update({k: _to_ndarray(s) for k, s in states.items()})
            return
        for (key, slc), state in states.items():
            arrays = [np.ascontiguousarray(a) for a in server_kernels.flatten_state(state)]
            if not arrays:
                continue  # a stateless optimizer (SGD without momentum)
            weight_dtype = _weight_dtype(self.kernel, arrays)
            self.native.set_states(key, slc, weight_dtype, str(arrays[0].dtype), arrays)

    # -- the per-slice MXNet path ------------------------------------------------------------------------
    def update(self, key: int, slc: int, offset: int, iteration: int, aggregated: np.ndarray,
               value: np.ndarray) -> None:
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


def _p3_num_states(spec: dict, weight_dtype: str) -> int:
    from p3kv import _p3

    try:
        return _p3.num_states(spec, weight_dtype)
    except Exception:  # noqa: BLE001  (a kernel that refuses this weight type: no states either way)
        return -1


def _weight_dtype(spec: dict, arrays: list) -> str:
    """The weights' dtype of a slice whose states are `arrays` (float32 states under multi_precision belong to
    float16 weights when the state list includes the master copy)."""
    dtype = str(arrays[0].dtype)
    if spec.get("multi_precision") and dtype == "float32":
        from p3kv import _p3

        if _p3.num_states(spec, "float16") == len(arrays) != _p3.num_states(spec, "float32"):
            return "float16"
    return dtype
