"""Makes `import p3kv` enough for `kvstore='p3'`, whether mxnet is imported before or after p3kv.

Registration needs mxnet, but `import p3kv` must stay cheap for processes that never use MXNet (servers
that only aggregate, numpy users). So: if mxnet is already imported, register now; otherwise a meta-path
finder waits for `import mxnet` to finish and registers then.

Registering also wraps gluon.Parameter.data so that each kvstore 'p3' can see the forward order of parameters
(its p3kv.mxnet.forward_order.ForwardOrder, watched through `watch_forward_pass`), and makes Gluon, Module and
model.py treat kvstore 'p3' (whose type is 'p3', MXNet's convention for a registered kvstore) as the
synchronous distributed kvstore it is. MXNet 1.9.1 decides that by
`'dist' in kv.type` (and '_sync'/'_async'); every such check that Trainer, Module and FeedForward reach:
- model._create_kvstore (imported by name into trainer.py and module.py): with one device per worker it
  silently drops a kvstore name without "dist". Patched: the name "p3" creates kvstore 'p3'.
- gluon.Trainer._init_kvstore (`_distributed`, which decides update_on_kvstore, the batch-size check of
  step(), pulls with ignore_sparse), _reset_kvstore ("cannot reset distributed KVStore") and _row_sparse_pull;
  Module.init_optimizer (rescale_grad = 1/(batch x num_workers)); FeedForward.fit (the same rescale). These
  run with kv.type reading 'dist_sync' for their duration (P3.mxnet_sees_dist_sync), so they take exactly
  dist_sync's branches; everywhere else kv.type is 'p3'.
- Trainer._check_and_rescale_grad: for dist_sync MXNet refuses a new batch size once the optimizer is on the
  servers; kvstore 'p3' carries the new rescale_grad to its servers (P3._start_step), so it is accepted.
This module imports mxnet only once mxnet is being imported anyway: `import p3kv` loads it.
- Sparse parameters or gradients are refused with a ConfigError naming them (P3 sends dense slices).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import weakref

P3_NAME = "p3"
_registered = False
# The forward orders that Parameter.data and autograd.record() report to: one per live kvstore 'p3', each owned by
# its kvstore (weak references: a kvstore that is gone stops listening).
_watched: weakref.WeakSet = weakref.WeakSet()


def watch_forward_pass(order) -> None:
    """From now on, `order` (a ForwardOrder) sees every parameter read and every start of a forward pass, until
    it has learned the order or is garbage. Any thread (reads are reported from the thread that reads)."""
    _watched.add(order)


def stop_watching(order) -> None:
    """`order` sees no more reads (its kvstore closed). Any thread."""
    _watched.discard(order)


def _listening() -> list:
    return [order for order in list(_watched) if not order.learned]


def activate() -> None:
    if "mxnet.kvstore" in sys.modules and "mxnet.model" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterMXNetImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterMXNetImport())


def register() -> None:
    """Registers kvstore 'p3' and patches MXNet's kvstore selection. Idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    import mxnet.gluon.trainer
    import mxnet.model
    import mxnet.module.module

    import p3kv.mxnet.kvstore  # noqa: F401  (the @register decorator runs on import)
    from p3kv.core import config

    original = mxnet.model._create_kvstore

    def _create_kvstore(kvstore, num_device, arg_params):
        if isinstance(kvstore, str) and kvstore.lower() == P3_NAME:
            kv = mxnet.kv.create(P3_NAME)
            update_on_kvstore = bool(config.get("MXNET_UPDATE_ON_KVSTORE"))
            return kv, update_on_kvstore and kv.is_capable(mxnet.kvstore.KVStoreBase.OPTIMIZER)
        return original(kvstore, num_device, arg_params)

    for module in (mxnet.model, mxnet.gluon.trainer, mxnet.module.module):
        module._create_kvstore = _create_kvstore
    _treat_p3_as_dist_sync(mxnet)

    # Tell the kvstore which parameter the forward pass reads, and when (its priorities follow that order).
    data = mxnet.gluon.Parameter.data

    def _data(self, ctx=None):
        array = data(self, ctx)
        if _watched:
            for order in _listening():
                order.used(array)
        return array

    mxnet.gluon.Parameter.data = _data

    # A forward pass starts when the outermost autograd.record() scope opens.
    scope = mxnet.autograd._RecordingStateScope
    enter = scope.__enter__

    def _enter(self):
        enter(self)
        if _watched and self._enter_is_record and not self._prev_is_record:
            for order in _listening():
                order.new_pass()

    scope.__enter__ = _enter


def _treat_p3_as_dist_sync(mxnet) -> None:
    """Patches the MXNet code paths that test `'dist' in kv.type` (see the module docstring)."""
    from p3kv.core.errors import ConfigError
    from p3kv.mxnet.kvstore import P3, SPARSE_ADVICE

    trainer = mxnet.gluon.Trainer

    def creating_p3(method, argument: str, does_nothing=lambda arguments: False):
        """Wraps `method` so that, when its `argument` is kvstore 'p3' (by name or instance), it runs with that
        kvstore reading as dist_sync. A name is turned into the kvstore first, as MXNet itself would do there
        (unless `does_nothing(arguments)`: the call would not create one)."""
        signature = inspect.signature(method)

        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if does_nothing(bound.arguments):
                return method(*bound.args, **bound.kwargs)
            kv = bound.arguments[argument]
            if isinstance(kv, str) and kv.lower() == P3_NAME:
                kv = bound.arguments[argument] = mxnet.kv.create(P3_NAME)
            if not isinstance(kv, P3):
                return method(*bound.args, **bound.kwargs)
            with kv.mxnet_sees_dist_sync():
                return method(*bound.args, **bound.kwargs)

        return wrapper

    mxnet.module.Module.init_optimizer = creating_p3(
        mxnet.module.Module.init_optimizer, "kvstore",
        lambda a: a["self"].optimizer_initialized and not a["force_init"])  # it only logs a warning then
    mxnet.model.FeedForward.fit = creating_p3(mxnet.model.FeedForward.fit, "kvstore")

    init_kvstore = trainer._init_kvstore

    @functools.wraps(init_kvstore)
    def _init_kvstore(self):
        config = self._kvstore_params
        kv = config["kvstore"]
        if isinstance(kv, str) and kv.lower() == P3_NAME:
            kv = config["kvstore"] = mxnet.kv.create(P3_NAME)
        if not isinstance(kv, P3):
            return init_kvstore(self)
        sparse = [f"{p.name} ({'weight ' + p._stype if p._stype != 'default' else 'gradient ' + p._grad_stype})"
                  for p in self._params if p._stype != "default" or p._grad_stype != "default"]
        if sparse:
            raise ConfigError(f"kvstore 'p3' cannot train sparse parameters: {', '.join(sparse)}; P3 sends every "
                              f"array dense, slice by slice; {SPARSE_ADVICE}")
        with kv.mxnet_sees_dist_sync():
            return init_kvstore(self)

    trainer._init_kvstore = _init_kvstore

    def on_own_kvstore(method):
        """Wraps a Trainer method that tests its kvstore's type so that it sees 'p3' as dist_sync."""
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            kv = getattr(self, "_kvstore", None)
            if not isinstance(kv, P3):
                return method(self, *args, **kwargs)
            with kv.mxnet_sees_dist_sync():
                return method(self, *args, **kwargs)

        return wrapper

    trainer._reset_kvstore = on_own_kvstore(trainer._reset_kvstore)
    trainer._row_sparse_pull = on_own_kvstore(trainer._row_sparse_pull)

    check_and_rescale = trainer._check_and_rescale_grad

    @functools.wraps(check_and_rescale)
    def _check_and_rescale_grad(self, scale):
        if isinstance(getattr(self, "_kvstore", None), P3):
            self._optimizer.rescale_grad = scale  # kvstore 'p3' carries it to its servers
            return
        check_and_rescale(self, scale)

    trainer._check_and_rescale_grad = _check_and_rescale_grad


class _AfterMXNetImport(importlib.abc.MetaPathFinder):
    """Finds the real `mxnet` package and arranges for register() to run once it has been executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "mxnet":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            register()

        loader.exec_module = exec_module
        return spec
