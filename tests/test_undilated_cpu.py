"""The part of the emulated hosts' CPU that does not scale with the dilation (benchmarks/analysis/undilated_cpu.py):
the line through the runs' host CPU against --gpu-scale, and the dilation block's sentences."""

import pytest

from benchmarks.analysis import undilated_cpu

pytestmark = pytest.mark.unit


def _row(system, scale, cores, faithful="True", host_cpus=4):
    per_host = f"{100 * cores:g}"
    return {"status": "ok", "smoke": "False", "model": "resnet50_v1", "kvstore": system, "gpu_scale": str(scale),
            "host_cpus": str(host_cpus), "cpu_host_pct": ";".join([per_host] * 4), "faithful": faithful}


def test_the_line_through_the_runs_gives_the_cpu_that_does_not_scale():
    # dist_sync: 0.6 cores per unit of scale plus 0.03 cores paid per real second; p3kv: all of it dilated
    rows = [_row("dist_sync", s, 0.6 * s + 0.03, faithful=str(s > 0.05)) for s in (0.05, 0.075, 0.1) for _ in "ab"]
    rows += [_row("p3", s, 0.9 * s) for s in (0.05, 0.1)]
    rows += [{**_row("horovod", 0.1, 0.5), "compute": "emulated", "horovod_cycle_ms": "10"},  # one scale
             {**_row("horovod", 0.05, 0.3), "compute": "emulated"},  # before its cycle was dilated: apart
             {**_row("p3", 0.1, 0.2), "status": "failed"},  # not ok
             {**_row("p3", 0.1, 0.2), "host_cpus": ""}]  # no CPU limit: no quota to dilate
    found = {f["system"]: f for f in undilated_cpu.fits(rows)}
    assert set(found) == {"dist_sync", "p3"}
    assert found["dist_sync"]["c0"] == pytest.approx(0.03) and found["dist_sync"]["slope"] == pytest.approx(0.6)
    assert found["dist_sync"]["unfaithful"] == 2 and found["dist_sync"]["runs"] == 6
    assert found["p3"]["c0"] == pytest.approx(0.0, abs=1e-9) and found["p3"]["scales"] == [0.05, 0.1]
    lines = undilated_cpu.sentences([found["dist_sync"]])
    assert lines[0].startswith("- CPU per host that does not scale")
    assert "3.0% of a core" in lines[1] and "15% of the quota at --gpu-scale 0.05, 7% at 0.1" in lines[1]
    assert undilated_cpu.sentences([]) == []
