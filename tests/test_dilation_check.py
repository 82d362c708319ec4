"""The dilation check's verdict (benchmarks/analysis/dilation_check.py) and the README paragraph made from it
(benchmarks/report/sweep_blocks.dilation_summary): every system's P100-equivalent throughput and p3kv's ratio to
every baseline within 5% across three or more dilations, or the check names what moved."""

import zlib

import numpy as np
import pytest

from benchmarks.analysis import bench_rows, dilation_check
from benchmarks.emulation import fidelity
from benchmarks.report import sweep_blocks

pytestmark = pytest.mark.unit

SCALES = (0.1, 0.075, 0.05)


def _row(kvstore, scale, seconds, run_id, faithful="True", notes=""):
    """A run of ResNet-50's 4 Gbit/s P100-equivalent point at --gpu-scale `scale`: 2 ranks x 20 iterations of
    about `seconds` P100-equivalent seconds (emulated time is that over `scale`)."""
    rng = np.random.default_rng(zlib.crc32(run_id.encode()))
    ranks = [list(rng.normal(seconds / scale, 0.002 * seconds / scale, size=20)) for _ in range(2)]
    return {"status": "ok", "smoke": "False", "tag": "dilation", "model": "resnet50_v1", "kvstore": kvstore,
            "hosts": "4", "layout": "colocated", "compute": "emulated", "batch_size": "32", "gpu_scale": str(scale),
            "bandwidth": f"{4000 * scale:g}mbit", "p100_equiv_gbps": "4", "efficiency_factor": "1.0",
            "optimizer": "sgd", "workers": "4", "samples_per_batch": "32", "host_cpus": "4", "faithful": faithful,
            "fidelity_notes": notes, "rank_iter_s": ranks, "run_id": run_id, "unit": "images",
            "timestamp": "2026-12-05T18:00:00+00:00", "tcp_congestion_control": "bbr"}


def _rows(seconds: dict[str, dict[float, float]], repeats: int = 2) -> list[dict]:
    """`seconds`: {system: {scale: P100-equivalent seconds per iteration}}; plus an unfaithful dist_sync run per
    scale 10x slower, which the check must leave out."""
    rows = []
    for system, at in seconds.items():
        for scale, s in at.items():
            rows += [_row(system, scale, s, f"{system}-{scale}-{r}") for r in range(repeats)]
    rows += [_row("dist_sync", x, 10.0, f"bad-{x}", faithful="False") for x in SCALES]
    return rows


STEADY = {"p3": dict.fromkeys(SCALES, 1.0), "dist_sync": dict.fromkeys(SCALES, 1.2),
          "horovod": dict.fromkeys(SCALES, 1.1)}


def test_a_point_whose_systems_and_ratios_stay_put_passes():
    [check] = dilation_check.checks(_rows(STEADY), resamples=200)
    assert check.model == "resnet50_v1" and check.equivalent_gbps == 4 and check.scales == list(SCALES)
    assert [s.name for s in check.systems] == ["p3kv", "dist_sync", "Horovod"]  # MXNet P3 did not run here
    assert check.runs == {"p3": [2, 2, 2], "dist_sync": [2, 2, 2], "horovod": [2, 2, 2]}  # unfaithful left out
    p3 = check.systems[0]
    assert [e.value for _, e in p3.at] == pytest.approx([128.0] * 3, rel=0.01)  # 4 x 32 images / 1 s
    assert p3.spread < 0.01 and check.failures == []
    assert [r.name for r in check.ratios] == ["p3kv / dist_sync", "p3kv / Horovod"]
    assert check.ratios[0].common is not None and check.ratios[0].at[0][1].value == pytest.approx(1.2, rel=0.01)
    [text] = dilation_check.sentences([check])
    assert text.startswith("**The dilation check passes at resnet50_v1's 4 Gbps-equivalent point**"), text
    assert "--gpu-scale 0.1, 0.075, 0.05, 2 faithful runs per system at each" in text
    assert "p3kv 128, 128 and 128 (" in text and "p3kv / dist_sync 1.20, 1.20 and 1.20 (" in text
    assert "Beyond" not in text and "CPU-bound" not in text


def test_a_system_that_moves_with_the_dilation_fails_the_check_and_is_named():
    moved = {**STEADY, "dist_sync": {0.1: 1.2, 0.075: 1.2, 0.05: 1.32}}  # 10% slower at the most dilated
    [check] = dilation_check.checks(_rows(moved), resamples=200)
    assert [s.name for s in check.failures] == ["dist_sync", "p3kv / dist_sync"]
    assert check.systems[1].spread == pytest.approx(0.1, abs=0.01)
    assert check.ratios[0].common is None  # the CIs are narrow: no one ratio fits all three
    [text] = dilation_check.sentences([check])
    assert text.startswith("**The dilation check fails at")
    assert "Beyond 5%: dist_sync, p3kv / dist_sync." in text and "no one value inside every 95% CI" in text


def test_two_dilations_or_a_system_missing_at_one_is_no_check():
    two = {s: {x: v for x, v in at.items() if x != 0.05} for s, at in STEADY.items()}
    assert dilation_check.checks(_rows(two), resamples=50) == []
    rows = [r for r in _rows(STEADY) if not (r["kvstore"] == "horovod" and r["gpu_scale"] == "0.05")]
    [check] = dilation_check.checks(rows, resamples=50)
    assert [s.name for s in check.systems] == ["p3kv", "dist_sync"]  # Horovod lacks a dilation: not compared


def test_cpu_bound_runs_are_counted_beside_the_verdict():
    rows = _rows(STEADY)
    for r in rows:
        if r["kvstore"] == "dist_sync" and r["faithful"] == "True" and r["gpu_scale"] == "0.1":
            r["fidelity_notes"] = fidelity.cpu_bound_flag("host 1 throttled 8% of the timed window")
    [check] = dilation_check.checks(rows, resamples=50)
    assert check.cpu_bound == {"dist_sync": 2}
    assert "CPU-bound (a host ran out of its CPUs, fidelity.py rule 1): dist_sync in 2 of 6 runs." in (
        dilation_check.sentences([check])[0])


def test_the_readme_paragraph_names_its_file_dates_and_fidelity(tmp_path):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    assert sweep_blocks.dilation_summary(tmp_path).startswith("Not measured yet at 3 dilations")
    for row in _rows(STEADY):
        bench_rows.write_run(sweeps / "dilation.csv", row)
    text = sweep_blocks.dilation_summary(tmp_path)
    head, verdict = text.split("\n\n")
    assert head.startswith("From `benchmarks/results/sweeps/dilation.csv` (runs from 2026-12-05, links under "
                           "TCP BBR; 18 faithful of 21 runs: the 3 others are left out"), head
    assert verdict.startswith("**The dilation check passes at resnet50_v1's")


def test_only_what_the_dilation_changes_may_differ_between_the_points_a_check_compares():
    """A shallow-queue copy of the point is another comparison; the link rate and the thread caps scaled with the
    dilation are not."""
    rows = _rows(STEADY)
    for r in rows:
        r["thread_cap_cores"] = r["gpu_scale"]  # each thread at one dilated CPU: a different cap at each scale
    shallow = [{**r, "link_queue_ms": "1", "run_id": r["run_id"] + "-shallow"} for r in rows]
    found = dilation_check.checks(rows + shallow, resamples=50)
    assert len(found) == 2 and all(c.scales == list(SCALES) for c in found)
    assert all(c.runs["p3"] == [2, 2, 2] for c in found)  # never pooled across the two queues
