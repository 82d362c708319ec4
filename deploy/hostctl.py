"""The host side of a deployed job: start a launcher detached from SSH, watch it, report on it, stop it.

Runs on each host (shipped by `fab install`, run with the deployment's Python; standard library only)::

    python deploy/hostctl.py start --job-dir DIR -- python -m p3kv.launch ...   # prints {"monitor_pid": ...}
    python deploy/hostctl.py status --job-dir DIR                               # prints {"running": ...}
    python deploy/hostctl.py stop --job-dir DIR [--grace S]                     # prints what it stopped

`start` spawns a *monitor* in a new session (so the job outlives the SSH connection and has a process group of
its own) and returns. The monitor is a child subreaper: every process of the job stays its descendant even when
a parent dies. It runs the launcher with output to DIR/launcher.log, records the pids in DIR/state.json, and
when the launcher exits, kills whatever of the job is left and writes the exit code to DIR/exit_code.
`stop` signals exactly the recorded processes (checked against their start times, so a reused pid is never
hit) and their descendants: SIGTERM to the launcher, which stops its job; SIGKILL to what remains after
--grace seconds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

STATE = "state.json"
EXIT_CODE = "exit_code"
LOG = "launcher.log"
_PR_SET_CHILD_SUBREAPER = 36


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if there is none (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def _same(pid: int, start: int) -> bool:
    """Whether `pid` is still the process that started at `start` (pids are reused)."""
    stat = _stat(pid)
    return stat is not None and stat[1] == start


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(name))
                starts[int(name)] = stat[1]
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in found:
            found[pid] = starts[pid]
            todo += children.get(pid, [])
    return found


def _wait_gone(processes: dict[int, int], timeout: float) -> dict[int, int]:
    """Waits until none of `processes` ({pid: start}) lives or `timeout` passes; those still alive."""
    deadline = time.monotonic() + timeout
    alive = {p: s for p, s in processes.items() if _same(p, s)}
    while alive and time.monotonic() < deadline:
        pid = next(iter(alive))
        try:  # wake up when that process exits (no pidfd: re-check every 50 ms)
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            time.sleep(0.05)
        else:
            try:
                select.select([fd], [], [], max(0.0, min(deadline - time.monotonic(), 1.0)))
            finally:
                os.close(fd)
        alive = {p: s for p, s in alive.items() if _same(p, s)}
    return alive


def _kill(processes: dict[int, int]) -> list[int]:
    """SIGKILL to each of `processes` still alive, and to the process group it leads; the pids signalled."""
    killed = []
    for pid, start in processes.items():
        if not _same(pid, start):
            continue
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def _write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _read_state(job_dir: str) -> dict:
    with open(os.path.join(job_dir, STATE)) as f:
        return json.load(f)


def _exit_code(job_dir: str) -> int | None:
    try:
        with open(os.path.join(job_dir, EXIT_CODE)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def monitor(job_dir: str, argv: list[str]) -> int:
    """The monitor process (a session leader): runs `argv`, then cleans up and records its exit code."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    with open(os.path.join(job_dir, LOG), "ab") as log:
        launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def forward(signum: int, _frame: object) -> None:
        launcher.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    me, child = _stat(os.getpid()), _stat(launcher.pid)
    state = {"monitor_pid": os.getpid(), "monitor_start": me[1] if me else 0,
             "launcher_pid": launcher.pid, "launcher_start": child[1] if child else 0}
    _write_atomic(os.path.join(job_dir, STATE), json.dumps(state))
    print(json.dumps(state), flush=True)  # to `start`, which waits for this line
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    code = launcher.wait()
    code = 128 - code if code < 0 else code
    leftovers = descendants(os.getpid())  # orphans of the job, re-parented to this subreaper
    if leftovers:
        os.write(2, f"killing {len(leftovers)} processes left by the launcher: {sorted(leftovers)}\n".encode())
        _kill(leftovers)
        _wait_gone(leftovers, 10)
    _write_atomic(os.path.join(job_dir, EXIT_CODE), f"{code}\n")
    return code


def start(job_dir: str, argv: list[str]) -> int:
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(job_dir, "monitor.log"), "ab") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_monitor", "--job-dir", job_dir,
                                 "--", *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else b""
    if not line:
        code = proc.wait()
        sys.stderr.write(f"the job's monitor exited ({code}) before starting the launcher; see "
                         f"{job_dir}/monitor.log\n")
        return 1
    sys.stdout.write(line.decode())
    return 0


def status(job_dir: str) -> dict:
    try:
        state = _read_state(job_dir)
    except (OSError, ValueError):
        return {"running": False, "started": False, "exit_code": None, "processes": []}
    running = _same(state["monitor_pid"], state["monitor_start"])
    processes = sorted(descendants(state["monitor_pid"])) if running else []
    return {"running": running, "started": True, "exit_code": _exit_code(job_dir),
            "processes": ([state["monitor_pid"]] if running else []) + processes}


def stop(job_dir: str, grace: float) -> dict:
    try:
        state = _read_state(job_dir)
    except (OSError, ValueError):
        return {"was_running": False, "killed": [], "exit_code": None}
    monitor_proc = {state["monitor_pid"]: state["monitor_start"]}
    if not _same(state["monitor_pid"], state["monitor_start"]):
        return {"was_running": False, "killed": [], "exit_code": _exit_code(job_dir)}
    if _same(state["launcher_pid"], state["launcher_start"]):
        os.kill(state["launcher_pid"], signal.SIGTERM)  # the launcher stops its scheduler, servers and workers
    remaining = _wait_gone(monitor_proc, grace)
    killed: list[int] = []
    if remaining:
        tree = {**descendants(state["monitor_pid"]), **monitor_proc}
        killed = _kill(tree)
        _wait_gone(tree, 10)
    return {"was_running": True, "killed": killed, "exit_code": _exit_code(job_dir)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("start", "_monitor", "status", "stop"):
        p = sub.add_parser(name)
        p.add_argument("--job-dir", required=True)
        if name == "stop":
            p.add_argument("--grace", type=float, default=20.0)
        if name in ("start", "_monitor"):
            p.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    job_dir = os.path.abspath(args.job_dir)
    if args.action in ("start", "_monitor"):
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("give the command to run after --")
        return start(job_dir, command) if args.action == "start" else monitor(job_dir, command)
    result = status(job_dir) if args.action == "status" else stop(job_dir, args.grace)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
