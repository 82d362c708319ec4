"""`make demo`'s statistics and final screen (benchmarks/analysis/bootstrap.py, benchmarks/suites/demo_screen.py)
on known numbers: the hierarchical bootstrap's CIs, the ratio's CI against 1.0, and the screen built from a
fixture CSV with its committed reference. The demo's runs are in tests/test_demo_system.py."""

import numpy as np
import pytest

from benchmarks.analysis import bench_rows, bootstrap, points
from benchmarks.suites import demo, demo_screen

pytestmark = pytest.mark.unit


def jobs(base_s: float, repeats: int = 3, iterations: int = 6, ranks: int = 4, spread: float = 0.02, seed: int = 1):
    """Per job an (iterations, ranks) array of iteration times around base_s (job means differ a little)."""
    rng = np.random.default_rng(seed)
    return [base_s * (1 + 0.01 * j) + spread * rng.standard_normal((iterations, ranks)) for j in range(repeats)]


def test_a_clear_difference_gives_a_ratio_ci_that_excludes_one():
    fast, slow = jobs(1.0, seed=1), jobs(1.2, seed=2)
    r = bootstrap.ratio(fast, slow, 128, 128, resamples=2000)
    assert r.value == pytest.approx(1.2, rel=0.03)
    assert r.low <= r.value <= r.high and r.excludes(1.0) and r.low > 1.1
    t = bootstrap.throughput(fast, 128, resamples=2000)
    assert t.value == pytest.approx(128 / np.median(np.stack(fast)))
    assert t.low < t.value < t.high and t.high - t.low < 0.1 * t.value


def test_identical_data_gives_a_ratio_ci_that_includes_one():
    same = jobs(1.0, seed=3)
    r = bootstrap.ratio(same, [j.copy() for j in same], 128, 128, resamples=2000)
    assert r.value == 1.0 and not r.excludes(1.0) and r.low < 1.0 < r.high


def test_jobs_that_differ_widen_the_interval():
    """The jobs are the independent units: the same iterations spread over jobs that differ give a wider CI than
    when every job looks alike (a one-level bootstrap over pooled iterations cannot tell the two apart)."""
    values = np.linspace(0.9, 1.1, 90)
    alike = [values[j::3].reshape(30, 1) for j in range(3)]  # every job spans the whole range
    apart = [values[30 * j:30 * (j + 1)].reshape(30, 1) for j in range(3)]  # a slow, a middle and a fast job
    narrow = bootstrap.throughput(alike, 100, resamples=2000)
    wide = bootstrap.throughput(apart, 100, resamples=2000)
    assert narrow.value == wide.value  # the same pooled iterations
    assert (wide.high - wide.low) > 2 * (narrow.high - narrow.low)


def test_jobs_of_unequal_length_are_cut_to_the_shortest():
    stacked = bootstrap.stack_jobs([np.ones((6, 4)), np.ones((5, 4)), np.ones((6, 3))])
    assert stacked.shape == (3, 5, 3)
    with pytest.raises(ValueError, match="no jobs"):
        bootstrap.stack_jobs([])


def write_fixture(path, kvstore_times: dict[str, float], *, tag="demo", iters=6, commit="c0ffee00" * 5,
                  timestamp="2026-12-01T10:00:00+0000", ranks=4, cpu=120.0, warning=""):
    """Rows and every rank's iterations as the demo writes them: 3 repeats per system, 4 workers x 32 images."""
    for repeat in range(3):
        for kv, base in kvstore_times.items():
            times = jobs(base, repeats=1, iterations=iters, ranks=ranks, spread=0.01, seed=repeat)[0]
            run_id = f"{tag}.{kv}.{repeat}"
            row = {"timestamp": timestamp, "run_id": run_id, "tag": tag, "smoke": False, "model": "resnet50_v1",
                   "kvstore": kv, "compute": "emulated", "status": "ok", "exit_code": 0, "hosts": 4,
                   "layout": "colocated", "workers": 4, "servers": 4, "bandwidth": "2gbit",
                   "bandwidth_bps": 2e9, "p100_equiv_gbps": 10.0, "batch_size": 32, "slice_size": "", "gpu": "p100",
                   "gpu_scale": 0.2, "efficiency_factor": 1.0, "optimizer": "sgd(lr=0.01,momentum=0.9)",
                   "warmup": 2, "iters": iters, "repeats": 3, "repeat": repeat, "order": 0, "seed": 0,
                   "unit": "images", "samples_per_batch": 32, "median_s": float(np.median(times[:, 0])),
                   "iter_s": list(times[:, 0]), "throughput": 128 / base, "bound_throughput": 160.0,
                   "cpu_host_pct": "30;30;30;30", "cpu_total_pct": cpu, "load_1m_before": 0.5,
                   "load_1m_after": 1.5, "git_commit": commit, "git_dirty": False, "cpus": 2, "wall_s": 17.0,
                   "idle_wait_s": 5.0, "idle_warning": warning}
            bench_rows.write_run(path, row, {rank: list(times[:, rank]) for rank in range(ranks)})


def test_the_final_screen_from_a_fixture(tmp_path):
    committed = tmp_path / "results" / "sweeps"
    write_fixture(committed / "demo.csv", {"p3": 0.95, "dist_sync": 1.10, "horovod": 1.2}, iters=20,
                  commit="9e0dad50" * 5, timestamp="2026-11-30T15:06:12+0000")
    run = tmp_path / "build" / "demo.csv"
    write_fixture(run, {"p3": 1.0, "dist_sync": 1.25}, warning="CPU busy 60% is above --max-busy 10% after "
                  "waiting 65 s (busiest: cc1plus (pid 9) 40%)")
    rows = bench_rows.read_runs(run, ok_only=False)
    arrays = demo_screen.iteration_arrays(bench_rows.iterations_path(run))
    assert {a.shape for a in arrays.values()} == {(6, 4)}
    text = demo_screen.screen(rows, arrays, resamples=1000, results_dir=committed, wall_s=150.0)
    lines = text.splitlines()
    assert len(lines) <= 24  # one screen
    assert lines[0] == "p3kv demo: resnet50_v1, 4 emulated hosts, 2gbit links, P100 compute x0.2 (10 Gbps " \
                       "P100-equivalent)"
    p3 = next(line for line in lines if line.startswith(f"{'p3kv':12s} "))
    dist = next(line for line in lines if line.startswith(f"{'dist_sync':12s} "))
    systems = demo_screen.system_results(rows, arrays, 1000)
    t = systems["p3"].throughput
    assert f"{t.value:.1f} ({t.low:.1f}-{t.high:.1f}) images/s" in p3 and 127 < t.value < 129
    assert p3.split()[-3:] == [f"{100 * t.value / 160:.0f}%", "120", "3"]  # % of bound, CPU %, jobs
    assert "102." in dist or "101." in dist or "103." in dist
    ratio_line = next(line for line in lines if line.startswith("p3kv / dist_sync:"))
    r = demo_screen.ratio(rows, arrays, "p3", 1000)
    assert ratio_line.startswith(f"p3kv / dist_sync: {r.value:.2f}x (95% CI {r.low:.2f}-{r.high:.2f})")
    assert "excludes 1.0" in ratio_line and 1.2 < r.value < 1.3
    assert "bound: 160.0 images/s" in text
    ref = lines.index(next(line for line in lines if line.startswith("committed reference:")))
    assert "demo.csv, commit 9e0dad50, 2026-11-30, 3 repeats x 20 iterations" in lines[ref]
    committed_points = {p["kvstore"]: p for p in points.aggregate(bench_rows.read_runs(committed / "demo.csv"))}
    p3_ref, dist_ref = committed_points["p3"]["throughput"], committed_points["dist_sync"]["throughput"]
    assert 133 < p3_ref < 136 and 115 < dist_ref < 118
    assert lines[ref + 1] == (f"  p3kv {p3_ref:.1f}, dist_sync {dist_ref:.1f} images/s; p3kv / dist_sync "
                              f"{p3_ref / dist_ref:.2f}x")  # Horovod's committed figure is left out: not run here
    assert "the committed ratio is outside this run's CI" in lines[ref + 2]
    assert "1-minute load 0.5-1.5 on 2 cores; the idle gate waited 30 s in all" in text
    assert "6 of 6 jobs started on a busy machine (recorded), the first: CPU busy 60%" in text
    assert lines[-1] == "took 150 s"


def test_no_reference_and_a_ratio_that_includes_one(tmp_path):
    run = tmp_path / "demo.csv"
    write_fixture(run, {"p3": 1.0, "dist_sync": 1.0})
    rows = bench_rows.read_runs(run)
    text = demo_screen.screen(rows, demo_screen.iteration_arrays(bench_rows.iterations_path(run)), resamples=500,
                              results_dir=tmp_path / "none")
    assert "committed reference: none at this point" in text and "the CI includes 1.0" in text
    assert "every job started on an idle machine" in text


def test_demo_defaults_are_the_papers_resnet50_point_within_the_cpu_quotas_and_a_short_run():
    args = demo.parse_args([])
    planned = demo.points(args)
    assert [p.kvstore for p in planned].count("p3") == 3 and {p.kvstore for p in planned} == {"p3", "dist_sync"}
    assert {(p.model, p.hosts, p.bandwidth, p.gpu_scale, p.warmup, p.iters, p.host_cpus, p.thread_cap_cores)
            for p in planned} == {("resnet50_v1", 4, "400mbit", 0.1, 2, 6, 4.0, 0.1)}
    # 400 Mbit at a tenth of a P100: 4 Gbps-equivalent; every thread at one dilated CPU unless asked otherwise
    assert all(p.thread_cap_cores is None for p in demo.points(demo.parse_args(["--no-thread-cap"])))
    assert [p.repeat for p in planned] == [0, 0, 1, 1, 2, 2]  # interleaved
    assert args.out == demo.ROOT / "build" / "demo" and args.wait == 60 and not args.strict
    more = demo.points(demo.parse_args(["--systems", "p3", "dist_sync", "mxnet-p3", "horovod"]))
    assert {p.kvstore for p in more} == {"p3", "dist_sync", "mxnet-p3", "horovod"}


def test_the_committed_reference_is_from_faithful_runs_under_the_same_conditions(tmp_path):
    committed = tmp_path / "results" / "sweeps"
    write_fixture(committed / "bandwidth.csv", {"p3": 0.95, "dist_sync": 1.10}, tag="bandwidth", iters=20)
    rows = bench_rows.read_runs(committed / "bandwidth.csv")
    run = tmp_path / "build" / "demo.csv"
    write_fixture(run, {"p3": 1.0, "dist_sync": 1.25})
    demo_row = bench_rows.read_runs(run)[0]
    assert demo_screen.reference(demo_row, committed) is not None  # another sweep's tag: the same point
    assert demo_screen.reference({**demo_row, "thread_cap_cores": "0.2"}, committed) is None  # capped: not
    assert demo_screen.reference({**demo_row, "host_cpus": "4.0"}, committed) is None  # CPU-limited: not
    # Runs the fidelity monitors failed are never a reference.
    for r in rows:
        r["faithful"] = "False"
    (committed / "bandwidth.csv").unlink()
    for r in rows:
        bench_rows.write_run(committed / "bandwidth.csv", {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    assert demo_screen.reference(demo_row, committed) is None


def test_the_screen_says_how_many_jobs_the_fidelity_monitors_passed(tmp_path):
    run = tmp_path / "demo.csv"
    write_fixture(run, {"p3": 1.0, "dist_sync": 1.2})
    rows = bench_rows.read_runs(run)
    for i, r in enumerate(rows):
        r["faithful"] = "False" if i == 0 else "True"
        r["fidelity_notes"] = "cpu: host 0 throttled 7.8% of the timed window (0.39 of 5.00 s, limit 5%)" if i == 0 \
            else ""
    text = demo_screen.screen(rows, demo_screen.iteration_arrays(bench_rows.iterations_path(run)), resamples=500,
                              results_dir=tmp_path / "none", wall_s=100.0)
    assert len(text.splitlines()) <= 24
    line = next(line for line in text.splitlines() if line.startswith("fidelity: "))
    assert line.startswith("fidelity: 5 faithful of 6 runs: the 1 others are in the numbers above (failed: cpu 1)")
    # The rows the demo has just run hold the verdict as a bool (read back from the CSV: its text): the same line.
    fresh = [{**r, "faithful": r["faithful"] == "True"} for r in rows]
    assert line in demo_screen.screen(fresh, demo_screen.iteration_arrays(bench_rows.iterations_path(run)),
                                      resamples=500, results_dir=tmp_path / "none", wall_s=100.0)
