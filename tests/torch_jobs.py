"""Torch jobs for tests/test_torch_*.py: tests/scripts/torch_train.py as a p3kv.torch job through the launcher,
or as a 2-process DDP job (gloo) with the same arguments, and the states worker/rank 0 saved."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, SCRIPTS, free_port, launcher_env, run_job

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
        deadline = time.monotonic() + timeout
        finished_at = None  # when every rank had printed its checksum
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if finished_at is None and all(_finished(log) for log in logs):
                finished_at = time.monotonic()
            if finished_at is not None and time.monotonic() - finished_at > TEARDOWN_GRACE_S:
                break
            if finished_at is None and any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
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
CHECKSUM = re.compile(r"^rank \d+ checksum ", re.MULTILINE)


def _finished(log) -> bool:
    log.flush()
    with open(log.name) as f:
        return CHECKSUM.search(f.read()) is not None
