"""Older rows move to results/legacy/ only where a faithful rerun of the same point and system replaces them
(benchmarks/analysis/superseded.py); the rest stay where the tables read them."""

import csv

import pytest

from benchmarks.analysis import bench_rows, superseded

pytestmark = pytest.mark.unit


def _row(kvstore, gbps, run_id, faithful="", scale=0.5):
    return {"status": "ok", "smoke": "False", "tag": "bandwidth", "model": "vgg19", "kvstore": kvstore, "hosts": 4,
            "layout": "colocated", "compute": "emulated", "batch_size": 32, "efficiency_factor": 1.0,
            "optimizer": "sgd(momentum=0.9)", "p100_equiv_gbps": gbps, "gpu_scale": scale, "run_id": run_id,
            "faithful": faithful, "iter_s": [1.0]}


def test_only_rows_a_faithful_rerun_replaces_move_with_their_iterations(tmp_path):
    sweep = tmp_path / "sweeps" / "bandwidth.csv"
    rows = [_row("p3", 15.0, "old-p3"), _row("dist_sync", 15.0, "old-ds"), _row("p3", 5.0, "old-p3-5"),
            _row("p3", 15.0, "bad-p3", faithful="False", scale=0.2), {**_row("p3", 15.0, "new-p3", faithful="True",
                                                                             scale=0.2), "priority_hold_ms": "1000"}]
    for r in rows:
        bench_rows.write_run(sweep, r, {0: [1.0, 1.0]})
    bench_rows.write_run(sweep, _row("p3", 5.0, "old-p3"), {0: [2.0]})  # a run_id repeated by an older --resume
    legacy = tmp_path / "legacy"
    assert superseded.move(sweep, legacy, dry_run=True) == 2 and not legacy.exists()
    assert superseded.move(sweep, legacy) == 2
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["old-ds", "old-p3-5", "new-p3", "old-p3"]
    assert [r["run_id"] for r in bench_rows.read_runs(legacy / "superseded_bandwidth.csv")] == ["old-p3", "bad-p3"]
    moved_iterations = bench_rows.iterations_path(legacy / "superseded_bandwidth.csv").read_text()
    assert moved_iterations.count("bad-p3,") == 2 and moved_iterations.count("old-p3,") == 3
    kept = bench_rows.iterations_path(sweep).read_text()
    assert "bad-p3," not in kept and kept.count("old-p3,") == 3  # the kept row with that run_id keeps them all
    assert superseded.move(sweep, legacy) == 0  # nothing left to replace


def test_files_without_verdicts_never_move(tmp_path):
    sweep = tmp_path / "bandwidth.csv"
    sweep.write_text("run_id,status,model\nx,ok,vgg19\n")
    assert superseded.move(sweep, tmp_path / "legacy") == 0
    assert sweep.read_text() == "run_id,status,model\nx,ok,vgg19\n"


def test_a_retired_sweeps_unjudged_rows_move_once_its_new_comparison_has_a_faithful_row(tmp_path):
    assert "dilation" in superseded.RETIRED
    sweep = tmp_path / "sweeps" / "dilation.csv"
    sweep.parent.mkdir()
    before = list(bench_rows.RUN_COLUMNS[:bench_rows.RUN_COLUMNS.index("faithful")])  # the file before verdicts
    with sweep.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=before, extrasaction="ignore")
        writer.writeheader()
        writer.writerows([_row("p3", 10.0, "old-p3"), _row("horovod", 10.0, "old-hvd")])
    assert superseded.move(sweep, tmp_path / "legacy") == 0  # nothing faithful yet: they stay
    bench_rows.write_run(sweep, _row("horovod", 4.0, "unfaithful", faithful="False", scale=0.1))  # judged: stays
    assert superseded.move(sweep, tmp_path / "legacy") == 0
    bench_rows.write_run(sweep, {**_row("p3", 4.0, "new-p3", faithful="True", scale=0.1), "priority_hold_ms": "1000"})
    rows = bench_rows.read_runs(sweep)
    assert [bench_rows.verdict(r) for r in rows] == [None, None, False, True]  # short rows have no verdict
    assert superseded.move(sweep, tmp_path / "legacy") == 2
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["unfaithful", "new-p3"]
    assert [r["run_id"] for r in bench_rows.read_runs(tmp_path / "legacy" / "superseded_dilation.csv")] == [
        "old-p3", "old-hvd"]


def test_in_the_dilation_sweep_a_faithful_run_replaces_only_runs_at_its_own_dilation(tmp_path):
    assert "dilation" in superseded.BY_DILATION
    rows = [_row("dist_sync", 4.0, "ok-0.1", faithful="True", scale=0.1),
            _row("dist_sync", 4.0, "bad-0.1", faithful="False", scale=0.1),
            _row("dist_sync", 4.0, "bad-0.05", faithful="False", scale=0.05)]  # 0.05's own verdict: it stays
    assert superseded.superseded(rows, by_dilation=True) == [1]
    assert superseded.superseded(rows) == [1, 2]  # elsewhere a faithful rerun at any dilation replaces both


def test_a_horovod_run_from_before_its_cycle_was_dilated_moves_once_a_current_faithful_run_exists(tmp_path):
    sweep = tmp_path / "sweeps" / "bandwidth.csv"
    old = [_row("horovod", 15.0, "old-hvd", faithful="True"), _row("dist_sync", 15.0, "ds", faithful="True")]
    for r in old:
        bench_rows.write_run(sweep, r, {0: [1.0]})
    legacy = tmp_path / "legacy"
    assert superseded.outdated(old[0]) and not superseded.outdated(old[1])
    assert superseded.move(sweep, legacy) == 0  # an outdated row stays until a current one replaces it
    bench_rows.write_run(sweep, {**_row("horovod", 15.0, "new-hvd", faithful="True"), "horovod_cycle_ms": "2.0"},
                         {0: [1.0]})
    assert superseded.move(sweep, legacy) == 1
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["ds", "new-hvd"]


def test_a_p3kv_run_from_before_the_priority_hold_moves_once_a_faithful_run_with_it_exists(tmp_path):
    from benchmarks.suites import cluster_job, torch_systems

    # Every system whose launcher runs p3kv is p3kv's here, and no other.
    systems = {**cluster_job.KVSTORES, **torch_systems.KVSTORES}
    assert {k for k in systems if superseded.is_p3kv(k)} == {k for k, v in systems.items() if v[0] == "p3"}
    sweep = tmp_path / "sweeps" / "dilation.csv"
    old = [_row("p3", 4.0, "no-hold", faithful="True", scale=0.1), _row("dist_sync", 4.0, "ds", faithful="True",
                                                                        scale=0.1)]
    for r in old:
        bench_rows.write_run(sweep, r, {0: [1.0]})
    assert superseded.outdated(old[0]) and not superseded.outdated(old[1])
    assert not superseded.outdated({**old[0], "priority_hold_ms": "0"})  # the hold measured off is current
    legacy = tmp_path / "legacy"
    assert superseded.move(sweep, legacy) == 0  # no run with the hold yet: the old row stays
    bench_rows.write_run(sweep, {**_row("p3", 4.0, "hold-0.05", faithful="True", scale=0.05),
                                 "priority_hold_ms": "1000"}, {0: [1.0]})
    assert superseded.move(sweep, legacy) == 0  # dilation: only a run at its own dilation replaces it
    bench_rows.write_run(sweep, {**_row("p3", 4.0, "hold", faithful="True", scale=0.1), "priority_hold_ms": "1000"},
                         {0: [1.0]})
    assert superseded.move(sweep, legacy) == 1
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["ds", "hold-0.05", "hold"]


def test_a_cpu_limited_run_without_per_thread_caps_moves_once_a_capped_faithful_run_exists(tmp_path):
    sweep = tmp_path / "sweeps" / "bandwidth.csv"
    free = {**_row("dist_sync", 4.0, "uncapped", faithful="True", scale=0.11), "host_cpus": "4.0"}
    torch = {**_row("torch-ddp", 2.0, "torch", faithful="True", scale=0.11), "host_cpus": "4.0"}
    for r in (free, torch):
        bench_rows.write_run(sweep, r, {0: [1.0]})
    assert superseded.outdated_by(free) == "per-thread caps"
    # Capped, but from before the host's CPU count of OpenMP threads per process: outdated too.
    assert superseded.outdated_by({**free, "thread_cap_cores": "0.11"}) == "OpenMP threads per host"
    assert not superseded.outdated({**free, "thread_cap_cores": "0.11", "omp_threads": "4"})
    assert not superseded.outdated(_row("dist_sync", 4, "x"))  # no CPU limits: no rule of this kind
    legacy = tmp_path / "legacy"
    assert superseded.move(sweep, legacy) == 0  # nothing capped yet: both stay
    bench_rows.write_run(sweep, {**free, "run_id": "capped", "thread_cap_cores": "0.11", "omp_threads": "4"},
                         {0: [1.0]})
    assert superseded.move(sweep, legacy) == 1  # the uncapped dist_sync run; DDP's point has no capped run
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["torch", "capped"]


def test_rows_with_a_column_the_legacy_file_lacks_move_into_it_and_it_gains_the_column(tmp_path):
    sweep = tmp_path / "sweeps" / "dilation.csv"
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    with (legacy / "superseded_dilation.csv").open("w", newline="") as f:  # written before the column existed
        writer = csv.DictWriter(f, fieldnames=["run_id", "kvstore", "faithful"])
        writer.writeheader()
        writer.writerow({"run_id": "older", "kvstore": "p3", "faithful": ""})
    bench_rows.write_run(sweep, {**_row("horovod", 4.0, "old-hvd", faithful="False"), "horovod_cycle_ms": ""},
                         {0: [1.0]})
    bench_rows.write_run(sweep, {**_row("horovod", 4.0, "new-hvd", faithful="True"), "horovod_cycle_ms": "20.0"},
                         {0: [1.0]})
    assert superseded.move(sweep, legacy) == 1
    with (legacy / "superseded_dilation.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        moved = list(reader)
    assert reader.fieldnames[:3] == ["run_id", "kvstore", "faithful"] and "horovod_cycle_ms" in reader.fieldnames
    assert [r["run_id"] for r in moved] == ["older", "old-hvd"] and moved[0]["horovod_cycle_ms"] == ""


def test_rows_at_another_setting_move_once_a_faithful_run_at_the_new_tuned_setting_exists(tmp_path):
    sweep = tmp_path / "sweeps" / "bandwidth.csv"
    current = {"priority_hold_ms": "1000", "horovod_cycle_ms": "45"}  # not outdated (outdated_by)

    def run(kvstore, run_id, setting, stamp, faithful="True"):
        return {**_row(kvstore, 4.0, run_id, faithful=faithful, scale=0.11), **current, "baseline_setting": setting,
                "timestamp": f"2026-12-0{stamp}T00:00:00+0000"}
    rows = [run("p3", "default-1", "default (untuned)", 1), run("p3", "default-2", "default (untuned)", 1),
            run("dist_sync", "ds-default", "default (untuned)", 1),
            run("mxnet-p3", "mp3-default", "default (untuned)", 1),
            run("mxnet-p3", "mp3-kept", "default (tuned: MXNET_KVSTORE_SLICE_THRESHOLD=40000)", 2),
            run("horovod", "hvd-tuned-unfaithful", "HOROVOD_CYCLE_TIME=5 (tuned)", 2, "False")]
    for r in rows:
        bench_rows.write_run(sweep, r, {0: [1.0]})
    legacy = tmp_path / "legacy"
    # No faithful run at a new setting yet: nothing moves (a tuned default is the defaults' own setting).
    assert superseded.move(sweep, legacy) == 0
    bench_rows.write_run(sweep, run("p3", "tuned", "P3_SLICE_SIZE=25000 P3_SOCKET_BUFFER=131072 (tuned)", 3),
                         {0: [1.0]})
    bench_rows.write_run(sweep, run("p3", "smoke", "P3_SLICE_SIZE=100000 (tuned)", 4) | {"smoke": "True"},
                         {0: [1.0]})  # newer, but a smoke run never names the current setting
    assert superseded.move(sweep, legacy) == 3  # p3kv's runs at other settings; Horovod's tuned run is unfaithful
    assert [r["run_id"] for r in bench_rows.read_runs(legacy / "superseded_bandwidth.csv")] == [
        "default-1", "default-2", "smoke"]
    assert [r["run_id"] for r in bench_rows.read_runs(sweep) if r["kvstore"] == "p3"] == ["tuned"]
    # A later faithful run at a newer tuned setting replaces the earlier tuned one; the point's default rows of
    # other systems stay.
    bench_rows.write_run(sweep, run("p3", "retuned", "P3_SLICE_SIZE=12500 (tuned at x0.05)", 5), {0: [1.0]})
    assert superseded.move(sweep, legacy) == 1
    assert sorted(r["run_id"] for r in bench_rows.read_runs(sweep)) == [
        "ds-default", "hvd-tuned-unfaithful", "mp3-default", "mp3-kept", "retuned"]


def test_a_faithful_run_under_one_tcp_congestion_control_replaces_none_under_another(tmp_path):
    sweep = tmp_path / "sweeps" / "bandwidth.csv"
    current = {"priority_hold_ms": "1000"}  # a p3kv row from before the hold is outdated whatever its algorithm
    rows = [_row("p3", 15.0, "old-bbr"), {**_row("p3", 15.0, "new-cubic", faithful="True"),
                                          "tcp_congestion_control": "cubic", **current}]
    for r in rows:
        bench_rows.write_run(sweep, r, {0: [1.0]})
    assert superseded.move(sweep, tmp_path / "legacy") == 0  # the unjudged BBR row stays: nothing replaces it
    bench_rows.write_run(sweep, {**_row("p3", 15.0, "new-bbr", faithful="True"), "tcp_congestion_control": "bbr",
                                 **current}, {0: [1.0]})
    assert superseded.move(sweep, tmp_path / "legacy") == 1  # now a faithful BBR rerun does
    assert [r["run_id"] for r in bench_rows.read_runs(sweep)] == ["new-cubic", "new-bbr"]
