"""The soak benchmark's verdict (benchmarks/suites/soak_bench.py) on synthetic RSS series: it comes from the
trend (Theil-Sen slope with its CI), so one spike in a flat series does not make it "growing", a steady leak
does, and a series too short or noisy to tell says so. It runs under the run guard, whose record soak.md keeps."""

import argparse

import numpy as np
import pytest

from benchmarks.emulation import run_guard
from benchmarks.suites import soak_bench

pytestmark = pytest.mark.unit
TOLERANCE = 5.0


def _series(rss):
    return list(np.arange(len(rss), dtype=float)), list(rss)


def test_a_flat_noisy_series_with_one_spike_is_flat():
    rng = np.random.default_rng(0)
    rss = 200 + rng.normal(0, 2, 800)
    rss[600] = 260  # one spike in the second half: the old envelope rule called this "growing"
    t = soak_bench.trend(*_series(rss), TOLERANCE)
    assert t["state"] == "flat" and abs(t["trend"]) < 1 and t["trend_low"] <= t["trend"] <= t["trend_high"]
    assert t["p95_2"] < 210  # the second half's 95th percentile does not see the spike either
    assert max(rss[400:]) > 1.05 * max(rss[:400])


def test_a_sawtooth_like_a_servers_receive_queue_is_flat():
    t = np.arange(900, dtype=float)
    rss = 175 + 35 * ((t % 37) / 37)  # up and down with the queue, no growth
    assert soak_bench.trend(list(t), list(rss), TOLERANCE)["state"] == "flat"


def test_a_steadily_growing_series_is_growing():
    rng = np.random.default_rng(1)
    rss = np.linspace(200, 240, 800) + rng.normal(0, 2, 800)  # +20% over the phase
    t = soak_bench.trend(*_series(rss), TOLERANCE)
    assert t["state"] == "growing" and t["trend"] == pytest.approx(20, abs=1.5) and t["trend_low"] > TOLERANCE
    slow = np.linspace(200, 204, 800) + rng.normal(0, 2, 800)  # +2%: real, but within the tolerance
    assert soak_bench.trend(*_series(slow), TOLERANCE)["state"] == "flat"


def test_too_few_or_too_noisy_samples_are_inconclusive():
    assert soak_bench.trend([0.0, 1.0], [100.0, 120.0], TOLERANCE)["state"] == "inconclusive"
    rng = np.random.default_rng(2)
    noisy = np.linspace(200, 212, 12) + rng.normal(0, 20, 12)
    assert soak_bench.trend(*_series(noisy), TOLERANCE)["state"] == "inconclusive"


def test_the_verdict_is_growing_if_any_process_grows_and_flat_only_if_all_are():
    assert soak_bench.verdict([{"state": "flat"}, {"state": "flat"}]) == "flat"
    assert soak_bench.verdict([{"state": "flat"}, {"state": "inconclusive"}]) == "inconclusive"
    assert soak_bench.verdict([{"state": "inconclusive"}, {"state": "growing"}]) == "growing"


def test_summarize_judges_each_process_over_the_steady_phase_only():
    rng = np.random.default_rng(3)
    samples = []
    for i in range(400):
        t = float(i)
        samples.append((t, "worker", 10, 240 + rng.normal(0, 1) + (40 if i < 30 else 0)))  # warm-up, then flat
        samples.append((t, "server", 11, 170 + 0.1 * i + rng.normal(0, 1)))  # leaks 40 MiB over 400 s
    args = argparse.Namespace(warmup_fraction=0.1, window=10, tolerance=TOLERANCE)
    rows = {r["role"]: r for r in soak_bench.summarize(samples, 1, args)}
    assert rows["worker"]["state"] == "flat" and rows["server"]["state"] == "growing"
    assert soak_bench.verdict(list(rows.values())) == "growing"
    assert "| server | 11 |" in "\n".join(soak_bench.table(list(rows.values())))


def test_the_summary_records_the_run_guards_conditions(tmp_path):
    start = run_guard.Start(busy_pct=3.2, load_1m=0.41, forced=False, waited_s=12.0)
    line = soak_bench.conditions("0123456789abcdef", False, start, 1.87)
    assert line == ("Conditions: commit 0123456789ab, clean tree; started with the CPUs 3% busy over a 5 s sample "
                    "after waiting 12 s for an idle machine; 1-minute load 0.41 before, 1.87 after.")
    forced = soak_bench.conditions("0123456789abcdef", True, run_guard.Start(55.0, 2.0, True), 2.0)
    assert "uncommitted changes (--allow-dirty)" in forced and "--force" in forced
    args = argparse.Namespace(workers=1, servers=1, model="resnet50_v1", iters=10, interval=1.0, warmup_fraction=0.1,
                              window=10, tolerance=TOLERANCE)
    soak_bench.write_markdown(tmp_path / "soak.md", args, 0, 5.0, None, [], (0.0, 1.0), line)
    assert line in (tmp_path / "soak.md").read_text()


def test_a_dirty_tree_is_refused_before_any_job_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(run_guard, "git_state", lambda root=None: ("f" * 40, True))
    started = []
    monkeypatch.setattr(soak_bench, "run_job", lambda *a: started.append(a))
    assert soak_bench.main(["--iters", "5", "--results-dir", str(tmp_path)]) == 2
    assert not started and not (tmp_path / "soak.md").exists()
