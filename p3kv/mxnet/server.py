"""The server the launcher starts: a P3Server that runs the MXNet optimizer worker 0 sends, and
`python -m p3kv.mxnet.server` to run one from the P3_* environment.

p3kv.core.server knows nothing of MXNet; this module plugs the slices' optimizer into it: a SliceOptimizer (the
C++ kernels, p3kv.mxnet.server_kernels) as the update function and an OptimizerHost answering the workers'
optimizer requests (set, hyperparameters, states). The framework-free requests (a kernel by name, p3kv.torch's
server placement) go to the core's NativeOptimizerHost on the same SliceOptimizer, so these servers serve both
kinds of job (a job uses one of the two). Until a worker sends an optimizer the server broadcasts the summed
gradient. A server that only aggregates does not need mxnet installed; where it is, `main` imports it in
the background while the job starts (P3_PRELOAD_MXNET=0: only when an optimizer arrives).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading

from p3kv import _p3
from p3kv.core import config as config_lib
from p3kv.core import requests
from p3kv.core.config import Config, ConfigError
from p3kv.core.native_optimizer import NativeOptimizerHost
from p3kv.core.server import P3Server, serve
from p3kv.mxnet.optimizer_host import OptimizerHost


class OptimizerServer(P3Server):
    """A P3Server whose update function is the MXNet optimizer worker 0 ships (`optimizer_host`), or the native
    kernel a framework-free request names (`native_host`)."""

    def __init__(self, config: Config | None = None, **overrides):
        self.native = _p3.SliceOptimizer()
        self.optimizer_host = OptimizerHost(self.native)
        self.native_host = NativeOptimizerHost(self.native)
        super().__init__(config, updater=self.native, on_request=self._on_request, **overrides)

    def _on_request(self, kind: int, body: bytes) -> bytes:
        if kind in requests.NATIVE_KINDS:
            return self.native_host.on_request(kind, body)
        return self.optimizer_host.on_request(kind, body)


def preload_mxnet() -> threading.Thread | None:
    """Starts importing mxnet in a background thread, if it is installed. Worker 0 ships its optimizer right after
    the rendezvous and every server needs mxnet to unpickle it; imported only then, by all servers at once beside
    the workers' first iteration, it delays the first step by seconds. A failed import is left to the request
    that needs mxnet, which reports it."""
    if importlib.util.find_spec("mxnet") is None:
        return None

    def load() -> None:
        try:
            importlib.import_module("mxnet")
        except Exception:  # noqa: BLE001 (reported by the import that needs it)
            pass

    thread = threading.Thread(target=load, name="import mxnet", daemon=True)
    thread.start()
    return thread


def main() -> int:
    """Runs one server from the environment; returns the process exit code."""
    try:
        preload = config_lib.get("P3_PRELOAD_MXNET") == 1
    except ConfigError:
        preload = False  # serve's config load names the bad value
    if preload:
        preload_mxnet()
    return serve(OptimizerServer)


if __name__ == "__main__":
    sys.exit(main())
