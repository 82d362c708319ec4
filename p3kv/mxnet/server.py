"""The server the launcher starts: a P3Server that runs the MXNet optimizer worker 0 sends, and
`python -m p3kv.mxnet.server` to run one from the P3_* environment.

p3kv.core.server knows nothing of MXNet; this module plugs the slices' optimizer into it: a SliceOptimizer (the
C++ kernels, p3kv.mxnet.server_kernels) as the update function and an OptimizerHost answering the workers'
optimizer requests (set, hyperparameters, states). Until worker 0 sends an optimizer the server broadcasts the
summed gradient, and mxnet itself is imported only when one arrives: a server that only aggregates does not need
it installed.
"""

from __future__ import annotations

import sys

from p3kv import _p3
from p3kv.core.config import Config
from p3kv.core.server import P3Server, serve
from p3kv.mxnet.optimizer_host import OptimizerHost


class OptimizerServer(P3Server):
    """A P3Server whose update function is the MXNet optimizer worker 0 ships (`optimizer_host`)."""

    def __init__(self, config: Config | None = None, **overrides):
        native = _p3.SliceOptimizer()
        self.optimizer_host = OptimizerHost(native)
        super().__init__(config, updater=native, on_request=self.optimizer_host.on_request, **overrides)


def main() -> int:
    """Runs one server from the environment; returns the process exit code."""
    return serve(OptimizerServer)


if __name__ == "__main__":
    sys.exit(main())
