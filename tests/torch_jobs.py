"""Torch jobs for tests/test_torch_*.py: tests/scripts/torch_train.py as a p3kv.torch job through the launcher,
or as a 2-process DDP job (gloo) with the same arguments, and the states worker/rank 0 saved."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, ROOT, SCRIPTS, free_port, launcher_env, run_job

TRAIN = os.path.join(SCRIPTS, "torch_train.py")


def p3kv_job(out: Path, *args: str, workers: int = 2, servers: int = 2, env: dict | None = None,
             timeout: float = 300, server_module: str = "core",
             launcher_args: tuple | list = ()) -> subprocess.CompletedProcess:
    """The training script as a p3kv.torch job on the launcher's `--servers server_module` (the framework-free
    p3kv.core.server by default); worker 0 saves its state to `out`."""
    return run_job(workers, servers, [TRAIN, "p3kv", str(out), *args],
                   env={**launcher_env(), "P3_SLICE_SIZE": "1000", **(env or {})}, timeout=timeout,
                   launcher_args=["--servers", server_module, "--timeout", str(timeout - 10), *launcher_args])


def ddp_job(out: Path, *args: str, workers: int = 2, timeout: float = 300) -> list[str]:
    """The training script as a DDP job (gloo on loopback); rank 0 saves its state to `out`. Each rank's output.

    Output goes to files, not pipes (a rank blocked on a full pipe would stall the others' collectives), and the
    first rank to fail stops the job (the others would wait for it in a collective). A rank that has printed its
    checksum (rank 0 saved its state before) has done all the job is for: if gloo's teardown then hangs or aborts
    in it (torch 2.13 on CPU does now and then: destroy_process_group after rank 0 left, or "terminate called
    without an active exception"), it gets TEARDOWN_GRACE_S and is then let go, not counted as a failed job."""
    port = free_port()
    procs, logs = [], []
    try:
        for rank in range(workers):
            env = {**launcher_env(), "RANK": str(rank), "WORLD_SIZE": str(workers), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            logs.append(open(f"{out}.rank{rank}.log", "w+"))
            procs.append(subprocess.Popen([sys.executable, TRAIN, "ddp", str(out), *args], cwd=REPO, env=env,
                                          stdin=subprocess.DEVNULL, stdout=logs[-1], stderr=subprocess.STDOUT))
        wait_with_teardown_grace(procs, lambda: all(_finished(log) for log in logs), timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    report = "\n".join(f"rank {r} exited {p.returncode}:\n{o[-3000:]}" for r, (p, o) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 or CHECKSUM.search(o) for p, o in zip(procs, outputs)), report
    return outputs


TEARDOWN_GRACE_S = 20.0


def wait_with_teardown_grace(procs: list, finished, timeout: float) -> float | None:
    """Waits for `procs` to exit, at most `timeout` s; once `finished()` (every rank has reported its result) they
    get TEARDOWN_GRACE_S more, and a rank failing before that stops the wait. Returns when they had finished (a
    monotonic time), or None; the caller kills what still runs."""
    deadline = time.monotonic() + timeout
    finished_at = None
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if finished_at is None and finished():
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > TEARDOWN_GRACE_S:
            break
        if finished_at is None and any(p.returncode not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    return finished_at
CHECKSUM = re.compile(r"^rank \d+ checksum ", re.MULTILINE)


def _finished(log) -> bool:
    log.flush()
    with open(log.name) as f:
        return CHECKSUM.search(f.read()) is not None


def torchrun_env(**extra: str) -> dict[str, str]:
    """This process's environment without P3_*/DMLC_* variables (nothing of a p3kv launcher), the checkout on
    PYTHONPATH, small slices and INFO logs (the workers log the services' pids)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P3_", "DMLC_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    # No PYTHONUNBUFFERED: torchrun's workers share one pipe, and an unbuffered print writes its text and its newline
    # separately (lines of two workers could interleave); print(..., flush=True) writes a line at once.
    env.pop("PYTHONUNBUFFERED", None)
    env.update(P3_SLICE_SIZE="1000", P3_LOG_LEVEL="INFO", **extra)
    return env


def torchrun_argv(out: Path | str, *args: str, workers: int = 2, servers: int = 2,
                  standalone: bool = False) -> list[str]:
    """The training script under torchrun (one node, `workers` processes), starting p3kv's services itself; with
    torchrun's static rendezvous on a free port, or its c10d rendezvous (`standalone`, what users type)."""
    rendezvous = ["--standalone"] if standalone else ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return [sys.executable, "-m", "torch.distributed.run", *rendezvous, "--nproc-per-node", str(workers), TRAIN,
            "p3kv", str(out), "--servers", str(servers), *args]


def torchrun_job(out: Path, *args: str, workers: int = 2, servers: int = 2, standalone: bool = False,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """The training script as a p3kv.torch job under torchrun, run to its end (output merged into stdout)."""
    argv = torchrun_argv(out, *args, workers=workers, servers=servers, standalone=standalone)
    return subprocess.run(argv, cwd=REPO, env=torchrun_env(),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


SERVICE = re.compile(r"started p3kv (scheduler|server \d+ of node \d+) \(pid (\d+)\)")


def service_pids(output: str) -> dict[str, int]:
    """The scheduler's and servers' pids the workers logged when they started them."""
    return {m.group(1): int(m.group(2)) for m in SERVICE.finditer(output)}


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
