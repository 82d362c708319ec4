"""SSH sessions to the hosts of a deployment: connecting, running commands, and errors that name the host.

Every operation takes a *connection factory*: a callable that turns a `Host` into a `fabric.Connection` (not yet
opened). `default_connect` is the one the fab tasks use; tests pass their own (their hosts live in network
namespaces). Each failure becomes a `HostError` that names the host and says how to fix it; an operation over
several hosts collects them and raises one `DeployError` listing every host that failed.
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import shlex
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import paramiko
from fabric import Config, Connection

from deploy.hosts import Host

LOG = logging.getLogger("p3kv.deploy")
ConnectionFactory = Callable[[Host], Connection]
T = TypeVar("T")
DEFAULT_CONNECT_TIMEOUT = 10  # seconds: how long an unreachable host may take to fail


class HostError(Exception):
    """One host failed; the message names it and says what to do."""

    def __init__(self, host: Host, message: str):
        super().__init__(f"{host.label}: {message}")
        self.host = host


class DeployError(Exception):
    """An operation failed on some hosts: `failures` maps each such host's label to its message."""

    def __init__(self, what: str, failures: Mapping[str, str]):
        self.failures = dict(failures)
        lines = "\n".join(f"  {message}" for message in self.failures.values())
        super().__init__(f"{what} failed on {len(self.failures)} host(s):\n{lines}")


def default_connect(config: Config | None = None, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
                    ) -> ConnectionFactory:
    """Connections as `ssh` makes them: user, keys and options from ~/.ssh/config and the fab command line
    (`config`). Hosts already in ~/.ssh/known_hosts must present the key recorded there; unknown hosts are
    accepted (Fabric's default)."""

    def connect(host: Host) -> Connection:
        conn = Connection(host.hostname, user=host.user, port=host.port, config=config,
                          connect_timeout=connect_timeout)
        conn.client.load_system_host_keys()
        return conn

    return connect


def _connect_error(host: Host, error: BaseException) -> HostError:
    """A HostError saying why `host` could not be reached or logged into, and what to do about it."""
    where = f"{host.hostname}:{host.port}"
    reach_fix = (f"check the host and SSH port in the hosts file, that sshd runs on {host.hostname} and that "
                 f"this machine can reach it (try: ssh -p {host.port} {host.login} true)")
    if isinstance(error, paramiko.BadHostKeyException):
        return HostError(host, f"{host.hostname} presented a host key that differs from the one in "
                         f"~/.ssh/known_hosts; if the machine was reinstalled, remove the old key with "
                         f"ssh-keygen -R {host.hostname}")
    if isinstance(error, paramiko.AuthenticationException):
        user = host.user or "your user"
        return HostError(host, f"SSH authentication failed for {user} at {where} ({error}); set up passwordless "
                         f"SSH: ssh-copy-id -p {host.port} {host.login}, or give the key with fab -i KEYFILE")
    if isinstance(error, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = "; ".join(sorted({e.strerror or str(e) for e in error.errors.values()}))
        return HostError(host, f"unreachable: cannot connect to {where} ({reasons}); {reach_fix}")
    if isinstance(error, (socket.timeout, TimeoutError)):
        return HostError(host, f"unreachable: no answer from {where} within the connect timeout; {reach_fix}")
    if isinstance(error, socket.gaierror):
        return HostError(host, f"unreachable: the name {host.hostname} cannot be resolved ({error.strerror}); "
                         "fix it in the hosts file")
    if isinstance(error, OSError) and error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNREFUSED,
                                                      errno.ECONNRESET, errno.ETIMEDOUT):
        return HostError(host, f"unreachable: cannot connect to {where} ({error.strerror}); {reach_fix}")
    if isinstance(error, (paramiko.SSHException, EOFError)):
        return HostError(host, f"SSH to {where} failed ({error or type(error).__name__}); is an SSH server "
                         f"listening there? {reach_fix}")
    return HostError(host, f"cannot connect to {where}: {type(error).__name__}: {error}")


def remote_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """A shell command line running `argv` (quoted) with `env` set, in `cwd`."""
    words = [shlex.quote(a) for a in argv]
    if env:
        words = ["env", *(f"{k}={shlex.quote(v)}" for k, v in env.items()), *words]
    line = " ".join(words)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


class Session:
    """Open connections to `hosts` (opened on first use, one per host, closed by `close`). Methods may be called
    from several threads, each working on its own host; a connection may carry several commands at once."""

    def __init__(self, hosts: Sequence[Host], connect: ConnectionFactory):
        labels = [h.label for h in hosts]
        if len(set(labels)) != len(labels):
            raise ValueError(f"hosts given twice: {labels}")
        self.hosts = list(hosts)
        self._connect = connect
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            conn.close()

    def connection(self, host: Host) -> Connection:
        """`host`'s open connection; HostError (unreachable, authentication failed, ...) if it cannot be made."""
        with self._lock:
            conn = self._connections.get(host.label)
        if conn is not None and conn.is_connected:
            return conn
        try:
            conn = self._connect(host)
            conn.open()
        except Exception as e:  # every connect failure becomes a message naming the host
            raise _connect_error(host, e) from e
        with self._lock:
            self._connections[host.label] = conn
        return conn

    def run(self, host: Host, command: str, what: str, fix: str = "", **kwargs) -> str:
        """Runs `command` on `host`; its stdout. A non-zero exit raises HostError: "`what` failed (exit N):
        <last lines of its output>; `fix`"."""
        kwargs.setdefault("hide", True)
        try:
            result = self.connection(host).run(command, warn=True, in_stream=False, **kwargs)
        except HostError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(host, f"{what}: the SSH connection failed ({e}); is the host still up?") from e
        if result.exited != 0:
            output = (result.stderr.strip() or result.stdout.strip()).splitlines()[-6:]
            detail = ("\n    " + "\n    ".join(output)) if output else ""
            raise HostError(host, f"{what} failed (exit {result.exited}){'; ' + fix if fix else ''}{detail}")
        return result.stdout

    def resolve(self, host: Host, path: str) -> str:
        """`path` on `host` as an absolute path: a leading ~/ is that host's home directory."""
        if path.startswith("~/") or path == "~":
            home = self.run(host, 'printf %s "$HOME"', "finding the home directory").strip()
            return home + path[1:]
        if not path.startswith("/"):
            raise HostError(host, f"{path!r} is neither absolute nor under ~/: give a path like /srv/p3kv or ~/p3kv")
        return path.rstrip("/") or "/"

    def read_file(self, host: Host, path: str) -> str | None:
        """The text of `path` on `host`, None if it does not exist."""
        try:
            with self.connection(host).sftp().open(path) as f:
                return f.read().decode()
        except FileNotFoundError:
            return None

    def write_file(self, host: Host, path: str, text: str, mode: int = 0o644) -> None:
        """Writes `text` to `path` on `host`; the file has `mode` before anything is written into it."""
        sftp = self.connection(host).sftp()
        with sftp.open(path, "w") as f:
            sftp.chmod(path, mode)
            f.write(text.encode())

    def each(self, fn: Callable[[Host], T], what: str, hosts: Iterable[Host] | None = None,
             parallel: bool = True) -> dict[str, T]:
        """Runs `fn(host)` for every host (default: all), in parallel or one after another; {label: result}. If
        any fail, raises one DeployError naming each failed host (the others' work is done)."""
        chosen = list(self.hosts if hosts is None else hosts)
        results: dict[str, T] = {}
        failures: dict[str, str] = {}
        if not chosen:
            return results
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(chosen)) if parallel else 1) as pool:
            futures = {pool.submit(fn, host): host for host in chosen}
            for future in concurrent.futures.as_completed(futures):
                host = futures[future]
                try:
                    results[host.label] = future.result()
                except HostError as e:
                    failures[host.label] = str(e)
                except Exception as e:  # reported per host, with the host named
                    LOG.debug("%s on %s", what, host.label, exc_info=True)
                    failures[host.label] = f"{host.label}: {type(e).__name__}: {e}"
        if failures:
            raise DeployError(what, {h.label: failures[h.label] for h in chosen if h.label in failures})
        return {h.label: results[h.label] for h in chosen}
