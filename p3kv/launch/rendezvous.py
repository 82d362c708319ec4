"""Horovod's rendezvous for a `--kvstore horovod` job: its own HTTP key-value store, with the scopes of the job's
slot plan, in the scheduler's place. The launcher runs it as a companion process (p3kv.launch.horovod plans it);
a module of its own, so that `python -m` runs it without the package having imported it first.

    python -m p3kv.launch.rendezvous --host 10.0.0.1 --port 9000 --slots 10.0.0.1:1,10.0.0.2:1
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from p3kv.core.errors import ConfigError
from p3kv.launch.horovod import INSTALL_HINT, parse_slots

LOG = logging.getLogger("p3kv.launch")


def serve(host: str, port: int, slots: Sequence[tuple[str, int]]) -> int:
    """Horovod's rendezvous (its own HTTP key-value store, with the scopes of the slot plan) on host:port until
    SIGTERM: the launcher's supervisor sends it once this host's workers are done (a companion service)."""
    try:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as e:
        LOG.error("Horovod is not importable here (%s): %s", e, INSTALL_HINT)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server = RendezvousHTTPServer((host, port), RendezvousHandler, False)
    except OSError as e:
        LOG.error("Horovod's rendezvous cannot listen on %s:%d (%s); pick another --port", host, port, e.strerror)
        return 2
    total = sum(k for _, k in slots)
    server.init(get_host_assignments(parse_hosts(",".join(f"{h}:{k}" for h, k in slots)), total))
    thread = threading.Thread(target=server.serve_forever, name="rendezvous", daemon=True)
    thread.start()
    LOG.info("Horovod rendezvous on %s:%d for %d ranks", host, port, total)
    while not stop.wait(1.0):  # a timed wait, so the SIGTERM handler runs promptly
        pass
    server.shutdown()
    server.server_close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m p3kv.launch.rendezvous", description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slots", required=True, help="ADDR:K,ADDR:K,... every host and its ranks, rank order")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr, level=logging.INFO)
    try:
        return serve(args.host, args.port, parse_slots(args.slots))
    except ConfigError as e:
        LOG.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
