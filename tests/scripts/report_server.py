"""A p3kv server that prints ``server rank=R pid=P port=N`` once it has joined the job, then serves as
``python -m p3kv.mxnet.server`` does (same exit codes). Tests use the port to reach it and the pid to kill it. After a
clean end it prints ``server rank=R rejected_frames=N`` (its counter of refused frames and connections)."""

import os
import sys

from p3kv.core.errors import P3Error
from p3kv.mxnet.server import OptimizerServer


def main() -> int:
    try:
        server = OptimizerServer()
        server.start()
        print(f"server rank={server.rank} pid={os.getpid()} port={server.port}", flush=True)
        server.run()
        print(f"server rank={server.rank} rejected_frames={server.counters()['rejected_frames']}", flush=True)
    except P3Error as e:
        print(f"server failed: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
