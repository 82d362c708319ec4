"""`kvstore='p3'` for MXNet: the thin adapter between MXNet's KVStore API and P3Worker.

    import p3kv                                   # registers 'p3' (also when mxnet is imported later)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore='p3')
    mod.fit(..., kvstore='p3')

What it does, and why:
- `pushpull` returns at once. It pushes an MXNet engine operation (cpp/mxnet/engine_bridge.cc) that reads
  the gradient and writes the parameter: the engine starts it the moment backward has written that gradient,
  and it completes when the servers' broadcast of the key's last slice has arrived, so the next forward of
  layer k waits for layer k only. Nothing here waits on the training path.
- Priorities follow the forward pass. Gluon numbers keys alphabetically (bias before weight, dense10
  before dense4), so the key order says nothing: the adapter watches the order in which the forward pass
  reads the parameters (p3kv.mxnet.forward_order) and gives the k-th parameter priority -k. Module's keys are in
  forward order already. Pushes start layer by layer during backward only with
  MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD=1 (the launcher sets it for workers unless you set it).
- update_on_kvstore=True (the default, as in the paper): worker 0 ships the optimizer and servers update
  each slice (p3kv.mxnet.optimizer_host). False: servers broadcast the summed gradient. A later change of the
  workers' optimizer (trainer.set_learning_rate, opt.wd = ..., lr_mult, a new batch size in trainer.step)
  is seen at the next step's first push and carried to the servers before that step's updates (MXNet's
  dist_sync never carries it). The lr scheduler is not compared: it runs on the servers.
- type is 'p3' (MXNet's convention); p3kv.mxnet.hook makes Gluon and Module treat it as dist_sync.
- Sparse arrays (row_sparse, csr) are refused: P3 sends every array dense, slice by slice.
- `out` may be the gradient or any view of it (g.reshape(...), g[:], g.detach()): one engine variable, updated in
  place. An `out` overlapping only part of the gradient fails that pushpull (MXNetError at the next wait).
- Every pushpull pushes once, also when MXNet skips it because an operation its gradient depends on failed (the
  script sees that error at its next wait and may train on): zeros go in place of the gradient, so this worker
  stays at the others' iteration and that iteration's result lacks this worker's gradient (a warning names the key).
- String keys (Module) are numbered in init order, as MXNet does, so optimizer indices match idx2name.
- Arrays on GPUs, or several devices per worker, are staged through one CPU buffer per key (local sum,
  then the result copied to every device), all as engine operations.
- Optimizer states: p3kv.mxnet.checkpoint; the optimizer the servers get: p3kv.mxnet.shipped_optimizer.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import pickle

import mxnet as mx
import numpy as np

from p3kv import _p3
from p3kv.core import config, requests
from p3kv.core.config import BULK_VARIABLE, Role
from p3kv.core.errors import ConfigError, P3Error, UnsupportedRequest
from p3kv.core.worker import P3Worker
from p3kv.mxnet import checkpoint, hook, server_kernels
from p3kv.mxnet.forward_order import ForwardOrder
from p3kv.mxnet.shipped_optimizer import hyperparameters, server_copy

log = logging.getLogger("p3kv.kvstore")

P3_TYPE = "p3"


class _Key:
    """What the adapter knows of one key."""

    def __init__(self, index: int, name, shape: tuple, dtype):
        self.index = index  # the core's key id and the optimizer's parameter index
        self.name = name
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.staging: mx.nd.NDArray | None = None  # CPU buffer for GPU or multi-device values
        self.latest: mx.nd.NDArray | None = None  # array holding the last broadcast (for pull)


@mx.kvstore.KVStoreBase.register
class P3(mx.kvstore.KVStoreBase):
    """MXNet KVStore backed by p3kv. Create it with kvstore='p3' (or mx.kv.create('p3')) in a worker started
    by `python -m p3kv.launch` (or with the P3_* environment set)."""

    def __init__(self):
        role = config.get("P3_ROLE") or Role.WORKER.value
        if role != Role.WORKER.value:
            raise ConfigError(f"kvstore 'p3' is created in a process with P3_ROLE={role}; only workers create it")
        if config.get("P3_ROOT_URI") is None:
            raise ConfigError("kvstore 'p3' needs a p3kv job: start the script with python -m p3kv.launch -n W -s S "
                              "-- python train.py (or set P3_ROLE, P3_ROOT_URI, P3_ROOT_PORT, P3_NUM_WORKER, "
                              "P3_NUM_SERVER)")
        if config.get(BULK_VARIABLE) != "1":
            log.warning("%s is not 1: MXNet releases gradients in bulk at the end of backward, so pushes cannot "
                        "start layer by layer (python -m p3kv.launch sets it for you)", BULK_VARIABLE)
        self._worker = P3Worker()
        self._bridge = _p3.EngineBridge.load(mx.libinfo.find_lib_path()[0])
        self._keys: dict[object, _Key] = {}
        self._order = ForwardOrder()  # this kvstore's: Gluon's forward pass reports to it through the hook
        hook.watch_forward_pass(self._order)
        self._optimizer = None
        self._updater = None  # Trainer.load_states reads kv._updater.optimizer
        self._seen_as: str | None = None  # see mxnet_sees_dist_sync
        self._hyper: dict | None = None  # the optimizer's hyperparameters as the servers have them
        self._pushed: set = set()  # keys pushed in this step (a key pushed again starts the next step)
        self._closed = False
        atexit.register(self._close_at_exit)

    # -- facts -----------------------------------------------------------------------------------------
    @property
    def type(self) -> str:
        # MXNet's convention for a registered KVStoreBase: its name. Gluon and Module decide "distributed" by
        # 'dist' in kv.type; p3kv.mxnet.hook makes those code paths treat 'p3' as dist_sync.
        return self._seen_as or P3_TYPE

    @contextlib.contextmanager
    def mxnet_sees_dist_sync(self):
        """While MXNet's own Gluon/Module code decides how to treat this kvstore (p3kv.mxnet.hook), its type
        reads 'dist_sync', so that code takes dist_sync's branches: P3 is synchronous distributed SGD."""
        before, self._seen_as = self._seen_as, "dist_sync"
        try:
            yield
        finally:
            self._seen_as = before

    @property
    def rank(self) -> int:
        return self._worker.rank

    @property
    def num_workers(self) -> int:
        return self._worker.num_workers

    @staticmethod
    def is_capable(capability: str) -> bool:
        if capability.lower() == mx.kvstore.KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"unknown capability: {capability}")

    @property
    def worker(self) -> P3Worker:
        """The underlying P3Worker (counters, trace)."""
        return self._worker

    # -- initialisation --------------------------------------------------------------------------------
    def init(self, key, value) -> None:
        """Declares keys; worker 0's values become every worker's (blocks until the servers have them)."""
        for k, v in zip(*_pairs(key, value)):
            self._init_one(k, _first(v), [])

    def broadcast(self, key, value, out, priority=0) -> None:
        """Declares keys with worker 0's value and writes that value into every array of `out`."""
        keys, values = _pairs(key, value)
        outs = _pairs(key, out)[1]
        for k, v, o in zip(keys, values, outs):
            self._init_one(k, _first(v), _as_list(o))

    def _init_one(self, key, value: mx.nd.NDArray, outs: list) -> None:
        if key in self._keys:
            raise ConfigError(f"key {key!r} is already initialised on kvstore 'p3'")
        if not isinstance(key, (int, str)):
            raise ConfigError(f"kvstore key {key!r} must be an int or a str")
        if self._keys and type(key) is not type(next(iter(self._keys))):
            raise ConfigError("kvstore 'p3' keys must be all ints (Gluon) or all strs (Module)")
        _refuse_sparse(key, [value, *outs], "init")
        index = key if isinstance(key, int) else len(self._keys)  # MXNet numbers str keys in init order
        info = _Key(index, key, tuple(value.shape), value.dtype)
        data = value.asnumpy()  # init is not on the training path: a synchronous copy is fine
        self._worker.init(index, data, name=key)
        self._worker.wait(index)
        self._keys[key] = info
        if outs:
            self._order.bind(index, outs[0])
        result = mx.nd.array(data.reshape(info.shape), ctx=mx.cpu(), dtype=info.dtype)
        info.latest = result
        for o in outs:
            result.copyto(o)

    # -- the training path -----------------------------------------------------------------------------
    def pushpull(self, key, value, out=None, priority=0) -> None:
        """Pushes gradients and receives the servers' result (new weights, or the summed gradient) into `out`
        (into `value` if out is None). Asynchronous: returns after queueing engine operations."""
        keys, values = _pairs(key, value)
        outs = values if out is None else _pairs(key, out)[1]
        for k, v, o in zip(keys, values, outs):
            _refuse_sparse(k, _as_list(v) + _as_list(o), "pushpull")
        self._learn_order()
        self._start_step(keys)
        for k, v, o in zip(keys, values, outs):
            info = self._known(k)
            prio = self._order.of(info.index, priority if len(keys) == 1 else priority - info.index)
            self._pushpull_one(info, _as_list(v), _as_list(o), prio)

    def push(self, key, value, priority=0) -> None:
        """Pushes gradients; the result is kept for pull()."""
        keys, values = _pairs(key, value)
        for k, v in zip(keys, values):
            _refuse_sparse(k, _as_list(v), "push")
        self._learn_order()
        self._start_step(keys)
        for k, v in zip(keys, values):
            info = self._known(k)
            self._pushpull_one(info, _as_list(v), [], self._order.of(info.index, priority))

    def pull(self, key, out=None, priority=0, ignore_sparse=True) -> None:
        """Copies the latest value the servers broadcast for each key into `out` (no request is sent: P3
        servers broadcast every update unasked)."""
        keys, outs = _pairs(key, out)
        for k, o in zip(keys, outs):
            _refuse_sparse(k, _as_list(o), "pull")
            info = self._known(k)
            for dst in _as_list(o):
                info.latest.copyto(dst)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None) -> None:
        """Refused: P3 keeps and broadcasts dense parameters only."""
        raise ConfigError(f"kvstore 'p3' got row_sparse_pull for key {_one_key(key)!r}: P3 keeps and broadcasts "
                          f"dense parameters only; {SPARSE_ADVICE}")

    def _pushpull_one(self, info: _Key, values: list, outs: list, priority: int) -> None:
        direct = len(values) == 1 and values[0].context.device_type == "cpu" and \
            all(o.context.device_type == "cpu" for o in outs) and len(outs) <= 1
        if direct:
            # One CPU array: the engine op reads the gradient and writes the result straight into `out`
            # (push_engine checks both).
            target = outs[0] if outs else self._staging(info)
            self._worker.push_engine(info.index, values[0], target, self._bridge, priority)
            info.latest = target
            return
        # Every device's array, not only the staging buffer that reaches the worker: they are copied below.
        self._worker.check_arrays(info.index, values, outs)
        staging = self._staging(info)
        if len(values) == 1:
            values[0].copyto(staging)
        else:  # several devices: sum locally first, as MXNet's KVStore does
            mx.nd.add_n(*[v.as_in_context(mx.cpu()) for v in values], out=staging)
        self._worker.push_engine(info.index, staging, staging, self._bridge, priority)
        for o in outs:
            staging.copyto(o)
        info.latest = staging

    def _staging(self, info: _Key) -> mx.nd.NDArray:
        if info.staging is None:
            info.staging = mx.nd.zeros(info.shape, ctx=mx.cpu(), dtype=info.dtype)
        return info.staging

    def _learn_order(self) -> None:
        self._order.learn()

    def _start_step(self, keys: list) -> None:
        """Before pushes: a key pushed again means a new step; then carry any change of the optimizer's
        hyperparameters (trainer.set_learning_rate, opt.wd = ..., a new batch size in trainer.step) to the
        servers. Once per step, not per key: the fingerprint reads a few dozen attributes."""
        if self._optimizer is None:
            return
        if self._pushed and self._pushed.isdisjoint(keys):
            self._pushed.update(keys)
            return
        self._pushed = set(keys)
        hyper = hyperparameters(self._optimizer)
        if hyper == self._hyper:
            return
        changed = sorted(name for name in hyper if hyper[name] != (self._hyper or {}).get(name))
        self._hyper = hyper
        if self.rank != 0:
            return  # every worker runs the same script: worker 0 speaks for all
        log.info("optimizer hyperparameters changed (%s): updating the servers' optimizer", ", ".join(changed))
        # The servers must apply the change between two iterations. Requests overtake data in the send queue
        # (they are the most urgent frames), so first let the previous step's updates finish: once this worker
        # has every key's result, every server has updated every slice of it. Then the request is answered
        # before this step's pushes leave: no slice of this iteration is updated with the old values.
        # This stalls the pipeline once per change (an lr decay per epoch), never otherwise.
        for info in self._keys.values():
            if info.latest is not None:
                info.latest.wait_to_read()
        body = pickle.dumps(hyper, protocol=4)
        for s in range(self._worker.num_servers):
            self._worker.request(s, requests.SET_HYPERPARAMETERS, body)

    # -- optimizer -------------------------------------------------------------------------------------
    def set_optimizer(self, optimizer, keep_states: bool = False) -> None:
        """Ships the optimizer to every server (from worker 0); servers then update each slice they own.

        As on MXNet's dist_sync, the servers drop every slice's optimizer state (momentum, Adam's m and v) and
        take the update counts the optimizer carries (its `_index_update_count`, else `begin_num_update`); the
        float32 copy of float16 weights under multi_precision is the weights, not a state, and is kept.
        keep_states=True (p3kv only) continues instead: every slice keeps its state and each key's update count
        is the larger of the servers' and the optimizer's, for a changed copy of the same optimizer (Sockeye's
        entry point ships it again after each checkpoint); the new optimizer must keep the same states per
        weight, or the servers refuse it.

        The change applies between two iterations: every worker first waits for its pushes in flight (the
        request would overtake slices still queued), so a slice is never updated by the new optimizer in an
        iteration whose other slices the old one updated."""
        # Every worker refuses what the servers would refuse, so that all of them raise, not only worker 0.
        try:
            server_kernels.kernel_spec(optimizer)
        except ValueError as e:
            raise ConfigError(f"kvstore 'p3' cannot run {type(optimizer).__name__} on its servers: {e}") from None
        self._drain()
        self._worker.barrier()  # no worker has a push in flight now: the servers are between iterations
        self._use_optimizer(optimizer, keep_states)
        self._worker.barrier()

    def _drain(self) -> None:
        """Waits until every push of this worker has its result. A key's result arrives once every server has
        updated every slice of it with all workers' pushes, so when every worker has drained (then met at a
        barrier), no slice of any key is between aggregation and update anywhere: a control request that
        changes the optimizer or its states applies between two iterations for every key."""
        for info in self._keys.values():
            if info.latest is not None:
                info.latest.wait_to_read()

    def _use_optimizer(self, optimizer, keep_states: bool = False) -> None:
        """Makes `optimizer` this kvstore's; worker 0 sends it to every server."""
        self._optimizer = optimizer
        self._updater = mx.optimizer.get_updater(optimizer)
        self._hyper = hyperparameters(optimizer)
        self._pushed = set()
        if self.rank == 0:
            shipped = server_copy(optimizer)
            body = pickle.dumps({"optimizer": shipped, "keep_states": True} if keep_states else shipped, protocol=4)
            for s in range(self._worker.num_servers):
                try:
                    self._worker.request(s, requests.SET_OPTIMIZER, body)
                except UnsupportedRequest as e:  # the server's REPLY status says it has no request handler
                    raise P3Error(f"{e}. Its servers run no MXNet optimizer host (p3kv.core.server, framework-"
                                  "free, or a custom P3Server): start them with `python -m p3kv.mxnet.server`, which "
                                  "python -m p3kv.launch runs by default, or train with update_on_kvstore=False (the "
                                  "workers update)") from None

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Collects every slice's optimizer state from the servers and writes them per key, in the format of
        mx.optimizer.Updater (loadable by Trainer.load_states and by load_optimizer_states)."""
        if self._optimizer is None:
            raise ConfigError("no optimizer on kvstore 'p3' (update_on_kvstore=False keeps states on the workers)")
        # Pushpulls return before the servers have updated: wait for this worker's, or the servers could answer
        # with the states of the previous step for some slices (a checkpoint taken right after trainer.step).
        # Once this worker's are complete, every worker's are: a slice is updated only when all pushed it.
        self._drain()
        states, counts = checkpoint.collect(self._worker, self._keys.values())
        # The servers did the updates, so the workers' optimizer has counted none: the saved one takes the
        # servers' update counts (Adam's bias correction, lr schedules), and Gluon's per-parameter lr_mult and
        # wd_mult by index (pickling drops param_dict, and Trainer.load_states restores it only after
        # load_optimizer_states has shipped the optimizer).
        payload = states
        if dump_optimizer:
            optimizer = server_copy(self._optimizer)
            optimizer._index_update_count.update(counts)
            optimizer.num_update = max([optimizer.num_update, *counts.values()])
            payload = (states, optimizer)
        with open(fname, "wb") as f:
            f.write(pickle.dumps(payload))

    def load_optimizer_states(self, fname: str) -> None:
        """Loads states saved by save_optimizer_states (or MXNet's Updater) and sends each slice's to its
        server (from worker 0); every worker waits for it."""
        with open(fname, "rb") as f:
            loaded = pickle.loads(f.read())
        states, optimizer = loaded if isinstance(loaded, tuple) else (loaded, None)
        # Replacing the servers' states between two iterations: no push of any worker may still be in flight
        # (its slices would be updated with the loaded states, or overtaken by the request), see _drain.
        self._drain()
        self._worker.barrier()
        if optimizer is not None:
            if not getattr(optimizer, "param_dict", None) and self._optimizer is not None:
                # Pickling dropped Gluon's param_dict; Trainer.load_states puts the current one back, but only
                # after this returns: the servers need its lr_mult/wd_mult now.
                optimizer.param_dict = getattr(self._optimizer, "param_dict", {})
            self._use_optimizer(optimizer)
        if self.rank == 0:
            checkpoint.distribute(self._worker, self._keys.values(), states)
        self._worker.barrier()

    def set_gradient_compression(self, compression_params) -> None:
        raise ConfigError("kvstore 'p3' sends full gradients (as the paper): remove compression_params")

    # -- lifecycle -------------------------------------------------------------------------------------
    def barrier(self) -> None:
        self._worker.barrier()

    def _barrier(self) -> None:  # called by some MXNet code paths
        self._worker.barrier()

    def close(self) -> None:
        """Waits for outstanding operations and leaves the job. Called at exit."""
        if self._closed:
            return
        self._closed = True
        hook.stop_watching(self._order)
        try:
            mx.nd.waitall()
        except mx.base.MXNetError as e:
            # Usually the script met this error already; one line here instead of a second traceback at exit.
            log.warning("kvstore 'p3' closes after a failed operation: %s", str(e).strip().splitlines()[0])
            try:
                self._worker.close()
            except P3Error:
                pass  # the same failure, reported above
            return
        self._worker.close()

    def _close_at_exit(self) -> None:
        # At exit a raised error only adds "Exception ignored in atexit" and a second traceback after the one the
        # script printed; when MXNet already rethrew the failure, waitall is quiet and the core's close raises it.
        try:
            self.close()
        except P3Error as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            log.warning("kvstore 'p3' closes after a failed operation: %s", first)

    def _known(self, key) -> _Key:
        info = self._keys.get(key)
        if info is None:
            raise ConfigError(f"key {key!r} was never initialised on kvstore 'p3': call init or broadcast first")
        return info


def _pairs(key, value):
    """MXNet's key/value conventions: one key with one value (or a list of per-device values), or lists."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ConfigError(f"{len(key)} keys need a list of {len(key)} values")
        return list(key), list(value)
    return [key], [value]


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _first(v):
    return v[0] if isinstance(v, (list, tuple)) else v


SPARSE_ADVICE = ("use dense gradients (e.g. Embedding(sparse_grad=False), grad_stype='default', or "
                 "grad.tostype('default')), or keep sparse training on MXNet's own kvstores")


def _refuse_sparse(key, arrays: list, call: str) -> None:
    """P3 cuts each array's dense buffer into slices: a sparse array's compact buffer would be sent as if it
    were the whole array."""
    for a in arrays:
        stype = getattr(a, "stype", "default")
        if stype != "default":
            raise ConfigError(f"kvstore 'p3' {call} of key {key!r}: the array has storage type '{stype}', but "
                              f"P3 sends every array dense, slice by slice; {SPARSE_ADVICE}")


def _one_key(key):
    return key[0] if isinstance(key, (list, tuple)) and len(key) == 1 else key


