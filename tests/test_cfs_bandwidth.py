"""The CFS period and bandwidth-slice policy of the emulated hosts' CPU quotas (emulation/cfs_bandwidth.py)."""

import pytest

from benchmarks.emulation import cfs_bandwidth

pytestmark = pytest.mark.unit


def test_the_period_grows_only_where_the_quota_would_fall_under_the_kernels_minimum():
    assert cfs_bandwidth.period_us(0.4) == 10_000
    assert cfs_bandwidth.period_us(0.4, base=2500) == 2500  # 1 ms of quota: the kernel's minimum, kept
    assert cfs_bandwidth.period_us(0.2, base=2500) == 5000  # 0.5 ms would be rounded up to 1 ms: the period grows
    assert cfs_bandwidth.period_us(None, base=2500) == 2500
    with pytest.raises(ValueError, match="outside the kernel's 1000 us to 1000000 us"):
        cfs_bandwidth.period_us(0.4, base=500)
    with pytest.raises(ValueError, match="outside the kernel's 1000 us to 1000000 us"):
        cfs_bandwidth.period_us(0.4, base=2_000_000)


def test_the_slice_is_set_for_the_groups_lifetime_and_refused_below_one_us(tmp_path):
    file = tmp_path / "slice"
    file.write_text("5000\n")
    machine = cfs_bandwidth.MachineSlice(file, 250)
    machine.start()
    assert file.read_text() == "250" and machine.slice_us == 250
    machine.close()
    assert file.read_text() == "5000"
    with pytest.raises(ValueError, match="minimum of 1 us"):
        cfs_bandwidth.MachineSlice(file, 0)
