"""P3Worker: the worker side of P3 on numpy buffers.

    w = P3Worker()                      # job from the P3_* environment (python -m p3kv.launch sets it)
    w.init("fc1_weight", weight)        # worker 0's value becomes everyone's (written into `weight`)
    w.push("fc1_weight", grad, out=weight, priority=-layer)   # returns at once
    w.wait("fc1_weight")                # the servers' broadcast is now in `weight`
    w.close()

Priorities follow MXNet: larger is more urgent, so layer k of the forward pass pushes with priority -k.
Arrays must stay unmodified until their key completes (wait). The worker keeps a reference to them until the core
has released them: also after a wait that timed out, was interrupted (Ctrl-C) or failed, since receivers may
still write a late slice into `out` and the sender may still read `grad`. Passing such an array to another init
or push raises ConfigError instead of letting a late slice overwrite it.
An execution engine's arrays (MXNet's, through the engine bridge) are pushed with `push_engine` instead.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np

from p3kv import _p3
from p3kv.core import node
from p3kv.core.config import Config, Role, load
from p3kv.core.errors import ConfigError
from p3kv.core.keys import key_id

log = logging.getLogger("p3kv.worker")
_string_key_id = functools.lru_cache(maxsize=1 << 16)(key_id)


def _key_id(key: int | str) -> int:
    """key_id, with a string's hash computed once: push, wait and completed() (which p3kv.torch's staging thread
    polls) look a key up several times per key and iteration, and key_id hashes a string byte by byte in Python."""
    return _string_key_id(key) if type(key) is str else key_id(key)


@dataclasses.dataclass
class _Operation:
    """An init or push the core may still read or write through: its arrays stay referenced until `ticket`
    (what the core returned) says released."""
    label: object
    ticket: object
    arrays: tuple
    abandoned: str = ""  # why a wait gave up on it while the core still held its arrays


@dataclasses.dataclass
class _Key:
    name: str
    label: object  # what messages call it: the user's key, or the name given to init
    shape: tuple
    dtype: np.dtype
    in_use: list = dataclasses.field(default_factory=list)  # _Operations not yet released by the core
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
        self._abandoned: list[_Operation] = []  # operations a wait gave up on, until the core releases them
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
        label = key if name is None else name
        self._check_not_abandoned(label, (value, out))
        wire = wire_dtype or value.dtype.name
        k = self._keys[kid] = _Key(str(key), label, value.shape, value.dtype, wire=wire)
        try:
            ticket = self._core.init(kid, str(key), wire, value.reshape(-1), out.reshape(-1))
        except Exception:
            del self._keys[kid]
            raise
        k.in_use.append(_Operation(label, ticket, (value, out)))

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
        self._check_not_abandoned(k.label, (grad, out))
        ticket = self._core.push(_key_id(key), k.wire, grad.reshape(-1), out.reshape(-1), priority)
        # (Pruned here too, so that pushing without waiting keeps only what the core still holds.)
        k.in_use[:] = [op for op in k.in_use if not op.ticket.released]
        k.in_use.append(_Operation(k.label, ticket, (grad, out)))

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
        after `timeout` seconds (default P3_TIMEOUT) naming the servers still owing slices. A rejected operation
        completes only once none of its slices is still queued for another server and no receiver writes into
        its `out`.
        An array stays referenced (and refused by init and push) while the core may still touch it: a wait that
        gave up leaves its operations running.
        """
        timeout = self.config.timeout if timeout is None else timeout
        keys = list(self._keys.values()) if key is None else [self._known(key)]
        try:
            if key is None:
                self._core.wait_all(timeout)
            else:
                self._core.wait(_key_id(key), timeout)
        except BaseException as e:  # KeyboardInterrupt too: the operations go on
            why = str(e).splitlines()[0][:160] if str(e) else ""
            self._release(keys, abandoned=f"{type(e).__name__}: {why}" if why else type(e).__name__)
            raise
        self._release(keys)

    def completed(self, key: int | str) -> bool:
        """Whether the core has completed every operation on `key` (and let go of its arrays): wait(key) then
        returns at once, or raises the operation's error. Never blocks; any thread (p3kv.torch's staging thread
        polls it)."""
        k = self._keys.get(_key_id(key))
        if k is None:
            self._known(key)  # raises, naming the key
        return all(op.ticket.released for op in list(k.in_use))

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
            self._release(list(self._keys.values()))  # the core's threads are gone: nothing is held any more
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
    def _release(self, keys: list, abandoned: str = "") -> None:
        """Drops the arrays of the keys' operations the core released; marks the others `abandoned` (why)."""
        if self._abandoned:
            self._abandoned[:] = [op for op in self._abandoned if not op.ticket.released]
        for k in keys:
            k.in_use[:] = [op for op in k.in_use if not op.ticket.released]
            if abandoned:
                for op in k.in_use:
                    if not op.abandoned:
                        op.abandoned = abandoned
                        self._abandoned.append(op)

    def _check_not_abandoned(self, label, arrays: tuple) -> None:
        """Refuses an array the core may still touch for an operation a wait gave up on: a late slice of that
        operation would silently overwrite it (or the sender would read it while it changes)."""
        if not self._abandoned:
            return
        self._abandoned[:] = [op for op in self._abandoned if not op.ticket.released]
        for op in self._abandoned:
            for mine in arrays:
                if any(np.may_share_memory(mine, theirs) for theirs in op.arrays):
                    raise ConfigError(
                        f"an array given for key {label!r} is still in use by an operation on key {op.label!r} "
                        f"whose wait gave up ({op.abandoned}): the core may still write a late slice into it or "
                        f"send from it. Wait for key {op.label!r} again until it completes, or pass another array")

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
        k = self._keys.get(_key_id(key))
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
