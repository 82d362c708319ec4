"""What the processes of a job that did not end are doing, for the failure message of the test that waited on it: a
hang seen once on a CI machine then says where it was (ps-lite's barrier, ZMQ, MXNet's engine, our transport).

Each process under the one that hung is named by its command line, then each of its threads by the kernel's wait
channel, and, where gdb is installed, by its C stack (all processes attached at once, so the report costs one gdb
run's time, not one per process)."""

from __future__ import annotations

import os
import shutil
import subprocess

GDB_SECONDS = 90  # attaching loads libmxnet's symbols: 10-30 s per process on the 2-core test machine
FRAMES = 30
STACK_CHARS = 12000  # per process: an MXNet process has a dozen threads
# Interpreter frames say nothing about where a native hang is; the frames around them do.
_NOISE = ("_PyEval_", "PyEval_", "_PyObject_", "PyObject_", "_PyFunction_", "method_vectorcall", "cfunction_",
          "slot_tp_", "type_call", "pymain_", "Py_RunMain", "builtin_exec", "run_mod", "run_eval_code")


def descendants(pid: int) -> list[int]:
    """`pid`'s children, grandchildren, ... (from /proc, in the order found)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _threads(pid: int) -> list[str]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return ["  (exited)"]
    return [f"  thread {tid} {_read(f'/proc/{pid}/task/{tid}/comm')}: waits in "
            f"{_read(f'/proc/{pid}/task/{tid}/wchan') or 'nothing (running)'}" for tid in tids]


def _stacks(pids: list[int]) -> dict[int, str]:
    """Each process's threads' C stacks from gdb (empty where gdb is missing or fails)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return {}
    runs = {pid: subprocess.Popen([gdb, "-p", str(pid), "-batch", "-nx", "-ex", f"thread apply all bt {FRAMES}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True) for pid in pids}
    stacks = {}
    for pid, run in runs.items():
        try:
            out, _ = run.communicate(timeout=GDB_SECONDS)
        except subprocess.TimeoutExpired:
            run.kill()
            out, _ = run.communicate()
        keep = [line for line in out.splitlines()
                if line.startswith("Thread ") or (line.startswith("#") and not any(n in line for n in _NOISE))]
        text = "\n".join("    " + line[:220] for line in keep)
        stacks[pid] = text if len(text) <= STACK_CHARS else text[:STACK_CHARS] + "\n    (cut)"
    return stacks


def report(pid: int) -> str:
    """`pid` and every process under it: command line, threads' wait channels, and C stacks where gdb is."""
    pids = [pid, *descendants(pid)]
    stacks = _stacks(pids)
    parts = []
    for p in pids:
        command = _read(f"/proc/{p}/cmdline") or "(exited, not yet reaped by its parent)"
        parts += [f"process {p}: {command}", *_threads(p)]
        if stacks.get(p):
            parts.append(stacks[p])
    if not stacks:
        parts.append("(no C stacks: gdb is not installed)")
    return "\n".join(parts)
