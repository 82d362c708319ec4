"""The scheduler role: `python -m p3kv.core.scheduler` runs the job's rendezvous from the P3_* environment."""

from __future__ import annotations

import logging
import sys

from p3kv import _p3
from p3kv.core import node
from p3kv.core.config import Config, Role, load
from p3kv.core.errors import P3Error

log = logging.getLogger("p3kv.scheduler")


def run_scheduler(config: Config | None = None) -> None:
    """Admits every node, distributes ranks and addresses, runs barriers, and ends the job. Raises P3Error
    naming the node if one dies or the job is misconfigured."""
    config = config if config is not None else load(role=Role.SCHEDULER)
    node.configure_logging(config)
    core_config = node.node_config(config)
    core_config.host = config.root_uri
    scheduler = _p3.Scheduler(core_config)
    scheduler.bind()
    log.info("scheduler listening on %s:%d", config.root_uri, scheduler.port)
    scheduler.run()


def main() -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        run_scheduler()
    except P3Error as e:
        log.error("scheduler failed: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
