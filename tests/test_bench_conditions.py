"""The emulated-cluster benchmark's bookkeeping, without a cluster: the row schema and writer, the shuffled
interleaving of systems, the run guard (dirty tree, load), the repeat statistics, the header-inclusive bound,
the per-model calibration and the README blocks generated from the result CSVs."""

import argparse
import csv
import json
import os
import pathlib
import subprocess

import pytest
from conftest import ROOT

from benchmarks.analysis import bench_rows, bench_stats, link_utilisation
from benchmarks.analysis import points as point_stats
from benchmarks.emulation import emulated_compute, run_guard, wire_bound
from benchmarks.report import loopback_blocks, sentences, sweep_blocks
from benchmarks.report import readme as report
from benchmarks.suites import cluster_bench, sweeps
from benchmarks.workloads import cluster_worker

pytestmark = pytest.mark.unit


def test_run_columns_record_optimizer_statistics_and_conditions():
    for column in ("optimizer", "update_on", "repeat", "repeats", "order", "seed", "iter_s", "q1_s", "q3_s",
                   "load_1m_before", "load_1m_after", "max_load", "busy_pct_before", "max_busy_pct", "forced",
                   "cpu_host_pct", "cpu_total_pct",
                   "git_dirty", "allow_dirty", "smoke", "efficiency", "p100_equiv_gbps", "wire_bytes", "horovod"):
        assert column in bench_rows.RUN_COLUMNS, column
    assert cluster_bench.COLUMNS == bench_rows.RUN_COLUMNS


def test_write_run_appends_rows_and_iterations(tmp_path):
    path = tmp_path / "runs.csv"
    row = {"run_id": "a", "model": "m", "kvstore": "p3", "status": "ok", "optimizer": "sgd", "repeat": 1,
           "iter_s": [0.5, 0.25]}
    bench_rows.write_run(path, row, {0: [0.5, 0.25], 1: [0.5, 0.3]})
    bench_rows.write_run(path, {**row, "run_id": "b"}, {0: [0.4]})
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run_id"] for r in rows] == ["a", "b"]
    assert rows[0]["optimizer"] == "sgd" and json.loads(rows[0]["iter_s"]) == [0.5, 0.25]
    with bench_rows.iterations_path(path).open() as f:
        its = list(csv.DictReader(f))
    assert [(r["run_id"], r["rank"], r["iteration"], float(r["time_s"])) for r in its] == [
        ("a", "0", "0", 0.5), ("a", "0", "1", 0.25), ("a", "1", "0", 0.5), ("a", "1", "1", 0.3), ("b", "0", "0", 0.4)]
    with pytest.raises(ValueError, match="not run columns"):
        bench_rows.write_run(path, {"optimiser": "sgd"})
    other = tmp_path / "old.csv"  # run columns, some missing: rewritten with all of them, its row kept
    other.write_text("model,timestamp\n m,1\n")
    bench_rows.write_run(other, row)
    with other.open() as f:
        old, new = csv.DictReader(f)
    assert (old["model"], old["timestamp"], old["run_id"]) == (" m", "1", "") and new["run_id"] == "a"
    foreign = tmp_path / "foreign.csv"  # a column no run writes: refused, naming it
    foreign.write_text("timestamp,modell\n1,m\n")
    with pytest.raises(SystemExit, match=r"does not write \(modell\)"):
        bench_rows.write_run(foreign, row)


def test_legacy_rows_read_as_no_optimizer_single_run(tmp_path):
    path = tmp_path / "sweep_old.csv"
    path.write_text("model,kvstore,status,throughput,median_s,bound_s\nvgg19,p3,ok,17.3,1.8,1.7\n"
                    "vgg19,p3,failed(1),,,\n")
    [row] = bench_rows.read_runs(path)
    assert row["optimizer"] == "none" and row["repeats"] == "1" and row["legacy"] == "True"
    assert bench_rows.iteration_times(row) == [1.8]


def test_interleave_shuffles_systems_per_repeat_with_a_seed():
    base = [cluster_bench.Point(model=m, kvstore=kv) for m in ("resnet50_v1", "vgg19")
            for kv in ("p3", "dist_sync", "mxnet-p3", "horovod")]
    runs = cluster_bench.interleave(base, 3, seed=7)
    assert len(runs) == 24
    assert runs == cluster_bench.interleave(base, 3, seed=7)  # seeded: reproducible
    orders = []
    for repeat in range(3):
        for model in ("resnet50_v1", "vgg19"):
            mine = [p for p in runs if p.repeat == repeat and p.model == model]
            assert sorted(p.kvstore for p in mine) == sorted(["p3", "dist_sync", "mxnet-p3", "horovod"])
            assert [p.order for p in mine] == [0, 1, 2, 3] and all(p.repeats == 3 for p in mine)
            orders.append(tuple(p.kvstore for p in mine))
    assert len(set(orders)) > 1  # not one fixed order (p3kv always first was the old bias)
    assert [p.repeat for p in runs] == sorted(p.repeat for p in runs)  # repeats are rounds over every point
    assert cluster_bench.interleave(base, 3, seed=8) != runs


def _repo(tmp_path: pathlib.Path) -> pathlib.Path:
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return tmp_path


def test_dirty_tree_is_refused_unless_allowed_and_recorded(tmp_path):
    root = _repo(tmp_path)
    commit, dirty = run_guard.check_tree(False, root)
    assert len(commit) == 40 and not dirty
    (root / "README.md").write_text("tables\n")
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "benchmarks" / "results" / "x.csv").write_text("a\n")
    subprocess.run(["git", "add", "README.md", "benchmarks"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two"], cwd=root, check=True)
    commit = run_guard.git_state(root)[0]
    (root / "README.md").write_text("regenerated tables\n")  # what a sweep itself writes does not count
    (root / "benchmarks" / "results" / "x.csv").write_text("a\nb\n")
    assert run_guard.check_tree(False, root) == (commit, False)
    (root / "f.txt").write_text("b\n")
    with pytest.raises(run_guard.Refused, match="--allow-dirty"):
        run_guard.check_tree(False, root)
    assert run_guard.check_tree(True, root) == (commit, True)
    assert run_guard.tree_or_refusal(False, root) is None  # a command's main() exits 2 on it
    assert run_guard.tree_or_refusal(True, root) == (commit, True)
    row = cluster_bench.common_columns(cluster_bench.Conditions(allow_dirty=True, seed=5), commit, True)
    assert row["git_dirty"] is True and row["allow_dirty"] is True and row["seed"] == 5


def test_idle_gate_waits_for_the_cpus_then_refuses_or_records_force(monkeypatch):
    busy = iter([80.0, 40.0, 4.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    now = [0.0]
    slept = []

    def sleep(s):  # samples take no time here (tests/test_run_guard.py counts them)
        slept.append(s)
        now[0] += s

    start = run_guard.wait_for_idle(10.0, None, 60, False, busy=lambda: next(busy), sleep=sleep, poll_s=5,
                                    clock=lambda: now[0])
    assert start == run_guard.Start(busy_pct=4.0, load_1m=3.0, forced=False, waited_s=10.0)
    assert slept == [5, 5]  # waited for the CPUs; the load average (3.0) is not checked by default
    slept.clear()
    with pytest.raises(run_guard.Refused, match=r"CPU busy 50% is above --max-busy 10%"):
        run_guard.wait_for_idle(10.0, None, 12, False, busy=lambda: 50.0, sleep=sleep, poll_s=5, clock=lambda: now[0])
    assert slept == [5, 5, 2]
    with pytest.raises(run_guard.Refused, match=r"1-minute load 3.00 is above --max-load 1.00"):
        run_guard.wait_for_idle(10.0, 1.0, 0, False, busy=lambda: 1.0)
    slept.clear()
    forced = run_guard.wait_for_idle(10.0, 1.0, 25, True, busy=lambda: 50.0, sleep=sleep, clock=lambda: now[0])
    assert forced == run_guard.Start(50.0, 3.0, True) and slept == []  # force starts at once
    assert run_guard.wait_for_idle(10.0, 5.0, 0, False, busy=lambda: 9.0).forced is False


def test_busy_percent_counts_every_core_and_not_idle_or_iowait(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text("cpu  100 0 50 800 50 0 0 0\ncpu0 1 1 1 1\n")
    assert run_guard.cpu_times(str(stat)) == (150, 1000)
    samples = iter([(150, 1000), (250, 1400)])  # 100 of 400 jiffies busy: one core of four, or half of two
    assert run_guard.busy_percent(1.0, times=lambda: next(samples), sleep=lambda s: None) == 25.0
    before = run_guard.cpu_times()
    assert 0 <= before[0] <= before[1]  # the real /proc/stat parses


def test_busy_machine_refuses_before_any_run(monkeypatch, tmp_path):
    monkeypatch.setattr(run_guard, "sample_cpu", lambda: run_guard.Sample(90.0))
    conditions = cluster_bench.Conditions(load_wait=0, allow_dirty=True)
    with pytest.raises(run_guard.Refused, match="--max-busy"):
        cluster_bench.run_points([cluster_bench.Point(model="resnet50_v1", kvstore="p3")], tmp_path / "x.csv",
                                 conditions)
    assert not (tmp_path / "x.csv").exists()


def test_statistics_on_known_numbers():
    assert bench_stats.quartiles([1, 2, 3, 4, 5]) == (2, 3, 4)
    assert bench_stats.quartiles([7.0]) == (7.0, 7.0, 7.0)
    s = bench_stats.spread([[1, 2, 3], [4, 5], [], [6, 7, 8, 9]])
    assert (s.n, s.iterations, s.median_s) == (3, 9, 5)
    assert (s.q1_s, s.q3_s) == (3, 7)
    assert (s.run_median_min_s, s.run_median_max_s) == (2, 7.5)
    assert s.throughput(10) == (2.0, 10 / 7, 10 / 3)


def test_aggregate_pools_iterations_of_repeats_and_compares_systems():
    def row(kv, repeat, times):
        return {"status": "ok", "model": "m", "kvstore": kv, "hosts": "2", "workers": "2", "samples_per_batch": "4",
                "bandwidth": "1gbit", "bandwidth_bps": "1e9", "gpu_scale": "0.5", "optimizer": "sgd(...)",
                "unit": "images", "bound_throughput": "20", "repeat": str(repeat), "iter_s": json.dumps(times),
                "cpu_host_pct": "50;70", "cpu_total_pct": "120", "load_1m_before": "0.5", "load_1m_after": "0.7",
                "smoke": "False", "legacy": "False"}

    rows = [row("p3", 0, [1.0, 1.0]), row("p3", 1, [0.5, 0.5]), row("dist_sync", 0, [2.0, 2.0, 2.0]),
            {**row("dist_sync", 1, [9.0]), "smoke": "True"}]
    p3, ds = point_stats.aggregate(rows)
    assert (p3["kvstore"], p3["n"], p3["iterations"]) == ("p3", 2, 4)
    assert p3["throughput"] == pytest.approx(8 / 0.75) and p3["p100_equiv_gbps"] == 2.0
    assert (p3["low"], p3["high"]) == (pytest.approx(8 / 1.0), pytest.approx(8 / 0.5))
    assert ds["n"] == 1 and ds["throughput"] == 4.0  # the smoke row is never counted
    assert p3["vs_dist_sync"] == pytest.approx(8 / 0.75 / 4)
    assert p3["cpu_host_max_pct"] == 70 and p3["optimizer"] == "sgd"
    table = point_stats.point_table([p3, ds])
    # P100-equivalent: 10.7 images/s of emulated time at --gpu-scale 0.5.
    assert ("| m | 2 | 1gbit (2 Gbps) | sgd | p3kv | 10.7 images/s | 21.3 | 8.0–16.0 | 8.0–16.0 | 2 | 53% | 2.67× |"
            in table)
    assert sentences.verdicts([p3, ds]) == ["- m, 2 hosts, 1gbit (2 Gbps), optimizer sgd: p3kv 10.7 images/s, 53% of "
                                         "the bound, ahead of dist_sync (2.67×)."]


def test_bound_counts_frame_and_tcp_ip_headers():
    # 2 hosts, one 100,000-element float32 array, p3kv's 50,000-element slices: each link carries the whole model
    # each way in 2 messages of 64-byte headers; 1448-byte segments with 66 bytes of TCP/IPv4/Ethernet headers,
    # and the measured rate of 66-byte pure ACKs per segment of the reverse direction.
    load = wire_bound.link_load("p3", [100_000], 400_000, hosts=2)
    framed = 400_000 + 2 * 64
    assert load.payload == 400_000 and load.messages == 2
    assert load.wire == pytest.approx(framed + framed / 1448 * 66 * (1 + wire_bound.ACKS_PER_SEGMENT))
    assert load.seconds(1e9) == pytest.approx(load.wire * 8 / 1e9)
    assert load.seconds(1e9) > cluster_bench.comm_bound_seconds(400_000, 2, 1e9)
    # dist_sync: arrays above 10^6 elements go to every server in parts; a push and a pull request per part.
    assert wire_bound.messages_per_worker("dist_sync", [2_000_000, 10], servers=4) == 2 * (4 + 1)
    assert wire_bound.messages_per_worker("mxnet-p3", [100_000], servers=4) == 2 * 3
    assert wire_bound.messages_per_worker("p3-priority-split", [2_000_000, 10], servers=4) == 5
    hvd = wire_bound.link_load("horovod", [100_000], 400_000, hosts=4)
    assert hvd.payload == pytest.approx(1.5 * 400_000) and hvd.messages == 6
    assert wire_bound.header_of("horovod") == 48 and wire_bound.header_of("dist_sync") == 80


def test_calibration_reproduces_the_published_rate():
    for model in cluster_bench.MODELS:
        description = emulated_compute.load_description(model)
        calibration = description["calibration"]
        assert calibration["source"] and calibration["published"]
        profile = emulated_compute.Profile("p100", 1.0, emulated_compute.efficiency_of(description))
        seconds = sum(layer.forward_s + layer.backward_s for layer in emulated_compute.layers_of(description, 32,
                                                                                                 profile))
        assert 32 / seconds == pytest.approx(calibration["samples_per_s"], rel=1e-6)
        assert emulated_compute.efficiency_of(description, 2.0) == pytest.approx(
            2 * emulated_compute.efficiency_of(description))
    resnet = emulated_compute.load_description("resnet50_v1")["calibration"]
    assert resnet["samples_per_s"] == 195.0  # TensorFlow's DGX-1 P100 table, batch 32


def test_split_big_arrays_spreads_them_over_keys():
    description = {"params": [{"name": "a", "shape": [3, 1_000_000], "dtype": "float32"},
                              {"name": "b", "shape": [10], "dtype": "float32"}],
                   "layers": [{"name": "l0", "params": [1]}, {"name": "l1", "params": [0]}]}
    split = cluster_worker.split_big_arrays(description, 4)
    assert [p["shape"] for p in split["params"]] == [[750_000]] * 4 + [[10]]
    assert [layer["params"] for layer in split["layers"]] == [[4], [0, 1, 2, 3]]
    assert cluster_worker.split_big_arrays(description, 1) == {**description, "params": description["params"]}


def test_readme_and_docs_blocks_are_what_the_csvs_give_now():
    readme = (pathlib.Path(ROOT) / "README.md").read_text()
    # The front page shows the headlines only (MXNet's, MXNet's under CUBIC, PyTorch's), the dilation check's
    # verdict and the simulator's validation, a paragraph each; every table lives in docs/.
    assert {m["name"] for m in report.BLOCK.finditer(readme)} == {"headline", "cubic-headline", "torch-headline",
                                                                   "dilation-check", "sim-summary"}
    assert report.render(readme) == readme, "the README's headline is stale: run python -m benchmarks.report"
    text = report.DOCS.read_text()
    names = {m["name"] for m in report.BLOCK.finditer(text)}
    assert {"status", "bandwidth", "ablation", "slice", "scale", "sensitivity", "dilation"} <= names
    # Rows from before the reviewed settings are not results: their tables live beside their CSVs, not here.
    assert "legacy" not in names
    assert report.render(text) == text, "docs/benchmarks.md is stale: run python -m benchmarks.report"
    torch_doc = report.TORCH_DOC.read_text()  # the PyTorch comparison lives with p3kv.torch's page
    assert {m["name"] for m in report.BLOCK.finditer(torch_doc)} == {"torch", "torch-headline", "torch-loopback"}
    assert report.render(torch_doc) == torch_doc, "docs/torch.md is stale: run python -m benchmarks.report"
    legacy = (report.RESULTS / report.LEGACY / "README.md").read_text()
    assert {m["name"] for m in report.BLOCK.finditer(legacy)} == {"legacy"}
    assert report.render(legacy) == legacy, "results/legacy/README.md is stale: run python -m benchmarks.report"
    assert report.stale_bound_rows(report.SWEEPS_DIR) == [], "run python -m benchmarks.suites.sweeps rebound"


def test_rebound_rewrites_only_the_bound_columns(tmp_path):
    from benchmarks.suites import cluster_job
    settings = {"tag": "bandwidth", "model": "resnet50_v1", "kvstore": "p3", "status": "ok", "hosts": 4,
                "workers": 4, "layout": "colocated", "bandwidth": "2gbit", "bandwidth_bps": 2e9, "slice_size": "",
                "samples_per_batch": 32, "throughput": 100.0, "compute_s": 0.3, "median_s": 1.25, "optimizer": "sgd"}
    good = {**settings, "run_id": "a", **cluster_job.bound_columns(settings)}
    link_s = wire_bound.link_load("p3", *cluster_job.model_arrays("resnet50_v1"), 4).seconds(2e9)
    assert good["bound_s"] == round(link_s, 4) and good["bound_throughput"] == round(128 / link_s, 2)
    assert good["pct_of_bound"] == round(100 * 100.0 / good["bound_throughput"], 1)
    stale = {**good, "run_id": "b", "bound_s": 9.0, "bound_throughput": 1.0, "pct_of_bound": 1e4}
    csv_path = tmp_path / "bandwidth.csv"
    bench_rows.write_run(csv_path, good, {0: [1.25, 1.25]})
    bench_rows.write_run(csv_path, stale)
    bench_rows.write_run(csv_path, {**stale, "run_id": "c", "status": "failed(1)"})  # failed rows are left alone
    before = list(csv.DictReader(open(csv_path)))
    assert report.stale_bound_rows(tmp_path) == ["bandwidth.csv:b"]
    assert sweeps.rebound(tmp_path) == {csv_path: 1}
    after = list(csv.DictReader(open(csv_path)))
    assert after[0] == before[0] and after[2] == before[2]
    assert {k: v for k, v in after[1].items() if before[1][k] != v} == {
        "bound_s": str(good["bound_s"]), "bound_throughput": str(good["bound_throughput"]),
        "pct_of_bound": str(good["pct_of_bound"])}
    assert report.stale_bound_rows(tmp_path) == [] and sweeps.rebound(tmp_path) == {csv_path: 0}


def test_report_rewrites_a_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:slice -->\nold numbers\n<!-- /bench:slice -->\nend\n")
    results = tmp_path / "results"
    assert report.main(["--readme", str(readme), "--results-dir", str(results), "--check"]) == 1
    assert report.main(["--readme", str(readme), "--results-dir", str(results)]) == 0
    text = readme.read_text()
    assert "old numbers" not in text and "benchmarks.suites.sweeps slice" in text
    assert text.endswith("<!-- /bench:slice -->\nend\n")
    assert report.main(["--readme", str(readme), "--results-dir", str(results), "--check"]) == 0


def test_a_partly_run_sweep_names_what_is_missing_and_how_idle_the_machine_was(tmp_path):
    base = {"status": "ok", "tag": "bandwidth", "model": "resnet50_v1", "hosts": "4", "workers": "4",
            "samples_per_batch": "32", "bandwidth": "2gbit", "bandwidth_bps": "2e9", "gpu_scale": "1",
            "optimizer": "sgd(momentum=0.9)", "unit": "images", "bound_throughput": "200", "iter_s": "[1.0, 1.0]",
            "load_1m_before": "0.4", "load_1m_after": "3.5", "smoke": "False", "git_dirty": "False"}
    for repeat, (kv, busy) in enumerate([("p3", "2.5"), ("dist_sync", "7.9")]):
        bench_rows.write_run(tmp_path / "sweeps" / "bandwidth.csv",
                             {**base, "kvstore": kv, "repeat": repeat, "busy_pct_before": busy})
    block = sweep_blocks.reviewed_block("bandwidth", tmp_path)
    assert "(2 runs; CPUs busy before a run at most 8% (5-second sample); highest 1-minute load before/after a " \
           "run 3.50, the runs' own included; links under TCP BBR)" in block, block  # rows without the column
    assert "- Not measured yet: inceptionv3, sockeye, vgg19 (`sudo .venv/bin/python -m benchmarks.suites.sweeps " \
           "bandwidth --models inceptionv3 sockeye vgg19` appends them)." in block, block


def test_resume_skips_the_runs_already_in_the_csv(tmp_path):
    from benchmarks.suites import sweeps

    points = cluster_bench.interleave([cluster_bench.Point(model="resnet50_v1", kvstore=kv, tag="slice", slice_size=s,
                                                           bandwidth="2gbit", warmup=2, iters=20)
                                       for s in (5_000, 50_000) for kv in ("p3",)], 2, seed=0)
    csv_path = tmp_path / "slice.csv"
    assert sweeps.not_yet_run(points, csv_path) == points  # no CSV yet
    first = points[0]
    row = {"tag": "slice", "model": "resnet50_v1", "kvstore": "p3", "hosts": 4, "layout": "colocated",
           "bandwidth": "2gbit", "compute": "emulated", "batch_size": 32, "gpu_scale": "1.0",
           "efficiency_factor": "1.0", "slice_size": first.slice_size, "warmup": 2, "iters": 20,
           "optimizer": "sgd(lr=0.01,momentum=0.9,wd=0.0001,rescale_grad=1/4)", "repeat": first.repeat,
           "status": "ok", "smoke": False, "link_burst_bytes": first.link_burst_bytes,
           "tcp_rto_min_ms": first.tcp_rto_min_real_ms, "priority_hold_ms": 1000.0}
    bench_rows.write_run(csv_path, {**row, "priority_hold_ms": ""})  # p3kv before the sender's hold: run again
    assert sweeps.not_yet_run(points, csv_path) == points
    bench_rows.write_run(csv_path, row)
    bench_rows.write_run(csv_path, {**row, "repeat": 1, "status": "failed(1)"})  # a failed run is run again
    bench_rows.write_run(csv_path, {**row, "repeat": 1, "smoke": True})  # and a smoke run does not count
    left = sweeps.not_yet_run(points, csv_path)
    assert left == points[1:] and first.repeat == 0 and first.slice_size == 5_000
    # --redo-unfaithful: a run the monitors failed is run again, one with no verdict (older rows) is not.
    assert sweeps.not_yet_run(points, csv_path, redo_unfaithful=True) == points[1:]
    second = next(p for p in points if p.slice_size == first.slice_size and p.repeat == 1)
    bench_rows.write_run(csv_path, {**row, "repeat": 1, "faithful": False})
    without = [p for p in points[1:] if p != second]
    assert sweeps.not_yet_run(points, csv_path) == without
    assert sweeps.not_yet_run(points, csv_path, redo_unfaithful=True) == points[1:]
    bench_rows.write_run(csv_path, {**row, "repeat": 1, "faithful": True})  # the pass after the steal
    assert sweeps.not_yet_run(points, csv_path, redo_unfaithful=True) == without


def test_estimate_counts_every_sweep_in_full_and_what_is_left(tmp_path):
    from benchmarks.suites import sweeps

    rows, source = sweeps.estimates(sweeps.parse_args(["estimate"]), tmp_path / "sweeps")
    assert [name for name, _, _ in rows] == list(sweeps.ALL)
    assert all(full > 0 and left == full for _, full, left in rows)  # nothing measured in an empty folder
    assert source.endswith("from defaults")
    block = sweeps.estimate_block(tmp_path / "sweeps")
    assert block.count("\n| ") == len(sweeps.ALL) + 1 and "| all |" in block  # a row per sweep, and the total


def _args(**overrides):
    from benchmarks.suites import sweeps

    args = argparse.Namespace(
        models=sweeps.MODELS, kvstores=list(sweeps.SYSTEMS), hosts=4, batch_size=32, gpu_scale=None,
        link_max=sweeps.LINK_MAX_GBPS, optimizer="sgd", warmup=2, iters=20, timeout=1800.0,
        equivalents=sweeps.EQUIVALENTS, host_cpus=cluster_bench.DEFAULT_HOST_CPUS, no_cpu_limit=False,
        link_rx="softirq")
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def test_sweep_definitions_cover_the_papers_evaluation():
    from benchmarks.emulation import emulated_cluster
    from benchmarks.suites import sweeps

    args = _args()
    bandwidth = sweeps.sweep_bandwidth(args)
    for model in sweeps.MODELS:
        mine = [p for p in bandwidth if p.model == model]
        equivalents = {round(emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale / 1e9, 3) for p in mine}
        assert len(equivalents) >= 6 and min(equivalents) >= 1 and max(equivalents) == 30, (model, equivalents)
        assert {p.kvstore for p in mine} == {"p3", "dist_sync", "mxnet-p3", "horovod"}
        assert all(emulated_cluster.parse_rate(p.bandwidth) <= sweeps.LINK_MAX_GBPS * 1e9 for p in mine)
        assert all(p.optimizer == "sgd" and p.iters >= 20 for p in mine)
    assert 4.0 in {emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale / 1e9
                   for p in bandwidth if p.model == "resnet50_v1"}
    ablation = sweeps.sweep_ablation(args)
    assert {p.kvstore for p in ablation} == {"dist_sync", "p3-priority-split", "p3-slicing-only", "p3"}
    assert all(emulated_cluster.parse_rate(p.bandwidth) / p.gpu_scale == pytest.approx(30e9) for p in ablation)
    scale = sweeps.sweep_scale(args)
    assert {p.kvstore for p in scale} == {"p3", "dist_sync", "mxnet-p3", "horovod"}
    assert {p.hosts for p in scale} == {2, 4, 8}
    # The slice sweep's point is link-bound: the link needs longer per iteration than the compute.
    [point] = {(p.model, p.bandwidth, p.gpu_scale) for p in sweeps.sweep_slice(args)}
    sizes, nbytes = cluster_bench.model_arrays(point[0])
    description = emulated_compute.load_description(point[0])
    profile = emulated_compute.Profile("p100", point[2], emulated_compute.efficiency_of(description))
    compute = sum(lay.forward_s + lay.backward_s for lay in emulated_compute.layers_of(description, 32, profile))
    link_s = wire_bound.link_load("p3", sizes, nbytes, 4).seconds(emulated_cluster.parse_rate(point[1]))
    assert link_s > 2 * compute
    assert {p.efficiency_factor for p in sweeps.sweep_sensitivity(args)} == {0.5, 1.0, 2.0}
    assert sweeps.least_dilation(1) == 1.0 and sweeps.least_dilation(20) == pytest.approx(0.1)
    assert sweeps.estimate_seconds(sweeps.sweep_demo(args), 3, (10.0, 1.0, "test")) > 3 * 4 * 22 * 0.1


def test_link_utilisation_measures_the_timed_window_per_host_and_direction(tmp_path):
    # 1 Gbit/s links sampled every 10 ms for 2 s; the timed iterations take 1 s. Host 0 sends at the full rate and
    # host 1 receives at half of it from 0.5 s to 1.5 s, nothing else moves: the window is (0.5, 1.5], where of
    # the four directions one is full, one half busy and two idle.
    row = {"model": "sockeye", "kvstore": "p3", "hosts": "2", "bandwidth": "1gbit", "repeat": "0", "status": "ok",
           "bandwidth_bps": "1000000000.0", "iter_s": "[0.5, 0.5]", "tag": "utilisation"}
    full = 1_000_000_000 // 8 // 100  # bytes per 10 ms at 1 Gbit/s
    counters = {0: [0, 0], 1: [0, 0]}
    lines = ["time_s,host,tx_bytes,rx_bytes"]
    for k in range(201):
        if 50 < k <= 150:
            counters[0][0] += full
            counters[1][1] += full // 2
        lines += [f"{k / 100:.4f},{h},{tx},{rx}" for h, (tx, rx) in counters.items()]
    link_utilisation.samples_path(tmp_path, row).write_text("\n".join(lines) + "\n")
    measured = link_utilisation.run_utilisation(row, tmp_path)
    assert measured == {"busy": pytest.approx((1 + 0 + 0 + 0.5) / 4), "idle": pytest.approx(0.5)}
    assert link_utilisation.summary([row, {**row, "repeat": "1"}], tmp_path) == {
        "p3": {"busy": pytest.approx(0.375), "idle": pytest.approx(0.5), "n": 1}}  # repeat 1 has no samples
    sentence = sentences.utilisation_sentences([row], tmp_path)
    assert sentence == ["- Links during the timed iterations (mean rate over the link rate, both directions, every "
                        "host; idle: 10-ms samples below 10% of it; median of 1 runs): p3kv 38% busy, idle in 50% "
                        "of the samples."]


def test_link_utilisation_times_the_window_by_every_rank():
    # The window is as long as the slowest rank's timed iterations; older rows give rank 0's.
    assert link_utilisation.timed_seconds({"iter_s": "[0.5, 0.5]", "rank_iter_s": "[[0.5, 0.5], [0.6, 0.7]]"}) == \
        pytest.approx(1.3)
    assert link_utilisation.timed_seconds({"iter_s": "[0.5, 0.5]"}) == pytest.approx(1.0)


def _sweep_row(kv, repeat, hosts="2", cpu="120"):
    return {"status": "ok", "model": "m", "kvstore": kv, "hosts": hosts, "workers": hosts, "samples_per_batch": "4",
            "bandwidth": "1gbit", "bandwidth_bps": "1e9", "gpu_scale": "0.5", "optimizer": "sgd(...)",
            "unit": "images", "bound_throughput": "20", "repeat": str(repeat), "repeats": "3",
            "iter_s": json.dumps([1.0, 1.0]), "cpu_host_pct": "50;70", "cpu_total_pct": cpu, "cpus": "2",
            "load_1m_before": "0.5", "load_1m_after": "0.7", "smoke": "False", "legacy": "False"}


def test_status_counts_the_repeats_each_point_has_not_the_ones_planned(tmp_path):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    complete = [_sweep_row(kv, r) for kv in ("p3", "dist_sync") for r in range(3)]
    cut_short = complete[:3] + [_sweep_row("dist_sync", 0)]  # a sweep interrupted after dist_sync's first repeat
    for name, rows in (("done", complete), ("short", cut_short)):
        with open(sweeps / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    table = sweep_blocks.status_block(tmp_path)
    assert "| `" in table and "done.csv` | 6 | sgd | 3 | headers included | yes |" in table, table
    assert ("short.csv` | 4 | sgd | 1–3 | headers included | not yet: 1 of 2 points have fewer than 3 repeats |"
            in table), table


def test_points_near_the_cpu_limit_are_named_with_their_systems():
    points = point_stats.aggregate([_sweep_row("p3", 0, cpu="185"), _sweep_row("dist_sync", 0, cpu="150"),
                               _sweep_row("p3", 0, hosts="4", cpu="100")])
    assert sentences.saturation_sentences(points, cpus=2) == [
        "- Near the CPU limit (the hosts together above 90% of 2 cores): m, 2 hosts, 1gbit (2 Gbps) (p3kv 185%). "
        "There the cores, not the links, may limit the systems named, and their numbers understate them."]
    assert sentences.saturation_sentences(points, cpus=4) == []


def test_every_system_has_one_colour_of_its_own_in_the_figures():
    # The line figures colour a system the same in every panel: one that lacked a colour would take the fallback.
    assert set(sweeps.SYSTEM_COLORS) == set(cluster_bench.KVSTORES)
    assert len(set(sweeps.SYSTEM_COLORS.values())) == len(sweeps.SYSTEM_COLORS)


def test_server_slice_block_condenses_the_csv_and_names_the_points_above_the_target(tmp_path):
    fields = ["workers", "count", "optimizer", "repeats", "ratio_median", "commit", "git_dirty", "busy_pct_before",
              "load_1m_before", "load_1m_after"]
    ratios = {("none", 50_000, 2): 1.10, ("none", 50_000, 4): 1.20, ("none", 10_000, 2): 1.30,
              ("adam", 50_000, 2): 1.90, ("adam", 50_000, 4): 2.30, ("adam", 10_000, 2): 2.10}
    with open(tmp_path / "server_slice.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for (optimizer, count, workers), ratio in ratios.items():
            writer.writerow({"workers": workers, "count": count, "optimizer": optimizer, "repeats": 5,
                             "ratio_median": ratio, "commit": "abcdef0123456789", "git_dirty": "False",
                             "busy_pct_before": "3.2", "load_1m_before": "0.5", "load_1m_after": "0.9"})
    block = loopback_blocks.server_slice_block(tmp_path)
    assert block.splitlines()[0] == ("`benchmarks/results/server_slice.csv`, commit abcdef012345: median of 5 repeats "
                                     "of work / floor; CPUs 3% busy over a 5-second sample before it, 1-minute load "
                                     "0.5 before, 0.9 after.")
    assert "| 50k, W=2 | 1.10 | 1.90 |" in block and "| 50k, W=4 | 1.20 | 2.30 |" in block
    assert "| 10k, W=2 | 1.30 | 2.10 |" in block
    assert ("- aggregate only: 1.10–1.30× the floor over the 3 pairs of slice size and W; within the 2× target "
            "everywhere.") in block
    assert ("- Adam: 1.90–2.30× the floor over the 3 pairs of slice size and W; above the 2× target at 10k with W=2 "
            "(2.10), 50k with W=4 (2.30).") in block
    assert "SGD" not in block  # no rows, no column
