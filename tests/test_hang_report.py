"""A job that does not end fails its test with what each of its processes was doing (tests/hang_report.py)."""

import os
import shutil
import sys

import pytest
from harness import run_job


@pytest.mark.integration
def test_a_job_past_its_time_fails_with_its_processes_threads_and_stacks():
    """A worker that blocks in a read past the harness's timeout: the failure names the launcher, the worker's
    command line, its main thread's wait channel and (with gdb) the C stack of the read, and nothing survives."""
    worker = "import os; print('reading in', os.getpid(), flush=True); os.read(os.pipe()[0], 1)"
    with pytest.raises(pytest.fail.Exception) as failure:
        run_job(1, 1, ["-c", worker], timeout=8)
    text = str(failure.value)
    assert "the launcher did not end within 8 s" in text and "[worker 0] reading in " in text, text
    pid = int(text.split("[worker 0] reading in ", 1)[1].split()[0])
    assert not os.path.exists(f"/proc/{pid}"), "the worker outlived its test"
    assert "--- its processes when the time ran out:" in text
    assert f"{sys.executable} -c {worker}" in text, text  # the worker's own command line
    worker_part = text.split(f"-c {worker}", 1)[1]
    assert "pipe_read" in worker_part or "pipe_wait" in worker_part, worker_part[:2000]  # its read, by the kernel
    if shutil.which("gdb"):
        assert "__libc_read" in worker_part or " read (" in worker_part or "in read" in worker_part, worker_part
    else:
        assert "(no C stacks: gdb is not installed)" in text
