"""The priority-hold comparison's table (benchmarks/analysis/priority_hold.py): p3kv with and without its sender
hold at one point, each variant's throughput and iteration spread, its ratio to the no-hold runs with a CI, and
the unfaithful runs left out but counted."""

import numpy as np
import pytest

from benchmarks.analysis import priority_hold

pytestmark = pytest.mark.unit


def _row(kvstore, hold, seconds, spread, run_id, faithful="True"):
    rng = np.random.default_rng(len(run_id) + int(1000 * seconds))
    ranks = [list(rng.normal(seconds, spread * seconds, size=20)) for _ in range(4)]
    return {"status": "ok", "smoke": "False", "model": "resnet50_v1", "kvstore": kvstore, "hosts": "4",
            "bandwidth": "220mbit", "p100_equiv_gbps": "2", "gpu_scale": "0.11", "host_cpus": "4",
            "workers": "4", "samples_per_batch": "32", "faithful": faithful, "rank_iter_s": ranks,
            "run_id": run_id, "unit": "images", "pct_of_bound": str(round(100 * 5.84 / seconds, 1)),
            "priority_hold_ms": hold}


def test_each_variant_has_its_throughput_spread_and_ratio_to_no_hold():
    rows = ([_row("torch-p3kv", "1000", 6.4, 0.02, f"held{i}") for i in range(3)]
            + [_row("torch-p3kv", "0", 7.0, 0.12, f"free{i}") for i in range(3)]
            + [_row("ddp", "", 6.5, 0.01, f"ddp{i}") for i in range(3)]
            + [_row("torch-p3kv", "0", 20.0, 0.0, "bad", faithful="False")])  # left out, counted
    text = priority_hold.table(rows, resamples=300)
    lines = text.splitlines()
    by_system = {line.split(" | ")[3]: line.split(" | ") for line in lines[2:5]}
    assert set(by_system) == {"ddp", "torch-p3kv, hold 0 ms", "torch-p3kv, hold 1000 ms"}
    held, free, ddp = by_system["torch-p3kv, hold 1000 ms"], by_system["torch-p3kv, hold 0 ms"], by_system["ddp"]
    assert held[4] == free[4] == ddp[4] == "3"  # the unfaithful run is not among the faithful runs
    assert float(held[6]) < 0.05 < float(free[6])  # iteration CV
    ratio = float(held[8].split(" (")[0])
    assert ratio == pytest.approx(7.0 / 6.4, rel=0.03)
    low, high = (float(x) for x in held[8].split(" (")[1].rstrip(") |").split("-"))
    assert low <= ratio <= high
    assert free[8] == ddp[8] == "- |"  # no ratio of the reference to itself, nor for DDP
    assert "1 run(s) the fidelity monitors judged unfaithful are left out" in text
    assert priority_hold.table([]) == ""


def test_a_row_from_before_the_column_is_its_system_alone():
    assert priority_hold.variant({"kvstore": "p3", "priority_hold_ms": ""}) == "p3"
    assert priority_hold.variant({"kvstore": "p3", "priority_hold_ms": "1000.0"}) == "p3, hold 1000 ms"
