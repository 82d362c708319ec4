"""The scheduler and servers a worker process starts as its own children, for a job whose launcher (torchrun)
knows nothing of p3kv; p3kv.torch.torchrun decides which, this module runs and reaps them.

They end with the job: the scheduler ends it when every worker has closed, or when a node dies (its connection
drops, or it misses heartbeats for P3_HEARTBEAT_TIMEOUT), and then every server exits too. They stay in the
worker's process group, so torchrun, which stops a failed job's workers by process group, stops them as well.
`ChildServices.reap` (called at the worker's exit, after its clean close) waits for them and reports a failure.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping

from p3kv.core import config
from p3kv.core.config import Config, Role
from p3kv.launch.torchrun import PER_PROCESS

LOG = logging.getLogger("p3kv.launch")

# Where `import p3kv` found this package: the children must find the same one (torchrun starts scripts with their
# own folder, not the current directory, first on sys.path).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_KILL_WAIT = 10.0  # seconds for a SIGKILLed child to be reaped


def child_environment(cfg: Config, role: Role, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without its P3_* and per-worker variables, plus the P3_* description of `cfg` for `role`."""
    env = {k: v for k, v in environ.items() if not k.startswith("P3_") and k not in PER_PROCESS}
    # Tuning the user set (P3_SLICE_SIZE, P3_HEARTBEAT_TIMEOUT, ...) is in cfg and comes back below.
    env.update(config.environment_for(cfg, role))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, environ.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class ChildServices:
    """Scheduler and/or servers started as children of this process (their output goes to this process's)."""

    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, role: Role, cfg: Config, environ: Mapping[str, str] | None = None) -> None:
        """Starts `python -m p3kv.core.scheduler` or `p3kv.core.server` with this process's environment (or
        `environ`) described by `cfg`."""
        module = "p3kv.core.scheduler" if role is Role.SCHEDULER else "p3kv.core.server"
        env = child_environment(cfg, role, config.handed_on() if environ is None else environ)
        proc = subprocess.Popen([sys.executable, "-m", module], env=env,
                                stdin=subprocess.DEVNULL)
        self.children.append((name, proc))
        LOG.info("started %s (pid %d)", name, proc.pid)

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.children}

    def reap(self, timeout: float) -> list[str]:
        """Waits up to `timeout` seconds for every child to exit (they do once the job has ended), kills those
        still running after it; what failed, as messages (also logged)."""
        deadline = time.monotonic() + timeout
        failed = []
        for name, proc in self.children:
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_KILL_WAIT)
                failed.append(f"{name} (pid {proc.pid}) still ran {timeout:g} s after this worker closed; killed it")
                continue
            if code != 0:
                failed.append(f"{name} (pid {proc.pid}) exited with code {code}")
        for message in failed:
            LOG.error("%s", message)
        return failed

    def kill(self) -> None:
        """Kills every child still running and reaps it (for a start that failed half-way)."""
        for _, proc in self.children:
            if proc.poll() is None:
                proc.kill()
        for _, proc in self.children:
            try:
                proc.wait(timeout=_KILL_WAIT)
            except subprocess.TimeoutExpired:
                LOG.error("pid %d survived SIGKILL", proc.pid)
