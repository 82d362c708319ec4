"""Tuned baselines (benchmarks/suites/tune.py, baseline_settings.py, analysis/best_setting.py): the grids, each
cell's variables reaching every process of its job, the choice of a best setting (ties keep the default), the
rows' baseline_setting column, resuming a tuning CSV, the comparison suites applying best.json, and a smoke run
of `python -m benchmarks tune` on 2 emulated hosts (system tier)."""

import csv
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from harness import ROOT

from benchmarks.analysis import bench_rows, best_setting
from benchmarks.suites import baseline_settings, cluster_bench, cluster_job, demo, sweeps, tune
from benchmarks.suites.baseline_settings import DEFAULT_UNTUNED, DEFAULTS, MIB
from p3kv.launch import Job, KVStore, plan

BASE = cluster_job.Point(model="resnet50_v1", kvstore="", hosts=4, bandwidth="2gbit", gpu_scale=0.2, warmup=2,
                         iters=20, tag="tune")


@pytest.mark.unit
def test_grids_hold_each_systems_verified_default_once():
    assert DEFAULTS["horovod"] == {"HOROVOD_FUSION_THRESHOLD": str(128 * MIB), "HOROVOD_CYCLE_TIME": "1"}
    horovod = tune.grid("horovod")
    fixed = [(int(dict(c.env)["HOROVOD_FUSION_THRESHOLD"]) // MIB, dict(c.env)["HOROVOD_CYCLE_TIME"])
             for c in horovod if not c.reference]
    assert fixed == [(mib, ms) for mib in (16, 64, 128) for ms in ("1", "5", "10")]
    [autotune] = [c for c in horovod if c.reference]
    assert dict(autotune.env)["HOROVOD_AUTOTUNE"] == "1" and autotune.warmup == tune.AUTOTUNE_WARMUP
    assert [dict(c.env)["MXNET_KVSTORE_BIGARRAY_BOUND"] for c in tune.grid("dist_sync")] == [
        "100000", "1000000", "10000000"]
    assert [dict(c.env)["MXNET_KVSTORE_SLICE_THRESHOLD"] for c in tune.grid("mxnet-p3")] == ["40000", "50000",
                                                                                             "100000"]
    assert [tuple(dict(c.env).values()) for c in tune.grid("p3")] == [
        ("25000", "131072"), ("50000", "131072"), ("100000", "131072"), ("50000", "32768"), ("50000", "524288")]
    for system in tune.SYSTEMS:
        cells = tune.grid(system)
        assert [c.default for c in cells].count(True) == 1, system  # the default cell is exact, and only one
        assert len({c.label for c in cells}) == len(cells)
        assert all(c.label.endswith("(default)") == c.default for c in cells)
    assert tune.grid("horovod")[2].label == "HOROVOD_FUSION_THRESHOLD=16777216 HOROVOD_CYCLE_TIME=10"


@pytest.mark.unit
def test_a_cell_given_on_the_command_line_replaces_its_systems_grid():
    args = tune.parse_args(["--systems", "dist_sync", "p3", "--cell", "MXNET_KVSTORE_BIGARRAY_BOUND=100000",
                            "--cell", "MXNET_KVSTORE_BIGARRAY_BOUND=1000000"])
    cells = tune.cells_for(args.systems, args.cells)
    assert [c.label for c in cells if c.system == "dist_sync"] == [
        "MXNET_KVSTORE_BIGARRAY_BOUND=100000", "MXNET_KVSTORE_BIGARRAY_BOUND=1000000 (default)"]
    assert [c for c in cells if c.system == "p3"] == tune.grid("p3")  # untouched
    assert dict(tune.parse_cell("P3_SLICE_SIZE=25000").env) == {"P3_SLICE_SIZE": "25000", "P3_SOCKET_BUFFER": "131072"}
    for bad in ("P3_SLICE_SIZE", "NOPE=1", "P3_SLICE_SIZE=1 HOROVOD_CYCLE_TIME=5"):
        with pytest.raises(ValueError, match="--cell"):
            tune.parse_cell(bad)


@pytest.mark.unit
def test_tuning_points_run_every_cell_every_repeat_shuffled_with_its_setting(tmp_path):
    cells = tune.cells_for(["horovod", "dist_sync"])
    points = tune.tuning_points(BASE, cells, 3, 7, tmp_path)
    assert len(points) == 3 * len(cells) == 39
    for repeat in range(3):
        mine = [p for p in points if p.repeat == repeat]
        assert sorted(p.baseline_setting for p in mine) == sorted(c.label for c in cells)
        assert [p.order for p in mine] == list(range(len(cells)))
    orders = [[p.baseline_setting for p in points if p.repeat == r] for r in range(3)]
    assert orders[0] != orders[1] and orders == [[p.baseline_setting for p in tune.tuning_points(
        BASE, cells, 3, 7, tmp_path) if p.repeat == r] for r in range(3)]  # shuffled afresh, seeded
    for p in points:
        env = dict(p.setting_env)
        assert p.kvstore in ("horovod", "dist_sync") and p.tag == "tune"
        if "HOROVOD_AUTOTUNE" in env:  # the autotuner: a longer warm-up, its log beside the CSV, not in the label
            assert p.warmup == tune.AUTOTUNE_WARMUP and "HOROVOD_AUTOTUNE_LOG" not in p.baseline_setting
            assert env["HOROVOD_AUTOTUNE_LOG"] == str(tmp_path / "resnet50_v1.2gbit.4h.x0.2.emulated.autotune.csv")
        else:
            assert p.warmup == 2 and p.baseline_setting.startswith(baseline_settings.env_text(env))


@pytest.mark.unit
@pytest.mark.parametrize("system,kvstore", [("horovod", KVStore.HOROVOD), ("dist_sync", KVStore.DIST_SYNC),
                                            ("mxnet-p3", KVStore.MXNET_P3), ("p3", KVStore.P3)])
def test_every_cells_variables_reach_every_process_of_its_job(system, kvstore):
    """cluster_job's environment carries the cell's variables; the launcher, planning one host of a 2-host job
    with that environment, hands them to every process it starts (Horovod's ranks, ps-lite's or p3kv's
    scheduler, servers and workers)."""
    wanted = {k: v + "7" for k, v in DEFAULTS[system].items()}  # no variable at its default value
    point = cluster_job.Point(model="resnet50_v1", kvstore=system, setting_env=tuple(wanted.items()),
                              baseline_setting="x")
    env = cluster_job._environment(point, cluster_job.KVSTORES[system][1])
    assert {k: env[k] for k in wanted} == wanted
    if kvstore is KVStore.HOROVOD:
        job = Job(command=("train",), num_workers=2, num_servers=0, kvstore=kvstore, port=4242, local_workers=1,
                  scheduler=False, root="10.0.0.1", slots=(("10.0.0.1", 1), ("127.0.0.1", 1)))
    else:
        job = Job(command=("train",), num_workers=2, num_servers=2, kvstore=kvstore, port=4242)
    specs = plan(job, "127.0.0.1", 4242, env)
    assert specs and all({k: s.env.get(k) for k in wanted} == wanted for s in specs), [s.name for s in specs]
    if kvstore is not KVStore.HOROVOD:
        assert {s.name.split()[0] for s in specs} == {"scheduler", "server", "worker"}


@pytest.mark.unit
def test_horovods_cycle_time_is_dilated_like_every_timer_of_the_emulation():
    """Horovod's background thread negotiates once per cycle even when idle: at --gpu-scale 0.1 its 1 ms default
    (or a grid cell's value) is 10 ms of real time, in the environment every rank gets and in the row."""
    point = cluster_job.Point(model="resnet50_v1", kvstore="horovod", compute="emulated", gpu_scale=0.1)
    assert point.horovod_cycle_real_ms == pytest.approx(10.0)
    env = cluster_job._environment(point, cluster_job.KVSTORES["horovod"][1])
    assert float(env["HOROVOD_CYCLE_TIME"]) == pytest.approx(10.0)
    cell = dataclasses.replace(point, gpu_scale=0.075, setting_env=(("HOROVOD_CYCLE_TIME", "5"),))
    assert float(cluster_job._environment(cell, {})["HOROVOD_CYCLE_TIME"]) == pytest.approx(5 / 0.075, rel=1e-6)
    assert dataclasses.replace(point, compute="real").horovod_cycle_real_ms == 1.0  # a real cluster: as set
    assert dataclasses.replace(point, kvstore="p3").horovod_cycle_real_ms is None
    assert "HOROVOD_CYCLE_TIME" not in cluster_job._environment(dataclasses.replace(point, kvstore="p3"), {})
    # --resume tells a row of the dilated cycle from one before it (which ran Horovod's 1 ms undilated)
    fields = {k: ("" if v is None else str(v)) for k, v in dataclasses.asdict(cell).items()}
    row = {**fields, "horovod_cycle_ms": str(cell.horovod_cycle_real_ms), "cfs_period_us": "",
           "link_burst_bytes": str(cell.link_burst_bytes)}
    assert sweeps._signature(row) == sweeps._signature(sweeps._settings(cell))
    assert sweeps._signature({**row, "horovod_cycle_ms": ""}) != sweeps._signature(sweeps._settings(cell))


def _cell(label, seconds, default=False, reference=False, jobs=3, spread=0.01, seed=0):
    rng = np.random.default_rng(seed)
    return best_setting.Cell(label, tuple(rng.normal(seconds, spread * seconds, size=(20, 2)) for _ in range(jobs)),
                             128.0, default, reference)


@pytest.mark.unit
def test_the_best_setting_is_the_fastest_only_beyond_the_ci_of_the_default():
    clear = best_setting.choose([_cell("d", 1.0, default=True), _cell("a", 0.8, seed=1), _cell("b", 0.9, seed=2)],
                                resamples=400)
    assert clear.chosen.label == "a" and clear.vs_default.low > 1 and "faster than the default" in clear.reason
    assert clear.estimates["a"].value == pytest.approx(128 / 0.8, rel=0.02)
    # The same draws, 0.5% faster: the fastest cell, but well within the CI of the ratio.
    tie = best_setting.choose([_cell("d", 1.0, default=True, spread=0.1), _cell("a", 0.995, spread=0.1)],
                              resamples=400)
    assert tie.chosen.label == "d" and tie.vs_default.low <= 1 <= tie.vs_default.high and "tie" in tie.reason
    fastest_default = best_setting.choose([_cell("d", 0.7, default=True), _cell("a", 0.9, seed=1)], resamples=400)
    assert fastest_default.chosen.label == "d" and fastest_default.vs_default is None
    reference = best_setting.choose([_cell("d", 1.0, default=True), _cell("auto", 0.5, reference=True, seed=1)],
                                    resamples=400)
    assert reference.chosen.label == "d" and "auto" in reference.estimates  # shown, never chosen
    no_default = best_setting.choose([_cell("d", 1.0, default=True, jobs=0), _cell("a", 0.9, seed=1)],
                                     resamples=400)
    assert no_default.chosen.label == "a" and "no ok run" in no_default.reason
    few = best_setting.choose([_cell("d", 1.0, default=True), _cell("a", 0.5, seed=1, jobs=2)], resamples=400)
    assert few.chosen.label == "d" and "too few repeats" in few.reason  # 2 jobs: within-job spread only
    with pytest.raises(ValueError, match="no cell"):
        best_setting.choose([_cell("d", 1.0, default=True, jobs=0)])


def _row(point, seconds, run_id, **overrides):
    return {"run_id": run_id, "tag": "tune", "model": point.model, "kvstore": point.kvstore, "hosts": point.hosts,
            "layout": "colocated", "bandwidth": point.bandwidth, "compute": "emulated", "batch_size": 32,
            "gpu_scale": point.gpu_scale, "efficiency_factor": 1.0, "slice_size": "", "optimizer": "sgd",
            "warmup": point.warmup, "iters": point.iters, "repeat": point.repeat, "status": "ok", "smoke": False,
            "workers": 4, "samples_per_batch": 32, "iter_s": [seconds] * point.iters, "git_commit": "abc",
            "baseline_setting": point.baseline_setting, "link_burst_bytes": point.link_burst_bytes,
            "cfs_period_us": point.cfs_period_us or "", "tcp_rto_min_ms": point.tcp_rto_min_real_ms or "", **overrides}


@pytest.mark.unit
def test_a_tuning_csv_resumes_and_its_best_setting_goes_to_best_json(tmp_path):
    cells = tune.cells_for(["dist_sync"])
    points = tune.tuning_points(BASE, cells, 3, 0, tmp_path)
    csv_path = tmp_path / "point.csv"
    assert sweeps.not_yet_run(points, csv_path) == points
    seconds = {"100000": 1.0, "1000000": 1.0, "10000000": 0.8}
    rng = np.random.default_rng(0)
    for n, p in enumerate(points[:6]):  # an interrupted grid: 6 of 9 runs written, every rank's iterations too
        bound = dict(p.setting_env)["MXNET_KVSTORE_BIGARRAY_BOUND"]
        times = {rank: list(rng.normal(seconds[bound], 0.01, size=p.iters)) for rank in range(4)}
        bench_rows.write_run(csv_path, _row(p, seconds[bound], f"r{n}"), times)
    bench_rows.write_run(csv_path, _row(points[6], 0.1, "failed", status="failed(1)"))  # run again
    bench_rows.write_run(csv_path, _row(points[7], 0.1, "smoke", smoke=True))  # does not count
    assert sweeps.not_yet_run(points, csv_path) == points[6:]
    for n, p in enumerate(points[6:]):  # the resumed invocation writes the rest; the choice pools both
        bound = dict(p.setting_env)["MXNET_KVSTORE_BIGARRAY_BOUND"]
        bench_rows.write_run(csv_path, _row(p, seconds[bound], f"s{n}"),
                             {rank: list(rng.normal(seconds[bound], 0.01, size=p.iters)) for rank in range(4)})
    bench_rows.write_run(csv_path, _row(points[0], 0.01, "other-iters", iters=5))  # another grid's run: ignored
    bench_rows.write_run(csv_path, _row(points[0], 0.01, "unfaithful", faithful=False))  # not a result: ignored
    assert sweeps.not_yet_run(points, csv_path) == []
    entries = tune.choose_best(csv_path, BASE, cells)
    entry = entries["dist_sync"]
    assert entry["setting"] == {"MXNET_KVSTORE_BIGARRAY_BOUND": "10000000"} and not entry["default"]
    assert entry["label"] == "MXNET_KVSTORE_BIGARRAY_BOUND=10000000 (tuned)"
    assert entry["throughput"] == pytest.approx(128 / 0.8, rel=0.02) and entry["ci"][0] <= entry["throughput"]
    assert entry["grid"] == [c.label for c in cells] and len(entry["cells"]) == 3
    assert (entry["runs"], entry["repeats"], entry["commit"], entry["iters"]) == (9, 3, "abc", 20)
    assert entry["unfaithful_left_out"] == 1
    smoke = tune.choose_best(csv_path, BASE, cells, include_smoke=True)["dist_sync"]  # a machinery check keeps it
    assert smoke["smoke"] and smoke["runs"] == 11 and smoke["unfaithful_left_out"] == 0
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"other.point": {"p3": {"setting": {}}}}))
    merged = best_setting.merge_best(best, "resnet50_v1.2gbit.4h.x0.2.emulated", entries)
    assert set(merged) == {"other.point", "resnet50_v1.2gbit.4h.x0.2.emulated"}
    assert json.loads(best.read_text()) == merged
    # A run of the same cell under other conditions (here another link queue; in practice one from before a change
    # to the emulation, which --resume ran again): with the grid's runs given, left out and counted, never pooled.
    older = _row(points[0], 0.01, "older", link_queue_ms=1)
    assert tune.conditions(older) != tune.point_conditions(points[0])
    bench_rows.write_run(csv_path, older, {rank: [0.01] * points[0].iters for rank in range(4)})
    assert sweeps.not_yet_run(points, csv_path) == []
    pooled = tune.choose_best(csv_path, BASE, cells)["dist_sync"]
    assert pooled["runs"] == 10 and pooled["older_left_out"] == 0  # without the grid: every row of the cell
    now = tune.choose_best(csv_path, BASE, cells, grid=points)["dist_sync"]
    assert now["runs"] == 9 and now["older_left_out"] == 1
    assert now["cells"] == entry["cells"] and now["setting"] == entry["setting"]


@pytest.mark.unit
def test_resume_knows_the_rows_of_a_grid_without_emulated_compute(tmp_path):
    # cluster_job.py writes a dilation, an efficiency and CPUs only for emulated compute (the point has them anyway),
    # so --resume compares them only there: a `--compute none` grid's rows count as done instead of running again.
    args = tune.parse_args(["--systems", "dist_sync", "--compute", "none", "--hosts", "2", "--batch-size", "4"])
    base = tune.base_points(args)[0]
    assert base.gpu_scale == 1.0 and base.host_cpus and base.cpu_quota is None
    points = tune.tuning_points(base, tune.cells_for(["dist_sync"]), 2, 0, tmp_path)
    csv_path = tmp_path / "point.csv"
    blank = {"gpu_scale": "", "efficiency_factor": "", "host_cpus": ""}
    for n, p in enumerate(points[:4]):
        recorded = {k: v for k, v in sweeps._settings(p).items() if k in bench_rows.RUN_COLUMNS}
        row = {**recorded, **blank, "run_id": f"r{n}", "status": "ok", "smoke": False, "workers": 2,
               "samples_per_batch": 4, "iter_s": [1.0] * p.iters}
        bench_rows.write_run(csv_path, row)
    assert sweeps.not_yet_run(points, csv_path) == points[4:]
    emulated = dataclasses.replace(points[0], compute="emulated")  # there the blanks are another run's (older) rows
    assert sweeps._signature({**sweeps._settings(emulated), **blank}) != sweeps._signature(sweeps._settings(emulated))


@pytest.mark.unit
def test_choose_only_chooses_again_from_the_csv_and_runs_nothing(tmp_path):
    argv = ["--systems", "dist_sync", "--bandwidth", "2gbit", "--gpu-scale", "0.2", "--results-dir", str(tmp_path),
            "--choose-only"]
    args = tune.parse_args(argv)
    base = tune.base_points(args)[0]
    key = baseline_settings.point_key(base)
    assert tune.main(argv) == 2 and not (tmp_path / "best.json").exists()  # no CSV yet: says so, writes nothing
    cells = tune.cells_for(["dist_sync"])
    seconds = {"100000": 1.0, "1000000": 1.0, "10000000": 0.8}
    rng = np.random.default_rng(1)
    for n, p in enumerate(tune.tuning_points(base, cells, 3, 0, tmp_path)):
        bound = dict(p.setting_env)["MXNET_KVSTORE_BIGARRAY_BOUND"]
        bench_rows.write_run(tmp_path / f"{key}.csv", _row(p, seconds[bound], f"r{n}"),
                             {rank: list(rng.normal(seconds[bound], 0.01, size=p.iters)) for rank in range(4)})
    before = (tmp_path / f"{key}.csv").read_text()
    assert tune.main(argv) == 0  # as any user, no emulated cluster built: nothing here could run a job
    assert (tmp_path / f"{key}.csv").read_text() == before  # not a run added
    entry = json.loads((tmp_path / "best.json").read_text())[key]["dist_sync"]
    assert entry["setting"] == {"MXNET_KVSTORE_BIGARRAY_BOUND": "10000000"} and entry["runs"] == 9
    assert (tmp_path / f"{key}.md").read_text().startswith(f"Tuning at {key}")


@pytest.mark.unit
def test_a_grid_run_in_slices_chooses_a_systems_best_only_once_all_its_cells_ran(tmp_path, caplog):
    cells = tune.cells_for(["horovod", "dist_sync"])
    parts = [tune.cell_slice(cells, k, 3, [BASE], 3) for k in (1, 2, 3)]
    assert [c for part in parts for c in part] == cells  # every cell in exactly one part, in grid order
    assert all(parts) and tune.cell_slice(cells, 2, 3, [BASE], 3) == parts[1]  # K/N names the same cells again
    dist_sync = [c for c in cells if c.system == "dist_sync"]
    csv_path = tmp_path / "point.csv"
    rng = np.random.default_rng(0)
    points = tune.tuning_points(BASE, dist_sync, 3, 0, tmp_path)
    for n, p in enumerate(points):
        if p.baseline_setting != dist_sync[2].label:  # the last cell in a later slice, not run yet
            bench_rows.write_run(csv_path, _row(p, 1.0, f"r{n}"),
                                 {rank: list(rng.normal(1.0, 0.01, size=p.iters)) for rank in range(4)})
    assert tune.choose_best(csv_path, BASE, dist_sync) == {}  # a partial grid writes no best setting
    assert "has no run in" in caplog.text and "judged unfaithful" not in caplog.text
    last = [p for p in points if p.baseline_setting == dist_sync[2].label]
    bench_rows.write_run(csv_path, _row(last[0], 0.8, "u", faithful=False))  # its only run: not a result
    assert tune.choose_best(csv_path, BASE, dist_sync) == {}
    assert f"every run of cell {dist_sync[2].label} in {csv_path} (1) was judged unfaithful" in caplog.text
    for n, p in enumerate(points):
        if p.baseline_setting == dist_sync[2].label:
            bench_rows.write_run(csv_path, _row(p, 0.8, f"s{n}"),
                                 {rank: list(rng.normal(0.8, 0.01, size=p.iters)) for rank in range(4)})
    assert tune.choose_best(csv_path, BASE, dist_sync)["dist_sync"]["setting"] == dict(dist_sync[2].env)


@pytest.mark.unit
def test_comparisons_run_each_system_at_its_best_where_best_json_has_one(tmp_path):
    best = tmp_path / "best.json"
    key = "resnet50_v1.2gbit.4h.x0.2.emulated"
    best.write_text(json.dumps({key: {
        "horovod": {"setting": {"HOROVOD_FUSION_THRESHOLD": "16777216", "HOROVOD_CYCLE_TIME": "5"},
                    "label": "HOROVOD_FUSION_THRESHOLD=16777216 HOROVOD_CYCLE_TIME=5 (tuned)"},
        "p3": {"setting": {"P3_SLICE_SIZE": "100000", "P3_SOCKET_BUFFER": "131072"},
               "label": "P3_SLICE_SIZE=100000 P3_SOCKET_BUFFER=131072 (tuned)"}}}))
    planned = demo.points(demo.parse_args(["--systems", "p3", "dist_sync", "horovod", "--bandwidth", "2gbit",
                                           "--gpu-scale", "0.2", "--host-cpus", "2", "--best", str(best)]))
    assert baseline_settings.point_key(planned[0]) == key  # the demo's point is the tuning's demo point
    by_system = {p.kvstore: p for p in planned}
    assert dict(by_system["horovod"].setting_env)["HOROVOD_CYCLE_TIME"] == "5"
    assert by_system["p3"].baseline_setting.endswith("(tuned)")
    assert by_system["dist_sync"].setting_env == () and by_system["dist_sync"].baseline_setting == ""
    assert [p.repeat for p in planned] == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # still one comparison, interleaved
    untuned = demo.points(demo.parse_args(["--systems", "p3", "horovod", "--best", str(best), "--untuned"]))
    assert all(p.setting_env == () for p in untuned)
    args = cluster_bench.parse_args(["--bandwidth", "2gbit", "--gpu-scale", "0.2", "--best", str(best)])
    assert {p.kvstore for p in cluster_bench.points_from_args(args) if p.setting_env} == {"horovod", "p3"}
    # The sweeps: the demo sweep's point is tuned; the slice sweep fixes p3's slice size itself.
    swept = sweeps.sweep_points("demo", sweeps.parse_args(["demo", "--host-cpus", "2", "--best", str(best)]))
    assert {p.kvstore for p in swept if p.setting_env} == {"horovod", "p3"}
    sliced = baseline_settings.at_best([cluster_job.Point(model="resnet50_v1", kvstore="p3", bandwidth="2gbit",
                                                          gpu_scale=0.2, slice_size=5000)], best)
    assert dict(sliced[0].setting_env) == {"P3_SOCKET_BUFFER": "131072"} and "slice size" in \
        sliced[0].baseline_setting
    # A run at the tuned setting is a different run from one at the defaults (resume reruns it); the defaults
    # under any label are the same run.
    assert baseline_settings.identity(DEFAULT_UNTUNED) == baseline_settings.identity(
        "HOROVOD_FUSION_THRESHOLD=134217728 HOROVOD_CYCLE_TIME=1 (default)") == baseline_settings.identity(
        "default (tuned: HOROVOD_FUSION_THRESHOLD=134217728 HOROVOD_CYCLE_TIME=1)") == "default"
    assert baseline_settings.identity(by_system["horovod"].baseline_setting) == \
        "HOROVOD_FUSION_THRESHOLD=16777216 HOROVOD_CYCLE_TIME=5"
    # A variable at its default value runs what leaving it out runs: the slice sweep's p3 rows above keep only the
    # default socket buffer, so they are the defaults' run; a tuned pair with one default is its other variable.
    assert baseline_settings.identity(sliced[0].baseline_setting) == "default"
    assert baseline_settings.identity("P3_SLICE_SIZE=25000 P3_SOCKET_BUFFER=131072 (tuned)") == "P3_SLICE_SIZE=25000"
    assert baseline_settings.identity("P3_SOCKET_BUFFER=32768 (tuned)") == "P3_SOCKET_BUFFER=32768"


@pytest.mark.unit
def test_a_point_tuned_at_one_dilation_runs_its_best_setting_at_every_dilation(tmp_path):
    # The dilation sweep runs ResNet-50 at 4 Gbps-equivalent at 0.05, 0.075 and 0.1; `tune` tunes it at the sweeps'
    # dilation (0.11: 440 Mbit links). Same comparison, so the same setting, and the label says where it was tuned.
    best = tmp_path / "best.json"
    at_4_gbps = {"comparison": "resnet50_v1.4000mbit-p100.4h.emulated"}  # what tune writes into every entry
    best.write_text(json.dumps({
        "resnet50_v1.440mbit.4h.x0.11.emulated": {
            "dist_sync": {"setting": {"MXNET_KVSTORE_BIGARRAY_BOUND": "100000"},
                          "label": "MXNET_KVSTORE_BIGARRAY_BOUND=100000 (tuned)", **at_4_gbps, "gpu_scale": 0.11},
            "p3": {"setting": {"P3_SLICE_SIZE": "25000"}, "label": "P3_SLICE_SIZE=25000 (tuned)", **at_4_gbps,
                   "gpu_scale": 0.11}},
        "resnet50_v1.400mbit.4h.x0.1.emulated": {  # a point's own entry wins over another dilation's
            "p3": {"setting": {"P3_SLICE_SIZE": "100000"}, "label": "P3_SLICE_SIZE=100000 (tuned)", **at_4_gbps,
                   "gpu_scale": 0.1}},
        "resnet50_v1.1gbit.4h.x0.1.emulated": {  # 10 Gbps-equivalent: another comparison
            "mxnet-p3": {"setting": {"MXNET_KVSTORE_SLICE_THRESHOLD": "100000"}, "label": "x (tuned)",
                         "comparison": "resnet50_v1.10000mbit-p100.4h.emulated", "gpu_scale": 0.1}}}))
    points = sweeps.sweep_points("dilation", sweeps.parse_args(
        ["dilation", "--models", "resnet50_v1", "--kvstores", "dist_sync", "p3", "mxnet-p3", "--best", str(best)]))
    by = {(p.kvstore, p.gpu_scale): p for p in points}
    for scale in (0.05, 0.075, 0.1):
        ds = by["dist_sync", scale]
        assert dict(ds.setting_env) == {"MXNET_KVSTORE_BIGARRAY_BOUND": "100000"}
        assert ds.baseline_setting == "MXNET_KVSTORE_BIGARRAY_BOUND=100000 (tuned at x0.11)"
        assert baseline_settings.identity(ds.baseline_setting) == "MXNET_KVSTORE_BIGARRAY_BOUND=100000"
        assert by["mxnet-p3", scale].setting_env == ()  # tuned only at another equivalent: defaults
    assert dict(by["p3", 0.1].setting_env) == {"P3_SLICE_SIZE": "100000"}
    assert by["p3", 0.1].baseline_setting == "P3_SLICE_SIZE=100000 (tuned)"
    assert dict(by["p3", 0.05].setting_env) == {"P3_SLICE_SIZE": "25000"}  # the least dilated entry: x0.11's
    assert by["p3", 0.05].baseline_setting == "P3_SLICE_SIZE=25000 (tuned at x0.11)"
    tuned_at = cluster_job.Point(model="resnet50_v1", kvstore="p3", bandwidth="440mbit", gpu_scale=0.11, batch_size=64)
    assert baseline_settings.comparison_key(tuned_at) == "resnet50_v1.4000mbit-p100.4h.emulated.b64"
    assert baseline_settings.comparison_key(dataclasses.replace(tuned_at, bandwidth="")) is None


@pytest.mark.unit
def test_rows_carry_the_baseline_setting_column(tmp_path):
    assert "baseline_setting" in bench_rows.RUN_COLUMNS
    path = tmp_path / "runs.csv"
    old = list(bench_rows.RUN_COLUMNS[:bench_rows.RUN_COLUMNS.index("baseline_setting")])
    path.write_text(",".join(old) + "\n" + ",".join("ok" if c == "status" else "" for c in old) + "\n")
    bench_rows.write_run(path, {"run_id": "b", "status": "ok", "baseline_setting": "A=1 (tuned)"})
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["baseline_setting"] or "" for r in rows] == ["", "A=1 (tuned)"]  # an older file gains the column
    assert sweeps._signature({**_row(BASE, 1.0, "x"), "baseline_setting": ""})[-1] == "default"


@pytest.mark.unit
def test_python_m_benchmarks_tune_estimates_without_running(capsys):
    from benchmarks.__main__ import main

    assert main(["tune", "--systems", "dist_sync", "--equivalent", "10", "--estimate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("on an idle 2-core machine") and float(out[0].split()[0]) > 0
    assert out[1].startswith("in slices of at most 2 h: --slice K/")
    assert main(["tune", "--systems", "horovod", "--equivalent", "10", "--estimate", "--window", "0.01"]) == 0
    n = int(capsys.readouterr().out.splitlines()[1].split("K/")[1].split(",")[0])
    # A window shorter than any cell: the fewest parts none longer than the longest cell (the autotuner's, with
    # its long warm-up), not one part per cell.
    args = tune.parse_args(["--systems", "horovod", "--equivalent", "10", "--window", "0.01"])
    cells = tune.cells_for(args.systems, args.cells)
    longest_cell = max(tune.estimate_seconds(args, [c]) for c in cells)

    def longest_part(parts):
        return max(tune.estimate_seconds(args, tune.cell_slice(cells, k, parts, tune.base_points(args), args.repeats))
                   for k in range(1, parts + 1))

    assert tune.slice_count(args) == (n, pytest.approx(longest_part(n)))
    assert longest_part(n) <= longest_cell < longest_part(n - 1) and n < len(cells)


@pytest.mark.system
def test_tune_smoke_two_cells_of_dist_sync_on_two_hosts(tmp_path):
    from benchmarks.emulation import emulated_cluster

    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    cmd = [sys.executable, "-m", "benchmarks", "tune", "--compute", "none", "--hosts", "2", "--warmup", "1",
           "--iters", "2", "--repeats", "1", "--systems", "dist_sync", "--cell", "MXNET_KVSTORE_BIGARRAY_BOUND=100000",
           "--cell", "MXNET_KVSTORE_BIGARRAY_BOUND=1000000", "--batch-size", "4", "--timeout", "240",
           "--results-dir", str(tmp_path), "--smoke", "--force", "--allow-dirty"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    key = "resnet50_v1.2gbit.2h.x1.none.b4"
    rows = bench_rows.read_runs(tmp_path / f"{key}.csv")
    assert sorted(r["baseline_setting"] for r in rows) == ["MXNET_KVSTORE_BIGARRAY_BOUND=100000",
                                                           "MXNET_KVSTORE_BIGARRAY_BOUND=1000000 (default)"]
    best = json.loads((tmp_path / "best.json").read_text())
    assert "dist_sync" in best.get(key, {}), (best, done.stderr[-3000:])
    entry = best[key]["dist_sync"]
    assert (entry["comparison"], entry["gpu_scale"]) == ("resnet50_v1.2000mbit-p100.2h.none.b4", 1.0)
    assert entry["smoke"] and len(entry["grid"]) == 2 and entry["ci"][0] <= entry["throughput"] <= entry["ci"][1]
    assert entry["default"] and "too few repeats" in entry["reason"] or "default is the fastest" in entry["reason"]
