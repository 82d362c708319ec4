"""p3kv's ratio to each baseline per point with its bootstrap CI, and whether the dilation changed it
(benchmarks/analysis/ratio_table.py): the dilation sweep's evidence that the emulation is faithful."""

import numpy as np
import pytest

from benchmarks.analysis import ratio_table

pytestmark = pytest.mark.unit


def _row(kvstore, scale, seconds, run_id, faithful="True", rng=None):
    """A run of the ResNet-50 4 Gbit/s P100-equivalent comparison at --gpu-scale `scale`: 2 ranks x 20 iterations
    around `seconds` (emulated time grows as 1 / scale)."""
    rng = rng or np.random.default_rng(len(run_id))
    ranks = [list(rng.normal(seconds / scale, 0.01 * seconds / scale, size=20)) for _ in range(2)]
    return {"status": "ok", "smoke": "False", "tag": "dilation", "model": "resnet50_v1", "kvstore": kvstore,
            "hosts": "4", "layout": "colocated", "compute": "emulated", "batch_size": "32", "gpu_scale": str(scale),
            "bandwidth": f"{4000 * scale:g}mbit", "p100_equiv_gbps": "4", "efficiency_factor": "1.0",
            "optimizer": "sgd", "workers": "4", "samples_per_batch": "32", "host_cpus": "4", "faithful": faithful,
            "rank_iter_s": ranks, "run_id": run_id, "unit": "images"}


def _rows(ratios_at: dict[float, float]) -> list[dict]:
    rows = []
    for scale, ratio in ratios_at.items():
        for repeat in range(4):
            rows += [_row("p3", scale, 1.0, f"p3-{scale}-{repeat}"),
                     _row("dist_sync", scale, ratio, f"ds-{scale}-{repeat}"),
                     _row("dist_sync", scale, 10.0, f"bad-{scale}-{repeat}", faithful="False")]  # left out
    return rows


def test_each_point_has_p3kvs_throughput_and_its_ratio_to_each_baseline_with_a_ci():
    found = ratio_table.ratios(_rows({0.1: 1.2, 0.05: 1.2}), resamples=300)
    assert len(found) == 2
    for f in found:
        scale = float(f["row"]["gpu_scale"])
        assert f["runs"] == {"p3": 4, "dist_sync": 4}  # the unfaithful runs are not counted
        e = f["versus"]["dist_sync"]
        assert e.low <= e.value <= e.high and e.value == pytest.approx(1.2, rel=0.01)
        assert f["throughput"].value / scale == pytest.approx(4 * 32 / 1.0, rel=0.01)  # P100-equivalent: 128/s
    text = ratio_table.table(found)
    lines = text.splitlines()
    assert len(lines) == 4 and "vs dist_sync (95% CI)" in lines[0] and "vs Horovod (95% CI)" in lines[0]
    assert lines[2].split(" | ")[3] == "0.1" and lines[3].split(" | ")[3] == "0.05"  # least dilated first
    assert all(" 1.20 (" in line and line.endswith("| - | - |") for line in lines[2:])  # no MXNet P3, Horovod rows
    assert ratio_table.table([]) == ""


def test_the_sentence_says_whether_one_value_lies_inside_every_dilations_ci():
    same = ratio_table.invariance_sentences(ratio_table.ratios(_rows({0.1: 1.2, 0.05: 1.2}), resamples=300))
    assert len(same) == 1 and "p3kv / dist_sync 1.20 at 0.1, 1.20 at 0.05" in same[0]
    assert "the dilation did not change it" in same[0]
    moved = ratio_table.invariance_sentences(ratio_table.ratios(_rows({0.1: 1.2, 0.05: 1.5}), resamples=300))
    assert len(moved) == 1 and "the dilation changed it" in moved[0]
    assert ratio_table.invariance_sentences(ratio_table.ratios(_rows({0.1: 1.2}), resamples=300)) == []
