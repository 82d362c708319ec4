"""p3kv.torch (worker placement: servers sum, each worker runs the user's optimizer per parameter) gives the
parameters of torch's DistributedDataParallel (gloo) with the same seed, data shards and optimizer.

Bitwise with two workers: DDP multiplies each gradient by 1/world size before an all-reduce sum and p3kv.torch does
the same before the servers' sum; a sum of two terms does not depend on the order, and torch's CPU optimizers
(single-tensor path) update each parameter on its own, so stepping one module's parameters at a time changes no bit.
With four workers the servers add in arrival order and gloo in its ring's: equal within float32 rounding.
"""

from __future__ import annotations

import pytest
from torch_cases import DDP_CASES
from torch_jobs import ddp_job, p3kv_job

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="p3kv.torch needs torch (pip install '.[torch]')")

CASES = DDP_CASES


def _compare(a: dict, b: dict) -> dict:
    assert a.keys() == b.keys()
    return {k: float((a[k].double() - b[k].double()).abs().max()) for k in a if not torch.equal(a[k], b[k])}


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_end_with_ddps_parameters_bit_for_bit(tmp_path, case):
    args = CASES[case]
    result = p3kv_job(tmp_path / "p3kv.pt", *args)
    assert result.returncode == 0, result.stdout
    ddp_job(tmp_path / "ddp.pt", *args)
    p3, ddp = torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt")
    assert p3.keys() == ddp.keys()
    assert _compare(p3, ddp) == {}, f"differ (max abs difference per tensor): {_compare(p3, ddp)}"
    # Both workers hold the same parameters at the end.
    sums = {line.split()[-1] for line in result.stdout.splitlines() if " checksum " in line}
    assert len(sums) == 1, result.stdout


def test_four_workers_end_with_ddps_parameters_within_rounding(tmp_path):
    result = p3kv_job(tmp_path / "p3kv.pt", workers=4)
    assert result.returncode == 0, result.stdout
    ddp_job(tmp_path / "ddp.pt", workers=4)
    p3, ddp = torch.load(tmp_path / "p3kv.pt"), torch.load(tmp_path / "ddp.pt")
    for k in p3:
        # Six SGD steps from the same start: sums of four terms in another order differ in the last bits.
        torch.testing.assert_close(p3[k], ddp[k], rtol=1e-5, atol=1e-6, msg=k)
