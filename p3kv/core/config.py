"""Every environment variable p3kv reads, in one table: its own P3_* variables and the MXNet ones it consults.

This module is the only place the environment is read, besides the launcher (p3kv.launch), which hands its own
environment on to the processes it starts. docs/configuration.md's table is generated from `VARIABLES`
(``python -m p3kv.core.config --markdown``) and a test checks the two agree.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import sys
from typing import Mapping

from p3kv.core.errors import ConfigError


class Role(enum.Enum):
    SCHEDULER = "scheduler"
    SERVER = "server"
    WORKER = "worker"


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    kind: type
    default: object  # None means "required" for the roles listed in `required_for`
    help: str
    required_for: tuple[Role, ...] = ()
    internal: bool = False  # set by the launcher for its own bookkeeping: not in docs/configuration.md's table

    @property
    def field(self) -> str | None:
        """The `Config` field that holds it; None for another library's variable (read with `get`)."""
        return self.name[len("P3_"):].lower() if self.name.startswith("P3_") else None


# Gradients become ready layer by layer only when MXNet does not bulk backward operators; P3's (and MXNet's own)
# overlap of communication with backward needs that. The launcher sets it to 1 for workers unless the user set it.
BULK_VARIABLE = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise ConfigError(f"{name}={value} must be a positive integer")
    return value


VARIABLES: tuple[Variable, ...] = (
    Variable("P3_ROLE", str, None, "Role of this process: scheduler, server or worker. Set by the launcher.",
             (Role.SCHEDULER, Role.SERVER, Role.WORKER)),
    Variable("P3_ROOT_URI", str, None, "Address of the scheduler (IP or host name) that every node connects to.",
             (Role.SCHEDULER, Role.SERVER, Role.WORKER)),
    Variable("P3_ROOT_PORT", int, None, "TCP port the scheduler listens on.",
             (Role.SCHEDULER, Role.SERVER, Role.WORKER)),
    Variable("P3_NUM_WORKER", int, None, "Number of worker processes in the job.",
             (Role.SCHEDULER, Role.SERVER, Role.WORKER)),
    Variable("P3_NUM_SERVER", int, None, "Number of server processes in the job.",
             (Role.SCHEDULER, Role.SERVER, Role.WORKER)),
    Variable("P3_INTERFACE", str, "", "Network interface (e.g. eth0) whose IPv4 address this node binds and "
             "advertises. Empty: use P3_NODE_HOST, else the address that routes to P3_ROOT_URI."),
    Variable("P3_NODE_HOST", str, "", "Address this node binds and advertises to its peers (overrides "
             "P3_INTERFACE)."),
    Variable("P3_PORT", int, 0, "Port a server listens on for workers; 0 picks a free port."),
    Variable("P3_SLICE_SIZE", int, 50_000, "Maximum elements per slice (the paper's optimum is 50,000)."),
    Variable("P3_PRIORITY", str, "forward", "Send order of slices: forward (the most urgent layer first, P3) or "
             "none (first come, first served: the slicing-only ablation of the benchmarks)."),
    Variable("P3_SOCKET_BUFFER", int, 131_072, "Kernel send/receive buffer per data socket in bytes. Small "
             "buffers let an urgent slice overtake queued ones (the paper's send high-water mark of 1). Below "
             "128 KiB the TCP segment size is capped at a quarter of the buffer (TCP_MAXSEG): a worker's "
             "connection to the server on its own host runs over loopback, whose ~64 KiB segments do not fit a "
             "32 KiB window, and TCP then moved one window per 200 ms persist probe. Ethernet's 1448-byte "
             "segments stay as they are for buffers of 6 KiB and more."),
    Variable("P3_PRIORITY_HOLD_MS", float, 1000.0, "While a node's most urgent slice waits for its destination's "
             "socket buffer, less urgent slices to other destinations wait too, for at most this long after it "
             "blocked (strict priority across destinations: every server receives slices in the same order, so "
             "no server waits for one worker's late slice while links idle). A peer that declared a pause holds "
             "no one. 0 lets the others go at once (work-conserving, the behaviour before this variable)."),
    Variable("P3_CONNECT_TIMEOUT", float, 60.0, "Seconds to wait for the scheduler and for all nodes to "
             "register before failing."),
    Variable("P3_TIMEOUT", float, 600.0, "Seconds a blocking wait (init, push, barrier) may take before it "
             "fails with an error."),
    Variable("P3_MAX_MESSAGE_BYTES", int, 1 << 30, "Largest frame payload accepted; larger frames are "
             "rejected before any allocation."),
    Variable("P3_SERVER_QUEUE_BYTES", int, 64 << 20, "Server: payload bytes it holds received but not yet "
             "aggregated; beyond this it stops reading from workers (bounds server memory)."),
    Variable("P3_SERVER_SLICE_BYTES", int, 0, "Server: most bytes its parameter slices may take (value plus "
             "aggregation buffer, about 2x the parameters it owns); an INIT beyond it is rejected before anything "
             "is allocated. 0: half of the machine's physical memory."),
    Variable("P3_SECRET", str, "", "The job's shared secret: every connection proves it with an HMAC "
             "challenge-response. The launcher generates one per job. Empty (and no P3_SECRET_FILE): connections "
             "are checked against an empty secret, i.e. not protected."),
    Variable("P3_SECRET_FILE", str, "", "A file holding the shared secret (used when P3_SECRET is empty)."),
    Variable("P3_HEARTBEAT_INTERVAL", float, 1.0, "Seconds between heartbeats of each node and the scheduler."),
    Variable("P3_HEARTBEAT_TIMEOUT", float, 10.0, "Seconds of silence after which the scheduler declares a node "
             "dead (and a node the scheduler); every process then exits non-zero naming it."),
    Variable("P3_TRACE", str, "", "If set, a path prefix: each node writes its per-slice events as "
             "Chrome-trace JSON to PREFIX.<role><rank>.json when it closes."),
    Variable("P3_BASELINE", str, "", "Set by the launcher in baseline jobs (dist_sync or mxnet-p3) so a training "
             "script can tell how it runs; empty in p3kv jobs."),
    Variable("P3_PRELOAD_MXNET", int, 1, "Server: `1` imports mxnet (where installed) in a background thread at "
             "start-up, so that it is loaded when worker 0 ships its optimizer; `0` imports it only then. Servers "
             "that only sum (no optimizer on the kvstore) never need it: `0` saves them the import."),
    Variable("P3_LOG_LEVEL", str, "WARNING", "Log level of p3kv's Python and C++ logs (DEBUG, INFO, WARNING, "
             "ERROR)."),
    Variable("P3_WORKER_RANK", int, -1, "Worker: the rank to take (0 to P3_NUM_WORKER-1, each worker its own); "
             "-1 (default) takes ranks in the order workers register. The launcher sets it to equal the RANK it "
             "exports (torchrun's variables) in jobs on one host.", internal=True),
    Variable("P3_JOINED_FILE", str, "", "Set by the launcher for each worker: a file the worker creates once it "
             "joined the job, so that the launcher can name a worker that exits without joining.", internal=True),
    # MXNet's own variables that p3kv consults (MXNet reads them too).
    Variable(BULK_VARIABLE, str, "", "MXNet: how many backward operators it bulks into one "
             "(empty: MXNet's default). Workers need `1` so that gradients, and pushes, start layer by layer: the "
             "launcher sets it for workers unless set, and kvstore 'p3' warns if it is not 1."),
    Variable("MXNET_UPDATE_ON_KVSTORE", int, 1, "MXNet: with Module (and FeedForward), `1` runs the optimizer on "
             "the servers (the paper's setting), `0` on the workers; kvstore 'p3' follows it as MXNet does."),
    Variable("DMLC_PS_WATER_MARK", int, 10, "MXNet's P3 port (`--kvstore mxnet-p3` baseline): its send "
             "high-water mark; the launcher sets 10, as the paper's artifact does, unless set."),
    # torchrun's variables: p3kv's launcher exports the first six to workers; a script torchrun started reads them
    # to start p3kv's scheduler and servers itself (p3kv.torch.torchrun). Checked there (p3kv.launch.torchrun).
    *(Variable(name, str, "", f"torchrun: {meaning}") for name, meaning in (
        ("RANK", "the worker's rank; under torchrun without p3kv's launcher, also its p3kv rank."),
        ("WORLD_SIZE", "the number of workers."),
        ("LOCAL_RANK", "the worker's rank on its node; local rank 0 starts the node's p3kv servers."),
        ("LOCAL_WORLD_SIZE", "the number of workers on each node."),
        ("GROUP_RANK", "the node's index (default: RANK // LOCAL_WORLD_SIZE); node 0 runs the scheduler."),
        ("GROUP_WORLD_SIZE", "the number of nodes (default: WORLD_SIZE // LOCAL_WORLD_SIZE)."),
        ("MASTER_ADDR", "the address of torchrun's store; p3kv's scheduler (on node 0) listens on the address "
         "node 0 uses to reach it."),
        ("MASTER_PORT", "the port of torchrun's store (where the workers may not use that store, p3kv's "
         "scheduler listens on MASTER_PORT+1)."),
        ("TORCHELASTIC_USE_AGENT_STORE", "`True` when the workers may use torchrun's store: p3kv publishes the "
         "scheduler's address (and the job's secret, unless P3_SECRET_FILE is set) in it."),
        ("TORCHELASTIC_RUN_ID", "the job's id (part of p3kv's key in torchrun's store)."),
        ("TORCHELASTIC_RESTART_COUNT", "the restart (part of p3kv's key in torchrun's store)."),
    )),
)

_BY_NAME = {v.name: v for v in VARIABLES}


@dataclasses.dataclass(frozen=True)
class Config:
    role: Role
    root_uri: str
    root_port: int
    num_worker: int
    num_server: int
    interface: str = ""
    node_host: str = ""
    port: int = 0
    slice_size: int = 50_000
    priority: str = "forward"
    socket_buffer: int = 131_072
    priority_hold_ms: float = 1000.0
    connect_timeout: float = 60.0
    timeout: float = 600.0
    max_message_bytes: int = 1 << 30
    server_queue_bytes: int = 64 << 20
    server_slice_bytes: int = 0
    secret: str = dataclasses.field(default="", repr=False)
    secret_file: str = ""
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    trace: str = ""
    baseline: str = ""
    preload_mxnet: int = 1
    log_level: str = "WARNING"
    worker_rank: int = -1
    joined_file: str = ""

    def bind_host(self) -> str:
        """The address this node binds and advertises."""
        if self.node_host:
            return self.node_host
        if self.interface:
            return interface_address(self.interface)
        return route_address(self.root_uri, self.root_port)


def _convert(var: Variable, raw: str) -> object:
    try:
        if var.kind is int:
            return int(raw, 0)
        if var.kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{var.name}={raw!r} is not a valid {var.kind.__name__}: {var.help}") from None
    return raw


def get(name: str, environ: Mapping[str, str] | None = None) -> object:
    """One variable's value (converted), its default if unset."""
    env = os.environ if environ is None else environ
    var = _BY_NAME[name]
    raw = env.get(name, "")
    if raw == "":
        return var.default
    return _convert(var, raw)


def load(environ: Mapping[str, str] | None = None, role: Role | None = None, **overrides: object) -> Config:
    """Read the job description from the environment; keyword overrides win (e.g. slice_size=40000).

    Raises ConfigError naming the variable to set when something is missing or malformed.
    """
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for var in VARIABLES:
        field = var.field
        if field is None:
            continue
        if field in overrides and overrides[field] is not None:
            values[field] = overrides[field]
        else:
            values[field] = get(var.name, env)
    if role is not None:
        values["role"] = role.value
    if values["role"] is None:
        raise ConfigError("P3_ROLE is not set: set it to scheduler, server or worker "
                          "(python -m p3kv.launch sets it for you)")
    try:
        role_enum = Role(str(values["role"]).lower())
    except ValueError:
        raise ConfigError(f"P3_ROLE={values['role']!r} is not a role: use scheduler, server or worker") from None
    values["role"] = role_enum
    missing = [v.name for v in VARIABLES if role_enum in v.required_for and values[str(v.field)] is None]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not set for this {role_enum.value}: every node of a job needs "
            "P3_ROOT_URI, P3_ROOT_PORT, P3_NUM_WORKER and P3_NUM_SERVER (python -m p3kv.launch sets them)")
    for name in ("num_worker", "num_server", "slice_size", "socket_buffer", "max_message_bytes",
                 "server_queue_bytes"):
        _positive("P3_" + name.upper(), int(values[name]))
    if float(values["priority_hold_ms"]) < 0:
        raise ConfigError(f"P3_PRIORITY_HOLD_MS={values['priority_hold_ms']} must be 0 (no hold) or a positive "
                          "number of milliseconds")
    if int(values["server_slice_bytes"]) < 0:
        raise ConfigError(f"P3_SERVER_SLICE_BYTES={values['server_slice_bytes']} must be 0 (half the memory) or "
                          "a positive number of bytes")
    if float(values["heartbeat_interval"]) <= 0 or float(values["heartbeat_timeout"]) <= float(
            values["heartbeat_interval"]):
        raise ConfigError(f"P3_HEARTBEAT_TIMEOUT={values['heartbeat_timeout']} must exceed P3_HEARTBEAT_INTERVAL="
                          f"{values['heartbeat_interval']} (> 0)")
    if not values["secret"] and values["secret_file"]:
        try:
            with open(str(values["secret_file"])) as f:
                values["secret"] = f.read().strip()
        except OSError as e:
            raise ConfigError(f"P3_SECRET_FILE={values['secret_file']!r} cannot be read: {e.strerror}") from None
        if not values["secret"]:
            raise ConfigError(f"P3_SECRET_FILE={values['secret_file']!r} is empty")
    if values["priority"] not in ("forward", "none"):
        raise ConfigError(f"P3_PRIORITY={values['priority']!r} is not an order: use forward (P3) or none (FIFO)")
    if not 0 < int(values["root_port"]) < 65536:
        raise ConfigError(f"P3_ROOT_PORT={values['root_port']} is not a TCP port (1-65535)")
    if not 0 <= int(values["port"]) < 65536:
        raise ConfigError(f"P3_PORT={values['port']} is not a TCP port (0-65535; 0 picks a free one)")
    if not -1 <= int(values["worker_rank"]) < int(values["num_worker"]):
        raise ConfigError(f"P3_WORKER_RANK={values['worker_rank']} is not a worker rank: use 0 to "
                          f"P3_NUM_WORKER-1={int(values['num_worker']) - 1}, or -1 for registration order")
    if values["preload_mxnet"] not in (0, 1):
        raise ConfigError(f"P3_PRELOAD_MXNET={values['preload_mxnet']} must be 1 (import mxnet at start-up) or 0 "
                          "(only when an optimizer arrives)")
    return Config(**values)  # type: ignore[arg-type]


def interface_address(name: str) -> str:
    """IPv4 address of a network interface, or ConfigError listing the interfaces that exist."""
    import fcntl
    import struct

    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise ConfigError(f"P3_INTERFACE={name!r}: no such network interface here (have: {', '.join(names)})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            raise ConfigError(f"P3_INTERFACE={name!r} has no IPv4 address; pick another interface or set "
                              "P3_NODE_HOST") from None
    return socket.inet_ntoa(packed[20:24])


def route_address(host: str, port: int) -> str:
    """The local address the kernel would use to reach host:port (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise ConfigError(f"cannot find a route to P3_ROOT_URI={host!r}: {e}; set P3_NODE_HOST or "
                          "P3_INTERFACE") from None


def markdown_table() -> str:
    """docs/configuration.md's table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var in VARIABLES:
        if var.internal:
            continue
        default = "required" if var.default is None else (f"`{var.default}`" if var.default != "" else "empty")
        rows.append(f"| `{var.name}` | {default} | {var.help} |")
    return "\n".join(rows)


def handed_on() -> dict[str, str]:
    """This process's whole environment, to hand on to a process it starts (p3kv.launch's children), which reads
    what it needs through this table."""
    return dict(os.environ)


def environment_for(config: Config, role: Role) -> dict[str, str]:
    """The P3_* variables that describe `config` to a child process of `role`."""
    env = {}
    for var in VARIABLES:
        if var.field is None:
            continue
        value = getattr(config, var.field)
        if var.name == "P3_ROLE":
            value = role.value
        if var.name == "P3_WORKER_RANK":
            continue  # one worker's own (the launcher sets it per worker)
        if var.name == "P3_SECRET" and config.secret_file:
            continue  # the children read the file themselves: keep the secret out of environments
        if value is None or value == "":
            continue
        env[var.name] = str(value)
    return env


if __name__ == "__main__":
    if "--markdown" in sys.argv:
        sys.stdout.write(markdown_table() + "\n")
