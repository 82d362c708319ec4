"""What every node (scheduler, server, worker) shares: config translation, logging set-up, trace output."""

from __future__ import annotations

import json
import logging
import os

from p3kv import _p3
from p3kv.core.config import Config

log = logging.getLogger("p3kv.node")

_LEVELS = {"DEBUG": 0, "INFO": 1, "WARNING": 2, "ERROR": 3}


def configure_logging(config: Config) -> None:
    """Applies P3_LOG_LEVEL to p3kv's Python loggers and to the C++ core."""
    level = config.log_level.upper()
    if level not in _LEVELS:
        level = "WARNING"
    logger = logging.getLogger("p3kv")
    logger.setLevel(level)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    _p3.set_log_level(_LEVELS[level])


def _half_physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def node_config(config: Config) -> _p3.NodeConfig:
    """The core's view of the job."""
    node = _p3.NodeConfig()
    node.root_uri = config.root_uri
    node.root_port = config.root_port
    node.num_worker = config.num_worker
    node.num_server = config.num_server
    node.host = config.bind_host()
    node.port = config.port
    node.slice_size = config.slice_size
    node.socket_buffer = config.socket_buffer
    node.priority_hold = config.priority_hold_ms / 1000.0
    node.connect_timeout = config.connect_timeout
    node.timeout = config.timeout
    node.max_message_bytes = config.max_message_bytes
    node.server_queue_bytes = config.server_queue_bytes
    node.server_slice_bytes = config.server_slice_bytes or _half_physical_memory()
    node.trace = bool(config.trace)
    node.secret = config.secret
    node.heartbeat_interval = config.heartbeat_interval
    node.heartbeat_timeout = config.heartbeat_timeout
    node.rank = config.worker_rank if config.role.value == "worker" else -1
    return node


def write_trace(prefix: str, role: str, rank: int, events: list, dropped: int = 0) -> str:
    """Writes a node's trace events as Chrome-trace JSON (chrome://tracing, Perfetto); returns the path.

    Each event becomes an instant event on a row per peer; args carry key, slice, priority, iteration.
    The node keeps only its latest events (a bounded ring): `dropped` older ones were overwritten, and the file
    says so (otherData.dropped_records), as does a warning.
    """
    path = f"{prefix}.{role}{rank}.json"
    trace_events = [
        {
            "name": f"{name} k{key}/s{slc}",
            "cat": name,
            "ph": "i",
            "s": "t",
            "ts": t_ns / 1000.0,
            "pid": f"{role} {rank}",
            "tid": f"peer {peer}" if peer >= 0 else "local",
            "args": {"event": name, "key": key, "slice": slc, "priority": prio, "iteration": it, "peer": peer},
        }
        for t_ns, name, key, slc, prio, it, peer in events
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events, "displayTimeUnit": "ms",
                   "otherData": {"dropped_records": int(dropped)}}, f)
    if dropped:
        log.warning("trace %s holds the latest %d events only: %d older ones were dropped (the trace keeps a "
                    "bounded window)", path, len(trace_events), dropped)
    return path


def mark_joined(path: str) -> None:
    """Tells the launcher that this worker joined the job (P3_JOINED_FILE): it names a worker that exits 0
    without ever joining instead of waiting for the job to time out."""
    try:
        with open(path, "w"):
            pass
    except OSError as e:
        logging.getLogger("p3kv.worker").warning("cannot create P3_JOINED_FILE %s (%s): the launcher may report "
                                                 "this worker as never having joined", path, e.strerror)
