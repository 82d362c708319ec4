"""P3Worker: the worker side of P3 on numpy buffers.

    w = P3Worker()                      # job from the P3_* environment (python -m p3kv.launch sets it)
    w.init("fc1_weight", weight)        # worker 0's value becomes everyone's (written into `weight`)
    w.push("fc1_weight", grad, out=weight, priority=-layer)   # returns at once
    w.wait("fc1_weight")                # the servers' broadcast is now in `weight`
    w.close()

Priorities follow MXNet: larger is more urgent, so layer k of the forward pass pushes with priority -k.
Arrays must stay alive and unmodified until their key completes (wait); the worker keeps a reference.
An execution engine's arrays (MXNet's, through the engine bridge) are pushed with `push_engine` instead.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from p3kv import _p3
from p3kv.core import node
from p3kv.core.config import Config, Role, load
from p3kv.core.errors import ConfigError
from p3kv.core.keys import key_id

log = logging.getLogger("p3kv.worker")


@dataclasses.dataclass
class _Key:
    name: str
    label: object  # what messages call it: the user's key, or the name given to init
    shape: tuple
    dtype: np.dtype
    in_use: list  # arrays the core reads or writes until the key's operations complete
    wire: str = ""  # the core's element type, when numpy has none for it ("bfloat16" carried as uint16)


class P3Worker:
    """A worker process's connection to the job. Thread-safe; one per process is the normal use."""

    def __init__(self, config: Config | None = None, **overrides):
        """Joins the job (blocks until every node registered, up to P3_CONNECT_TIMEOUT).

        `overrides` replace environment settings by field name, e.g. slice_size=40000, timeout=30.
        """
        self.config = config if config is not None else load(role=Role.WORKER, **overrides)
        node.configure_logging(self.config)
        self._core = _p3.Worker(node.node_config(self.config))
        self._core.start()
        if self.config.joined_file:
            node.mark_joined(self.config.joined_file)
        self._keys: dict[int, _Key] = {}
        self._closed = False
        log.info("worker %d of %d joined (%d servers, slice size %d)", self.rank, self.num_workers,
                 self.num_servers, self.config.slice_size)

    # -- job facts ---------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def num_workers(self) -> int:
        return self._core.num_workers

    @property
    def num_servers(self) -> int:
        return self._core.num_servers

    @property
    def slice_size(self) -> int:
        return self.config.slice_size

    # -- operations --------------------------------------------------------------------------------------
    def init(self, key: int | str, value: np.ndarray, out: np.ndarray | None = None, name: str | None = None,
             wire_dtype: str | None = None) -> None:
        """Declares `key` and starts its initialisation; non-blocking.

        Worker 0's `value` becomes the value on the servers and is written into `out` (default: `value`
        itself) on every worker, so all workers start equal. Every worker must init the same keys, with the
        same shapes and dtypes, in the same order. `name` is what error messages call the key (default: the
        key itself; the MXNet adapter passes Module's parameter names for its numbered keys). `wire_dtype` names an
        element type numpy lacks: "bfloat16", whose arrays are uint16 views of the bits (p3kv.torch).
        """
        kid = key_id(key)
        if kid in self._keys:
            other = self._keys[kid].name
            what = "is already initialised" if other == str(key) else f"collides with key {other!r}"
            raise ConfigError(f"key {key!r} {what}")
        value = np.asarray(value)
        out = value if out is None else out
        self._check_out(key, out, value.shape, value.dtype)
        if not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        wire = wire_dtype or value.dtype.name
        self._keys[kid] = _Key(str(key), key if name is None else name, value.shape, value.dtype, [value, out], wire)
        try:
            self._core.init(kid, str(key), wire, value.reshape(-1), out.reshape(-1))
        except Exception:
            del self._keys[kid]
            raise

    def push(self, key: int | str, grad: np.ndarray, out: np.ndarray | None = None, priority: int = 0) -> None:
        """Sends `grad` slice by slice, most urgent first; non-blocking.

        The servers aggregate every worker's gradient, apply their update function and broadcast the
        result, which is written into `out` (default: `grad`, in place) as it arrives.
        """
        k = self._known(key)
        grad = np.asarray(grad)
        self._check_gradient(k, grad)
        if not grad.flags.c_contiguous:
            grad = np.ascontiguousarray(grad)
        out = grad if out is None else out
        self._check_out(k.label, out, k.shape, k.dtype)
        priority = self._send_priority(priority)
        k.in_use += [grad, out]
        self._core.push(key_id(key), k.wire, grad.reshape(-1), out.reshape(-1), priority)

    def push_engine(self, key: int | str, grad, out, engine, priority: int = 0) -> None:
        """`push` of an execution engine's arrays, as one engine operation; non-blocking.

        The operation starts when the engine has written `grad` and completes when the servers' broadcast of the
        key's last slice is in `out` (which may be `grad`): engine ops that read `out` wait for exactly this
        key. `grad` and `out` are engine arrays with `shape`, `dtype` and `handle.value` (MXNet NDArrays);
        `engine` is a loaded p3kv._p3.EngineBridge. The engine keeps them alive; `push`'s checks apply.
        Any thread.
        """
        self.check_arrays(key, [grad], [out])
        engine.push_pull(self._core, key_id(key), grad.handle.value, out.handle.value, self._send_priority(priority))

    def wait(self, key: int | str | None = None, timeout: float | None = None) -> None:
        """Blocks until every operation on `key` (all keys if None) completed.

        Raises P3Error naming the cause (a server rejected the request, a node died) or P3TimeoutError
        after `timeout` seconds (default P3_TIMEOUT) naming the servers still owing slices.
        """
        timeout = self.config.timeout if timeout is None else timeout
        if key is None:
            try:
                self._core.wait_all(timeout)
            finally:
                for k in self._keys.values():
                    k.in_use.clear()
            return
        k = self._known(key)
        try:
            self._core.wait(key_id(key), timeout)
        finally:
            k.in_use.clear()

    def barrier(self, timeout: float | None = None) -> None:
        """Blocks until every worker reached the barrier."""
        self._core.barrier(self.config.timeout if timeout is None else timeout)

    def request(self, server: int, kind: int, body: bytes, timeout: float | None = None) -> bytes:
        """Sends a control request (see p3kv.core.requests) to one server and returns its reply."""
        return self._core.request(server, kind, body, self.config.timeout if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Waits for outstanding operations, then leaves the job cleanly. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._core.close(self.config.timeout if timeout is None else timeout)
        finally:
            if self.config.trace:
                path = node.write_trace(self.config.trace, "worker", self.rank, self._core.trace(),
                                        self._core.trace_dropped())
                log.info("trace written to %s", path)

    def check_arrays(self, key: int | str, grads=(), outs=()) -> None:
        """Raises ConfigError unless every gradient and every out array (numpy or engine arrays: anything with
        `shape` and `dtype`) has the shape and dtype `key` was initialised with. Any thread."""
        k = self._known(key)
        for grad in grads:
            self._check_gradient(k, grad)
        for out in outs:
            if tuple(out.shape) != k.shape or np.dtype(out.dtype) != k.dtype:
                # An engine operation writes the key's whole size into `out`, whatever its shape.
                raise ConfigError(f"out for key {k.label!r} has shape {tuple(out.shape)} and dtype "
                                  f"{np.dtype(out.dtype)}; expected {k.shape} and {k.dtype}")

    # -- introspection ----------------------------------------------------------------------------------
    def counters(self) -> dict:
        """Frames and bytes sent/received per command (e.g. counters()['sent']['PUSH'])."""
        return self._core.counters()

    def trace_events(self) -> list:
        """Recorded events (time_ns, event, key_id, slice, priority, iteration, peer); needs P3_TRACE/trace=."""
        return self._core.trace()

    def slices(self, key: int | str) -> list:
        """The slices of a key: [(index, offset, count, server)]."""
        self._known(key)
        return self._core.slices(key_id(key))

    def __enter__(self) -> P3Worker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            # Leaving on an exception: do not wait; the core's destructor drops the connections.
            self._closed = True

    # -- helpers -----------------------------------------------------------------------------------------
    def _check_gradient(self, k: _Key, grad) -> None:
        if tuple(grad.shape) != k.shape or np.dtype(grad.dtype) != k.dtype:
            raise ConfigError(f"push of key {k.label!r}: gradient has shape {tuple(grad.shape)} and dtype "
                              f"{np.dtype(grad.dtype)}, but the key was initialised with shape {k.shape} and dtype "
                              f"{k.dtype}")

    def _send_priority(self, priority: int) -> int:
        if not -(2**31) <= priority < 2**31:
            raise ConfigError(f"priority {priority} does not fit in 32 bits")
        if self.config.priority == "none":
            return 0  # every slice equally urgent: the send queue degenerates to FIFO
        return int(priority)

    def _known(self, key: int | str) -> _Key:
        k = self._keys.get(key_id(key))
        if k is None:
            raise ConfigError(f"key {key!r} is unknown: call init({key!r}, value) first")
        return k

    @staticmethod
    def _check_out(key, out: np.ndarray, shape: tuple, dtype: np.dtype) -> None:
        if not isinstance(out, np.ndarray):
            raise ConfigError(f"out for key {key!r} must be a numpy array, not {type(out).__name__}")
        if out.shape != shape or out.dtype != dtype:
            raise ConfigError(f"out for key {key!r} has shape {out.shape} and dtype {out.dtype}; expected {shape} "
                              f"and {dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ConfigError(f"out for key {key!r} must be a writable C-contiguous array")
