"""The accuracy benchmark (benchmarks/suites/accuracy.py, accuracy_worker.py): its data split and shards, its
time-to-accuracy summary, and a short run on 2 emulated hosts (root, network namespaces).

p3kv and MXNet's dist_sync are both synchronous SGD with the update on the servers: fed the same batches from the
same initial weights, they compute the same updates, so their per-iteration losses and test accuracies must be the
same (p3kv does not change SGD; DESIGN.md). dist_async (MXNet's ASGD) applies each worker's gradient alone, on
stale weights: it must run, its numbers are not expected to match. Speed ratios are results, never asserted."""

import csv
import math

import pytest

from benchmarks.analysis import accuracy_summary, bench_rows
from benchmarks.emulation import emulated_cluster
from benchmarks.suites import accuracy
from benchmarks.workloads import accuracy_worker


@pytest.mark.unit
def test_split_is_fixed_by_the_seed_and_shards_are_disjoint():
    x_train, x_test, y_train, y_test = accuracy_worker.load_data(seed=3)
    again = accuracy_worker.load_data(seed=3)
    assert (x_train == again[0]).all() and (y_test == again[3]).all()
    assert len(x_train) + len(x_test) == 1797 and x_train.shape[1] == 64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(y_test.tolist()) == set(range(10))  # stratified: every digit is in the test set
    first = [next(accuracy_worker.batches(len(x_train), r, 3, 16, seed=3)).tolist() for r in range(3)]
    assert first == [next(accuracy_worker.batches(len(x_train), r, 3, 16, seed=3)).tolist() for r in range(3)]
    shards = [set(), set(), set()]
    for r in range(3):
        source = accuracy_worker.batches(len(x_train), r, 3, 16, seed=3)
        for _ in range(len(x_train) // 3 // 16):
            shards[r].update(next(source).tolist())
    assert not (shards[0] & shards[1]) and not (shards[1] & shards[2]) and not (shards[0] & shards[2])


def _row(system, iteration, seconds, acc):
    return {"status": "ok", "system": system, "repeat": 0, "iteration": iteration, "time_s": seconds,
            "test_accuracy": acc, "median_iter_s": 0.5}


@pytest.mark.unit
def test_summary_reports_time_to_accuracy_and_unreached_targets():
    rows = [_row("p3", 5, 1.0, 0.5), _row("p3", 10, 2.0, 0.85), _row("p3", 15, 3.0, 0.93),
            _row("dist_async", 5, 0.5, 0.6), _row("dist_async", 10, 1.0, 0.7), _row("dist_async", 15, 4.0, 0.82)]
    assert accuracy_summary.time_to(rows[:3], 0.8) == 2.0
    assert accuracy_summary.time_to(rows[:3], 0.95) is None
    table = accuracy_summary.summary(rows, [0.8, 0.9])
    assert "| p3kv (P3) | 1 | 93.0% | 0.500 | 2.0 s | 3.0 s |" in table
    assert "| MXNet dist_async (ASGD) | 1 | 82.0% | 0.500 | 4.0 s | not reached (0/1) |" in table
    assert "reached 80% 2.00x as fast as ASGD" in table
    assert "P3 93% vs ASGD 88%" in table  # the paper's numbers beside ours


@pytest.mark.unit
def test_summary_says_whether_the_sync_curves_match_and_the_spreads_overlap():
    def run(system, repeat, accs):
        return [{**_row(system, 5 * (i + 1), float(i + 1), acc), "repeat": repeat, "test_loss": "0.1"}
                for i, acc in enumerate(accs)]

    same = run("p3", 0, [0.5, 0.9]) + run("dist_sync", 0, [0.5, 0.9]) + run("dist_async", 0, [0.4, 0.8])
    table = accuracy_summary.summary(same, [0.8])
    assert ("In all 1 repeats p3kv and dist_sync gave the same test accuracy and loss (as the CSV prints them) at "
            "every one of the 2 evaluations") in table
    assert ("Final test accuracy over the repeats: p3kv (P3) 90.0%, MXNet dist_sync 90.0%, MXNet dist_async (ASGD) "
            "80.0%.") in table
    apart = same + run("p3", 1, [0.5, 0.9]) + run("dist_sync", 1, [0.5, 0.91])
    assert "drew different curves in repeat(s) 1 of 2" in accuracy_summary.summary(apart, [0.8])
    assert "p3kv (P3) 90.0%, MXNet dist_sync 90.0–91.0%" in accuracy_summary.summary(apart, [0.8])

    def job(system, times):
        return {"kvstore": system, "status": "ok", "iter_s": str(times), "median_s": "1"}

    fast, slow = job("p3", [0.9, 0.91, 0.92, 0.93]), job("dist_sync", [1.0, 1.01, 1.02, 1.03])
    assert "the IQRs do not overlap." in accuracy_summary.summary(same, [0.8], [fast, slow])
    overlapping = job("dist_sync", [0.9, 0.91, 0.92, 1.1])
    assert "the IQRs overlap." in accuracy_summary.summary(same, [0.8], [fast, overlapping])


@pytest.mark.system
def test_two_host_run_sync_systems_match_and_async_runs(tmp_path):
    reason = emulated_cluster.why_unavailable()
    if reason:
        pytest.skip(reason)
    args = accuracy.parse_args(["--hosts", "2", "--bandwidth", "300mbit", "--iters", "10", "--eval-every", "1",
                                "--hidden", "64", "--compute-s", "0.02", "--timeout", "240",
                                "--csv", str(tmp_path / "accuracy.csv"), "--keep-logs", str(tmp_path / "logs"),
                                "--order-seed", "3", "--force", "--allow-dirty"])
    rows = accuracy.run(args)
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    by_system = {s: sorted((r for r in rows if r["system"] == s), key=lambda r: r["iteration"])
                 for s in ("p3", "dist_sync", "dist_async")}
    assert [len(v) for v in by_system.values()] == [10, 10, 10]  # one evaluation per iteration
    # Synchronous systems: the same updates, so the same curve per iteration.
    for p3, sync in zip(by_system["p3"], by_system["dist_sync"]):
        assert p3["iteration"] == sync["iteration"]
        assert p3["train_loss"] == pytest.approx(sync["train_loss"], rel=1e-5, abs=1e-6)
        assert p3["test_loss"] == pytest.approx(sync["test_loss"], rel=1e-5, abs=1e-6)
        assert p3["test_accuracy"] == pytest.approx(sync["test_accuracy"], abs=1e-9)
    # Training trains: the held-out loss falls.
    assert by_system["p3"][-1]["test_loss"] < by_system["p3"][0]["test_loss"]
    # ASGD ran every iteration and its numbers are real.
    assert all(math.isfinite(r["test_loss"]) and 0 <= r["test_accuracy"] <= 1 for r in by_system["dist_async"])
    with open(tmp_path / "accuracy.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == 30 and tuple(written[0]) == accuracy.COLUMNS
    assert {r["optimizer"] for r in written} == {"sgd momentum+wd on servers"}
    assert {(r["allow_dirty"], r["order_seed"]) for r in written} == {("True", "3")}
    # One row per job in the emulated runner's columns, in interleave's order, with every rank's iterations.
    jobs = bench_rows.read_runs(accuracy.runs_path(tmp_path / "accuracy.csv"))
    assert [(j["kvstore"], int(j["order"])) for j in jobs] == [(p.kvstore, p.order) for p in accuracy.order(args)]
    for j in jobs:
        assert j["optimizer"].startswith("sgd(") and j["update_on"] == "servers" and j["forced"] in ("True", "False")
        assert len(bench_rows.iteration_times(j)) == 10 and float(j["q1_s"]) <= float(j["median_s"]) <= float(j["q3_s"])
    with open(bench_rows.iterations_path(accuracy.runs_path(tmp_path / "accuracy.csv")), newline="") as f:
        assert len(list(csv.DictReader(f))) == 3 * 2 * 10  # 3 jobs, 2 ranks, 10 iterations
    assert "s/iter IQR" in accuracy_summary.summary(rows, [0.5], jobs)


@pytest.mark.unit
def test_order_is_interleave_shuffled_per_repeat_and_seeded():
    args = accuracy.parse_args(["--repeats", "4", "--order-seed", "7"])
    runs = accuracy.order(args)
    assert runs == accuracy.order(args)  # seeded: the same for the same seed
    rounds = [[p.kvstore for p in runs if p.repeat == r] for r in range(4)]
    assert all(sorted(r) == sorted(accuracy.SYSTEMS) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # a fresh order per repeat, not one order reused
    assert all([p.order for p in runs if p.repeat == r] == [0, 1, 2] for r in range(4))
