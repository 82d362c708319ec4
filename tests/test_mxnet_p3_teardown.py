"""An mxnet-p3 job ends when its workers do, however slowly its scheduler sends.

ps-lite's P3 van sends through a priority queue that pops the newest of equal priorities first, and its sending
thread stops at the first TERMINATE it pops. A scheduler on that van queues the final barrier's replies to every
node, gets its own reply first, queues its TERMINATE, and may then stop before the other replies leave: those
workers wait in the barrier forever (a job seen to hang in CI after its workers finished). The launcher gives the
scheduler ps-lite's plain van (p3kv/launch/baselines.py). Here every send of the scheduler is delayed 3 ms
(tests/native/slow_ps_send.cc, preloaded), which makes the race happen every run: with the scheduler on the P3
van this job hung 3 runs of 3, its scheduler exited and workers waited; with the plain van it ends every run."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cpp_build import compiler
from harness import run_launcher

REPO = Path(__file__).resolve().parent.parent
DIST_SYNC_SUM = str(REPO / "tests" / "scripts" / "dist_sync_sum.py")
SHIM = str(REPO / "tests" / "native" / "slow_ps_send.cc")
DELAY_US = 3000


def libmxnet() -> str:
    spec = importlib.util.find_spec("mxnet")
    assert spec is not None and spec.submodule_search_locations, "MXNet is not installed (make setup)"
    return os.path.join(spec.submodule_search_locations[0], "libmxnet.so")


@pytest.mark.mxnet
def test_an_mxnet_p3_job_ends_when_its_scheduler_sends_slowly(tmp_path):
    shim = tmp_path / "slow_ps_send.so"
    subprocess.run([compiler(), "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(shim), SHIM,
                    "-ldl"], check=True, capture_output=True, text=True, timeout=120)
    scheduler = shlex.join(["env", f"LD_PRELOAD={shim}", f"P3_TEST_PS_LIB={libmxnet()}",
                            f"P3_TEST_SEND_DELAY_US={DELAY_US}", sys.executable, "-c", "import mxnet"])
    result = run_launcher("-n", "4", "-s", "2", "--kvstore", "mxnet-p3", "--scheduler-command", scheduler, "-v",
                          "--", sys.executable, DIST_SYNC_SUM, timeout=90)
    assert f"[scheduler] slow_ps_send: every ps-lite send waits {DELAY_US} us" in result.stdout, result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    oks = re.findall(r"^\[worker (\d)\] OK rank=(\d) baseline=mxnet-p3$", result.stdout, re.MULTILINE)
    assert sorted(r for _, r in oks) == ["0", "1", "2", "3"], result.stdout
    assert "all 7 processes exited with code 0" in result.stderr, result.stderr
