"""Runs an MXNet optimizer on the slices a server owns (the paper's server-side update, per slice).

Worker 0 ships the optimizer (as MXNet's dist_sync does). Optimizers with a native kernel (SGD, NAG, Adam,
RMSProp, AdaGrad, AdaDelta, Adamax, Signum, FTRL, FTML: p3kv.mxnet.server_kernels) update every slice in C++ without
the GIL; Python runs once per key and iteration, not per slice, to compute what MXNet computes per parameter
and update (learning rate after the scheduler and lr_mult, wd after wd_mult, the update count, bias
corrections) — so counts, schedules and multipliers work per key, as on a dist_sync server, and the weights
equal dist_sync's. Other optimizers (user-defined ones) run MXNet's own update on each slice, in Python: exact,
but slow (one warning says so). Optimizers whose update is not element-wise, or whose state is shared across
parameters (LARS, LAMB, LBSGD, Nadam), are refused with a message naming update_on_kvstore=False.

A new optimizer (SET_OPTIMIZER) drops every slice's state, as MXNet's dist_sync servers do (they build a new
Updater), and each key's update count continues from the optimizer's `_index_update_count` (else its
begin_num_update): an optimizer saved with its states, then loaded, goes on where it was (Adam's bias
correction, lr schedules), and GET_STATES reports the counts so the saved optimizer carries them. The float32
copy of float16 weights under multi_precision is the weights, not a state: it stays (dist_sync keeps it too).
With keep_states (kvstore 'p3''s set_optimizer(optimizer, keep_states=True)), a changed copy of the same
optimizer continues instead: every slice keeps its state and each key's count is the larger of the server's and
the optimizer's. SET_HYPERPARAMETERS (a change made on the workers during training) sets the changed attributes
on the optimizer and keeps every slice's state and count. Every request that changes the optimizer or its states
arrives between two iterations (the workers drain their pushes first); the SliceOptimizer refuses a new kernel
while a key is partly updated.

Known difference (documented, not fixed): MXNet's lr_scheduler reads `num_update`, the largest count over the
keys an optimizer object has updated. Each server has its own copy and sees only the keys it holds slices of, so
when keys' counts differ (a parameter frozen for a while, a key added later, per-key counts loaded from a
checkpoint) two servers can be on either side of a schedule boundary for one key: its slices then get different
learning rates for that update. With every key updated once per step (ordinary training) the counts agree.

mxnet is imported only when an optimizer arrives: a server that only aggregates does not need it (p3kv.mxnet.server
imports it in the background at start where it is installed).
"""

from __future__ import annotations

import copy
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
        # float16 slices under multi_precision: MXNet's state holds the float32 copy of the weights at position
        # `master_at` (base Optimizer: (master, state); SGD, NAG: (state, master)); the update changes it from the
        # float32 sum, as dist_sync's server does. `kept_masters`: those copies across a new optimizer.
        self.half: set = set()  # (key, slice) of float16 slices
        self.kept_masters: dict = {}
        self.master_at: int | None = None
        self.base_counts: dict = {}  # key -> updates done before this optimizer arrived (its _index_update_count)
        self.updates: dict = {}  # (key, slice) -> updates this optimizer made to the slice

    # -- control requests (the server's consumer thread) -------------------------------------------------
    def on_request(self, kind: int, body: bytes) -> bytes:
        if kind == requests.SET_OPTIMIZER:
            shipped = self._unpickle(body)
            if isinstance(shipped, dict):  # {"optimizer": ..., "keep_states": True}
                self._set_optimizer(shipped["optimizer"], keep_states=bool(shipped.get("keep_states")))
            else:
                self._set_optimizer(shipped)
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

    def _set_optimizer(self, optimizer, keep_states: bool = False) -> None:
        """A new optimizer. Drops every slice's state (MXNet's dist_sync builds a new Updater) but not the float32
        copy of float16 weights; the update counts are the optimizer's. keep_states: a changed copy of the same
        optimizer (Sockeye's entry point ships it at checkpoints): every slice keeps its state, and each key's
        count is the larger of this server's and the optimizer's; refused if the states per weight differ."""
        spec = server_kernels.kernel_spec(optimizer)  # raises ValueError for optimizers refused on servers
        keep = keep_states and self.optimizer is not None
        if keep and not self._same_state_layout(optimizer, spec):
            raise ValueError(f"set_optimizer(keep_states=True): {type(optimizer).__name__} "
                             f"({spec['kind'] if spec else 'no kernel'}) keeps other states per weight than the "
                             f"current {type(self.optimizer).__name__} ({self.kernel or 'no kernel'}); the servers "
                             "cannot convert slices' states: ship it without keep_states (states start afresh)")
        counts = self._counts() if keep else {}
        masters = {}  # MXNet's dist_sync keeps its float32 copy of the weights (not a state) across a new optimizer
        if not keep and spec is None and optimizer.multi_precision and self.optimizer is not None and \
                self.kernel is None and self.master_at is not None and self.master_at >= 0:
            masters = {index: self.states[index][self.master_at] for index in self.half
                       if isinstance(self.states.get(index), (tuple, list))}
        # The native side first: it refuses while a key is partly updated, and then nothing here has changed.
        if spec is not None:
            self.native.use_kernel(spec, self._step, keep_states=keep)
        else:
            self.native.use_function(self.update, exact_sum=bool(optimizer.multi_precision))
        previous = self.optimizer
        self.optimizer = optimizer
        self.kernel = spec
        for key, done in counts.items():
            optimizer._index_update_count[key] = max(done, optimizer._index_update_count.get(
                key, optimizer.begin_num_update))
            optimizer.num_update = max(optimizer.num_update, optimizer._index_update_count[key])
        self.base_counts = dict(optimizer._index_update_count)
        self.updates = {}
        if spec is not None or not keep:
            self.kept_masters = masters
            self.states = {}
        self.master_at = None
        name = type(optimizer).__name__
        if spec is not None:
            log.info("server optimizer: %s (native kernel, %s)%s", name, spec["kind"],
                     ", slices' states kept" if keep else "")
            return
        if keep and previous is not None:
            return  # warned when this optimizer class arrived
        log.warning("server optimizer: %s has no native kernel, so this server runs MXNet's update in Python "
                    "for every slice (GIL, an engine call and a wait per slice; typically several times slower "
                    "per iteration than a kernel). Use one of %s, or update_on_kvstore=False to update on the "
                    "workers", name, ", ".join(server_kernels.KERNEL_OPTIMIZERS))

    def _counts(self) -> dict:
        """Every key's update count on this server."""
        if self.kernel is not None:
            return dict(self.optimizer._index_update_count)
        return {**self.base_counts, **{key: self._count(key, slc) for key, slc in self.updates}}

    def _same_state_layout(self, optimizer, spec: dict | None) -> bool:
        if self.optimizer is None:
            return False
        if spec is None or self.kernel is None:
            return spec is None and self.kernel is None and type(optimizer) is type(self.optimizer)
        return all(spec.get(k) == self.kernel.get(k) for k in ("kind", "multi_precision")) and all(
            _p3_num_states(spec, d) == _p3_num_states(self.kernel, d) for d in ("float32", "float16"))

    def _set_hyperparameters(self, hyper: dict) -> None:
        """A change made on the workers during training (trainer.set_learning_rate, opt.wd = ...): applied to
        this optimizer, keeping every slice's state and every key's update count (the per-key values — lr, wd,
        rescale, clipping, multipliers — are read from the optimizer at each key's next update). Checked on a copy
        first: a change the servers refuse leaves the optimizer as it was."""
        if self.optimizer is None:
            raise ValueError("optimizer hyperparameters arrived before any optimizer")
        changed = copy.copy(self.optimizer)  # shares the update counts and the lr scheduler
        for name, value in hyper.items():
            setattr(changed, name, dict(value) if name in ("lr_mult", "wd_mult") else value)
        if self.kernel is not None:
            spec = server_kernels.kernel_spec(changed)
            if spec != self.kernel:
                # Attributes the kernel holds (momentum, betas, epsilon, ...): a new kernel, with the slices' states.
                if spec is None or any(spec.get(k) != self.kernel.get(k) for k in ("kind", "multi_precision")) or \
                        any(_p3_num_states(spec, d) != _p3_num_states(self.kernel, d) for d in ("float32", "float16")):
                    raise ValueError(f"the optimizer's change ({', '.join(sorted(hyper))}) changes the state it keeps "
                                     f"per weight ({self.kernel} -> {spec}); the servers cannot convert slices' "
                                     "states. Set it before training starts, or use update_on_kvstore=False")
                self.native.use_kernel(spec, self._step, keep_states=True)
                self.kernel = spec
                log.info("server optimizer: kernel settings changed to %s (slices' states kept)", spec)
        self.optimizer = changed

    def _step(self, key: int) -> tuple:
        """Once per key and iteration: what MXNet computes per parameter and update."""
        return server_kernels.step_params(self.optimizer, key)

    def _get_states(self, start: int = 0, max_bytes: int | None = None) -> dict:
        """The states of the slices from index `start` (in (key, slice) order) on, as many as fit in `max_bytes`
        (estimated; at least one; None: all), with "next" the index to ask for next (None at the end)."""
        if self.kernel is None:
            indices = sorted(self.states)
            state_of = lambda index: _to_numpy(self.states[index])  # noqa: E731
            counts = self._counts()
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
                self.kept_masters = {}
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
        """MXNet's update of one slice, as a dist_sync server runs it on the whole array. `aggregated` is the
        float32 sum for float16 slices under multi_precision (use_function(exact_sum=True)): the float32 copy
        of the weights is updated from it unrounded, then cast into `value`, as dist_sync's server does."""
        import mxnet as mx

        opt = self.optimizer
        index = (key, slc)
        # Zero-copy views of the server's buffers: the update writes the new weights straight into `value`.
        weight = mx.nd.from_numpy(value, zero_copy=True)
        grad = mx.nd.from_numpy(aggregated, zero_copy=True)
        if index not in self.states:
            self.states[index] = opt.create_state_multi_precision(key, weight)
            kept = self.kept_masters.pop(index, None)
            if kept is not None and self._master_at(key) is not None:
                kept.copyto(self.states[index][self.master_at])
        state = self.states[index]
        master_at = self._master_at(key) if value.dtype == np.float16 and opt.multi_precision else None
        # Every slice of a key is the same update of the same parameter: give each the key's count, so that
        # bias corrections (Adam) and learning-rate schedules advance once per iteration, not per slice.
        opt._index_update_count[key] = self._count(key, slc)
        if master_at is None:
            if grad.dtype != weight.dtype:
                grad = grad.astype(weight.dtype)
            opt.update_multi_precision(key, weight, grad, state)
        else:
            # What MXNet's Optimizer.update_multi_precision does with float16 weights, but from the float32 sum
            # (dist_sync's server: a float32 weight updated with the float32 sum), not the sum rounded to float16.
            self.half.add(index)
            master, inner = state[master_at], state[1 - master_at]
            opt.update_multi_precision(key, master, grad.astype(np.float32, copy=False), inner)
            master.astype(np.float16).copyto(weight)
        self.updates[index] = self.updates.get(index, 0) + 1
        # Both views are of the server's buffers, which it reuses once this returns: wait for every engine
        # operation that reads or writes either (an operation reading `grad` may be queued after the weight's
        # last write, e.g. a state updated from the gradient), not only for the weight's writes.
        _wait_to_write(weight)
        _wait_to_write(grad)

    def _master_at(self, key: int) -> int | None:
        """Where this optimizer's multi_precision state keeps the float32 copy of float16 weights (0 or 1), or
        None where it does not look like MXNet's (a custom create_state_multi_precision: MXNet's own update on
        the float16 sum then)."""
        import mxnet as mx

        if self.master_at is None:
            probe = self.optimizer.create_state_multi_precision(key, mx.nd.full((1,), 1.5, dtype=np.float16))
            found = [i for i, s in enumerate(probe) if isinstance(s, mx.nd.NDArray) and s.dtype == np.float32 and
                     s.asnumpy().tolist() == [1.5]] if isinstance(probe, (tuple, list)) and len(probe) == 2 else []
            self.master_at = found[0] if len(found) == 1 else -1
        return None if self.master_at < 0 else self.master_at

    def _count(self, key: int, slc: int) -> int:
        """Updates of `key` done so far, as the slice `slc` has seen them."""
        return self.base_counts.get(key, self.optimizer.begin_num_update) + self.updates.get((key, slc), 0)


def _wait_to_write(array) -> None:
    """Until no engine operation reads or writes `array` (NDArray has wait_to_read only in Python)."""
    from mxnet.base import _LIB, check_call

    check_call(_LIB.MXNDArrayWaitToWrite(array.handle))


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
