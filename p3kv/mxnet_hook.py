"""Makes `import p3kv` enough for `kvstore='p3'`, whether mxnet is imported before or after p3kv.

Registration needs mxnet, but `import p3kv` must stay cheap for processes that never use MXNet (servers
that only aggregate, numpy users). So: if mxnet is already imported, register now; otherwise a meta-path
finder waits for `import mxnet` to finish and registers then.

Registering also wraps gluon.Parameter.data so the kvstore can see the forward order of parameters
(p3kv.kvstore.ForwardOrder), and fixes an MXNet 1.x quirk: with one device per worker, Gluon's Trainer and Module.fit
silently drop a kvstore name unless it contains "dist" (mxnet.model._create_kvstore, which trainer.py and
module.py import by name). The patched function creates kvstore 'p3' for the name "p3" and defers to
MXNet's for every other name.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

P3_NAME = "p3"
_registered = False


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

    import p3kv.kvstore  # noqa: F401  (the @register decorator runs on import)

    original = mxnet.model._create_kvstore

    def _create_kvstore(kvstore, num_device, arg_params):
        if isinstance(kvstore, str) and kvstore.lower() == P3_NAME:
            kv = mxnet.kv.create(P3_NAME)
            update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
            return kv, update_on_kvstore and kv.is_capable(mxnet.kvstore.KVStoreBase.OPTIMIZER)
        return original(kvstore, num_device, arg_params)

    for module in (mxnet.model, mxnet.gluon.trainer, mxnet.module.module):
        module._create_kvstore = _create_kvstore

    # Tell the kvstore which parameter the forward pass reads, and when (its priorities follow that order).
    data = mxnet.gluon.Parameter.data

    def _data(self, ctx=None):
        array = data(self, ctx)
        recorder = p3kv.kvstore.ForwardOrder.recorder
        if recorder is not None and not recorder.learned:
            recorder.used(array)
        return array

    mxnet.gluon.Parameter.data = _data

    # A forward pass starts when the outermost autograd.record() scope opens.
    scope = mxnet.autograd._RecordingStateScope
    enter = scope.__enter__

    def _enter(self):
        enter(self)
        recorder = p3kv.kvstore.ForwardOrder.recorder
        if recorder is not None and not recorder.learned and self._enter_is_record and not self._prev_is_record:
            recorder.new_pass()

    scope.__enter__ = _enter


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
