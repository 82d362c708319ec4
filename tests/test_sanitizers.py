"""The sanitizer tier (`pytest -m sanitizer`): use after free, buffer overflows, undefined behaviour, leaks and data
races in the C++ core made visible for good.

- Every C++ test program (cpp/tests/*_tests.cc) built and run under AddressSanitizer + UndefinedBehaviorSanitizer
  (any undefined behaviour ends the program) and again under ThreadSanitizer; cpp/tests/threads_tests.cc drives
  a whole in-process job (scheduler, 2 servers, 2 workers: senders, receivers, the aggregator's consumer), the
  buffer pool and the request tracker from several threads for ThreadSanitizer's sake.
- A 2-worker/2-server numpy job and a 2-worker MXNet Module job (kvstore='p3') whose every process imports a copy
  of the `p3kv._p3` extension built with ASan + UBSan (tests/cpp_build.py's extension(), in build/cpp-tests/,
  never over the in-place one), the ASan runtime preloaded (python and libmxnet are not instrumented).

A finding fails the test with the sanitizer's report. tests/sanitizer_suppressions.txt may silence third-party
code only, each line with its reason; our own code is fixed, never suppressed.
"""

import glob
import os
import re
import subprocess
import sys

import cpp_build
import pytest
from harness import ROOT, SCRIPTS, free_port, node_env, run_job

pytestmark = pytest.mark.sanitizer

SUPPRESSIONS = os.path.join(ROOT, "tests", "sanitizer_suppressions.txt")
# The head of any sanitizer's report (a runtime error of UBSan's is one line).
REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|ThreadSanitizer: |"
                    r"runtime error: ")
PROGRAM_TIMEOUT = 300  # seconds for one sanitized test program (ThreadSanitizer runs them 5-15x slower)
JOB_TIMEOUT = 240  # seconds for a sanitized job through the launcher


# Findings in our code not fixed yet: (program, variant) -> the bug, as the sanitizer reports it. Only these
# tests are expected to fail (strict: one that passes fails, so the mark goes when the bug is fixed).
KNOWN: dict[tuple[str, str], str] = {}


def _cases():
    for program in cpp_build.programs():
        for variant in ("asan", "tsan"):
            bug = KNOWN.get((program, variant))
            marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
            yield pytest.param(program, variant, marks=marks, id=f"{program}-{variant}")


@pytest.mark.parametrize("program,variant", list(_cases()))
def test_cpp_program_is_clean_under_sanitizer(program, variant):
    result = cpp_build.run(program, timeout=PROGRAM_TIMEOUT, variant=variant)
    found = REPORT.search(result.stdout)
    assert found is None, f"{variant} found a problem in {program}:\n{result.stdout[-20000:]}"
    assert result.returncode == 0, result.stdout[-20000:]
    assert re.search(r"^[1-9]\d* passed, 0 failed$", result.stdout, re.MULTILINE), result.stdout[-20000:]


# ---- jobs with the sanitized extension ----

@pytest.fixture(scope="module")
def sanitized():
    """The folder holding the ASan+UBSan build of p3kv (first on PYTHONPATH) and the libraries to preload."""
    return cpp_build.extension("asan"), cpp_build.python_preload()


def _job_env(sanitized, log_dir) -> dict[str, str]:
    """Every process of the job imports the sanitized extension with the ASan runtime preloaded, and writes any
    report to log_dir/sanitizer.<pid> (whatever the launcher does with the processes' output)."""
    folder, preload = sanitized
    env = cpp_build.sanitizer_env(python=True, preload=preload)
    # CPython and libmxnet are not instrumented: leaks are off for Python (cpp_build.sanitizer_env says why);
    # third-party findings are silenced in the suppressions file, each with its reason.
    log = os.path.join(str(log_dir), "sanitizer")
    env["ASAN_OPTIONS"] += f":log_path={log}:suppressions={SUPPRESSIONS}"
    env["UBSAN_OPTIONS"] += f":log_path={log}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _reports(log_dir) -> str:
    return "".join(open(p, errors="replace").read() for p in sorted(glob.glob(os.path.join(str(log_dir),
                                                                                            "sanitizer*"))))


def test_jobs_import_the_sanitized_extension(sanitized, tmp_path):
    # What the job tests below rely on: a python started with their environment imports the sanitized copy, with
    # the ASan runtime in the process (an instrumented extension without it refuses to load), and an error of the
    # C++ core still reaches Python as an exception (a worker whose scheduler never answers: the C++ exception
    # the bindings throw aborted the process under ASan before libstdc++ was preloaded too).
    env = {**node_env("worker", free_port(), P3_CONNECT_TIMEOUT="1"), **_job_env(sanitized, tmp_path)}
    code = ("import p3kv._p3 as m\n"
            "print(m.__file__, open('/proc/self/maps').read().count('libasan'))\n"
            "from p3kv.core.worker import P3Worker\n"
            "try:\n"
            "    P3Worker()\n"
            "except Exception as e:\n"
            "    print('raised', type(e).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout
    assert _reports(tmp_path) == ""
    path, maps = re.search(r"^(\S+) (\d+)$", done.stdout, re.MULTILINE).groups()
    assert path.startswith(sanitized[0] + os.sep), done.stdout
    assert int(maps) > 0, done.stdout
    assert re.search(r"^raised P3\w*Error$", done.stdout, re.MULTILINE), done.stdout


def test_numpy_job_is_clean_with_sanitized_extension(sanitized, tmp_path):
    # agg_worker checks every broadcast sum (float32/float64/float16, 3 iterations) against numpy; servers sum.
    logs = tmp_path / "logs"
    logs.mkdir()
    env = _job_env(sanitized, logs)
    env.update(P3_TEST_OUT=str(tmp_path), P3_SLICE_SIZE="1000")
    result = run_job(2, 2, [os.path.join(SCRIPTS, "agg_worker.py")], env=env, server_script="test_server.py",
                     timeout=JOB_TIMEOUT)
    reports = _reports(logs)
    assert reports == "", reports[-20000:]
    assert result.returncode == 0, result.stdout[-20000:]
    assert sorted(os.listdir(tmp_path)) == ["logs", "server0.json", "server1.json", "worker0.json", "worker0.npz",
                                            "worker1.json", "worker1.npz"], result.stdout[-5000:]


def test_mxnet_job_is_clean_with_sanitized_extension(sanitized, tmp_path):
    # Module.fit with kvstore='p3' (the engine bridge, server-side SGD through the optimizer kernels), 2 epochs.
    logs = tmp_path / "logs"
    logs.mkdir()
    env = _job_env(sanitized, logs)
    env.update(P3_SLICE_SIZE="50")
    result = run_job(2, 2, [os.path.join(SCRIPTS, "module_train.py"), "p3", str(tmp_path), "--epochs", "2"],
                     env=env, timeout=JOB_TIMEOUT, launcher_args=["--kvstore", "p3", "--timeout", str(JOB_TIMEOUT)])
    reports = _reports(logs)
    assert reports == "", reports[-20000:]
    assert result.returncode == 0, result.stdout[-20000:]
    for rank in range(2):
        done = re.search(rf"\brank {rank} done, update_on_kvstore=1$", result.stdout, re.MULTILINE)
        assert done, result.stdout[-5000:]
        assert os.path.exists(tmp_path / f"p3-rank{rank}.npz")
