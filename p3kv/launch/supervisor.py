"""Run the processes of one job together: forward their output, and stop all of them as soon as one fails.

Knows nothing about p3kv's roles: a child has a display name and is either *primary* (a worker: the job is done
when every primary child has exited 0) or a service (scheduler, server: it must then exit 0 within a grace
period). A service marked `companion` (Horovod's rendezvous) does not know when the job ends: it gets SIGTERM
once every primary child has exited 0, and must then exit 0 within the grace period too. Used by `p3kv.launch`.

Threads: each child has a waiter thread (reports its exit) and a reader thread (forwards its output and owns its
log file). `Supervisor` starts them and joins them; they talk to the supervising thread through one
`queue.SimpleQueue`, whose `put` is reentrant, so the signal handlers put to it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, TextIO

LOG = logging.getLogger("p3kv.launch")

TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) returns
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KILL_WAIT = 10.0  # seconds to wait for SIGKILLed children (only a process stuck in the kernel takes longer)
_READER_WAIT = 5.0  # seconds to wait for output after all children are gone
ROOT_CAUSE_WINDOW = 0.5  # seconds a failure waits for a peer's exit that explains it (a node killed by a signal)
_MAX_LINE = 1 << 16  # longer lines are forwarded in pieces


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One child process: `name` prefixes its output ("worker 0"), `log_name` names its log file ("worker0").

    `joined_file`: a file the child creates once it has joined the job; a child that exits 0 without it fails
    the job at once ("exited without joining the job", then `join_hint`): the others would wait for it."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_name: str
    primary: bool
    joined_file: str | None = None
    join_hint: str = ""
    companion: bool = False  # a service stopped with SIGTERM when the primaries are done (see the module doc)


@dataclasses.dataclass(frozen=True)
class Outcome:
    exit_code: int
    message: str


def describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


class _Output:
    """The launcher's stdout, shared by all reader threads. Thread-safe."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    def write(self, text: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError) as e:
                # Keep draining the children's pipes (a full pipe would block them) but stop forwarding.
                self._broken = True
                LOG.warning("cannot write the children's output any more (%s); still collecting it", e)


def _wait_exit(popen: subprocess.Popen) -> int:
    """Block until the child exits; its Popen-style return code. Leaves it a zombie where the OS allows, so
    its pid (= its process group id) cannot be reused before `Supervisor` has killed the rest of its group."""
    if not hasattr(os, "waitid"):
        return popen.wait()
    info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class _Child:
    """A started child: its process, waiter thread and reader thread. Used by the supervising thread only."""

    def __init__(self, index: int, spec: ProcessSpec, events: queue.SimpleQueue, output: _Output,
                 log_file: IO[str] | None):
        self.index = index
        self.spec = spec
        self.returncode: int | None = None  # set by the supervising thread when it takes the exit event
        self._events = events
        self._output = output
        self._log_file = log_file
        self._popen: subprocess.Popen | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the process in its own session (so its whole process group can be killed). Raises OSError."""
        try:
            self._popen = subprocess.Popen(
                self.spec.argv, env=dict(self.spec.env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
        except OSError:
            self.discard()
            raise
        LOG.debug("started %s (pid %d): %s", self.spec.name, self._popen.pid, " ".join(self.spec.argv))
        for target, kind in ((self._wait, "wait"), (self._read, "read")):
            thread = threading.Thread(target=target, name=f"{kind} {self.spec.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def discard(self) -> None:
        """Release what `start` would have handed to the threads; for a child that was never started."""
        if self._popen is None and self._log_file is not None:
            self._log_file.close()

    @property
    def started(self) -> bool:
        return self._popen is not None

    @property
    def running(self) -> bool:
        return self.started and self.returncode is None

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to the child's whole process group (it is the group leader)."""
        if self._popen is None:
            return
        try:
            os.killpg(self._popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty already (a zombie leader may refuse signals on some systems)

    def reap(self) -> None:
        if self._popen is None:
            return
        try:
            self._popen.wait(timeout=_KILL_WAIT if self.returncode is None else None)
        except subprocess.TimeoutExpired:
            LOG.error("%s (pid %d) survived SIGKILL; it is stuck in the kernel", self.spec.name, self._popen.pid)

    def join_reader(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _wait(self) -> None:
        assert self._popen is not None
        self._events.put(("exit", self.index, _wait_exit(self._popen)))

    def _read(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        prefix = f"[{self.spec.name}] "
        pipe = self._popen.stdout
        try:
            for raw in iter(lambda: pipe.readline(_MAX_LINE), b""):
                text = raw.decode("utf-8", "replace")
                if not text.endswith("\n"):
                    text += "\n"
                self._output.write(prefix + text)
                if self._log_file is not None:
                    self._log_file.write(text)
        finally:
            pipe.close()
            if self._log_file is not None:
                self._log_file.close()


class Supervisor:
    """Runs `specs` (in that order) as one job. `run` may be called once, from one thread; it installs signal
    handlers only when called from the main thread."""

    def __init__(self, specs: Sequence[ProcessSpec], *, out: TextIO, log_dir: str | None = None,
                 timeout: float | None = None, grace: float = 30.0, kill_grace: float = 5.0):
        self._specs = list(specs)
        self._output = _Output(out)
        self._log_dir = log_dir
        self._timeout = timeout
        self._grace = grace
        self._kill_grace = kill_grace
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._children: list[_Child] = []

    def run(self) -> Outcome:
        """Start every child, wait for the job to finish or fail, stop whatever still runs. Never leaves a child
        running. Raises OSError if a log file cannot be created (before anything is started)."""
        log_files = self._open_log_files()
        self._children = [_Child(i, s, self._events, self._output, f)
                          for i, (s, f) in enumerate(zip(self._specs, log_files))]
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        previous_handlers = self._install_signal_handlers()
        try:
            return self._start_all() or self._supervise(deadline)
        finally:
            try:
                self._stop_all()
            finally:
                for signum, handler in previous_handlers.items():
                    signal.signal(signum, handler)

    def _open_log_files(self) -> list[IO[str] | None]:
        if self._log_dir is None:
            return [None] * len(self._specs)
        with contextlib.ExitStack() as opened:  # closes those already open if one fails
            files: list[IO[str] | None] = [
                opened.enter_context(open(os.path.join(self._log_dir, spec.log_name + ".log"), "w",
                                          encoding="utf-8", buffering=1))
                for spec in self._specs]
            opened.pop_all()  # the reader threads own them from now on
        return files

    def _install_signal_handlers(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: object) -> None:
            self._events.put(("signal", signum, 0))

        return {sig: signal.signal(sig, on_signal) for sig in _HANDLED_SIGNALS}

    def _start_all(self) -> Outcome | None:
        for child in self._children:
            try:
                child.start()
            except OSError as e:
                code = 127 if isinstance(e, FileNotFoundError) else 126  # the shell's codes for these
                return Outcome(code, f"cannot start {child.spec.name} ({' '.join(child.spec.argv)}): {e}; "
                                     "check the command and PATH")
        return None

    def _supervise(self, deadline: float | None) -> Outcome:
        primaries = {c.index for c in self._children if c.spec.primary}
        grace_deadline = None
        while True:
            if not primaries:
                if not any(c.running for c in self._children):
                    return Outcome(0, f"all {len(self._children)} processes exited with code 0")
                if grace_deadline is None:
                    grace_deadline = time.monotonic() + self._grace
                    for child in self._children:
                        if child.spec.companion and child.running:
                            child.signal_group(signal.SIGTERM)
            wake = min((d for d in (deadline, grace_deadline) if d is not None), default=None)
            try:
                kind, index, value = self._events.get(
                    timeout=None if wake is None else max(0.0, wake - time.monotonic()))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    running = [c.spec.name for c in self._children if c.running]
                    return Outcome(TIMEOUT_EXIT_CODE, f"the job timed out after {self._timeout:g} s (--timeout); "
                                                      f"killed the processes still running: {', '.join(running)}")
                lingering = [c.spec.name for c in self._children if c.running]
                return Outcome(1, f"{', '.join(lingering)} did not exit within {self._grace:g} s after all "
                                  "workers finished; killed them")
            if kind == "signal":
                return Outcome(128 + index, f"interrupted by {signal.Signals(index).name}; stopped all processes")
            child = self._children[index]
            child.returncode = value
            if value != 0:
                child = self._root_cause(child)
                value = child.returncode
                return Outcome(value if value > 0 else 1, f"{child.spec.name} {describe_exit(value)}; "
                                                          "stopped all other processes")
            joined = child.spec.joined_file
            if joined is not None and not os.path.exists(joined):
                hint = f" ({child.spec.join_hint})" if child.spec.join_hint else ""
                return Outcome(1, f"{child.spec.name} exited with code 0 without ever joining the job{hint}; "
                                  "stopped all other processes")
            LOG.info("%s exited with code 0", child.spec.name)
            primaries.discard(index)

    def _root_cause(self, failed: _Child) -> _Child:
        """The child to blame for a failure first seen in `failed`. A node killed by a signal makes its peers
        exit with an error within moments (the scheduler sees the connection drop), and their exit may be
        reported first: exits arriving within ROOT_CAUSE_WINDOW are taken, and one killed by a signal wins."""
        deadline = time.monotonic() + ROOT_CAUSE_WINDOW
        while failed.returncode >= 0:
            try:
                kind, index, value = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if kind == "signal":
                self._events.put((kind, index, value))  # handled by the caller's next wait
                break
            self._children[index].returncode = value
            if value < 0:
                return self._children[index]
        return failed

    def _await_exits(self, children: list[_Child], timeout: float) -> None:
        """Take exit events until none of `children` runs or `timeout` passes; a signal cuts the wait short."""
        deadline = time.monotonic() + timeout
        while any(c.running for c in children):
            try:
                kind, index, value = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if kind == "signal":
                LOG.warning("got %s while stopping the job; killing at once", signal.Signals(index).name)
                return
            self._children[index].returncode = value
            if value != 0:
                LOG.debug("%s %s", self._children[index].spec.name, describe_exit(value))

    def _stop_all(self) -> None:
        for child in self._children:
            child.discard()
        started = [c for c in self._children if c.started]
        running = [c for c in started if c.running]
        for child in running:
            child.signal_group(signal.SIGTERM)
        self._await_exits(running, self._kill_grace)
        stubborn = [c for c in running if c.running]
        if stubborn:
            LOG.warning("%s did not stop within %g s of SIGTERM; sending SIGKILL",
                        ", ".join(c.spec.name for c in stubborn), self._kill_grace)
            for child in stubborn:
                child.signal_group(signal.SIGKILL)
            self._await_exits(stubborn, _KILL_WAIT)
        # Leaders are exited (zombies, so their group ids are still theirs): kill whatever they left behind.
        for child in started:
            child.signal_group(signal.SIGKILL)
        for child in started:
            child.reap()
        for child in started:
            if not child.join_reader(_READER_WAIT):
                LOG.warning("the output pipe of %s is still open: a process it started left its process group "
                            "and still runs", child.spec.name)
