"""examples/torch_drop_in.py as users run it: under p3kv's launcher and under torchrun (DDP, gloo); the weights
end equal bit for bit (the printed checksums, to 10 decimals). torchrun sets OMP_NUM_THREADS=1 for its workers;
the p3kv job gets the same, so both compute with one thread."""

import os
import re
import subprocess
import sys

import pytest
from harness import REPO, ROOT, free_port, launcher_env, run_job

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="the example needs torch (pip install '.[torch]')")

EXAMPLE = os.path.join(ROOT, "examples", "torch_drop_in.py")
# Not anchored to lines: torchrun's two workers share one pipe, and a line's text and newline may interleave.
LINE = re.compile(r"worker (\d)/2 (p3kv placement=\w+|ddp): [^\n]*? weight checksum (\d+\.\d{10})")


def checksums(output: str, kind: str) -> dict:
    lines = LINE.findall(output)
    assert sorted(rank for rank, *_ in lines) == ["0", "1"] and {k for _, k, _ in lines} == {kind}, output[-4000:]
    return {rank: checksum for rank, _, checksum in lines}


@pytest.mark.parametrize("placement", ["worker", "server"])
def test_torch_example_runs_both_ways_and_p3kv_ends_with_ddps_weights(placement):
    job = run_job(2, 2, [EXAMPLE, "--steps", "8", "--placement", placement], env=launcher_env(), timeout=240,
                  launcher_args=("--servers", "core", "--timeout", "220", "--env", "OMP_NUM_THREADS=1"))
    assert job.returncode == 0, job.stdout[-4000:]
    p3 = checksums(job.stdout, f"p3kv placement={placement}")
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), EXAMPLE, "--steps", "8", "--ddp"], cwd=REPO, env=launcher_env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240, stdin=subprocess.DEVNULL)
    assert ddp.returncode == 0, ddp.stdout[-4000:]
    ddp_sums = checksums(ddp.stdout, "ddp")
    assert p3["0"] == p3["1"], f"p3kv workers ended with different weights: {p3}"
    assert p3["0"] == ddp_sums["0"], f"p3kv {p3} != ddp {ddp_sums}"
