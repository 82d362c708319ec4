"""The tables after the fidelity monitors: only faithful runs are shown and the others counted, every rank's
iterations are the statistics' data, and run_ids stay unique when a sweep is resumed."""

import csv
import json

import pytest

from benchmarks.analysis import bench_rows
from benchmarks.analysis import points as point_stats
from benchmarks.report import headline, sweep_blocks
from benchmarks.suites import cluster_bench, cluster_job

pytestmark = pytest.mark.unit


def _row(kvstore, repeat, faithful, ranks, notes="", **extra):
    return {"status": "ok", "tag": "bandwidth", "model": "resnet50_v1", "kvstore": kvstore, "hosts": "2",
            "workers": "2", "samples_per_batch": "32", "bandwidth": "400mbit", "bandwidth_bps": "4e8",
            "gpu_scale": "0.1", "p100_equiv_gbps": "4.0", "optimizer": "sgd(momentum=0.9)", "unit": "images",
            "bound_throughput": "200", "iter_s": json.dumps(ranks[0]), "rank_iter_s": json.dumps(ranks),
            "repeat": str(repeat), "smoke": "False", "git_dirty": "False", "faithful": faithful,
            "fidelity_notes": notes, "iters": "2", "batch_size": "32", "cpu_limit": "cgroup-v1",
            "cpu_quota_cores": "0.2", **extra}


def test_every_rank_iterations_are_the_data_and_older_rows_give_rank_0():
    row = {"iter_s": "[1.0, 2.0]", "rank_iter_s": "[[1.0, 2.0], [3.0, 4.0]]"}
    assert bench_rows.rank_iterations(row) == [[1.0, 2.0], [3.0, 4.0]]
    assert bench_rows.iteration_times(row) == [1.0, 2.0, 3.0, 4.0]
    assert bench_rows.iteration_times({"iter_s": "[1.0, 2.0]"}) == [1.0, 2.0]  # before rank_iter_s
    assert bench_rows.rank_iterations({"median_s": "1.5"}) == [[1.5]]  # legacy


def test_rank_iterations_round_trip_through_the_csv(tmp_path):
    path = tmp_path / "runs.csv"
    bench_rows.write_run(path, {"run_id": "x", "status": "ok", "iter_s": [0.5, 0.25],
                                "rank_iter_s": [[0.5, 0.25], [0.75, 0.125]], "faithful": True,
                                "host_cpu_s": "1.5;2.5", "qdisc_drops": "0;3"})
    [row] = bench_rows.read_runs(path)
    assert bench_rows.rank_iterations(row) == [[0.5, 0.25], [0.75, 0.125]]
    assert bench_rows.verdict(row) is True and row["host_cpu_s"] == "1.5;2.5"
    assert bench_rows.verdict({"faithful": "False"}) is False and bench_rows.verdict({}) is None
    assert bench_rows.verdict({"faithful": False}) is False  # a row a runner has just made: the bool, not its text


def test_tables_leave_out_unfaithful_runs_and_count_them():
    rows = [_row("p3", 0, "True", [[1.0, 1.0], [1.0, 1.0]]),
            _row("p3", 1, "False", [[9.0, 9.0], [9.0, 9.0]], "cpu: host 1 throttled 8.0% of the timed window "
                 "(0.80 of 10.00 s, limit 5%); vgpu: flagged, one completion 21076 us late (over 13333 us); "
                 "machine: the hypervisor took 4.3% of the CPUs' time during the run (steal); link: host 0's ingress "
                 "not judged: 1 of only 1 backlogged intervals starved (under 20); network: 3 packets dropped by the "
                 "link queues"),
            _row("dist_sync", 0, "True", [[2.0, 2.0], [2.0, 2.0]]),
            _row("dist_sync", 1, "", [[2.0, 2.0], [2.0, 2.0]])]  # a row from before the monitors
    points = {p["kvstore"]: p for p in point_stats.aggregate(rows)}
    assert points["p3"]["n"] == 1 and points["p3"]["throughput"] == pytest.approx(64.0)  # the 9 s run is out
    assert points["dist_sync"]["n"] == 2 and points["dist_sync"]["iterations"] == 8  # 2 runs x 2 ranks x 2
    assert point_stats.fidelity_count(rows) == {"faithful": 2, "unfaithful": 1, "unjudged": 1, "all": 4}
    assert point_stats.fidelity_sentence(rows) == (
        "2 faithful of 4 runs: the 1 others are left out (failed: cpu 1); 1 from before the monitors, shown "
        "without a verdict (benchmarks/emulation/fidelity.py).")
    assert point_stats.fidelity_sentence([_row("p3", 0, "", [[1.0]])]) == ""  # no verdicts: nothing to say
    # Runs with and without CPU limits are different points, never pooled.
    mixed = point_stats.aggregate([_row("p3", 0, "True", [[1.0]], host_cpus="2.0"), _row("p3", 1, "", [[3.0]])])
    assert [p["n"] for p in mixed] == [1, 1]


def test_the_sweep_block_and_the_headline_say_how_many_runs_were_faithful(tmp_path):
    path = tmp_path / "sweeps" / "bandwidth.csv"
    for r in [_row("p3", 0, "True", [[1.0, 1.0], [1.0, 3.0]]),
              _row("p3", 1, "False", [[9.0, 9.0], [9.0, 9.0]], "vgpu: a completion 2500 us late"),
              _row("dist_sync", 0, "True", [[2.0, 2.0], [2.0, 2.0]])]:
        bench_rows.write_run(path, {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    block = sweep_blocks.reviewed_block("bandwidth", tmp_path)
    assert "2 faithful of 3 runs: the 1 others are left out (failed: vgpu 1)" in block, block
    text = headline.headline_block(tmp_path)
    assert "2 faithful of 3 runs" in text and "every rank's 2 timed iterations" in text, text
    assert "Each host's CPUs were slowed with compute and links" in text and "0.2 cores per host" in text
    # p3kv: the median over both ranks' 4 iterations is 1.0 s, not rank 0's alone; the unfaithful run is out.
    assert "| 640 images/s | 2.00×" in text, text  # 2 x 32 images / 1.0 s, over gpu_scale 0.1
    only_bad = tmp_path / "bad"
    bench_rows.write_run(only_bad / "sweeps" / "bandwidth.csv",
                         {k: v for k, v in _row("p3", 0, "False", [[1.0]], "cpu: x").items()
                          if k in bench_rows.RUN_COLUMNS})
    assert sweep_blocks.reviewed_block("bandwidth", only_bad).startswith("No faithful runs yet")
    assert headline.headline_block(only_bad).startswith("No faithful runs yet")
    assert "not yet: no faithful run" in sweep_blocks.status_block(only_bad)


def test_cpu_bound_runs_are_shown_and_said_so_beside_their_numbers(tmp_path):
    flag = ("cpu: flagged CPU-bound, host 1 throttled 8.0% of the timed window (0.80 of 10.00 s, limit 5%): each "
            "thread capped at one dilated CPU")
    path = tmp_path / "sweeps" / "bandwidth.csv"
    for r in [_row("p3", 0, "True", [[1.0, 1.0], [1.0, 1.0]]),
              _row("dist_sync", 0, "True", [[2.0, 2.0], [2.0, 2.0]], flag),
              _row("dist_sync", 1, "True", [[2.0, 2.0], [2.0, 2.0]])]:
        bench_rows.write_run(path, {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    points = {p["kvstore"]: p for p in point_stats.aggregate(bench_rows.read_runs(path))}
    assert (points["dist_sync"]["cpu_bound"], points["dist_sync"]["n"], points["p3"]["cpu_bound"]) == (1, 2, 0)
    block = sweep_blocks.reviewed_block("bandwidth", tmp_path)
    assert "| dist_sync — CPU-bound in 1 of 2 runs |" in block and "| p3kv |" in block, block
    text = headline.headline_block(tmp_path)
    assert "| 2.00× (2.00–2.00), dist_sync CPU-bound |" in text, text
    assert "'CPU-bound': a host of that system ran out of its --host-cpus CPUs" in text


def test_the_runner_summary_counts_its_unfaithful_runs_smoke_included():
    rows = [_row("p3", 0, "False", [[1.0]], "cpu: host 0 throttled 7.8% of the timed window", smoke="True"),
            _row("dist_sync", 0, "True", [[2.0]], smoke="True")]
    text = cluster_bench.summary(rows)
    assert "| dist_sync |" in text and "| p3kv |" not in text
    assert "1 faithful of 2 runs: the 1 others are left out (failed: cpu 1)" in text


def test_the_written_summary_covers_every_invocation_of_its_csv_and_only_its_tag(tmp_path):
    path = tmp_path / "runs.csv"
    for r in [_row("p3", 0, "True", [[1.0]], tag="hosts"),  # an earlier invocation
              _row("dist_sync", 0, "True", [[2.0]], tag="hosts"),  # this one
              _row("horovod", 0, "True", [[2.0]], tag="other")]:
        bench_rows.write_run(path, {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    text = cluster_bench.csv_summary(path, "hosts", {"mxnet-p3": "not built"})
    assert "| p3kv |" in text and "| dist_sync |" in text and "| horovod |" not in text, text
    assert "- mxnet-p3 skipped: not built" in text


def test_run_ids_are_unique_when_the_same_point_runs_again():
    point = cluster_bench.Point(model="resnet50_v1", kvstore="p3", hosts=2, bandwidth="2gbit", repeat=1)
    first, second = cluster_job.new_run_id(point, 2), cluster_job.new_run_id(point, 2)
    assert first != second  # a resumed sweep runs the same point, repeat and port again
    assert first.startswith("resnet50_v1.p3.2gbit.2h.r1.")


def test_every_new_column_is_a_run_column_and_the_old_ones_keep_their_place():
    from benchmarks.emulation import run_monitors

    assert set(run_monitors.COLUMNS) <= set(bench_rows.RUN_COLUMNS)
    # Existing CSVs (header = the older columns) accept rows with the new ones appended at the end.
    assert bench_rows.RUN_COLUMNS.index("idle_warning") < bench_rows.RUN_COLUMNS.index("host_cpus")
    # Columns added since only ever go after the ones before them.
    order = ("fidelity_notes", "rank_iter_s", "update_placement", "cfs_period_us", "link_rx", "torch",
             "link_queue_ms", "link_monitor_cpu_s", "vgpu_late_us_per_iter", "steal_pct")
    assert [bench_rows.RUN_COLUMNS.index(c) for c in order] == sorted(bench_rows.RUN_COLUMNS.index(c) for c in order)


def test_every_committed_run_csv_takes_a_new_row():
    """The next run's row can be appended to every committed results CSV: each one's columns are run columns
    (bench_report.append_csv rewrites a file that lacks some; one with a column RUN_COLUMNS lacks is refused)."""
    from benchmarks.paths import RESULTS

    checked = 0
    for path in sorted(RESULTS.rglob("*.csv")):
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if "faithful" not in header or "run_id" not in header or path.stem.endswith("_iterations"):
            continue  # another benchmark's table, or a run CSV from before the fidelity monitors (never appended)
        checked += 1
        assert set(header) <= set(bench_rows.RUN_COLUMNS), (path, set(header) - set(bench_rows.RUN_COLUMNS))
    assert checked > 20


def test_a_csv_from_before_a_column_was_inserted_is_rewritten_with_it_and_keeps_its_rows(tmp_path):
    from benchmarks.analysis import bench_report

    path = tmp_path / "runs.csv"
    path.write_text("a,c\n1,3\n")
    bench_report.append_csv(path, [{"a": "4", "b": "5", "c": "6"}], ("a", "b", "c"))  # b inserted in the middle
    assert path.read_text().splitlines() == ["a,b,c", "1,,3", "4,5,6"]
    bench_report.append_csv(path, [{"a": "7", "b": "8", "c": "9", "d": "0"}], ("a", "b", "c", "d"))  # at the end
    assert path.read_text().splitlines() == ["a,b,c,d", "1,,3", "4,5,6", "7,8,9,0"]
    with pytest.raises(SystemExit, match=r"columns this version .* does not write \(d\)"):
        bench_report.append_csv(path, [{"a": "1"}], ("a", "b", "c"))


def test_steal_is_read_from_the_cpu_line_of_proc_stat(tmp_path):
    from benchmarks.emulation import run_monitors

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    before = run_monitors.steal_times(str(stat))
    assert before == (35, 1000)
    assert run_monitors.steal_share(before, (45, 1100)) == pytest.approx(0.1)
    assert run_monitors.steal_share(before, before) is None  # no time passed: no share
    assert run_monitors.steal_times(str(tmp_path / "absent")) is None


def test_the_headline_reads_a_rerun_point_from_its_new_runs_only(tmp_path):
    """A point rerun with dilated CPUs is read from its new runs alone: a baseline not yet rerun is said to be so,
    never pooled with the old runs; each row says how it was emulated and how many runs were faithful."""
    path = tmp_path / "sweeps" / "bandwidth.csv"
    old = {"cpu_limit": "", "cpu_quota_cores": ""}
    rows = [_row("p3", 0, "", [[0.5, 0.5]], **old), _row("dist_sync", 0, "", [[1.0, 1.0]], **old),
            _row("horovod", 0, "", [[1.0, 1.0]], **old),
            _row("p3", 0, "True", [[1.0, 1.0], [1.0, 1.0]], host_cpus="2"),
            _row("dist_sync", 0, "True", [[2.0, 2.0], [2.0, 2.0]], host_cpus="2"),
            _row("dist_sync", 1, "False", [[9.0, 9.0], [9.0, 9.0]], "cpu: host 1 throttled 8.0%", host_cpus="2")]
    for r in rows:
        bench_rows.write_run(path, {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    text = headline.headline_block(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| ResNet-50"))
    # p3kv: 2 x 32 images / 1.0 s over gpu_scale 0.1; dist_sync 2.0 s (the old 1.0 s runs and the 9 s one are out).
    assert "| 640 images/s | 2.00×" in line, line
    assert "| not rerun yet |" in line and line.count("| - |") == 1, line  # Horovod was not rerun; MXNet's P3 never ran
    # A baseline rerun whose runs the monitors all failed says so; its older runs stay out.
    bench_rows.write_run(path, {k: v for k, v in _row("horovod", 0, "False", [[1.0]], "cpu: x", host_cpus="2").items()
                                if k in bench_rows.RUN_COLUMNS})
    assert "| no faithful run (1 left out) |" in headline.headline_block(tmp_path)
    # Unfaithful runs of the point that superseded.py moved to results/legacy/ still count as run.
    bench_rows.write_run(tmp_path / "legacy" / "superseded_bandwidth.csv",
                         {k: v for k, v in _row("p3", 1, "False", [[9.0]], "cpu: x", host_cpus="2").items()
                          if k in bench_rows.RUN_COLUMNS})
    assert "; 2 of 5 runs faithful |" in headline.headline_block(tmp_path)
    assert line.endswith("| CPUs dilated (0.2 cores per host); 2 of 3 runs faithful |"), line
    assert "Each host's CPUs were slowed with compute and links" in text
    # Only old runs: the row says so, and the conditions sentence warns about the baselines' CPU.
    older = tmp_path / "old"
    for r in rows[:3]:
        bench_rows.write_run(older / "sweeps" / "bandwidth.csv",
                             {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    text = headline.headline_block(older)
    assert "| CPUs not dilated (older runs, no verdict) |" in text and "overstate p3kv's lead" in text, text


def test_a_point_rerun_with_threads_capped_says_so_in_its_tables(tmp_path):
    """Threads capped at one dilated CPU (thread_cap.py) are a point of their own: the headline reads the capped
    rerun alone and names the per-thread cap and Horovod's exemption; the sweep table labels the capped systems."""
    path = tmp_path / "sweeps" / "bandwidth.csv"
    free = [_row("p3", 0, "True", [[1.0, 1.0]], host_cpus="2"),
            _row("dist_sync", 0, "True", [[3.0, 3.0]], host_cpus="2")]
    capped = [_row(k, 0, "True", [[t, t]], host_cpus="2", thread_cap_cores="0.1", threads_capped="30;31",
                   threads_gpu_side="0;0" if k != "horovod" else "3;3")
              for k, t in (("p3", 1.0), ("dist_sync", 2.0), ("horovod", 1.25))]
    for r in [*free, *capped]:
        bench_rows.write_run(path, {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    text = headline.headline_block(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| ResNet-50"))
    assert "| 640 images/s | 2.00× (2.00–2.00) | - | 1.25× (1.25–1.25) |" in line, line  # never the 3.0 s run
    assert line.endswith("| CPUs dilated (0.2 cores per host, 0.1 per thread); 3 of 3 runs faithful |"), line
    assert "except Horovod's background thread" in text
    table = point_stats.point_table(point_stats.aggregate(bench_rows.read_runs(path)))
    assert table.count("(1 CPU per thread)") == 3 and "| p3kv |" in table, table


def test_a_headline_point_only_the_dilation_check_ran_dilated_is_read_from_it_dilations_pooled(tmp_path):
    """VGG-19 at 15 Gbps: the bandwidth sweep's runs there predate the dilated CPUs, the dilation check has runs
    at two dilations. The headline reads the check, each job in P100-equivalent seconds (iterations x gpu_scale)."""
    def vgg(kvstore, repeat, seconds, scale, **extra):
        dilated = {"thread_cap_cores": str(scale), "cpu_quota_cores": str(8 * scale), **extra}
        faithful = dilated.pop("faithful", "True")
        return _row(kvstore, repeat, faithful, [[seconds, seconds], [seconds, seconds]], model="vgg19",
                    p100_equiv_gbps="15.0", gpu_scale=str(scale), bandwidth=f"{round(15000 * scale)}mbit",
                    tag="dilation", **dilated)

    older = {"cpu_limit": "", "cpu_quota_cores": "", "faithful": "", "thread_cap_cores": ""}
    for r in [vgg("p3", 0, 1.0, 0.1, **older), vgg("dist_sync", 0, 1.5, 0.1, **older)]:  # 1.5x, not dilated
        bench_rows.write_run(tmp_path / "sweeps" / "bandwidth.csv",
                             {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    # p3kv: 1.0 s at 0.1 and 0.5 s at 0.2 are both 0.1 P100-equivalent seconds; dist_sync twice that at both.
    for r in [vgg("p3", 0, 1.0, 0.1), vgg("dist_sync", 0, 2.0, 0.1), vgg("p3", 0, 0.5, 0.2),
              vgg("dist_sync", 0, 1.0, 0.2)]:
        bench_rows.write_run(tmp_path / "sweeps" / "dilation.csv",
                             {k: v for k, v in r.items() if k in bench_rows.RUN_COLUMNS})
    text = headline.headline_block(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| VGG-19"))
    assert "| 640 images/s | 2.00× (2.00–2.00) |" in line, line  # 2 x 32 images / 0.1 s; not the older 1.5x
    assert "0.8/1.6 cores per host, 0.1/0.2 per thread); the dilation check's 2 dilations pooled" in line, line
    assert "; 4 of 4 runs faithful |" in line and "from `dilation.csv`, its dilations pooled" in text, text
