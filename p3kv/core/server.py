"""P3Server: the server side of P3, and `python -m p3kv.core.server` to run one from the P3_* environment.

The update function is pluggable. By default the server runs the framework-free optimizer host
(p3kv.core.native_optimizer): native kernels chosen by name, which p3kv.torch's server placement asks for; until a
worker sends a kernel spec it broadcasts the summed gradient ("aggregate only"). This module and that host import
no framework. p3kv.mxnet.server.OptimizerServer, the launcher's default server, adds the MXNet optimizer worker 0
pickles. A custom update function is called once per slice and iteration, on the server's consumer thread, as
`updater(key_id, slice, offset, iteration, aggregated, value)`: `aggregated` is a read-only view of the sum over
workers, `value` a writable view of the stored slice (initially worker 0's init value) to update in place; the new
`value` is then broadcast. An exception in it reaches every worker waiting on the key.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

import numpy as np

from p3kv import _p3
from p3kv.core import node
from p3kv.core.config import Config, Role, load
from p3kv.core.errors import P3Error
from p3kv.core.native_optimizer import NativeOptimizerHost

log = logging.getLogger("p3kv.server")

Updater = Callable[[int, int, int, int, np.ndarray, np.ndarray], None]


class P3Server:
    def __init__(self, config: Config | None = None, updater: Updater | None = None,
                 on_request: Callable[[int, bytes], bytes] | None = None, **overrides):
        """`on_request(type, body) -> reply` answers workers' control requests (see p3kv.core.requests) on the
        consumer thread. Without `updater` and `on_request` the server runs the framework-free optimizer host
        (`optimizer_host`, a NativeOptimizerHost; aggregate only until a kernel spec arrives). With an `updater`
        and no `on_request`, a request is refused with an error the worker raises."""
        if updater is None and on_request is None:
            self.native = _p3.SliceOptimizer()
            self.optimizer_host = NativeOptimizerHost(self.native)
            updater, on_request = self.native, self.optimizer_host.on_request
        self.config = config if config is not None else load(role=Role.SERVER, **overrides)
        node.configure_logging(self.config)
        self._core = _p3.Server(node.node_config(self.config), updater, on_request)
        self._started = False

    def start(self) -> None:
        """Binds, registers with the scheduler and learns the job (blocks up to P3_CONNECT_TIMEOUT)."""
        self._core.start()
        self._started = True
        log.info("server %d listening on port %d", self._core.rank, self._core.port)

    def run(self) -> None:
        """Serves until the scheduler ends the job; raises P3Error naming the node if a node fails."""
        if not self._started:
            self.start()
        try:
            self._core.run()
        finally:
            if self.config.trace:
                node.write_trace(self.config.trace, "server", self._core.rank, self._core.trace(),
                                 self._core.trace_dropped())

    def stop(self) -> None:
        """Any thread: makes run() return."""
        self._core.stop()

    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def port(self) -> int:
        return self._core.port

    def counters(self) -> dict:
        return self._core.counters()

    def buffer_stats(self) -> dict:
        """Receive buffers reused from the pool and allocated, and updates that copied a value being sent."""
        return self._core.buffer_stats()

    def trace_events(self) -> list:
        return self._core.trace()


def serve(create: Callable[[], P3Server]) -> int:
    """Runs the server `create()` builds from the environment until the job ends; returns the exit code."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        create().run()
    except P3Error as e:
        log.error("server failed: %s", e)
        return 1
    return 0


def main(updater: Updater | None = None) -> int:
    """Runs one server from the environment with `updater` (the framework-free optimizer host without one);
    returns the exit code. The launcher's default servers run p3kv.mxnet.server, which adds the MXNet optimizer;
    `--servers core` runs this one."""
    return serve(lambda: P3Server(updater=updater))


if __name__ == "__main__":
    sys.exit(main())
